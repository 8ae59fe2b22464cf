//! A step's activations beside the weights, as a family computes them from the shapes
//! of the tensors its blocks use: what a run reserves through the activation path,
//! and the working set of each kind of block. `stagehand sample` reports them and the
//! simulator's description of the same model carries them, from the same function.

use serde::Serialize;

/// A step's activation tensors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Activations {
    /// Every tensor of a step: what a run allocates once and reserves before its first
    /// block.
    pub reserved_bytes: u64,
    /// Each kind of block, in step order, with the bytes of the tensors live while
    /// one block of that kind runs (those it reads or writes, and those holding values
    /// a later block reads).
    pub peaks: Vec<BlockKindPeak>,
}

/// The working set of one kind of block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockKindPeak {
    /// "embedders", "double block", …
    pub kind: String,
    /// Blocks of this kind in a step.
    pub blocks: u64,
    pub bytes: u64,
}

impl Activations {
    /// One working set for the whole step, reserved before its first block and live
    /// through all `blocks` of it (a VAE's decode: every block's stage runs inside it).
    pub fn whole_step(kind: &str, blocks: u64, bytes: u64) -> Self {
        Self {
            reserved_bytes: bytes,
            peaks: vec![BlockKindPeak {
                kind: kind.to_string(),
                blocks,
                bytes,
            }],
        }
    }

    /// The largest working set of any kind of block.
    pub fn peak_bytes(&self) -> u64 {
        self.peaks.iter().map(|peak| peak.bytes).max().unwrap_or(0)
    }

    /// `embedders 1.20 MiB, double block 3.40 MiB, …`, for summaries.
    pub fn describe_peaks(&self) -> String {
        let peaks: Vec<String> = self
            .peaks
            .iter()
            .map(|peak| format!("{} {}", peak.kind, stagehand_actors::Bytes(peak.bytes)))
            .collect();
        peaks.join(", ")
    }
}

/// The workload a model description states its activations at (`[activations]` of a
/// `config/models/*.toml`): each family reads the sizes its step depends on and
/// refuses a missing one by name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DescribedWorkload {
    /// An image's pixels (diffusion transformers).
    pub width: Option<u64>,
    pub height: Option<u64>,
    /// The text encoder's tokens a step attends to (diffusion transformers).
    pub text_tokens: Option<u64>,
    /// The tokens a decoder's KV cache holds at the described step.
    pub context_tokens: Option<u64>,
}

/// What a described step reserves beside the weights, from a family's own code: a
/// decoder's KV cache, or a step's activation tensors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DescribedReserve {
    pub kv_cache: Option<super::KvCache>,
    pub activations: Option<Activations>,
}

impl DescribedWorkload {
    /// `key`'s value, or an error naming it for `family`.
    pub fn needs(value: Option<u64>, key: &str, family: &str) -> Result<u64, String> {
        value.ok_or_else(|| format!("`{key}` is needed: the {family} family's step depends on it"))
    }
}

/// Tensors of `shapes`, handed out in order by the function returned: how a state
/// struct is allocated from the same list of shapes its size is predicted from.
pub fn allocator<C: crate::compute::Compute>(
    compute: &C,
    shapes: Vec<(usize, usize)>,
) -> Result<impl FnMut() -> Result<C::Tensor, super::FamilyError>, super::FamilyError> {
    let mut tensors = shapes
        .into_iter()
        .map(|(rows, cols)| compute.tensor(rows, cols))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter();
    Ok(move || {
        tensors.next().ok_or_else(|| {
            super::FamilyError::internal("activation shapes and tensors disagree".into())
        })
    })
}

/// `[cos(t·f_i) …, sin(t·f_i) …]` with `f_i = exp(−ln(10000)·i/half)` over `dim`
/// frequencies, in f32 as diffusers' `get_timestep_embedding(flip_sin_to_cos=True,
/// downscale_freq_shift=0)` computes it: the diffusion transformers' time input.
pub fn sinusoidal_embedding(t: f32, dim: usize) -> Vec<f32> {
    let half = dim / 2;
    let log_period = -(10_000f64.ln() as f32);
    let arguments: Vec<f32> = (0..half)
        .map(|i| {
            let exponent = log_period * i as f32 / half as f32;
            t * exponent.exp()
        })
        .collect();
    let mut out: Vec<f32> = arguments.iter().map(|a| a.cos()).collect();
    out.extend(arguments.iter().map(|a| a.sin()));
    out
}

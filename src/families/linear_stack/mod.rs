//! The linear-stack workload: each block is a few dim×dim f32 linear layers; a layer
//! computes `x ← rmsnorm(x · Wᵀ)` for a batch of rows (plus the attached LoRA's
//! low-rank update on streamed blocks). Written once against the compute port.

use stagehand_actors::{BlockId, ModelLayout};

use crate::compute::{Compute, DType, TensorSlot};
use crate::families::blocks::Blocks;
use crate::families::family::{Facts, Family, StepOutput};
use crate::families::inputs::WorkloadKind;
use crate::families::registry::{DemoWriter, Found, Open, Request, StepUnit};
use crate::families::FamilyError;
use crate::model::demo::DemoSpec;
use crate::model::ModelIndex;

const RMS_EPSILON: f32 = 1e-6;

#[derive(Debug, Clone)]
pub struct LinearStack {
    pub spec: DemoSpec,
    pub batch: usize,
    /// Per block, its layers' weights in order.
    layers: Vec<Vec<TensorSlot>>,
    layout: ModelLayout,
    input: Vec<f32>,
}

/// The running activations and scratch, on the compute device.
pub struct StackState<C: Compute> {
    x: C::Tensor,
    y: C::Tensor,
    /// `batch × rank` scratch of the low-rank LoRA path (resized as needed).
    low_rank: C::Tensor,
}

impl LinearStack {
    /// Recognises a generated demo model and locates each layer in its block.
    pub fn from_index(index: &ModelIndex, batch: usize) -> Result<Self, FamilyError> {
        let spec = DemoSpec::from_metadata(&index.metadata).ok_or_else(|| {
            FamilyError::unsupported(&index.path, "not a linear-stack demo model", format!(
                "{} is not a linear-stack demo model (no stagehand.kind metadata); use `--workload stream-verify` for other checkpoints",
                index.path.display()
            ))
        })?;
        if batch == 0 {
            return Err(FamilyError::request(
                "batch",
                "batch must be at least 1".into(),
            ));
        }
        let dim = spec.dim as usize;
        let layer_bytes = (dim * dim * 4) as u64;
        let mut layers = Vec::with_capacity(index.blocks.len());
        for block in 0..spec.blocks {
            let mut slots = Vec::with_capacity(spec.layers_per_block as usize);
            for layer in 0..spec.layers_per_block {
                let name = DemoSpec::tensor_name(block, layer);
                let tensor = index.tensor(&name).ok_or_else(|| {
                    FamilyError::missing_tensor(
                        &index.path,
                        &name,
                        format!("{}: tensor {name} is missing", index.path.display()),
                    )
                })?;
                if tensor.dtype != "F32" || tensor.bytes != layer_bytes {
                    let message = format!(
                        "{name}: expected F32 [{dim}, {dim}], found {} {:?}",
                        tensor.dtype, tensor.shape
                    );
                    let wanted = ("F32", &[dim, dim][..]);
                    return Err(FamilyError::tensor_not(
                        &index.path,
                        tensor,
                        wanted,
                        message,
                    ));
                }
                if tensor.block != block as usize {
                    return Err(FamilyError::bad_file(
                        &index.path,
                        format!(
                            "{name} was grouped into block {}, expected {block}",
                            tensor.block
                        ),
                    ));
                }
                slots.push(TensorSlot {
                    offset: tensor.block_offset,
                    dtype: DType::F32,
                    rows: dim,
                    cols: dim,
                    scale: None,
                    groups: None,
                });
            }
            layers.push(slots);
        }
        let input = input_batch(spec.seed, checked_count(batch, dim)?);
        Ok(Self {
            spec,
            batch,
            layers,
            layout: index.layout(),
            input,
        })
    }

    pub fn dim(&self) -> usize {
        self.spec.dim as usize
    }

    pub fn blocks(&self) -> usize {
        self.layers.len()
    }

    pub fn layers_per_block(&self) -> usize {
        self.spec.layers_per_block as usize
    }

    /// Floating-point operations of one block for the whole batch.
    pub fn flops_per_block(&self) -> f64 {
        let dim = self.dim() as f64;
        2.0 * self.batch as f64 * dim * dim * self.spec.layers_per_block as f64
    }

    /// Loads LoRA adapters onto this model's layers.
    pub fn lora_set(
        &self,
        index: &ModelIndex,
        specs: &[crate::lora::LoraSpec],
    ) -> Result<crate::families::lora_set::LoraSet, crate::lora::LoraError> {
        crate::families::lora_set::LoraSet::load(index, &[], specs, self.blocks(), &|tensor| {
            self.place(index, tensor)
        })
    }

    /// Where a tensor of the index sits, for LoRA targets: every layer weight, in the
    /// index's own blocks.
    pub fn place(&self, index: &ModelIndex, tensor: usize) -> Option<(usize, TensorSlot)> {
        let info = index.tensors.get(tensor)?;
        let slot = self
            .layers
            .get(info.block)?
            .iter()
            .find(|slot| slot.offset == info.block_offset)?;
        Some((info.block, *slot))
    }
}

/// `batch × dim`, or a clear error when that many activations cannot be addressed.
fn checked_count(batch: usize, dim: usize) -> Result<usize, FamilyError> {
    batch
        .checked_mul(dim)
        .filter(|count| count.checked_mul(4).is_some())
        .ok_or_else(|| {
            FamilyError::request(
                "batch",
                format!("batch {batch} × dim {dim} is too large; lower --batch"),
            )
        })
}

impl Open for LinearStack {
    const NAME: &'static str = "linear-stack";
    const KIND: WorkloadKind = WorkloadKind::LinearStack;
    const STEP: StepUnit = StepUnit::Batch;
    const DEMO: Option<DemoWriter> =
        Some(|cache_dir| crate::model::cache::ensure_demo_model(cache_dir, &DemoSpec::default()));

    fn recognises(found: &Found<'_>) -> bool {
        DemoSpec::from_metadata(&found.index.metadata).is_some()
    }

    fn activation_row_values(found: &Found<'_>) -> Option<u64> {
        DemoSpec::from_metadata(&found.index.metadata).map(|spec| u64::from(spec.dim))
    }

    fn open(request: &Request<'_>) -> Result<Self, FamilyError> {
        Self::from_index(request.index, request.batch)
    }
}

impl Facts for LinearStack {
    fn kind(&self) -> WorkloadKind {
        WorkloadKind::LinearStack
    }

    fn describe(&self) -> &'static str {
        "linear-stack"
    }

    fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    fn takes_lora(&self) -> bool {
        true
    }

    fn place(&self, index: &ModelIndex, tensor: usize) -> Option<(usize, TensorSlot)> {
        LinearStack::place(self, index, tensor)
    }

    fn tokens_per_step(&self) -> u64 {
        self.batch as u64
    }
}

impl Family for LinearStack {
    type State<C: Compute> = StackState<C>;

    fn start<C: Compute>(&self, compute: &C) -> Result<StackState<C>, FamilyError> {
        let dim = self.dim();
        Ok(StackState {
            x: compute.tensor(self.batch, dim)?,
            y: compute.tensor(self.batch, dim)?,
            low_rank: compute.tensor(self.batch, 1)?,
        })
    }

    fn step<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut StackState<C>,
        blocks: &mut B,
        _step: u64,
    ) -> Result<StepOutput, FamilyError> {
        compute.write(&mut state.x, &self.input)?;
        for (block, layers) in self.layers.iter().enumerate() {
            let held = blocks.acquire(compute, BlockId(block as u32))?;
            let outcome = (|| {
                let view = held.view(compute);
                for slot in layers {
                    let weight = view.weight(slot)?;
                    compute.linear(&state.x, &weight, None, &mut state.y)?;
                    for (factors, scale) in
                        held.low_rank(compute, blocks.lora(), slot, 0..slot.rows)?
                    {
                        compute.low_rank_add(
                            &state.x,
                            &factors,
                            scale,
                            &mut state.low_rank,
                            &mut state.y,
                        )?;
                    }
                    compute.rms_norm(&state.y, None, RMS_EPSILON, &mut state.x)?;
                }
                Ok::<(), FamilyError>(())
            })();
            blocks.release(compute, held)?;
            outcome?;
        }
        Ok(StepOutput {
            output: Some(compute.read(&state.x)?),
            ..StepOutput::default()
        })
    }
}

/// A deterministic input batch of `count` values in [-1, 1) from a model's seed (an LCG:
/// the same seed gives the same input to a streamed run and to its reference).
pub fn input_batch(seed: u64, count: usize) -> Vec<f32> {
    let mut state = seed ^ 0x1234_5678;
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The first element where two outputs differ in their bits.
pub fn first_difference(got: &[f32], expected: &[f32]) -> Option<(usize, f32, f32)> {
    got.iter()
        .zip(expected)
        .enumerate()
        .find(|(_, (a, b))| a.to_bits() != b.to_bits())
        .map(|(index, (a, b))| (index, *a, *b))
        .or_else(|| {
            (got.len() != expected.len())
                .then(|| (got.len().min(expected.len()), f32::NAN, f32::NAN))
        })
}

/// The first element where two outputs differ by more than `tolerance`.
pub fn first_difference_within(
    got: &[f32],
    expected: &[f32],
    tolerance: f32,
) -> Option<(usize, f32, f32)> {
    if got.len() != expected.len() {
        return Some((got.len().min(expected.len()), f32::NAN, f32::NAN));
    }
    got.iter()
        .zip(expected)
        .enumerate()
        .find(|(_, (a, b))| {
            // NaN differences fail too: `<=` is false for them.
            let close = (*a - *b).abs() <= tolerance;
            !close
        })
        .map(|(index, (a, b))| (index, *a, *b))
}

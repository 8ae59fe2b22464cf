//! What a Flux run samples: the conditioning file (T5 hidden states and the pooled
//! CLIP vector, so the transformer runs without its text encoders), the image size,
//! the steps, guidance, and where the initial latent comes from.
//!
//! The conditioning file is safetensors with two tensors (F32, F16 or BF16):
//! - `encoder_hidden_states`: `[1, L, joint_attention_dim]` (or `[L, D]`), T5's last
//!   hidden states for the prompt (L = 512 for dev, 256 for schnell, or any length);
//! - `pooled_projections`: `[1, pooled_projection_dim]` (or `[D]`), CLIP's pooled
//!   output.
//!
//! The names are the arguments of diffusers' `FluxTransformer2DModel.forward`.
//! An `--init` latent file holds `latent`: `[1, 16, H/8, W/8]` (or without the 1).

use std::path::{Path, PathBuf};

use crate::compute::DType;
use crate::families::FamilyError;

pub const CONTEXT_NAME: &str = "encoder_hidden_states";
pub const POOLED_NAME: &str = "pooled_projections";
pub const LATENT_NAME: &str = "latent";

/// Where the first latent comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Start {
    /// Seeded Gaussian noise.
    Seed(u64),
    /// The starting noise itself, unpacked (`[channels, height / 8, width / 8]`):
    /// diffusers' `latents` argument, given by a pipeline.
    Latent(Vec<f32>),
    /// Image-to-image from an encoded image's latent (unpacked, scaled as the VAE's
    /// encoder gives it), noised to `strength` with `seed`'s noise.
    Image {
        latent: Vec<f32>,
        strength: f64,
        seed: u64,
    },
    /// A latent file: the starting noise itself, or with `strength` the image to
    /// start from (noised with `seed`).
    Init {
        path: PathBuf,
        strength: Option<f64>,
        seed: u64,
    },
}

/// Where the conditioning comes from: a file, or a pipeline's text encoders.
#[derive(Debug, Clone, PartialEq)]
pub enum CondInput {
    File(PathBuf),
    Given(Conditioning),
}

impl From<PathBuf> for CondInput {
    fn from(path: PathBuf) -> Self {
        CondInput::File(path)
    }
}

/// What `stagehand sample` asks of a Flux model.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleInput {
    pub cond: CondInput,
    pub width: usize,
    pub height: usize,
    /// Steps of the schedule.
    pub steps: usize,
    /// Distilled guidance (dev only); `None`: 3.5 on dev.
    pub guidance: Option<f32>,
    pub start: Start,
}

/// The conditioning, read: `[tokens, context_dim]` and `[pooled_dim]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Conditioning {
    pub context: Vec<f32>,
    pub tokens: usize,
    pub pooled: Vec<f32>,
}

/// A file of tensors the caller gave (text states, a latent) is not what it should be.
fn bad(path: &Path, message: impl std::fmt::Display) -> FamilyError {
    FamilyError::bad_file(path, format!("{}: {message}", path.display()))
}

/// A tensor read to the host: its name, shape and values.
pub type HostTensor = (String, Vec<usize>, Vec<f32>);

/// The tensors of a small safetensors file, as f32 with their shapes.
pub fn read_tensors(path: &Path) -> Result<Vec<HostTensor>, FamilyError> {
    // A file the caller named: absent or unreadable is theirs to fix (exit 2), not
    // a failure of the run.
    let bytes = std::fs::read(path).map_err(|error| match error.kind() {
        std::io::ErrorKind::NotFound => FamilyError::MissingFile {
            path: path.to_path_buf(),
            message: format!("{}: {error}", path.display()),
        },
        _ => bad(path, error),
    })?;
    let file = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|error| bad(path, format!("is not a safetensors file ({error})")))?;
    let mut tensors = Vec::new();
    for (name, view) in file.tensors() {
        let dtype_name = format!("{:?}", view.dtype());
        let dtype = match dtype_name.as_str() {
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::Bf16,
            other => {
                return Err(bad(
                    path,
                    format!("tensor `{name}` is {other}; write it as F32, F16 or BF16"),
                ))
            }
        };
        let shape = view.shape().to_vec();
        let mut values = vec![0.0; shape.iter().product()];
        dtype.widen(view.data(), &mut values);
        tensors.push((name, shape, values));
    }
    Ok(tensors)
}

/// `name` of `tensors` with a shape of `dims` after leading 1s are dropped (`None` in
/// `dims`: any length). Returns the values and the shape.
fn take(
    path: &Path,
    tensors: &mut Vec<HostTensor>,
    name: &str,
    dims: &[Option<usize>],
) -> Result<(Vec<usize>, Vec<f32>), FamilyError> {
    let Some(position) = tensors.iter().position(|(found, ..)| found == name) else {
        return Err(bad(
            path,
            format!("tensor `{name}` is missing (expected {})", shape_text(dims)),
        ));
    };
    let (_, shape, values) = tensors.swap_remove(position);
    let mut squeezed: &[usize] = &shape;
    while squeezed.len() > dims.len() && squeezed.first() == Some(&1) {
        squeezed = &squeezed[1..];
    }
    let fits = squeezed.len() == dims.len()
        && squeezed
            .iter()
            .zip(dims)
            .all(|(&size, want)| size > 0 && want.is_none_or(|want| want == size));
    if !fits {
        return Err(bad(
            path,
            format!(
                "tensor `{name}` has shape {shape:?}, expected {}",
                shape_text(dims)
            ),
        ));
    }
    Ok((squeezed.to_vec(), values))
}

fn shape_text(dims: &[Option<usize>]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|dim| dim.map_or("L".to_string(), |dim| dim.to_string()))
        .collect();
    format!("[1, {}]", parts.join(", "))
}

impl Conditioning {
    /// The conditioning `input` names, checked against the transformer's widths.
    pub fn of(
        input: &CondInput,
        context_dim: usize,
        pooled_dim: usize,
    ) -> Result<Self, FamilyError> {
        match input {
            CondInput::File(path) => Self::read(path, context_dim, pooled_dim),
            CondInput::Given(cond) => {
                let fits = cond.tokens > 0
                    && cond.context.len() == cond.tokens * context_dim
                    && cond.pooled.len() == pooled_dim;
                if !fits {
                    return Err(FamilyError::request("condition", format!(
                        "the text encoders gave {} states of {} values and a pooled vector of {}; the transformer takes states of {context_dim} (joint_attention_dim) and a pooled vector of {pooled_dim} (pooled_projection_dim): the pipeline's parts are of different models",
                        cond.tokens,
                        cond.context.len() / cond.tokens.max(1),
                        cond.pooled.len()
                    )));
                }
                Ok(cond.clone())
            }
        }
    }

    pub fn read(path: &Path, context_dim: usize, pooled_dim: usize) -> Result<Self, FamilyError> {
        let mut tensors = read_tensors(path)?;
        let (shape, context) = take(path, &mut tensors, CONTEXT_NAME, &[None, Some(context_dim)])?;
        let (_, pooled) = take(path, &mut tensors, POOLED_NAME, &[Some(pooled_dim)])?;
        Ok(Self {
            context,
            tokens: shape[0],
            pooled,
        })
    }

    /// A seeded stand-in: `tokens` text tokens, for runs without a conditioning file.
    pub fn seeded(tokens: usize, context_dim: usize, pooled_dim: usize) -> Self {
        Self {
            context: super::embed::gaussian(tokens * context_dim, 11),
            tokens,
            pooled: super::embed::gaussian(pooled_dim, 12),
        }
    }
}

/// An `--init` latent of `channels × height × width` (the latent's own size: pixels / 8).
pub fn read_latent(
    path: &Path,
    channels: usize,
    height: usize,
    width: usize,
) -> Result<Vec<f32>, FamilyError> {
    let mut tensors = read_tensors(path)?;
    let (_, values) = take(
        path,
        &mut tensors,
        LATENT_NAME,
        &[Some(channels), Some(height), Some(width)],
    )?;
    Ok(values)
}

/// Writes `latent` (`[1, channels, height, width]`, F32) as `latent` in `path`,
/// through an unnamed file named once complete.
pub fn write_latent(
    path: &Path,
    latent: &[f32],
    channels: usize,
    height: usize,
    width: usize,
) -> Result<(), FamilyError> {
    let bytes: Vec<u8> = latent
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .collect();
    let view = safetensors::tensor::TensorView::new(
        safetensors::Dtype::F32,
        vec![1, channels, height, width],
        &bytes,
    )
    .map_err(|error| bad(path, error))?;
    let file =
        safetensors::serialize([(LATENT_NAME, view)], None).map_err(|error| bad(path, error))?;
    crate::os::write_atomically(path, |mut out| std::io::Write::write_all(&mut out, &file)).map_err(
        |error| FamilyError::Io {
            path: path.display().to_string(),
            reason: error.to_string(),
        },
    )
}

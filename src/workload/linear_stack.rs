//! The linear-stack workload: each block is a few dim×dim f32 linear layers; a layer
//! computes `x ← rmsnorm(x · Wᵀ)` for a batch of rows. The GEMM is `matrixmultiply`
//! (pure Rust, maintained, deterministic and single-threaded by default, so a streamed
//! run and the resident reference produce the same bits).

use std::os::unix::fs::FileExt;

use crate::model::demo::DemoSpec;
use crate::model::ModelIndex;

use super::WorkloadError;

/// One layer's weight inside its block's buffer.
#[derive(Debug, Clone, Copy)]
struct LayerRef {
    block_offset: u64,
}

#[derive(Debug, Clone)]
pub struct LinearStack {
    pub spec: DemoSpec,
    pub batch: usize,
    /// Per block, its layers in order.
    layers: Vec<Vec<LayerRef>>,
}

/// The running activations and a scratch buffer, allocated once.
pub struct Activations {
    pub x: Vec<f32>,
    y: Vec<f32>,
}

const RMS_EPSILON: f32 = 1e-6;

impl LinearStack {
    /// Recognises a generated demo model and locates each layer in its block.
    pub fn from_index(index: &ModelIndex, batch: usize) -> Result<Self, WorkloadError> {
        let spec = DemoSpec::from_metadata(&index.metadata).ok_or_else(|| {
            WorkloadError::Model(format!(
                "{} is not a linear-stack demo model (no stagehand.kind metadata); use `--workload stream-verify` for other checkpoints",
                index.path.display()
            ))
        })?;
        if batch == 0 {
            return Err(WorkloadError::Model("batch must be at least 1".into()));
        }
        let dim = spec.dim as usize;
        let layer_bytes = (dim * dim * 4) as u64;
        let mut layers = Vec::with_capacity(index.blocks.len());
        for block in 0..spec.blocks {
            let mut refs = Vec::with_capacity(spec.layers_per_block as usize);
            for layer in 0..spec.layers_per_block {
                let name = DemoSpec::tensor_name(block, layer);
                let tensor = index.tensor(&name).ok_or_else(|| {
                    WorkloadError::Model(format!(
                        "{}: tensor {name} is missing",
                        index.path.display()
                    ))
                })?;
                if tensor.dtype != "F32" || tensor.bytes != layer_bytes {
                    return Err(WorkloadError::Model(format!(
                        "{name}: expected F32 [{dim}, {dim}], found {} {:?}",
                        tensor.dtype, tensor.shape
                    )));
                }
                if tensor.block != block as usize {
                    return Err(WorkloadError::Model(format!(
                        "{name} was grouped into block {}, expected {block}",
                        tensor.block
                    )));
                }
                refs.push(LayerRef {
                    block_offset: tensor.block_offset,
                });
            }
            layers.push(refs);
        }
        Ok(Self {
            spec,
            batch,
            layers,
        })
    }

    pub fn dim(&self) -> usize {
        self.spec.dim as usize
    }

    pub fn blocks(&self) -> usize {
        self.layers.len()
    }

    /// Floating-point operations of one block for the whole batch.
    pub fn flops_per_block(&self) -> f64 {
        let dim = self.dim() as f64;
        2.0 * self.batch as f64 * dim * dim * self.spec.layers_per_block as f64
    }

    /// A deterministic input batch.
    pub fn activations(&self) -> Activations {
        let count = self.batch * self.dim();
        let mut state = self.spec.seed ^ 0x1234_5678;
        let x = (0..count)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        Activations {
            x,
            y: vec![0.0; count],
        }
    }

    /// Runs block `block` on `activations`, reading weights from the block's buffer.
    pub fn forward_block(
        &self,
        block: usize,
        block_bytes: &[u8],
        activations: &mut Activations,
    ) -> Result<(), WorkloadError> {
        let dim = self.dim();
        let layer_values = dim * dim;
        for layer in &self.layers[block] {
            let start = layer.block_offset as usize;
            let bytes = block_bytes
                .get(start..start + layer_values * 4)
                .ok_or_else(|| {
                    WorkloadError::Model(format!("block {block} buffer is too short"))
                })?;
            // SAFETY: every bit pattern is a valid f32; `align_to` only yields the
            // aligned middle, and we insist it is the whole slice.
            let (prefix, weights, suffix) = unsafe { bytes.align_to::<f32>() };
            if !prefix.is_empty() || !suffix.is_empty() {
                return Err(WorkloadError::Model(format!(
                    "block {block}: weights are not 4-byte aligned in memory"
                )));
            }
            linear(weights, dim, self.batch, activations);
        }
        Ok(())
    }

    /// The fully-resident reference: every weight read straight from the file, the
    /// same arithmetic in the same order.
    pub fn reference(&self, index: &ModelIndex) -> Result<Vec<f32>, WorkloadError> {
        let mut activations = self.activations();
        let files: Vec<std::fs::File> = index
            .files
            .iter()
            .map(|shard| {
                std::fs::File::open(&shard.path).map_err(|error| WorkloadError::Io {
                    path: shard.path.display().to_string(),
                    reason: error.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
        for (block_number, block) in index.blocks.iter().enumerate().take(self.blocks()) {
            let mut buffer = vec![0u32; (block.bytes as usize).div_ceil(4)];
            // SAFETY: a u32 buffer viewed as bytes, for an aligned read target.
            let bytes = unsafe {
                std::slice::from_raw_parts_mut(buffer.as_mut_ptr() as *mut u8, block.bytes as usize)
            };
            let mut at = 0usize;
            for extent in &block.extents {
                let file = &files[extent.file.0 as usize];
                file.read_exact_at(&mut bytes[at..at + extent.length as usize], extent.offset)
                    .map_err(|error| WorkloadError::Io {
                        path: index.files[extent.file.0 as usize]
                            .path
                            .display()
                            .to_string(),
                        reason: error.to_string(),
                    })?;
                at += extent.length as usize;
            }
            self.forward_block(block_number, bytes, &mut activations)?;
        }
        Ok(activations.x)
    }
}

/// `x ← rmsnorm(x · Wᵀ)` for a batch of rows; `weights` is row-major [out, in].
fn linear(weights: &[f32], dim: usize, batch: usize, activations: &mut Activations) {
    let Activations { x, y } = activations;
    // SAFETY: x is batch×dim, weights dim×dim, y batch×dim, all row-major with the
    // strides given; y does not alias x or weights.
    unsafe {
        matrixmultiply::sgemm(
            batch,
            dim,
            dim,
            1.0,
            x.as_ptr(),
            dim as isize,
            1,
            weights.as_ptr(),
            1,
            dim as isize,
            0.0,
            y.as_mut_ptr(),
            dim as isize,
            1,
        );
    }
    for (row_in, row_out) in y.chunks_exact(dim).zip(x.chunks_exact_mut(dim)) {
        let mean_square = row_in.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let scale = 1.0 / (mean_square + RMS_EPSILON).sqrt();
        for (out, value) in row_out.iter_mut().zip(row_in) {
            *out = value * scale;
        }
    }
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

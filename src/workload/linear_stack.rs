//! The linear-stack workload: each block is a few dim×dim f32 linear layers; a layer
//! computes `x ← rmsnorm(x · Wᵀ)` for a batch of rows. The GEMM is `matrixmultiply`
//! (pure Rust, maintained, deterministic and single-threaded by default, so a streamed
//! run and the resident reference produce the same bits).

use crate::model::demo::DemoSpec;
use crate::model::ModelIndex;

use super::lora_set::{BlockPatches, LoraSet};
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
    /// `batch × rank` scratch of the low-rank LoRA path.
    low_rank: Vec<f32>,
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
        Activations {
            x: input_batch(self.spec.seed, count),
            y: vec![0.0; count],
            low_rank: Vec::new(),
        }
    }

    /// Runs block `block` on `activations`, reading weights from the block's buffer.
    pub fn forward_block(
        &self,
        block: usize,
        block_bytes: &[u8],
        activations: &mut Activations,
    ) -> Result<(), WorkloadError> {
        self.forward_block_patched(block, block_bytes, activations, None)
    }

    /// As [`LinearStack::forward_block`], adding each layer's LoRA patches the low-rank
    /// way (`y += s·(x·Aᵀ)·Bᵀ`) before the norm: the streamed-weight path.
    pub fn forward_block_patched(
        &self,
        block: usize,
        block_bytes: &[u8],
        activations: &mut Activations,
        lora: Option<&BlockPatches<'_>>,
    ) -> Result<(), WorkloadError> {
        let dim = self.dim();
        for (layer_number, layer) in self.layers[block].iter().enumerate() {
            let weights = layer_weights(block, block_bytes, layer.block_offset, dim)?;
            let Activations { x, y, low_rank } = activations;
            gemm(weights, dim, self.batch, x, y);
            let patches = lora.and_then(|layers| layers.get(layer_number));
            for (factors, scale) in patches.into_iter().flatten() {
                crate::lora::apply_low_rank(x, self.batch, factors, *scale, low_rank, y);
            }
            rms_norm(dim, y, x);
        }
        Ok(())
    }

    /// Bakes the LoRA set into a block's weights in place: `W ← W + s·B·A` per patch,
    /// in adapter order — the resident-weight path and the merged reference.
    pub fn bake_block(
        &self,
        block: usize,
        block_bytes: &mut [u8],
        lora: &BlockPatches<'_>,
    ) -> Result<(), WorkloadError> {
        let dim = self.dim();
        for (layer_number, layer) in self.layers[block].iter().enumerate() {
            let start = layer.block_offset as usize;
            let bytes = block_bytes
                .get_mut(start..start + dim * dim * 4)
                .ok_or_else(|| {
                    WorkloadError::Model(format!("block {block} buffer is too short"))
                })?;
            // SAFETY: every bit pattern is a valid f32; we insist the slice is aligned.
            let (prefix, weights, suffix) = unsafe { bytes.align_to_mut::<f32>() };
            if !prefix.is_empty() || !suffix.is_empty() {
                return Err(WorkloadError::Model(format!(
                    "block {block}: weights are not 4-byte aligned in memory"
                )));
            }
            for (factors, scale) in lora.get(layer_number).into_iter().flatten() {
                crate::lora::merge_into(weights, factors, *scale);
            }
        }
        Ok(())
    }

    /// The layer of `block` whose weight starts at `block_offset`.
    pub fn layer_at(&self, block: usize, block_offset: u64) -> Option<usize> {
        self.layers
            .get(block)?
            .iter()
            .position(|layer| layer.block_offset == block_offset)
    }

    pub fn layers_per_block(&self) -> usize {
        self.spec.layers_per_block as usize
    }

    /// The fully-resident reference: every weight read straight from the file, the
    /// same arithmetic in the same order.
    pub fn reference(&self, index: &ModelIndex) -> Result<Vec<f32>, WorkloadError> {
        self.reference_merged(index, None)
    }

    /// The fully-merged reference: every weight read from the file with the LoRA set
    /// merged in (`W + s·B·A`), then the same forward pass.
    pub fn reference_merged(
        &self,
        index: &ModelIndex,
        lora: Option<&LoraSet>,
    ) -> Result<Vec<f32>, WorkloadError> {
        let mut activations = self.activations();
        let reader = crate::model::BlockReader::open(index)?;
        for (block_number, block) in index.blocks.iter().enumerate().take(self.blocks()) {
            let mut buffer = vec![0u32; (block.bytes as usize).div_ceil(4)];
            // SAFETY: a u32 buffer viewed as bytes, for an aligned read target.
            let bytes = unsafe {
                std::slice::from_raw_parts_mut(buffer.as_mut_ptr() as *mut u8, block.bytes as usize)
            };
            reader.read_into(block_number, bytes)?;
            if let Some(lora) = lora {
                self.bake_block(block_number, bytes, &lora.host_patches(block_number))?;
            }
            self.forward_block(block_number, bytes, &mut activations)?;
        }
        Ok(activations.x)
    }
}

fn layer_weights(
    block: usize,
    block_bytes: &[u8],
    block_offset: u64,
    dim: usize,
) -> Result<&[f32], WorkloadError> {
    let start = block_offset as usize;
    let bytes = block_bytes
        .get(start..start + dim * dim * 4)
        .ok_or_else(|| WorkloadError::Model(format!("block {block} buffer is too short")))?;
    // SAFETY: every bit pattern is a valid f32; `align_to` only yields the aligned
    // middle, and we insist it is the whole slice.
    let (prefix, weights, suffix) = unsafe { bytes.align_to::<f32>() };
    if !prefix.is_empty() || !suffix.is_empty() {
        return Err(WorkloadError::Model(format!(
            "block {block}: weights are not 4-byte aligned in memory"
        )));
    }
    Ok(weights)
}

/// `y ← x · Wᵀ` for a batch of rows; `weights` is row-major [out, in].
pub(crate) fn gemm(weights: &[f32], dim: usize, batch: usize, x: &[f32], y: &mut [f32]) {
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

/// `x ← rmsnorm(y)` row by row.
pub(crate) fn rms_norm(dim: usize, y: &[f32], x: &mut [f32]) {
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

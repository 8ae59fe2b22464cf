//! Where a WAN transformer's weights are, as blocks, by diffusers' names: the
//! embedders (`head`: patch embedding and condition embedder), one block per
//! transformer block, then the output layer (`scale_shift_table`, `proj_out`) — the
//! order a step walks them.

use crate::compute::TensorSlot;
use crate::families::placement::{Placement, PlacementBuilder};
use crate::families::FamilyError;
use crate::model::ModelIndex;

use super::config::WanConfig;
use super::fp8;

/// A linear's weight and bias, as slots are found by tensor index.
#[derive(Debug, Clone, Copy)]
pub struct Linear {
    pub weight: usize,
    pub bias: usize,
    /// The weight's matrix shape `[out, in]` (the patch embedding's Conv3d kernel is
    /// stored `[dim, channels, 1, 2, 2]`: a matrix over flattened patches).
    pub rows: usize,
    pub cols: usize,
}

/// An attention's projections and its q/k RMS norms (across all heads).
#[derive(Debug, Clone, Copy)]
pub struct AttentionWeights {
    pub to_q: Linear,
    pub to_k: Linear,
    pub to_v: Linear,
    pub to_out: Linear,
    pub norm_q: usize,
    pub norm_k: usize,
}

#[derive(Debug, Clone, Copy)]
pub struct BlockWeights {
    /// `[1, 6, dim]`: shift, scale, gate of self-attention, then of the feed-forward.
    pub scale_shift_table: usize,
    pub attn1: AttentionWeights,
    pub attn2: AttentionWeights,
    /// `norm2`'s weight and bias (`cross_attn_norm`).
    pub norm2: Option<(usize, usize)>,
    pub ffn_in: Linear,
    pub ffn_out: Linear,
}

#[derive(Debug, Clone, Copy)]
pub struct HeadWeights {
    pub patch_embedding: Linear,
    pub time_1: Linear,
    pub time_2: Linear,
    /// `dim → 6·dim`: the blocks' modulation from `silu(temb)`.
    pub time_proj: Linear,
    pub text_1: Linear,
    pub text_2: Linear,
}

#[derive(Debug, Clone, Copy)]
pub struct OutputWeights {
    /// `[1, 2, dim]`: shift, scale of the output norm.
    pub scale_shift_table: usize,
    pub proj_out: Linear,
}

pub struct WanWeights {
    pub placement: Placement,
    pub head: HeadWeights,
    pub blocks: Vec<BlockWeights>,
    pub output: OutputWeights,
}

impl WanWeights {
    /// The slot of a placed tensor.
    pub fn slot(&self, tensor: usize) -> Result<TensorSlot, FamilyError> {
        self.placement
            .slot_of(tensor)
            .map(|(_, slot)| slot)
            .ok_or_else(|| FamilyError::internal(format!("tensor {tensor} was not placed")))
    }

    /// A linear's weight as the matrix it computes as.
    pub fn matrix(&self, linear: &Linear) -> Result<TensorSlot, FamilyError> {
        Ok(TensorSlot {
            rows: linear.rows,
            cols: linear.cols,
            ..self.slot(linear.weight)?
        })
    }

    /// A `[1, count, dim]` modulation table as `count` rows of `dim`.
    pub fn table(
        &self,
        tensor: usize,
        count: usize,
        dim: usize,
    ) -> Result<TensorSlot, FamilyError> {
        Ok(TensorSlot {
            rows: count,
            cols: dim,
            ..self.slot(tensor)?
        })
    }

    pub fn place(index: &ModelIndex, config: &WanConfig) -> Result<Self, FamilyError> {
        let mut placer = Placer {
            builder: PlacementBuilder::new(index),
            index,
        };
        let (dim, ffn) = (config.dim(), config.ffn_dim);
        placer.builder.block("head");
        let [frames, rows, cols] = config.patch;
        let patch_shape = [dim, config.in_channels, frames, rows, cols];
        let patch_embedding = Linear {
            weight: placer.add("patch_embedding.weight", &patch_shape)?,
            bias: placer.add("patch_embedding.bias", &[dim])?,
            rows: dim,
            cols: config.patch_in(),
        };
        let embedder = "condition_embedder";
        let head = HeadWeights {
            patch_embedding,
            time_1: placer.linear(
                &format!("{embedder}.time_embedder.linear_1"),
                dim,
                config.freq_dim,
            )?,
            time_2: placer.linear(&format!("{embedder}.time_embedder.linear_2"), dim, dim)?,
            time_proj: placer.linear(&format!("{embedder}.time_proj"), 6 * dim, dim)?,
            text_1: placer.linear(
                &format!("{embedder}.text_embedder.linear_1"),
                dim,
                config.text_dim,
            )?,
            text_2: placer.linear(&format!("{embedder}.text_embedder.linear_2"), dim, dim)?,
        };
        let blocks = (0..config.layers)
            .map(|block| {
                let at = format!("blocks.{block}");
                placer.builder.block(at.clone());
                Ok(BlockWeights {
                    scale_shift_table: placer
                        .add(&format!("{at}.scale_shift_table"), &[1, 6, dim])?,
                    attn1: placer.attention(&format!("{at}.attn1"), dim)?,
                    attn2: placer.attention(&format!("{at}.attn2"), dim)?,
                    norm2: match config.cross_attn_norm {
                        true => Some((
                            placer.add(&format!("{at}.norm2.weight"), &[dim])?,
                            placer.add(&format!("{at}.norm2.bias"), &[dim])?,
                        )),
                        false => None,
                    },
                    ffn_in: placer.linear(&format!("{at}.ffn.net.0.proj"), ffn, dim)?,
                    ffn_out: placer.linear(&format!("{at}.ffn.net.2"), dim, ffn)?,
                })
            })
            .collect::<Result<_, FamilyError>>()?;
        placer.builder.block("output");
        let output = OutputWeights {
            scale_shift_table: placer.add("scale_shift_table", &[1, 2, dim])?,
            proj_out: placer.linear("proj_out", config.patch_out(), dim)?,
        };
        Ok(Self {
            placement: placer.builder.finish(),
            head,
            blocks,
            output,
        })
    }
}

struct Placer<'i> {
    builder: PlacementBuilder<'i>,
    index: &'i ModelIndex,
}

impl Placer<'_> {
    /// A tensor computed as stored: never FP8 (see [`fp8`]).
    fn add(&mut self, name: &str, shape: &[usize]) -> Result<usize, FamilyError> {
        fp8::check_stored(self.index, name)?;
        self.builder.add(name, shape)
    }

    /// A Linear: its weight may be ComfyUI's scaled FP8, which the placement puts
    /// beside its scale.
    fn linear(&mut self, stem: &str, rows: usize, cols: usize) -> Result<Linear, FamilyError> {
        let weight = format!("{stem}.weight");
        fp8::check_linear(self.index, &weight)?;
        Ok(Linear {
            weight: self.builder.add_weight(&weight, &[rows, cols], true)?,
            bias: self.add(&format!("{stem}.bias"), &[rows])?,
            rows,
            cols,
        })
    }

    fn attention(&mut self, at: &str, dim: usize) -> Result<AttentionWeights, FamilyError> {
        Ok(AttentionWeights {
            to_q: self.linear(&format!("{at}.to_q"), dim, dim)?,
            to_k: self.linear(&format!("{at}.to_k"), dim, dim)?,
            to_v: self.linear(&format!("{at}.to_v"), dim, dim)?,
            to_out: self.linear(&format!("{at}.to_out.0"), dim, dim)?,
            norm_q: self.add(&format!("{at}.norm_q.weight"), &[dim])?,
            norm_k: self.add(&format!("{at}.norm_k.weight"), &[dim])?,
        })
    }
}

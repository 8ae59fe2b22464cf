//! Where a Flux transformer's weights are, as blocks: the embedders (`head`), one block
//! per double-stream block, one per single-stream block, then the final layer — the
//! order a denoising step walks them. Every tensor is looked up by its original name
//! through [`Names`], so the three layouts place the same values in the same roles.

use crate::compute::TensorSlot;
use crate::families::placement::{Placement, PlacementBuilder};
use crate::families::FamilyError;
use crate::model::ModelIndex;

use super::config::FluxConfig;
use super::names::Names;

/// One tensor of a linear's weight (and its bias), covering output rows
/// `first .. first + rows` of the original (possibly fused) weight.
#[derive(Debug, Clone, Copy)]
pub struct Piece {
    pub first: usize,
    pub rows: usize,
    pub weight: usize,
    pub bias: usize,
}

/// A linear layer of the original layout, as its checkpoint's pieces.
#[derive(Debug, Clone)]
pub struct Linear {
    pub pieces: Vec<Piece>,
}

/// One stream of a double block (image or text).
#[derive(Debug, Clone)]
pub struct StreamWeights {
    pub modulation: Linear,
    pub qkv: Linear,
    pub q_norm: usize,
    pub k_norm: usize,
    pub proj: Linear,
    pub mlp_in: Linear,
    pub mlp_out: Linear,
}

#[derive(Debug, Clone)]
pub struct DoubleWeights {
    pub img: StreamWeights,
    pub txt: StreamWeights,
}

#[derive(Debug, Clone)]
pub struct SingleWeights {
    pub modulation: Linear,
    /// q, k, v and the MLP's input, stacked by rows.
    pub linear1: Linear,
    pub q_norm: usize,
    pub k_norm: usize,
    pub linear2: Linear,
}

/// An MLP embedder: `in_layer`, SiLU, `out_layer`.
#[derive(Debug, Clone)]
pub struct Embedder {
    pub in_layer: Linear,
    pub out_layer: Linear,
}

#[derive(Debug, Clone)]
pub struct HeadWeights {
    pub img_in: Linear,
    pub txt_in: Linear,
    pub time_in: Embedder,
    pub vector_in: Embedder,
    pub guidance_in: Option<Embedder>,
}

#[derive(Debug, Clone)]
pub struct FinalWeights {
    /// Shift then scale (original), or scale then shift (diffusers).
    pub modulation: Linear,
    pub scale_first: bool,
    pub linear: Linear,
}

/// A linear as the original layout names it, and the output rows of its parts (the
/// pieces diffusers splits it into; one part for a linear no layout splits).
#[derive(Debug, Clone)]
pub struct LinearName {
    pub stem: String,
    pub parts: Vec<usize>,
}

pub struct FluxWeights {
    pub placement: Placement,
    /// Every linear placed, in placement order.
    pub linears: Vec<LinearName>,
    pub head: HeadWeights,
    pub double: Vec<DoubleWeights>,
    pub single: Vec<SingleWeights>,
    pub last: FinalWeights,
}

impl FluxWeights {
    /// The slot of a placed tensor.
    pub fn slot(&self, tensor: usize) -> Result<TensorSlot, FamilyError> {
        self.placement
            .slot_of(tensor)
            .map(|(_, slot)| slot)
            .ok_or_else(|| FamilyError::internal(format!("tensor {tensor} was not placed")))
    }

    pub fn place(
        index: &ModelIndex,
        names: Names,
        config: &FluxConfig,
    ) -> Result<Self, FamilyError> {
        let scales_required = index.tensors.iter().any(|tensor| {
            tensor.name.ends_with(".scale_weight") || tensor.name.ends_with(".weight_scale")
        });
        let mut placer = Placer {
            names,
            builder: PlacementBuilder::new(index),
            scales_required,
            linears: Vec::new(),
        };
        let (hidden, mlp) = (config.hidden(), config.mlp);
        placer.builder.block("head");
        let head = HeadWeights {
            img_in: placer.linear("img_in", &[hidden], config.in_channels)?,
            txt_in: placer.linear("txt_in", &[hidden], config.context_dim)?,
            time_in: placer.embedder("time_in", 256, hidden)?,
            vector_in: placer.embedder("vector_in", config.pooled_dim, hidden)?,
            guidance_in: match config.guidance {
                true => Some(placer.embedder("guidance_in", 256, hidden)?),
                false => None,
            },
        };
        let double = (0..config.double_blocks)
            .map(|block| {
                let at = format!("double_blocks.{block}");
                placer.builder.block(at.clone());
                Ok(DoubleWeights {
                    img: placer.stream(&at, "img", config)?,
                    txt: placer.stream(&at, "txt", config)?,
                })
            })
            .collect::<Result<_, FamilyError>>()?;
        let single = (0..config.single_blocks)
            .map(|block| {
                let at = format!("single_blocks.{block}");
                placer.builder.block(at.clone());
                Ok(SingleWeights {
                    modulation: placer.linear(
                        &format!("{at}.modulation.lin"),
                        &[3 * hidden],
                        hidden,
                    )?,
                    linear1: placer.linear(
                        &format!("{at}.linear1"),
                        &[hidden, hidden, hidden, mlp],
                        hidden,
                    )?,
                    q_norm: placer.norm(&format!("{at}.norm.query_norm.scale"), config.head_dim)?,
                    k_norm: placer.norm(&format!("{at}.norm.key_norm.scale"), config.head_dim)?,
                    linear2: placer.linear(&format!("{at}.linear2"), &[hidden], hidden + mlp)?,
                })
            })
            .collect::<Result<_, FamilyError>>()?;
        placer.builder.block("final_layer");
        let last = FinalWeights {
            modulation: placer.linear("final_layer.adaLN_modulation.1", &[2 * hidden], hidden)?,
            scale_first: names.scale_first(),
            linear: placer.linear("final_layer.linear", &[config.in_channels], hidden)?,
        };
        Ok(Self {
            placement: placer.builder.finish(),
            linears: placer.linears,
            head,
            double,
            single,
            last,
        })
    }
}

struct Placer<'i> {
    names: Names,
    builder: PlacementBuilder<'i>,
    scales_required: bool,
    linears: Vec<LinearName>,
}

impl Placer<'_> {
    /// The original linear `stem` with output rows `parts` (the pieces diffusers
    /// splits it into; one piece of their sum in the fused layouts) and `input` columns.
    fn linear(&mut self, stem: &str, parts: &[usize], input: usize) -> Result<Linear, FamilyError> {
        let stems = self.names.pieces(stem);
        let rows: Vec<usize> = if stems.len() == 1 {
            vec![parts.iter().sum()]
        } else {
            parts.to_vec()
        };
        let mut first = 0;
        let mut pieces = Vec::with_capacity(stems.len());
        for (stem, rows) in stems.iter().zip(rows) {
            let weight = self.builder.add_weight(
                &format!("{stem}.weight"),
                &[rows, input],
                self.scales_required,
            )?;
            let bias = self.builder.add(&format!("{stem}.bias"), &[rows])?;
            pieces.push(Piece {
                first,
                rows,
                weight,
                bias,
            });
            first += rows;
        }
        self.linears.push(LinearName {
            stem: stem.to_string(),
            parts: parts.to_vec(),
        });
        Ok(Linear { pieces })
    }

    fn norm(&mut self, name: &str, width: usize) -> Result<usize, FamilyError> {
        self.builder.add(&self.names.full(name), &[width])
    }

    fn embedder(
        &mut self,
        stem: &str,
        input: usize,
        hidden: usize,
    ) -> Result<Embedder, FamilyError> {
        Ok(Embedder {
            in_layer: self.linear(&format!("{stem}.in_layer"), &[hidden], input)?,
            out_layer: self.linear(&format!("{stem}.out_layer"), &[hidden], hidden)?,
        })
    }

    fn stream(
        &mut self,
        at: &str,
        stream: &str,
        config: &FluxConfig,
    ) -> Result<StreamWeights, FamilyError> {
        let (hidden, mlp) = (config.hidden(), config.mlp);
        let attn = format!("{at}.{stream}_attn");
        Ok(StreamWeights {
            modulation: self.linear(&format!("{at}.{stream}_mod.lin"), &[6 * hidden], hidden)?,
            qkv: self.linear(&format!("{attn}.qkv"), &[hidden, hidden, hidden], hidden)?,
            q_norm: self.norm(&format!("{attn}.norm.query_norm.scale"), config.head_dim)?,
            k_norm: self.norm(&format!("{attn}.norm.key_norm.scale"), config.head_dim)?,
            proj: self.linear(&format!("{attn}.proj"), &[hidden], hidden)?,
            mlp_in: self.linear(&format!("{at}.{stream}_mlp.0"), &[mlp], hidden)?,
            mlp_out: self.linear(&format!("{at}.{stream}_mlp.2"), &[hidden], mlp)?,
        })
    }
}

//! Where a Llama-family decoder's weights are, by Hugging Face name, checked against
//! `config.json` and placed as blocks: one per layer (attention, norms, and the dense
//! MLP or the router), then the head (final norm and `lm_head`, or the tied embedding
//! table). A Mixtral expert (`w1`, `w2`, `w3`) is a block of its own outside the step
//! order, acquired as the router picks it.

use crate::compute::TensorSlot;
use crate::families::placement::{Placement, PlacementBuilder};
use crate::families::FamilyError;
use crate::model::ModelIndex;

use super::config::DecoderConfig;

#[derive(Debug, Clone, Copy)]
pub struct Projection {
    pub weight: TensorSlot,
    pub bias: Option<TensorSlot>,
}

#[derive(Debug, Clone, Copy)]
pub struct Mlp {
    pub gate: TensorSlot,
    pub up: TensorSlot,
    pub down: TensorSlot,
}

#[derive(Debug, Clone)]
pub struct LayerSlots {
    pub input_norm: TensorSlot,
    pub q: Projection,
    pub k: Projection,
    pub v: Projection,
    pub o: TensorSlot,
    pub post_norm: TensorSlot,
    /// The dense MLP, or (Mixtral) the router over the experts.
    pub mlp: Option<Mlp>,
    pub router: Option<TensorSlot>,
}

#[derive(Debug, Clone, Copy)]
pub struct HeadSlots {
    pub norm: TensorSlot,
    /// `lm_head`, or the embedding table when tied.
    pub lm_head: TensorSlot,
}

pub struct DecoderWeights {
    pub placement: Placement,
    pub layers: Vec<LayerSlots>,
    pub head: HeadSlots,
    /// Per layer, per expert: the expert's slots (in its own block).
    pub experts: Vec<Vec<Mlp>>,
    /// The embedding table's tensor in the index.
    pub embed_tensor: usize,
}

impl DecoderWeights {
    pub fn place(index: &ModelIndex, config: &DecoderConfig) -> Result<Self, FamilyError> {
        let (hidden, inner) = (config.hidden, config.intermediate);
        let scales_required = index.tensors.iter().any(|tensor| {
            tensor.name.ends_with(".weight_scale") || tensor.name.ends_with(".scale_weight")
        });
        let mut builder = PlacementBuilder::new(index);
        let mut layer_tensors = Vec::with_capacity(config.layers);
        for layer in 0..config.layers {
            let at = format!("model.layers.{layer}");
            builder.block(at.clone());
            let mut weight =
                |name: String, shape: &[usize]| builder.add_weight(&name, shape, scales_required);
            let input_norm = weight(format!("{at}.input_layernorm.weight"), &[hidden])?;
            let q = weight(
                format!("{at}.self_attn.q_proj.weight"),
                &[config.q_dim(), hidden],
            )?;
            let k = weight(
                format!("{at}.self_attn.k_proj.weight"),
                &[config.kv_dim(), hidden],
            )?;
            let v = weight(
                format!("{at}.self_attn.v_proj.weight"),
                &[config.kv_dim(), hidden],
            )?;
            let o = weight(
                format!("{at}.self_attn.o_proj.weight"),
                &[hidden, config.q_dim()],
            )?;
            let post_norm = weight(format!("{at}.post_attention_layernorm.weight"), &[hidden])?;
            let biases = if config.qkv_bias {
                Some([
                    weight(format!("{at}.self_attn.q_proj.bias"), &[config.q_dim()])?,
                    weight(format!("{at}.self_attn.k_proj.bias"), &[config.kv_dim()])?,
                    weight(format!("{at}.self_attn.v_proj.bias"), &[config.kv_dim()])?,
                ])
            } else {
                None
            };
            let (mlp, router) = match config.experts {
                None => (
                    Some([
                        weight(format!("{at}.mlp.gate_proj.weight"), &[inner, hidden])?,
                        weight(format!("{at}.mlp.up_proj.weight"), &[inner, hidden])?,
                        weight(format!("{at}.mlp.down_proj.weight"), &[hidden, inner])?,
                    ]),
                    None,
                ),
                Some(experts) => (
                    None,
                    Some(weight(
                        format!("{at}.block_sparse_moe.gate.weight"),
                        &[experts.count, hidden],
                    )?),
                ),
            };
            layer_tensors.push((input_norm, q, k, v, o, post_norm, biases, mlp, router));
        }
        builder.block("lm_head");
        let norm = builder.add_weight("model.norm.weight", &[hidden], scales_required)?;
        let head_name = if config.tie_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        let lm_head = builder.add_weight(head_name, &[config.vocab, hidden], scales_required)?;
        let mut expert_tensors = Vec::new();
        if let Some(experts) = config.experts {
            for layer in 0..config.layers {
                let mut per_layer = Vec::with_capacity(experts.count);
                for expert in 0..experts.count {
                    let at = format!("model.layers.{layer}.block_sparse_moe.experts.{expert}");
                    builder.block(at.clone());
                    per_layer.push([
                        builder.add_weight(
                            &format!("{at}.w1.weight"),
                            &[inner, hidden],
                            scales_required,
                        )?,
                        builder.add_weight(
                            &format!("{at}.w3.weight"),
                            &[inner, hidden],
                            scales_required,
                        )?,
                        builder.add_weight(
                            &format!("{at}.w2.weight"),
                            &[hidden, inner],
                            scales_required,
                        )?,
                    ]);
                }
                expert_tensors.push(per_layer);
            }
        }
        let embed_tensor = index
            .tensors
            .iter()
            .position(|tensor| tensor.name == "model.embed_tokens.weight")
            .ok_or_else(|| {
                FamilyError::Model(format!(
                    "{}: tensor `model.embed_tokens.weight` is missing (expected shape [{}, {hidden}])",
                    index.path.display(),
                    config.vocab
                ))
            })?;
        let embed = &index.tensors[embed_tensor];
        if embed.shape != [config.vocab, hidden] {
            return Err(FamilyError::Model(format!(
                "{}: tensor `model.embed_tokens.weight` has shape {:?}, but config.json implies [{}, {hidden}]",
                index.path.display(),
                embed.shape,
                config.vocab
            )));
        }
        let placement = builder.finish();
        let slot = |tensor: usize| {
            placement
                .slot_of(tensor)
                .map(|(_, slot)| slot)
                .ok_or_else(|| FamilyError::Model(format!("tensor {tensor} was not placed")))
        };
        let mlp = |[gate, up, down]: [usize; 3]| -> Result<Mlp, FamilyError> {
            Ok(Mlp {
                gate: slot(gate)?,
                up: slot(up)?,
                down: slot(down)?,
            })
        };
        let mut layers = Vec::with_capacity(config.layers);
        for (input_norm, q, k, v, o, post_norm, biases, dense, router) in layer_tensors {
            let bias = |index: usize| biases.map(|biases| slot(biases[index])).transpose();
            layers.push(LayerSlots {
                input_norm: slot(input_norm)?,
                q: Projection {
                    weight: slot(q)?,
                    bias: bias(0)?,
                },
                k: Projection {
                    weight: slot(k)?,
                    bias: bias(1)?,
                },
                v: Projection {
                    weight: slot(v)?,
                    bias: bias(2)?,
                },
                o: slot(o)?,
                post_norm: slot(post_norm)?,
                mlp: dense.map(mlp).transpose()?,
                router: router.map(slot).transpose()?,
            });
        }
        let experts = expert_tensors
            .into_iter()
            .map(|per_layer| {
                per_layer
                    .into_iter()
                    .map(mlp)
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            head: HeadSlots {
                norm: slot(norm)?,
                lm_head: slot(lm_head)?,
            },
            placement,
            layers,
            experts,
            embed_tensor,
        })
    }

    /// The head block: after the layers.
    pub fn head_block(&self) -> u32 {
        self.layers.len() as u32
    }

    /// The block of expert `expert` of layer `layer`.
    pub fn expert_block(&self, layer: usize, expert: usize) -> u32 {
        let per_layer = self.experts.first().map_or(0, Vec::len);
        (self.layers.len() + 1 + layer * per_layer + expert) as u32
    }
}

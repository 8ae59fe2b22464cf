//! Where a Llama-family decoder's weights are, by Hugging Face name, checked against
//! `config.json` and placed as blocks: one per layer (attention, norms, and the dense
//! MLP, or the router and a shared expert), then the head (final norm and `lm_head`,
//! or the tied embedding table). An expert (Mixtral's `w1`, `w3`, `w2`; Qwen's
//! `gate_proj`, `up_proj`, `down_proj`) is a block of its own outside the step order,
//! acquired as the router picks it.
//!
//! The slots are first gathered as tensor numbers of the index (`*<usize>`), then
//! resolved to their place in the finished blocks.

use crate::compute::TensorSlot;
use crate::families::placement::{Placement, PlacementBuilder};
use crate::families::FamilyError;
use crate::model::ModelIndex;

use super::config::{DecoderConfig, ExpertNames};

#[derive(Debug, Clone, Copy)]
pub struct Projection<T = TensorSlot> {
    pub weight: T,
    pub bias: Option<T>,
}

#[derive(Debug, Clone, Copy)]
pub struct Mlp<T = TensorSlot> {
    pub gate: Projection<T>,
    pub up: Projection<T>,
    pub down: Projection<T>,
}

#[derive(Debug, Clone)]
pub struct LayerSlots<T = TensorSlot> {
    pub input_norm: T,
    pub q: Projection<T>,
    pub k: Projection<T>,
    pub v: Projection<T>,
    pub o: Projection<T>,
    /// Qwen3: RMSNorm of each head of q and of k, before the rotation.
    pub q_norm: Option<T>,
    pub k_norm: Option<T>,
    pub post_norm: T,
    pub ffn: Ffn<T>,
}

/// A layer's feed-forward part.
#[derive(Debug, Clone)]
pub enum Ffn<T = TensorSlot> {
    Dense(Mlp<T>),
    /// The router over the layer's experts (in blocks of their own), and Qwen2-MoE's
    /// shared expert with its sigmoid gate (in the layer's block).
    Experts {
        router: T,
        shared: Option<(Mlp<T>, T)>,
    },
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
    /// Per layer, per expert: the expert's slots (in its own block); empty for a
    /// dense layer.
    pub experts: Vec<Vec<Mlp>>,
    /// Per layer: the block of its first expert.
    expert_first_block: Vec<Option<u32>>,
    /// The embedding table's tensor in the index.
    pub embed_tensor: usize,
}

/// Adds weights to a placement, every FP8 weight with its scale when any has one.
struct Adder<'b, 'i> {
    builder: &'b mut PlacementBuilder<'i>,
    scales_required: bool,
}

impl Adder<'_, '_> {
    fn weight(&mut self, name: &str, shape: &[usize]) -> Result<usize, FamilyError> {
        self.builder.add_weight(name, shape, self.scales_required)
    }

    /// `<at>.weight` `[rows, cols]`, and `<at>.bias` `[rows]` when `bias`.
    fn projection(
        &mut self,
        at: &str,
        rows: usize,
        cols: usize,
        bias: bool,
    ) -> Result<Projection<usize>, FamilyError> {
        Ok(Projection {
            weight: self.weight(&format!("{at}.weight"), &[rows, cols])?,
            bias: match bias {
                true => Some(self.weight(&format!("{at}.bias"), &[rows])?),
                false => None,
            },
        })
    }

    /// A SwiGLU MLP of width `inner` under `at` with the given projection names.
    fn mlp(
        &mut self,
        at: &str,
        [gate, up, down]: [&str; 3],
        hidden: usize,
        inner: usize,
        bias: bool,
    ) -> Result<Mlp<usize>, FamilyError> {
        Ok(Mlp {
            gate: self.projection(&format!("{at}.{gate}"), inner, hidden, bias)?,
            up: self.projection(&format!("{at}.{up}"), inner, hidden, bias)?,
            down: self.projection(&format!("{at}.{down}"), hidden, inner, bias)?,
        })
    }
}

const QWEN_MLP: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];
const MIXTRAL_EXPERT: [&str; 3] = ["w1", "w3", "w2"];

impl DecoderWeights {
    pub fn place(index: &ModelIndex, config: &DecoderConfig) -> Result<Self, FamilyError> {
        refuse_block_scales(index)?;
        check_heads(index, config)?;
        let scales_required = index.tensors.iter().any(|tensor| {
            tensor.name.ends_with(".weight_scale") || tensor.name.ends_with(".scale_weight")
        });
        let mut builder = PlacementBuilder::new(index);
        let mut adder = Adder {
            builder: &mut builder,
            scales_required,
        };
        let layers = (0..config.layers)
            .map(|layer| place_layer(&mut adder, config, layer))
            .collect::<Result<Vec<_>, _>>()?;
        adder.builder.block("lm_head");
        let norm = adder.weight("model.norm.weight", &[config.hidden])?;
        let head_name = match config.tie_embeddings {
            true => "model.embed_tokens.weight",
            false => "lm_head.weight",
        };
        let lm_head = adder.weight(head_name, &[config.vocab, config.hidden])?;
        let (experts, expert_first_block) = place_experts(&mut adder, config)?;
        let embed_tensor = embedding(index, config)?;
        let placement = builder.finish();
        let slots = Slots(&placement);
        Ok(Self {
            head: HeadSlots {
                norm: slots.get(norm)?,
                lm_head: slots.get(lm_head)?,
            },
            layers: layers
                .into_iter()
                .map(|layer| layer.resolve(&slots))
                .collect::<Result<_, _>>()?,
            experts: experts
                .into_iter()
                .map(|per_layer| {
                    per_layer
                        .into_iter()
                        .map(|mlp| mlp.resolve(&slots))
                        .collect()
                })
                .collect::<Result<_, _>>()?,
            expert_first_block,
            embed_tensor,
            placement,
        })
    }

    /// The head block: after the layers.
    pub fn head_block(&self) -> u32 {
        self.layers.len() as u32
    }

    /// The block of expert `expert` of layer `layer` (an MoE layer).
    pub fn expert_block(&self, layer: usize, expert: usize) -> Option<u32> {
        let first = self.expert_first_block.get(layer).copied().flatten()?;
        Some(first + expert as u32)
    }
}

/// Layer `layer`'s block: attention, norms, and its dense MLP or router.
fn place_layer(
    adder: &mut Adder<'_, '_>,
    config: &DecoderConfig,
    layer: usize,
) -> Result<LayerSlots<usize>, FamilyError> {
    let (hidden, head_dim) = (config.hidden, config.head_dim);
    let at = format!("model.layers.{layer}");
    adder.builder.block(at.clone());
    let attention = format!("{at}.self_attn");
    let qkv_bias = config.biases.qkv;
    let norm = |adder: &mut Adder<'_, '_>, which: &str| match config.variant.has_qk_norm() {
        true => adder
            .weight(&format!("{attention}.{which}.weight"), &[head_dim])
            .map(Some),
        false => Ok(None),
    };
    let slots = LayerSlots {
        input_norm: adder.weight(&format!("{at}.input_layernorm.weight"), &[hidden])?,
        q: adder.projection(
            &format!("{attention}.q_proj"),
            config.q_dim(),
            hidden,
            qkv_bias,
        )?,
        k: adder.projection(
            &format!("{attention}.k_proj"),
            config.kv_dim(),
            hidden,
            qkv_bias,
        )?,
        v: adder.projection(
            &format!("{attention}.v_proj"),
            config.kv_dim(),
            hidden,
            qkv_bias,
        )?,
        o: adder.projection(
            &format!("{attention}.o_proj"),
            hidden,
            config.q_dim(),
            config.biases.o,
        )?,
        q_norm: norm(adder, "q_norm")?,
        k_norm: norm(adder, "k_norm")?,
        post_norm: adder.weight(&format!("{at}.post_attention_layernorm.weight"), &[hidden])?,
        ffn: place_ffn(adder, config, layer, &at)?,
    };
    Ok(slots)
}

fn place_ffn(
    adder: &mut Adder<'_, '_>,
    config: &DecoderConfig,
    layer: usize,
    at: &str,
) -> Result<Ffn<usize>, FamilyError> {
    let hidden = config.hidden;
    let experts = match &config.experts {
        Some(experts) if config.is_sparse(layer) => experts,
        _ => {
            let mlp = adder.mlp(
                &format!("{at}.mlp"),
                QWEN_MLP,
                hidden,
                config.intermediate,
                config.biases.mlp,
            )?;
            return Ok(Ffn::Dense(mlp));
        }
    };
    let router_at = match experts.names {
        ExpertNames::Mixtral => format!("{at}.block_sparse_moe.gate.weight"),
        ExpertNames::Qwen => format!("{at}.mlp.gate.weight"),
    };
    let router = adder.weight(&router_at, &[experts.count, hidden])?;
    let shared = match experts.shared_intermediate {
        Some(inner) => Some((
            adder.mlp(
                &format!("{at}.mlp.shared_expert"),
                QWEN_MLP,
                hidden,
                inner,
                false,
            )?,
            adder.weight(&format!("{at}.mlp.shared_expert_gate.weight"), &[1, hidden])?,
        )),
        None => None,
    };
    Ok(Ffn::Experts { router, shared })
}

type PlacedExperts = (Vec<Vec<Mlp<usize>>>, Vec<Option<u32>>);

/// One block per expert of every MoE layer, after the head.
fn place_experts(
    adder: &mut Adder<'_, '_>,
    config: &DecoderConfig,
) -> Result<PlacedExperts, FamilyError> {
    let mut experts = vec![Vec::new(); config.layers];
    let mut first_block = vec![None; config.layers];
    let Some(moe) = &config.experts else {
        return Ok((experts, first_block));
    };
    let mut next_block = config.layers as u32 + 1;
    for layer in moe.sparse_layers() {
        first_block[layer] = Some(next_block);
        for expert in 0..moe.count {
            let (at, names) = match moe.names {
                ExpertNames::Mixtral => (
                    format!("model.layers.{layer}.block_sparse_moe.experts.{expert}"),
                    MIXTRAL_EXPERT,
                ),
                ExpertNames::Qwen => (
                    format!("model.layers.{layer}.mlp.experts.{expert}"),
                    QWEN_MLP,
                ),
            };
            adder.builder.block(at.clone());
            experts[layer].push(adder.mlp(&at, names, config.hidden, moe.intermediate, false)?);
            next_block += 1;
        }
    }
    Ok((experts, first_block))
}

/// Block-wise FP8 (`weight_scale_inv` per tile, DeepSeek and Qwen3 FP8 checkpoints) is
/// not implemented: refused, not read as unscaled weights.
fn refuse_block_scales(index: &ModelIndex) -> Result<(), FamilyError> {
    match index
        .tensors
        .iter()
        .find(|tensor| tensor.name.ends_with(".weight_scale_inv"))
    {
        Some(tensor) => Err(FamilyError::unsupported(&index.path, "block-wise FP8", format!(
            "{}: tensor `{}` is a block-wise FP8 scale (`weight_scale_inv`); block-wise FP8 is not implemented (stagehand computes FP8 weights with one per-tensor `weight_scale`)",
            index.path.display(),
            tensor.name
        ))),
        None => Ok(()),
    }
}

/// `head_dim × num_attention_heads` against the first layer's `q_proj`, naming the keys.
fn check_heads(index: &ModelIndex, config: &DecoderConfig) -> Result<(), FamilyError> {
    let name = "model.layers.0.self_attn.q_proj.weight";
    let Some(q) = index.tensor(name) else {
        return Ok(()); // placing it names the missing tensor
    };
    if q.shape.first() == Some(&config.q_dim()) {
        return Ok(());
    }
    Err(FamilyError::tensor_shape(&index.path, name, (&[config.q_dim()], &q.shape[..1]), format!(
        "{}: `head_dim` {} × `num_attention_heads` {} = {} rows of `{name}`, but the weights have shape {:?}",
        index.path.display(),
        config.head_dim,
        config.heads,
        config.q_dim(),
        q.shape
    )))
}

/// The embedding table's tensor, checked against `config.json`.
fn embedding(index: &ModelIndex, config: &DecoderConfig) -> Result<usize, FamilyError> {
    let name = "model.embed_tokens.weight";
    let expected = [config.vocab, config.hidden];
    let position = index
        .tensors
        .iter()
        .position(|tensor| tensor.name == name)
        .ok_or_else(|| {
            FamilyError::missing_tensor(
                &index.path,
                name,
                format!(
                    "{}: tensor `{name}` is missing (expected shape {expected:?})",
                    index.path.display(),
                ),
            )
        })?;
    let shape = &index.tensors[position].shape;
    if shape[..] != expected {
        return Err(FamilyError::tensor_shape(
            &index.path,
            name,
            (&expected, shape),
            format!(
                "{}: tensor `{name}` has shape {shape:?}, but config.json implies {expected:?}",
                index.path.display(),
            ),
        ));
    }
    Ok(position)
}

/// Tensor numbers → their slots in the finished placement.
struct Slots<'p>(&'p Placement);

impl Slots<'_> {
    fn get(&self, tensor: usize) -> Result<TensorSlot, FamilyError> {
        self.0
            .slot_of(tensor)
            .map(|(_, slot)| slot)
            .ok_or_else(|| FamilyError::internal(format!("tensor {tensor} was not placed")))
    }
}

impl Projection<usize> {
    fn resolve(self, slots: &Slots<'_>) -> Result<Projection, FamilyError> {
        Ok(Projection {
            weight: slots.get(self.weight)?,
            bias: self.bias.map(|bias| slots.get(bias)).transpose()?,
        })
    }
}

impl Mlp<usize> {
    fn resolve(self, slots: &Slots<'_>) -> Result<Mlp, FamilyError> {
        Ok(Mlp {
            gate: self.gate.resolve(slots)?,
            up: self.up.resolve(slots)?,
            down: self.down.resolve(slots)?,
        })
    }
}

impl LayerSlots<usize> {
    fn resolve(self, slots: &Slots<'_>) -> Result<LayerSlots, FamilyError> {
        let optional = |tensor: Option<usize>| tensor.map(|tensor| slots.get(tensor)).transpose();
        Ok(LayerSlots {
            input_norm: slots.get(self.input_norm)?,
            q: self.q.resolve(slots)?,
            k: self.k.resolve(slots)?,
            v: self.v.resolve(slots)?,
            o: self.o.resolve(slots)?,
            q_norm: optional(self.q_norm)?,
            k_norm: optional(self.k_norm)?,
            post_norm: slots.get(self.post_norm)?,
            ffn: match self.ffn {
                Ffn::Dense(mlp) => Ffn::Dense(mlp.resolve(slots)?),
                Ffn::Experts { router, shared } => Ffn::Experts {
                    router: slots.get(router)?,
                    shared: match shared {
                        Some((mlp, gate)) => Some((mlp.resolve(slots)?, slots.get(gate)?)),
                        None => None,
                    },
                },
            },
        })
    }
}

//! The sparse MLP of Mixtral, Qwen2-MoE and Qwen3-MoE: the router's softmax top-k
//! picks experts per token; each picked expert is a block of its own, acquired in
//! router order through the session's expert cache; outputs are mixed by the top-k
//! routing weights (renormalised to sum to one in Mixtral, and in Qwen when
//! `norm_topk_prob`).
//!
//! Speculative expert prefetch: while layer l's experts compute, the next MoE layer's
//! router is applied (on the host, from its own copy of the routers) to the current
//! hidden state — close to what that layer will see — and the experts it picks are
//! hinted to the allocator, so their loads overlap compute. An oracle mode hints the
//! routing a previous run of the same tokens recorded, to measure how good the guess
//! is.

use stagehand_actors::BlockId;

use super::config::{DecoderConfig, ExpertNames};
use super::layer::SwigluIo;
use super::{unallocated, Decoder, DecoderState};
use crate::compute::{Compute, DType};
use crate::families::blocks::Blocks;
use crate::families::family::StepOutput;
use crate::families::FamilyError;
use crate::model::{BlockReader, ModelIndex};

/// What the decoder hints to the allocator about the next layer's experts.
#[derive(Debug, Clone, PartialEq)]
pub enum ExpertHint {
    None,
    /// Layer l+1's router applied to the hidden state at layer l.
    NextLayer,
    /// The true routing, recorded by an earlier run of the same tokens:
    /// `[step][MoE layer]` → experts.
    Oracle(Vec<Vec<Vec<u32>>>),
}

/// The routing of one token: softmax over all experts, the top `top_k` (ties to the
/// lower expert), their weights renormalised to sum to one when `renormalise`.
pub fn route(logits: &[f32], top_k: usize, renormalise: bool) -> Vec<(u32, f32)> {
    let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exponentials: Vec<f32> = logits.iter().map(|logit| (logit - top).exp()).collect();
    let total: f32 = exponentials.iter().sum();
    let mut ranked: Vec<(u32, f32)> = exponentials
        .iter()
        .enumerate()
        .map(|(expert, value)| (expert as u32, value / total))
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.truncate(top_k);
    if renormalise {
        let kept: f32 = ranked.iter().map(|(_, weight)| weight).sum();
        ranked.iter_mut().for_each(|(_, weight)| *weight /= kept);
    }
    ranked
}

/// A layer's post-attention norm weight and router, widened to f32 on the host.
pub(super) type HostRouter = (Vec<f32>, Vec<f32>);

/// Each MoE layer's post-attention norm weight and router, widened to f32, for hints
/// (`None` for a dense layer); `headers_only`: zeros of their shapes, for a model
/// described and not run.
pub(super) fn host_routers(
    index: &ModelIndex,
    config: &DecoderConfig,
    headers_only: bool,
) -> Result<Vec<Option<HostRouter>>, FamilyError> {
    let Some(experts) = &config.experts else {
        return Ok(Vec::new());
    };
    let reader = (!headers_only)
        .then(|| BlockReader::open(index))
        .transpose()?;
    let read = |name: String| -> Result<Vec<f32>, FamilyError> {
        let tensor = index.tensor(&name).ok_or_else(|| {
            FamilyError::missing_tensor(
                &index.path,
                &name,
                format!("{}: tensor `{name}` is missing", index.path.display()),
            )
        })?;
        let Some(reader) = &reader else {
            let elements: usize = tensor.shape.iter().product();
            return Ok(vec![0.0; elements]);
        };
        let dtype = DType::float_from_safetensors(&tensor.dtype).ok_or_else(|| {
            FamilyError::tensor_dtype(
                &index.path,
                &name,
                &tensor.dtype,
                format!("{name}: {} is not a float tensor", tensor.dtype),
            )
        })?;
        let extent = stagehand_actors::Extent {
            file: stagehand_actors::FileId(tensor.file as u32),
            offset: tensor.offset,
            length: tensor.bytes,
        };
        let mut bytes = vec![0u8; tensor.bytes as usize];
        reader.read_once(&[extent], &mut bytes)?;
        Ok(dtype.decode(&bytes))
    };
    (0..config.layers)
        .map(|layer| {
            if !config.is_sparse(layer) {
                return Ok(None);
            }
            let router = match experts.names {
                ExpertNames::Mixtral => {
                    format!("model.layers.{layer}.block_sparse_moe.gate.weight")
                }
                ExpertNames::Qwen => format!("model.layers.{layer}.mlp.gate.weight"),
            };
            Ok(Some((
                read(format!(
                    "model.layers.{layer}.post_attention_layernorm.weight"
                ))?,
                read(router)?,
            )))
        })
        .collect()
}

impl Decoder {
    /// Layer `layer`'s experts on the normalised hidden state, mixed into the residual.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut DecoderState<C>,
        blocks: &mut B,
        layer: usize,
        router_logits: &[f32],
        step: u64,
        output: &mut StepOutput,
    ) -> Result<(), FamilyError> {
        let Some(experts) = &self.config.experts else {
            return Err(FamilyError::internal("a dense model has no experts".into()));
        };
        let routes: Vec<Vec<(u32, f32)>> = router_logits
            .chunks_exact(experts.count)
            .map(|row| route(row, experts.top_k, experts.renormalise))
            .collect();
        let mut used: Vec<u32> = Vec::new();
        for &(expert, _) in routes.iter().flatten() {
            if !used.contains(&expert) {
                used.push(expert);
            }
        }
        output.experts.routes.push(used.clone());
        // What the previous layer hinted for this one, before the hint for the next.
        let hinted = std::mem::take(&mut state.hinted);
        self.hint_next(compute, state, blocks, layer, step, output)?;
        let acts = state.acts.as_mut().ok_or_else(unallocated)?;
        let zeros = vec![0.0; state.rows * self.config.hidden];
        compute.write(&mut acts.mixed, &zeros)?;
        for expert in used {
            let block = self
                .weights
                .expert_block(layer, expert as usize)
                .map(BlockId)
                .ok_or_else(|| FamilyError::internal(format!("layer {layer} has no experts")))?;
            let held = blocks.acquire(compute, block)?;
            output
                .experts
                .count(held.was_ready(), hinted.contains(&block));
            let scales: Vec<f32> = routes
                .iter()
                .map(|row| {
                    row.iter()
                        .find(|(picked, _)| *picked == expert)
                        .map_or(0.0, |(_, weight)| *weight)
                })
                .collect();
            let mlp = &self.weights.experts[layer][expert as usize];
            let lora = blocks.lora();
            let outcome = (|| {
                let io = SwigluIo {
                    x: &acts.normed,
                    scratch: &mut acts.expert,
                    out: &mut acts.out,
                    low_rank: &mut acts.low_rank,
                };
                Self::swiglu(compute, &held, lora, mlp, io)?;
                compute.add_scaled_rows(&mut acts.mixed, &acts.out, &scales)?;
                Ok::<_, FamilyError>(())
            })();
            blocks.release(compute, held)?;
            outcome?;
        }
        compute.add(&mut acts.x, &acts.mixed)?;
        Ok(())
    }

    /// The MoE layer after `layer` (the next token's first MoE layer after the last):
    /// its step, its layer, and its place among the MoE layers (for oracle routes).
    fn next_moe_layer(&self, layer: usize, step: u64) -> Option<(u64, usize, usize)> {
        let sparse: Vec<usize> = self.config.experts.as_ref()?.sparse_layers().collect();
        let later = sparse.iter().position(|&moe| moe > layer);
        match later {
            Some(ordinal) => Some((step, sparse[ordinal], ordinal)),
            None => sparse.first().map(|&first| (step + 1, first, 0)),
        }
    }

    /// The experts `router` (with its layer's norm `norm`) picks for the rows of
    /// `hidden`, on the host.
    fn host_route(&self, hidden: &[f32], (norm, router): &HostRouter) -> Vec<u32> {
        let Some(experts) = &self.config.experts else {
            return Vec::new();
        };
        let mut picked = Vec::new();
        for row in hidden.chunks_exact(self.config.hidden) {
            let mean_square = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
            let scale = 1.0 / (mean_square + self.config.rms_eps).sqrt();
            let logits: Vec<f32> = router
                .chunks_exact(self.config.hidden)
                .map(|weights| {
                    row.iter()
                        .zip(norm)
                        .zip(weights)
                        .map(|((value, gamma), weight)| value * scale * gamma * weight)
                        .sum()
                })
                .collect();
            for (expert, _) in route(&logits, experts.top_k, experts.renormalise) {
                if !picked.contains(&expert) {
                    picked.push(expert);
                }
            }
        }
        picked
    }

    /// Hints the experts the next MoE layer (or the next token's first) will likely
    /// use, per the hint mode.
    fn hint_next<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut DecoderState<C>,
        blocks: &mut B,
        layer: usize,
        step: u64,
        output: &mut StepOutput,
    ) -> Result<(), FamilyError> {
        let Some((next_step, next_layer, ordinal)) = self.next_moe_layer(layer, step) else {
            return Ok(());
        };
        let picked: Vec<u32> = match &self.hint {
            ExpertHint::None => return Ok(()),
            ExpertHint::Oracle(routes) => routes
                .get(next_step as usize)
                .and_then(|layers| layers.get(ordinal))
                .cloned()
                .unwrap_or_default(),
            ExpertHint::NextLayer => {
                let acts = state.acts.as_ref().ok_or_else(unallocated)?;
                let hidden = compute.read(&acts.x)?;
                match self.host_routers.get(next_layer).and_then(Option::as_ref) {
                    Some(router) => self.host_route(&hidden, router),
                    None => Vec::new(),
                }
            }
        };
        let hinted: Vec<BlockId> = picked
            .iter()
            .filter_map(|&expert| self.weights.expert_block(next_layer, expert as usize))
            .map(BlockId)
            .collect();
        output.experts.hints += hinted.len() as u64;
        blocks.hint(&hinted);
        state.hinted = hinted;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_is_softmax_top_k_renormalised() {
        // Proves the top-k are the largest logits, ties go to the lower expert, and the
        // kept weights sum to one in their softmax proportions.
        let routes = route(&[1.0, 3.0, 2.0, 3.0], 2, true);
        assert_eq!(
            routes.iter().map(|(e, _)| *e).collect::<Vec<_>>(),
            vec![1, 3]
        );
        assert!((routes[0].1 - 0.5).abs() < 1e-6 && (routes[1].1 - 0.5).abs() < 1e-6);
        let routes = route(&[0.0, 2f32.ln()], 2, true);
        assert!((routes[0].1 - 2.0 / 3.0).abs() < 1e-6, "{routes:?}");
    }

    #[test]
    fn qwen_routing_keeps_the_softmax_weights_unless_norm_topk_prob() {
        // Proves norm_topk_prob false keeps each top-k weight its share of all experts.
        let routes = route(&[0.0, 0.0, 0.0, 0.0], 2, false);
        assert!(routes
            .iter()
            .all(|(_, weight)| (weight - 0.25).abs() < 1e-6));
    }
}

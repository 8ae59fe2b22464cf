//! The MoE workload: one step is one token through every layer. Each layer runs its
//! dense linear, its router picks `top_k` experts (drawn from the seeded skewed
//! routing; the router's logits weigh them), and the picked experts — acquired on
//! their own, outside the step order — are mixed. Written once against the compute
//! port; every token's output must equal the fully-resident reference bit for bit.

use stagehand_actors::{BlockId, ExpertPolicy, ModelLayout};

mod layout;

use crate::compute::{Compute, DType, TensorSlot};
use crate::families::blocks::Blocks;
use crate::families::family::{ExpertNeeds, Facts, Family, StepOutput};
use crate::families::inputs::WorkloadKind;
use crate::families::linear_stack::input_batch;
use crate::families::registry::{DemoWriter, Found, Open, Request, StepUnit};
use crate::families::FamilyError;
use crate::model::demo_moe::MoeSpec;

pub use layout::MoeLayout;

const RMS_EPSILON: f32 = 1e-6;

/// Whether the compute thread tells the allocator which experts come next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum HintMode {
    /// No speculative expert loads.
    None,
    /// The next layer's routing, known early (its gate applied ahead of time).
    NextLayer,
}

pub struct MoeRun {
    pub model: MoeLayout,
    pub batch: usize,
    pub hint: HintMode,
    pub policy: ExpertPolicy,
    /// Expert cache slots; `None`: what the budget leaves.
    pub slots: Option<u32>,
    input: Vec<f32>,
    zeros: Vec<f32>,
}

pub struct MoeState<C: Compute> {
    x: C::Tensor,
    y: C::Tensor,
    mixed: C::Tensor,
    logits: C::Tensor,
}

impl MoeRun {
    pub fn new(model: MoeLayout, batch: usize, hint: HintMode) -> Result<Self, FamilyError> {
        if batch == 0 {
            return Err(FamilyError::request(
                "batch",
                "batch must be at least 1".into(),
            ));
        }
        let count = batch.checked_mul(model.spec.dim as usize).ok_or_else(|| {
            FamilyError::request(
                "batch",
                format!("batch {batch} is too large; lower --batch"),
            )
        })?;
        Ok(Self {
            input: input_batch(model.spec.seed, count),
            zeros: vec![0.0; count],
            model,
            batch,
            hint,
            policy: ExpertPolicy::default(),
            slots: None,
        })
    }

    fn dim(&self) -> usize {
        self.model.spec.dim as usize
    }

    fn square(&self, offset: u64) -> TensorSlot {
        TensorSlot {
            offset,
            dtype: DType::F32,
            rows: self.dim(),
            cols: self.dim(),
            scale: None,
            groups: None,
        }
    }

    /// Per row, a softmax of the router logits over the picked experts.
    fn gates(&self, logits: &[f32], experts: &[u32]) -> Vec<Vec<f32>> {
        let all = self.model.spec.experts as usize;
        let mut gates = vec![vec![0.0; self.batch]; experts.len()];
        for (row, logits) in logits.chunks_exact(all).enumerate() {
            let picked: Vec<f32> = experts.iter().map(|&e| logits[e as usize]).collect();
            let top = picked.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let weights: Vec<f32> = picked.iter().map(|value| (value - top).exp()).collect();
            let total: f32 = weights.iter().sum();
            for (slot, weight) in weights.iter().enumerate() {
                gates[slot][row] = weight / total;
            }
        }
        gates
    }

    /// The dense linear and rmsnorm of `layer`, then the router's logits.
    fn dense<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut MoeState<C>,
        blocks: &mut B,
        layer: u32,
    ) -> Result<Vec<f32>, FamilyError> {
        let held = blocks.acquire(compute, self.model.dense_block(layer))?;
        let outcome = (|| {
            let view = held.view(compute);
            compute.linear(&state.x, &view.weight(&self.square(0))?, None, &mut state.y)?;
            compute.rms_norm(&state.y, None, RMS_EPSILON, &mut state.x)?;
            let router = TensorSlot {
                offset: self.model.router_offset,
                dtype: DType::F32,
                rows: self.model.spec.experts as usize,
                cols: self.dim(),
                scale: None,
                groups: None,
            };
            compute.linear(&state.x, &view.weight(&router)?, None, &mut state.logits)?;
            Ok::<_, FamilyError>(compute.read(&state.logits)?)
        })();
        blocks.release(compute, held)?;
        outcome
    }
}

impl Open for MoeRun {
    const NAME: &'static str = "moe";
    const KIND: WorkloadKind = WorkloadKind::Moe;
    const STEP: StepUnit = StepUnit::Batch;
    const DEMO: Option<DemoWriter> =
        Some(|cache_dir| crate::model::cache::ensure_moe_model(cache_dir, &MoeSpec::default()));

    fn recognises(found: &Found<'_>) -> bool {
        MoeSpec::from_metadata(&found.index.metadata).is_some()
    }

    fn activation_row_values(found: &Found<'_>) -> Option<u64> {
        MoeSpec::from_metadata(&found.index.metadata).map(|spec| u64::from(spec.dim))
    }

    fn open(request: &Request<'_>) -> Result<Self, FamilyError> {
        let spec = MoeSpec::from_metadata(&request.index.metadata).ok_or_else(|| {
            FamilyError::unsupported(request.path, "not a generated MoE model", format!(
                "{} is not a generated MoE model (no stagehand.kind = moe metadata); run `stagehand run --workload moe` without --model to use the demo one",
                request.path.display()
            ))
        })?;
        let layout = MoeLayout::new(request.index, spec)?;
        let mut run = MoeRun::new(layout, request.batch, request.extras.moe.hint)?;
        run.policy = request.extras.moe.policy;
        run.slots = request.extras.moe.slots;
        Ok(run)
    }
}

impl Facts for MoeRun {
    fn kind(&self) -> WorkloadKind {
        WorkloadKind::Moe
    }

    fn describe(&self) -> &'static str {
        "moe"
    }

    fn layout(&self) -> &ModelLayout {
        &self.model.layout
    }

    fn order(&self) -> Vec<BlockId> {
        self.model.order()
    }

    fn experts(&self) -> Option<ExpertNeeds> {
        let spec = self.model.spec;
        let dense_bytes = self.model.dense_bytes();
        Some(ExpertNeeds {
            dense_total_bytes: u64::from(spec.layers) * stagehand_actors::arena_bytes(dense_bytes),
            dense_block_bytes: dense_bytes,
            expert_bytes: spec.expert_bytes(),
            experts: u64::from(spec.layers * spec.experts),
            per_layer: u64::from(spec.experts),
            top_k: u64::from(spec.top_k),
            slots: self.slots,
            policy: self.policy,
        })
    }

    fn experts_of(&self, block: BlockId) -> Vec<BlockId> {
        let layer = block.0;
        if layer >= self.model.spec.layers {
            return Vec::new();
        }
        (0..self.model.spec.experts)
            .map(|expert| self.model.expert_block(layer, expert))
            .collect()
    }

    fn reference_key(&self, token: u64) -> u64 {
        token
    }

    fn reference_keeps_blocks(&self) -> bool {
        true
    }

    fn tokens_per_step(&self) -> u64 {
        self.batch as u64
    }
}

impl Family for MoeRun {
    type State<C: Compute> = MoeState<C>;

    fn start<C: Compute>(&self, compute: &C) -> Result<MoeState<C>, FamilyError> {
        let dim = self.dim();
        Ok(MoeState {
            x: compute.tensor(self.batch, dim)?,
            y: compute.tensor(self.batch, dim)?,
            mixed: compute.tensor(self.batch, dim)?,
            logits: compute.tensor(self.batch, self.model.spec.experts as usize)?,
        })
    }

    fn step<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut MoeState<C>,
        blocks: &mut B,
        token: u64,
    ) -> Result<StepOutput, FamilyError> {
        let spec = self.model.spec;
        let routing = spec.routing();
        let mut output = StepOutput::default();
        compute.write(&mut state.x, &self.input)?;
        let mut next = routing.route(token, 0);
        for layer in 0..spec.layers {
            let experts = next;
            next = if layer + 1 < spec.layers {
                routing.route(token, layer + 1)
            } else {
                routing.route(token + 1, 0)
            };
            let logits = self.dense(compute, state, blocks, layer)?;
            let gates = self.gates(&logits, &experts);
            if self.hint == HintMode::NextLayer {
                let next_layer = (layer + 1) % spec.layers;
                let hinted: Vec<BlockId> = next
                    .iter()
                    .map(|&expert| self.model.expert_block(next_layer, expert))
                    .collect();
                blocks.hint(&hinted);
                output.experts.hints += hinted.len() as u64;
            }
            compute.write(&mut state.mixed, &self.zeros)?;
            for (slot, &expert) in experts.iter().enumerate() {
                let held = blocks.acquire(compute, self.model.expert_block(layer, expert))?;
                // The previous layer (or the previous token's last) hinted these.
                let hinted = self.hint == HintMode::NextLayer && (layer > 0 || token > 0);
                output.experts.count(held.was_ready(), hinted);
                let outcome = (|| {
                    let view = held.view(compute);
                    compute.linear(&state.x, &view.weight(&self.square(0))?, None, &mut state.y)?;
                    compute.add_scaled_rows(&mut state.mixed, &state.y, &gates[slot])?;
                    Ok::<_, FamilyError>(())
                })();
                blocks.release(compute, held)?;
                outcome?;
            }
            compute.rms_norm(&state.mixed, None, RMS_EPSILON, &mut state.x)?;
        }
        output.output = Some(compute.read(&state.x)?);
        Ok(output)
    }
}

//! What every model family gives the rest of stagehand (DESIGN §6), in two traits:
//!
//! - [`Facts`]: what the run, the budget policy, the simulator, bench and validate
//!   ask about a model without running it — its blocks and their order, what it
//!   reserves beside the weights, its expert cache, where LoRA targets land. Object
//!   safe: [`super::Model::facts`] answers for any family.
//! - [`Family`]: the forward pass, one step written against the compute port and a
//!   block source. The run loop runs the same step over a session (the streamed run)
//!   and over blocks read straight from the files (the fully-resident reference), and
//!   compares the two; the simulator runs it over a recording compute to learn the
//!   kernels a step calls ([`crate::compute::record`]).
//!
//! How a folder is recognised and opened is [`super::registry::Open`].

use stagehand_actors::{BlockId, ExpertPolicy, ModelLayout};

use super::blocks::Blocks;
use super::inputs::WorkloadKind;
use super::kv_cache::KvCache;
use super::FamilyError;
use crate::compute::{Compute, TensorSlot};
use crate::model::ModelIndex;

/// What one step produced.
#[derive(Debug, Default, Clone)]
pub struct StepOutput {
    /// The values the step is checked on against the reference (`None`: the step
    /// checked itself, as stream-verify does against the file's checksums).
    pub output: Option<Vec<f32>>,
    /// Mixture-of-experts families: the step's expert acquires.
    pub experts: ExpertStep,
    /// Decoders: the token picked and the KV cache's growth.
    pub decoded: Option<Decoded>,
}

/// A step's expert acquires (MoE families).
#[derive(Debug, Default, Clone)]
pub struct ExpertStep {
    /// Acquires that found the expert ready, and those that waited.
    pub hits: u64,
    pub misses: u64,
    /// Of the waits, those for an expert a hint had already asked for: the hint was
    /// right, its load had not landed yet. Unlike hits, whose split with these depends
    /// on how fast the loads ran, hits + late depends only on the routing and the
    /// cache policy.
    pub late: u64,
    /// Experts hinted ahead.
    pub hints: u64,
    /// Per layer, the experts this step used, in router order (decoders).
    pub routes: Vec<Vec<u32>>,
}

impl ExpertStep {
    /// Counts one expert acquire: ready (a hit) or waited for, and then whether a hint
    /// had asked for it (late).
    pub fn count(&mut self, ready: bool, hinted: bool) {
        if ready {
            self.hits += 1;
        } else {
            self.misses += 1;
            self.late += u64::from(hinted);
        }
    }

    pub fn acquires(&self) -> u64 {
        self.hits + self.misses
    }
}

/// What a decoder step did beside its logits.
#[derive(Debug, Default, Clone)]
pub struct Decoded {
    /// The token this step picked.
    pub token: u32,
    /// Bytes of KV cache after this step, bytes reserved for it in this step, and the
    /// resident blocks that gave way to that reservation.
    pub kv_bytes: u64,
    pub kv_reserved_bytes: u64,
    pub kv_evicted: Vec<BlockId>,
}

/// What an expert cache is sized from: the dense blocks every token uses, and the
/// experts the router picks from.
#[derive(Debug, Clone, Copy)]
pub struct ExpertNeeds {
    /// The dense blocks of the step order: their total footprint in the arena and
    /// their largest size.
    pub dense_total_bytes: u64,
    pub dense_block_bytes: u64,
    /// One expert's bytes (every expert has the same shape).
    pub expert_bytes: u64,
    /// Experts of the whole model, and of one layer; a token uses `top_k` a layer.
    pub experts: u64,
    pub per_layer: u64,
    pub top_k: u64,
    /// Expert cache slots asked for (`None`: what the budget leaves).
    pub slots: Option<u32>,
    pub policy: ExpertPolicy,
}

/// What the run and the tools ask about a model, whatever its family.
pub trait Facts {
    /// The kind of work this is (what `--workload` names and bench measures a step of).
    fn kind(&self) -> WorkloadKind;

    /// A short name of what runs, for summaries: "llama decoder", "bert encoder".
    fn describe(&self) -> &'static str;

    /// The blocks the session streams (which may leave out tensors the forward pass
    /// does not use, or keeps on the host).
    fn layout(&self) -> &ModelLayout;

    /// The step order over the layout's blocks.
    fn order(&self) -> Vec<BlockId> {
        (0..self.layout().len() as u32).map(BlockId).collect()
    }

    /// A decoder's KV cache: reserved beside the weights as the sequence grows.
    fn kv_cache(&self) -> Option<KvCache> {
        None
    }

    /// Why a run of `steps` steps cannot compute this model correctly (a decoder's
    /// sequence would outgrow its positions or the sliding window it does not
    /// implement); `None` when it can. The run refuses such a run before it starts.
    fn refuse_steps(&self, steps: u64) -> Option<String> {
        let _ = steps;
        None
    }

    /// Device memory a run of `steps` steps reserves beside the weights: the KV
    /// cache of its prompt and tokens, in whole pages.
    fn activation_bytes(&self, steps: u64) -> u64 {
        self.kv_cache()
            .map_or(0, |kv| kv.reserved_bytes(kv.prompt_tokens + steps))
    }

    /// A step's activation tensors, reserved and per kind of block, for a family that
    /// computes them from its shapes (Flux).
    fn activations(&self) -> Option<super::Activations> {
        None
    }

    /// Model bytes kept in host memory outside the tiers (an embedding table whose
    /// rows alone go to the device).
    fn host_table_bytes(&self) -> u64 {
        0
    }

    /// A mixture-of-experts model: what its expert cache is sized from.
    fn experts(&self) -> Option<ExpertNeeds> {
        None
    }

    /// The expert blocks that belong to block `block` of the order (its layer's
    /// experts, acquired while the layer is held).
    fn experts_of(&self, block: BlockId) -> Vec<BlockId> {
        let _ = block;
        Vec::new()
    }

    /// Whether LoRA adapters apply to this family (its dense weights are computed).
    fn takes_lora(&self) -> bool {
        false
    }

    /// Where tensor `tensor` of the checkpoint sits in this family's blocks (block
    /// index and slot), for LoRA targets; `None`: the family does not compute it.
    fn place(&self, index: &ModelIndex, tensor: usize) -> Option<(usize, TensorSlot)> {
        let _ = (index, tensor);
        None
    }

    /// Modules of another layout of this model's weights an adapter may name (Flux's
    /// diffusers pieces of an original checkpoint's fused weights, or the reverse),
    /// tried after the checkpoint's own tensor names.
    fn lora_aliases(&self) -> Vec<crate::lora::LoraAlias> {
        Vec::new()
    }

    /// Inputs the family had to cut short (texts longer than the model takes), by
    /// position.
    fn truncated_inputs(&self) -> &[usize] {
        &[]
    }

    /// The input position of each output in the order the steps produce them, when a
    /// family reorders its inputs (an encoder batches texts by length); empty: input
    /// order.
    fn output_order(&self) -> &[usize] {
        &[]
    }

    /// Steps with the same key compute the same output, so the reference is computed
    /// once per key.
    fn reference_key(&self, step: u64) -> u64 {
        let _ = step;
        0
    }

    /// Whether the reference must replay the steps in order with one state (a
    /// decoder's KV cache carries from token to token); otherwise each distinct
    /// [`Facts::reference_key`] is computed once from a fresh state.
    fn reference_is_sequential(&self) -> bool {
        false
    }

    /// Whether the reference keeps every block it read loaded (a family that uses
    /// blocks out of order and many times a step, such as MoE experts).
    fn reference_keeps_blocks(&self) -> bool {
        false
    }

    /// Tokens one step pushes through every block, for rates and descriptions.
    fn tokens_per_step(&self) -> u64 {
        1
    }
}

/// A model family's forward pass.
pub trait Family: Facts {
    /// Activations and scratch, allocated once per run on the compute device.
    type State<C: Compute>;

    fn start<C: Compute>(&self, compute: &C) -> Result<Self::State<C>, FamilyError>;

    /// Runs step `step` over `blocks`.
    fn step<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut Self::State<C>,
        blocks: &mut B,
        step: u64,
    ) -> Result<StepOutput, FamilyError>;
}

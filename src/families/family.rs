//! What every model family gives the run loop: one step written against the compute
//! port and a block source (DESIGN §6). The loop runs the same step over a session
//! (the streamed run) and over blocks read straight from the files (the
//! fully-resident reference), and compares the two.

use stagehand_actors::{BlockId, ModelLayout};

use super::blocks::Blocks;
use super::FamilyError;
use crate::compute::Compute;

/// What one step produced.
#[derive(Debug, Default, Clone)]
pub struct StepOutput {
    /// The values the step is checked on against the reference (`None`: the step
    /// checked itself, as stream-verify does against the file's checksums).
    pub output: Option<Vec<f32>>,
    /// MoE: expert acquires that found the expert ready, those that waited, and the
    /// experts hinted ahead.
    pub expert_hits: u64,
    pub expert_misses: u64,
    /// Of the waits, those for an expert a hint had already asked for: the hint was
    /// right, its load had not landed yet. Unlike hits, whose split with these depends
    /// on how fast the loads ran, hits + late depends only on the routing and the
    /// cache policy.
    pub expert_late: u64,
    pub expert_hints: u64,
    /// Decoders: the token this step picked.
    pub token: Option<u32>,
    /// MoE decoders: per layer, the experts this step used, in router order.
    pub routes: Vec<Vec<u32>>,
    /// Decoders: bytes of KV cache after this step, bytes reserved for it in this step,
    /// and the resident blocks that gave way to that reservation.
    pub kv_bytes: u64,
    pub kv_reserved_bytes: u64,
    pub kv_evicted: Vec<stagehand_actors::BlockId>,
}

impl StepOutput {
    /// Counts one expert acquire: ready (a hit) or waited for, and then whether a hint
    /// had asked for it (late).
    pub fn count_expert(&mut self, ready: bool, hinted: bool) {
        if ready {
            self.expert_hits += 1;
        } else {
            self.expert_misses += 1;
            self.expert_late += u64::from(hinted);
        }
    }
}

/// A model family's forward pass.
pub trait Family {
    /// Activations and scratch, allocated once per run on the compute device.
    type State<C: Compute>;

    /// The blocks the session streams (which may leave out tensors the forward pass
    /// does not use, or keeps on the host).
    fn layout(&self) -> &ModelLayout;

    /// The step order over the layout's blocks.
    fn order(&self) -> Vec<BlockId> {
        (0..self.layout().len() as u32).map(BlockId).collect()
    }

    fn start<C: Compute>(&self, compute: &C) -> Result<Self::State<C>, FamilyError>;

    /// Runs step `step` over `blocks`.
    fn step<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut Self::State<C>,
        blocks: &mut B,
        step: u64,
    ) -> Result<StepOutput, FamilyError>;

    /// Steps with the same key compute the same output, so the reference is computed
    /// once per key.
    fn reference_key(&self, step: u64) -> u64 {
        let _ = step;
        0
    }

    /// Whether the reference must replay the steps in order with one state (a
    /// decoder's KV cache carries from token to token); otherwise each distinct
    /// [`Family::reference_key`] is computed once from a fresh state.
    fn reference_is_sequential(&self) -> bool {
        false
    }

    /// Whether the reference keeps every block it read loaded (a family that uses
    /// blocks out of order and many times a step, such as MoE experts).
    fn reference_keeps_blocks(&self) -> bool {
        false
    }
}

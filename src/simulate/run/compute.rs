//! The compute side of a simulated run: a task on the actors' own thread that
//! acquires each block, spends the block's modelled compute time on the simulated
//! compute stream, and releases it, recording where it is and what each step moved.

use std::cell::Cell;
use std::time::Duration;

use stagehand_actors::{BlockId, LocalSession};

use crate::families::KvCache;
use crate::sim::{HardwareProfile, SimMachine};
use crate::simulate::model::ModelDescription;
use crate::simulate::reuse::ReuseLedger;
use crate::simulate::steady::LinkBytes;

/// Where the compute side is, for stall reports.
#[derive(Default)]
pub(super) struct Progress {
    pub step: Cell<u64>,
    pub position: Cell<usize>,
}

/// What the compute side records as it goes.
pub(super) struct Record {
    /// The exact time and the link counters at the start and at each step's end.
    pub boundaries: Vec<(Duration, LinkBytes)>,
    pub reuse: ReuseLedger,
}

/// What the compute side runs: the blocks in step order, their names and compute
/// times, the KV cache's growth, and how many steps.
pub(super) struct ComputeSide<'a> {
    pub machine: &'a SimMachine,
    pub order: &'a [BlockId],
    pub names: &'a [String],
    /// Each block's compute times and weight bytes: for the first step, for the rest.
    pub block_durations: [Vec<BlockCost>; 2],
    /// The run's compute threads (what a block asks of a shared bus's cores).
    pub compute_threads: u64,
    pub kv_cache: Option<KvCache>,
    /// A family's activation tensors, reserved before the first block of the first
    /// step (as the Flux family reserves them).
    pub activation_bytes: u64,
    pub steps: u64,
    pub progress: Progress,
}

impl ComputeSide<'_> {
    /// Every block in order, every step. Records the exact time and the link counters
    /// at each step's end, and which uses needed no copy. An error is the failing
    /// acquire's message.
    pub(super) async fn drive(
        &self,
        session: &mut LocalSession,
        record: &mut Record,
    ) -> Result<(), String> {
        let (machine, progress) = (self.machine, &self.progress);
        for step in 0..self.steps {
            // A signal stops a long simulation between steps, like a real run.
            crate::signals::check().map_err(|interrupted| interrupted.to_string())?;
            progress.step.set(step);
            // The decoder grows its KV cache before the step's first block; resident
            // weights give way when the budget is full, as in the real session.
            if step == 0 && self.activation_bytes > 0 {
                session
                    .reserve_activations(self.activation_bytes)
                    .await
                    .map_err(|error| format!("the activations do not fit: {error}"))?;
            }
            let growth = self.kv_cache.map_or(0, |kv| kv.growth_bytes(step));
            if growth > 0 {
                session
                    .reserve_activations(growth)
                    .await
                    .map_err(|error| format!("the KV cache does not fit: {error}"))?;
            }
            let block_durations = &self.block_durations[usize::from(step > 0)];
            for (position, &block) in self.order.iter().enumerate() {
                progress.position.set(position);
                let handle = session
                    .acquire(block)
                    .await
                    .map_err(|error| error.to_string())?;
                let index = block.index();
                record.reuse.used(step, block);
                let cost = block_durations[index];
                // A streamed block was just copied in with non-temporal stores: its
                // weights come from memory. A resident one's, from the caches as far
                // as they hold it.
                let duration = if handle.streamed {
                    cost.streamed
                } else {
                    cost.resident
                };
                let weight_bytes = cost.weight_bytes;
                machine
                    .compute
                    .compute_on(
                        self.names[index].clone(),
                        duration,
                        weight_bytes,
                        self.compute_threads,
                    )
                    .await;
                session.release(handle).await;
            }
            session.step_done().await;
            record
                .boundaries
                .push((machine.clock.now(), LinkBytes::of(&session.stats())));
        }
        Ok(())
    }

    /// The block the compute side is at, for stall and failure reports.
    pub(super) fn block_now(&self) -> String {
        self.names
            .get(self.order[self.progress.position.get() % self.order.len()].index())
            .cloned()
            .unwrap_or_default()
    }
}

/// A block's compute time, resident and streamed, and its weight bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct BlockCost {
    pub resident: Duration,
    /// With its weights read from memory: copied in just before.
    pub streamed: Duration,
    pub weight_bytes: u64,
}

/// Each block's compute time in the first and in a later step, resident and
/// streamed, its measured kernel costs divided by `speedup` (what the run's compute
/// threads gain over the threads the costs were timed on: [`crate::sim::ThreadScaling`]).
pub(super) fn block_durations(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    machine: &SimMachine,
    speedup: f64,
) -> [Vec<BlockCost>; 2] {
    let block_durations = |first_step: bool| -> Vec<BlockCost> {
        model
            .blocks
            .iter()
            .map(|block| {
                let work = match (&block.first_step_work, first_step) {
                    (Some(first), true) => Some(first),
                    _ => block.work.as_ref(),
                };
                let flops = model.block_step_flops(block);
                let speedup = speedup.max(1e-9);
                let compute = &machine.compute;
                BlockCost {
                    resident: compute
                        .block_time(flops, block.bytes, work)
                        .div_f64(speedup),
                    streamed: compute
                        .cold_block_time(flops, block.bytes, work)
                        .div_f64(speedup),
                    weight_bytes: block.bytes,
                }
            })
            .collect()
    };
    let mut block_durations = [block_durations(true), block_durations(false)];
    // The first step's compute faults in the cast buffer (the CPU backend's widened
    // weights) on a profile that charges first touches.
    if let (Some(gb_per_s), Some(first)) = (
        hardware.first_touch_gb_per_s,
        block_durations[0].first_mut(),
    ) {
        let cast_bytes = model
            .blocks
            .iter()
            .filter_map(|block| block.work.as_ref())
            .map(crate::compute::work::Work::cast_buffer_bytes)
            .max()
            .unwrap_or(0);
        let fault = crate::sim::FirstTouch::new(gb_per_s).duration(cast_bytes);
        first.resident += fault;
        first.streamed += fault;
    }
    block_durations
}

//! The MoE workload: one step is one token through every layer. Each layer runs its
//! dense linear, its router picks `top_k` experts (drawn from the seeded skewed
//! routing; the router's logits weigh them), and the picked experts — acquired on
//! their own, outside the step order — are mixed. The output of every token must equal
//! the fully-resident reference bit for bit.

use std::time::Instant;

use stagehand_actors::{BlockHandle, Session, StatsSnapshot};

use super::driver::{close_step, DriverOptions, RunReport};
use super::linear_stack::{first_difference, gemm, input_batch, rms_norm};
use super::moe_model::MoeLayout;
use super::WorkloadError;
use crate::device::cpu::block_bytes;
use crate::model::ModelIndex;

/// Whether the compute thread tells the allocator which experts come next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
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
    pub policy: stagehand_actors::ExpertPolicy,
    /// Expert cache slots; `None`: what the budget leaves.
    pub slots: Option<u32>,
    /// Every unit's bytes read from the file: the fully-resident reference's weights.
    resident: Vec<Vec<f32>>,
}

struct Scratch {
    x: Vec<f32>,
    y: Vec<f32>,
    mixed: Vec<f32>,
    gates: Vec<f32>,
}

impl MoeRun {
    pub fn new(
        index: &ModelIndex,
        model: MoeLayout,
        batch: usize,
        hint: HintMode,
    ) -> Result<Self, WorkloadError> {
        if batch == 0 {
            return Err(WorkloadError::Model("batch must be at least 1".into()));
        }
        let reader = crate::model::BlockReader::open(index)?;
        let mut resident = Vec::with_capacity(model.layout.blocks.len());
        for block in &model.layout.blocks {
            let mut bytes = vec![0u8; block.bytes as usize];
            reader.read_extents(&block.extents, &mut bytes)?;
            resident.push(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            );
        }
        Ok(Self {
            model,
            batch,
            hint,
            policy: stagehand_actors::ExpertPolicy::default(),
            slots: None,
            resident,
        })
    }

    fn scratch(&self) -> Scratch {
        let dim = self.model.spec.dim as usize;
        let count = self.batch * dim;
        Scratch {
            x: input_batch(self.model.spec.seed, count),
            y: vec![0.0; count],
            mixed: vec![0.0; count],
            gates: vec![0.0; self.batch * self.model.spec.top_k as usize],
        }
    }

    /// The dense part of a layer, then the router's gate weights for `experts`:
    /// per row, a softmax of the router logits over the picked experts.
    fn dense(&self, dense: &[f32], experts: &[u32], scratch: &mut Scratch) {
        let dim = self.model.spec.dim as usize;
        let Scratch { x, y, gates, .. } = scratch;
        gemm(&dense[..dim * dim], dim, self.batch, x, y);
        rms_norm(dim, y, x);
        let router = &dense[dim * dim..];
        let k = experts.len();
        for (row, x_row) in x.chunks_exact(dim).enumerate() {
            let gates = &mut gates[row * k..(row + 1) * k];
            for (gate, &expert) in gates.iter_mut().zip(experts) {
                let weights = &router[expert as usize * dim..(expert as usize + 1) * dim];
                *gate = x_row.iter().zip(weights).map(|(a, b)| a * b).sum();
            }
            let top = gates.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut total = 0.0;
            for gate in gates.iter_mut() {
                *gate = (*gate - top).exp();
                total += *gate;
            }
            gates.iter_mut().for_each(|gate| *gate /= total);
        }
        scratch.mixed.iter_mut().for_each(|value| *value = 0.0);
    }

    /// Adds the `slot`-th picked expert's output, weighted by its gate.
    fn expert(&self, weights: &[f32], slot: usize, k: usize, scratch: &mut Scratch) {
        let dim = self.model.spec.dim as usize;
        let Scratch { x, y, mixed, gates } = scratch;
        gemm(weights, dim, self.batch, x, y);
        for (row, (out, values)) in mixed
            .chunks_exact_mut(dim)
            .zip(y.chunks_exact(dim))
            .enumerate()
        {
            let gate = gates[row * k + slot];
            out.iter_mut()
                .zip(values)
                .for_each(|(out, value)| *out += gate * value);
        }
    }

    fn finish_layer(&self, scratch: &mut Scratch) {
        let dim = self.model.spec.dim as usize;
        rms_norm(dim, &scratch.mixed, &mut scratch.x);
    }

    /// One token through every layer with every weight resident.
    pub fn reference(&self, token: u64) -> Vec<f32> {
        let spec = self.model.spec;
        let routing = spec.routing();
        let mut scratch = self.scratch();
        for layer in 0..spec.layers {
            let experts = routing.route(token, layer);
            self.dense(&self.resident[layer as usize], &experts, &mut scratch);
            for (slot, &expert) in experts.iter().enumerate() {
                let unit = self.model.expert_block(layer, expert).index();
                self.expert(&self.resident[unit], slot, experts.len(), &mut scratch);
            }
            self.finish_layer(&mut scratch);
        }
        scratch.x
    }
}

fn floats(handle: &BlockHandle) -> Result<&[f32], WorkloadError> {
    // SAFETY: the caller holds the handle until it is done with the slice, so the
    // allocator can neither evict nor overwrite the range.
    let bytes = unsafe { block_bytes(handle.ptr, handle.bytes) };
    // SAFETY: every bit pattern is a valid f32; we insist the slice is aligned.
    let (prefix, values, suffix) = unsafe { bytes.align_to::<f32>() };
    if !prefix.is_empty() || !suffix.is_empty() {
        return Err(WorkloadError::Model(format!(
            "{}: weights are not 4-byte aligned in memory",
            handle.block
        )));
    }
    Ok(values)
}

/// Runs tokens over the session; each token's output is checked against the
/// fully-resident reference. The session is shut down on any failure.
pub fn drive(
    mut session: Session,
    run: &MoeRun,
    mut options: DriverOptions,
) -> Result<RunReport, Box<(WorkloadError, StatsSnapshot)>> {
    let mut report = RunReport::new(session.plan().clone());
    let mut token = 0u64;
    while options.steps == 0 || token < options.steps {
        if options.stop.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        let started = Instant::now();
        let outcome = token_step(&mut session, run, token, &mut report);
        let compute_seconds = match outcome {
            Ok(seconds) => seconds,
            // Stopped inside a token: the tokens before it stand.
            Err(WorkloadError::Session(stagehand_actors::SessionError::Interrupted)) => break,
            Err(error) => {
                let stats = session.finish();
                return Err(Box::new((error, stats)));
            }
        };
        close_step(
            &mut session,
            &mut report,
            token,
            started,
            compute_seconds,
            &mut options.on_step,
        );
        token += 1;
    }
    report.steps = token;
    report.stats = session.finish();
    Ok(report)
}

fn token_step(
    session: &mut Session,
    run: &MoeRun,
    token: u64,
    report: &mut RunReport,
) -> Result<f64, WorkloadError> {
    let spec = run.model.spec;
    let routing = spec.routing();
    let mut scratch = run.scratch();
    let mut compute_seconds = 0.0;
    let mut next = routing.route(token, 0);
    for layer in 0..spec.layers {
        let experts = next;
        next = if layer + 1 < spec.layers {
            routing.route(token, layer + 1)
        } else {
            routing.route(token + 1, 0)
        };
        let dense = session.acquire(run.model.dense_block(layer))?;
        let started = Instant::now();
        let result = floats(&dense).map(|weights| run.dense(weights, &experts, &mut scratch));
        compute_seconds += started.elapsed().as_secs_f64();
        session.release(dense);
        result?;
        if run.hint == HintMode::NextLayer {
            let next_layer = (layer + 1) % spec.layers;
            let blocks: Vec<_> = next
                .iter()
                .map(|&expert| run.model.expert_block(next_layer, expert))
                .collect();
            session.hint(&blocks);
            report.expert_hints += blocks.len() as u64;
        }
        for (slot, &expert) in experts.iter().enumerate() {
            let block = run.model.expert_block(layer, expert);
            let handle = match session.try_acquire(block) {
                Some(handle) => {
                    report.expert_hits += 1;
                    handle
                }
                None => {
                    report.expert_misses += 1;
                    session.acquire(block)?
                }
            };
            let started = Instant::now();
            let result = floats(&handle)
                .map(|weights| run.expert(weights, slot, experts.len(), &mut scratch));
            compute_seconds += started.elapsed().as_secs_f64();
            session.release(handle);
            result?;
        }
        run.finish_layer(&mut scratch);
    }
    let expected = run.reference(token);
    if let Some((index, got, expected)) = first_difference(&scratch.x, &expected) {
        return Err(WorkloadError::Mismatch {
            step: token,
            index,
            got,
            expected,
        });
    }
    Ok(compute_seconds)
}

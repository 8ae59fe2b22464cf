//! The fully-resident reference a run is checked against: the same family's steps,
//! on the same device, over blocks read straight from the files (with the step's LoRA
//! phase merged in) — so "streamed = resident, bit for bit" compares the same kernels
//! in the same order.
//!
//! Keyed families (an encoder's batches, the linear stack) compute each distinct
//! step once. Sequential families (a decoder's tokens, whose KV cache carries from
//! step to step) replay the steps in order with one state of their own.

use std::collections::{HashMap, VecDeque};

use super::driver::Workload;
use crate::compute::Compute;
use crate::families::blocks::FromFiles;
use crate::families::family::Family;
use crate::families::FamilyError;
use crate::model::BlockReader;

/// Reference outputs a run keeps: every input of an encoder run of up to this many
/// batches stays computed once.
pub const REFERENCES_KEPT: usize = 256;

pub(super) struct Reference<'a, C: Compute, F: Family> {
    family: &'a F,
    workload: &'a Workload,
    files: &'a BlockReader<'a>,
    /// The block source of the current LoRA phase.
    source: Option<(Option<usize>, FromFiles<'a, C>)>,
    /// Keyed families: outputs by (reference key, LoRA phase), at most
    /// [`REFERENCES_KEPT`], the oldest dropped first — a family whose every step has
    /// its own key (MoE: one per token) would otherwise grow without end in a run of
    /// `--steps 0` (the soak found 60 KiB a token).
    outputs: HashMap<(u64, Option<usize>), Vec<f32>>,
    /// Keys in `outputs`, oldest first.
    kept: VecDeque<(u64, Option<usize>)>,
    /// Sequential families: the state carried from step to step, and the next step.
    sequential: Option<(F::State<C>, u64)>,
    /// The output of the last sequential step.
    last: Vec<f32>,
}

impl<'a, C: Compute, F: Family> Reference<'a, C, F> {
    pub(super) fn new(family: &'a F, workload: &'a Workload, files: &'a BlockReader<'a>) -> Self {
        Self {
            family,
            workload,
            files,
            source: None,
            outputs: HashMap::new(),
            kept: VecDeque::new(),
            sequential: None,
            last: Vec::new(),
        }
    }

    /// The files the reference reads its blocks from.
    pub(super) fn files(&self) -> &'a BlockReader<'a> {
        self.files
    }

    fn source(&mut self, step: u64) -> &mut FromFiles<'a, C> {
        let phase = self.workload.phase_at(step);
        let reusable = matches!(&self.source, Some((kept, _)) if *kept == phase);
        if !reusable {
            let lora = phase.map(|phase| &self.workload.lora[phase].set);
            let source = FromFiles::new(
                self.files,
                self.family.layout(),
                lora,
                self.family.reference_keeps_blocks(),
            );
            self.source = Some((phase, source));
        }
        match &mut self.source {
            Some((_, source)) => source,
            None => unreachable!("the source was set just above"),
        }
    }

    /// The reference output of step `step`. A sequential family's steps must be asked
    /// for in order.
    pub(super) fn expected(&mut self, compute: &C, step: u64) -> Result<&[f32], FamilyError> {
        let family = self.family;
        if family.reference_is_sequential() {
            let next = self.sequential.as_ref().map_or(0, |(_, next)| *next);
            if step != next {
                return Err(FamilyError::internal(format!(
                    "the reference replays steps in order: asked for step {step}, next is {next}"
                )));
            }
            if self.sequential.is_none() {
                self.sequential = Some((family.start(compute)?, 0));
            }
            let mut state = match self.sequential.take() {
                Some((state, _)) => state,
                None => unreachable!("the state was set just above"),
            };
            let output = family.step(compute, &mut state, self.source(step), step);
            self.sequential = Some((state, step + 1));
            self.last = output?.output.unwrap_or_default();
            return Ok(&self.last);
        }
        let key = (family.reference_key(step), self.workload.phase_at(step));
        if !self.outputs.contains_key(&key) {
            let mut state = family.start(compute)?;
            let output = family.step(compute, &mut state, self.source(step), step)?;
            if self.kept.len() == REFERENCES_KEPT {
                if let Some(oldest) = self.kept.pop_front() {
                    self.outputs.remove(&oldest);
                }
            }
            self.outputs.insert(key, output.output.unwrap_or_default());
            self.kept.push_back(key);
        }
        Ok(&self.outputs[&key])
    }

    /// Keyed reference outputs kept now (at most [`REFERENCES_KEPT`]).
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.outputs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::demo_moe::{write_moe_model, MoeSpec};
    use crate::run::driver::Model;
    use crate::run::{prepare, WorkloadKind};

    #[test]
    fn a_run_of_many_tokens_keeps_a_bounded_number_of_references() {
        // Proves a MoE run's references, one key per token, stay at REFERENCES_KEPT
        // however many tokens are checked (they grew by 64 KiB a token without end).
        let dir = tempfile::tempdir().expect("temp dir");
        let spec = MoeSpec {
            layers: 2,
            experts: 4,
            top_k: 2,
            dim: 16,
            skew: 1.1,
            drift_tokens: 8,
            seed: 3,
        };
        let model = write_moe_model(dir.path(), &spec).expect("model");
        let settings = crate::settings::Settings::default();
        let prepared = prepare(&model, WorkloadKind::Moe, 2, &settings, true).expect("prepares");
        let Model::Moe(run) = &prepared.workload.model else {
            panic!("a MoE model");
        };
        let files = BlockReader::open(&prepared.index).expect("files");
        let mut reference = Reference::new(&**run, &prepared.workload, &files);
        let compute = crate::device::CpuCompute::new();
        for token in 0..REFERENCES_KEPT as u64 + 100 {
            reference.expected(&compute, token).expect("reference");
            assert!(reference.kept() <= REFERENCES_KEPT, "token {token}");
        }
        assert_eq!(reference.kept(), REFERENCES_KEPT);
    }
}

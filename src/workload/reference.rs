//! The fully-resident reference a run is checked against: the same family's steps,
//! on the same device, over blocks read straight from the files (with the step's LoRA
//! phase merged in) — so "streamed = resident, bit for bit" compares the same kernels
//! in the same order.
//!
//! Keyed families (an encoder's batches, the linear stack) compute each distinct
//! step once. Sequential families (a decoder's tokens, whose KV cache carries from
//! step to step) replay the steps in order with one state of their own.

use std::collections::HashMap;

use super::blocks::FromFiles;
use super::driver::Workload;
use super::family::Family;
use super::WorkloadError;
use crate::compute::Compute;
use crate::model::BlockReader;

pub(super) struct Reference<'a, C: Compute, F: Family> {
    family: &'a F,
    workload: &'a Workload,
    files: &'a BlockReader<'a>,
    /// The block source of the current LoRA phase.
    source: Option<(Option<usize>, FromFiles<'a, C>)>,
    /// Keyed families: outputs by (reference key, LoRA phase).
    outputs: HashMap<(u64, Option<usize>), Vec<f32>>,
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
            sequential: None,
            last: Vec::new(),
        }
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
    pub(super) fn expected(&mut self, compute: &C, step: u64) -> Result<&[f32], WorkloadError> {
        let family = self.family;
        if family.reference_is_sequential() {
            let next = self.sequential.as_ref().map_or(0, |(_, next)| *next);
            if step != next {
                return Err(WorkloadError::Model(format!(
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
            self.outputs.insert(key, output.output.unwrap_or_default());
        }
        Ok(&self.outputs[&key])
    }
}

//! A family's kernels, learned by running its own steps over the recording compute
//! ([`crate::compute::record::Recorder`]) with blocks that hold no bytes: what the
//! simulator describes a family from.
//!
//! Each kernel is put on the block of the step order held most recently when it was
//! called (an expert's kernels on its layer's block; the embedding of the next token
//! on the head that picked it); kernels before a step's first block go on that block.

use stagehand_actors::BlockId;

use super::blocks::{Blocks, Held};
use super::family::Family;
use super::lora_set::LoraSet;
use super::registry::{Model, Visit};
use super::FamilyError;
use crate::compute::record::{RecordedBlock, Recorder};
use crate::compute::work::Work;

/// The kernels of steps `0..steps` of `family`, per step and per block of its
/// layout (blocks outside the step order stay empty).
pub fn record_steps<F: Family>(family: &F, steps: u64) -> Result<Vec<Vec<Work>>, FamilyError> {
    let recorder = Recorder::new();
    let mut state = family.start(&recorder)?;
    let layout = family.layout();
    let order = family.order();
    let mut recorded = Vec::new();
    for step in 0..steps {
        let mut blocks = Recording {
            recorder: &recorder,
            bytes: layout.blocks.iter().map(|block| block.bytes).collect(),
            in_order: (0..layout.len())
                .map(|block| order.contains(&BlockId(block as u32)))
                .collect(),
            works: vec![Work::default(); layout.len()],
            current: None,
            pending: Work::default(),
            mark: recorder.len(),
        };
        family.step(&recorder, &mut state, &mut blocks, step)?;
        recorded.push(blocks.finish());
    }
    Ok(recorded)
}

/// [`record_steps`] of whichever family `model` holds.
pub fn record_model(model: &Model, steps: u64) -> Result<Vec<Vec<Work>>, FamilyError> {
    struct Record(u64);
    impl Visit for Record {
        type Output = Result<Vec<Vec<Work>>, FamilyError>;
        fn visit<F: Family>(self, family: &F) -> Self::Output {
            record_steps(family, self.0)
        }
    }
    model.visit(Record(steps))
}

/// The block source of a recorded step: blocks of the layout's lengths, no bytes.
struct Recording<'r> {
    recorder: &'r Recorder,
    bytes: Vec<u64>,
    in_order: Vec<bool>,
    works: Vec<Work>,
    /// The order block kernels go on now; `None` before the step's first.
    current: Option<usize>,
    /// Kernels before the step's first block.
    pending: Work,
    /// Kernels of the recorder already put on a block.
    mark: usize,
}

impl Recording<'_> {
    /// Puts the kernels recorded since the last call on the current block.
    fn settle(&mut self) {
        let kernels = self.recorder.since(self.mark);
        self.mark = self.recorder.len();
        match self.current {
            Some(block) => self.works[block].kernels.extend(kernels),
            None => self.pending.kernels.extend(kernels),
        }
    }

    fn finish(mut self) -> Vec<Work> {
        self.settle();
        self.works
    }
}

impl Blocks<Recorder> for Recording<'_> {
    fn acquire(
        &mut self,
        _compute: &Recorder,
        block: BlockId,
    ) -> Result<Held<RecordedBlock>, FamilyError> {
        let index = block.index();
        let Some(&bytes) = self.bytes.get(index) else {
            return Err(FamilyError::internal(format!(
                "block {index} is outside the layout's {} blocks",
                self.bytes.len()
            )));
        };
        self.settle();
        if self.in_order[index] {
            if self.current.is_none() {
                let pending = std::mem::take(&mut self.pending);
                self.works[index].kernels.extend(pending.kernels);
            }
            self.current = Some(index);
        }
        Ok(Held::of_loaded(block, RecordedBlock { bytes }))
    }

    fn release(
        &mut self,
        _compute: &Recorder,
        _held: Held<RecordedBlock>,
    ) -> Result<(), FamilyError> {
        Ok(())
    }

    fn lora(&self) -> Option<&LoraSet> {
        None
    }
}

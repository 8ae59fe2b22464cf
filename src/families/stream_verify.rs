//! stream-verify: any safetensors checkpoint. Every block crosses the tiers and its
//! bytes, as they sit in the device, are checksummed on the device against the
//! file's. Nothing is computed on the weights: this checks bytes only.

use stagehand_actors::{BlockId, ModelLayout};

use super::blocks::Blocks;
use super::family::{Facts, Family, StepOutput};
use super::inputs::WorkloadKind;
use super::registry::{Found, Open, Request, StepUnit};
use super::FamilyError;
use crate::compute::checksum::checksum;
use crate::compute::Compute;
use crate::model::ModelIndex;

pub struct StreamVerify {
    layout: ModelLayout,
    names: Vec<String>,
    /// Each block's checksum, from plain reads of the files.
    checksums: Vec<u64>,
}

impl StreamVerify {
    pub fn new(index: &ModelIndex) -> Result<Self, FamilyError> {
        let reader = crate::model::BlockReader::open(index)?;
        let checksums = (0..index.blocks.len())
            .map(|block| Ok(checksum(&reader.read(block)?)))
            .collect::<Result<_, FamilyError>>()?;
        Ok(Self {
            layout: index.layout(),
            names: index
                .blocks
                .iter()
                .map(|block| block.name.clone())
                .collect(),
            checksums,
        })
    }
}

impl Open for StreamVerify {
    const NAME: &'static str = "stream-verify";
    const KIND: WorkloadKind = WorkloadKind::StreamVerify;
    const STEP: StepUnit = StepUnit::Check;

    /// A bare checkpoint (no `config.json` beside it): its bytes are what can be checked.
    fn recognises(found: &Found<'_>) -> bool {
        found.folder.is_none()
    }

    fn open(request: &Request<'_>) -> Result<Self, FamilyError> {
        Self::new(request.index)
    }
}

impl Facts for StreamVerify {
    fn kind(&self) -> WorkloadKind {
        WorkloadKind::StreamVerify
    }

    fn describe(&self) -> &'static str {
        "stream-verify"
    }

    fn layout(&self) -> &ModelLayout {
        &self.layout
    }
}

impl Family for StreamVerify {
    type State<C: Compute> = ();

    fn start<C: Compute>(&self, _compute: &C) -> Result<(), FamilyError> {
        Ok(())
    }

    fn step<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        _state: &mut (),
        blocks: &mut B,
        _step: u64,
    ) -> Result<StepOutput, FamilyError> {
        for (block, expected) in self.checksums.iter().enumerate() {
            let held = blocks.acquire(compute, BlockId(block as u32))?;
            let outcome = compute.checksum(&held.view(compute));
            blocks.release(compute, held)?;
            if outcome? != *expected {
                return Err(FamilyError::Corrupt {
                    block: self.names[block].clone(),
                    offset: 0,
                });
            }
        }
        Ok(StepOutput::default())
    }
}

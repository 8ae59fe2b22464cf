//! The compute thread's side of LoRA during a run: which phase's adapters are
//! attached, and how each block meets its factors — baked once into a resident copy,
//! or applied the low-rank way to a streamed one — reading the factors from the packs
//! the LoRA offloader brought to VRAM with the block.

use stagehand_actors::{BlockHandle, BlockId, LoraHandle, LoraSlot, Session};

use super::driver::LoraPhase;
use super::linear_stack::{Activations, LinearStack};
use super::lora_set::{BlockPatches, LoraSet};
use super::WorkloadError;
use crate::device::cpu::block_bytes;

/// Which LoRA phase is attached, and which resident blocks carry it baked in.
pub(super) struct LoraSteps<'a> {
    phases: &'a [LoraPhase],
    phase: Option<usize>,
    /// The session's slot of each adapter of the attached phase, in set order.
    slots: Vec<LoraSlot>,
    /// Per block: the (generation, phase) of the resident copy that was baked.
    baked: Vec<Option<(u32, usize)>>,
}

/// How a block was computed, for the step's check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    /// No LoRA, or baked into the resident copy: the same arithmetic as the merged
    /// reference, so the result must match it bit for bit.
    Exact,
    /// Low-rank on a streamed weight: the reference's sum in another order.
    LowRank,
}

impl<'a> LoraSteps<'a> {
    pub(super) fn new(blocks: usize, phases: &'a [LoraPhase]) -> Self {
        Self {
            phases,
            phase: None,
            slots: Vec::new(),
            baked: vec![None; blocks],
        }
    }

    pub(super) fn phase(&self) -> Option<&'a LoraPhase> {
        self.phases.get(self.phase?)
    }

    fn phase_set(&self) -> Option<&'a LoraSet> {
        self.phase().map(|phase| &phase.set)
    }

    /// At a step boundary: switches to the phase this step belongs to — detaches the
    /// old adapters, attaches the new ones and drops baked resident copies so they
    /// reload pristine and are baked again with the new set.
    pub(super) fn enter_step(
        &mut self,
        session: &mut Session,
        step: u64,
    ) -> Result<(), WorkloadError> {
        let phases = self.phases;
        let wanted = phases.iter().rposition(|phase| phase.from_step <= step);
        if wanted == self.phase {
            return Ok(());
        }
        if let Some(old) = self.phase_set() {
            for adapter in old.adapters() {
                session.detach_lora(&adapter.name)?;
            }
        }
        self.slots.clear();
        let stale: Vec<BlockId> = (0..self.baked.len())
            .filter(|&block| self.baked[block].is_some())
            .map(|block| BlockId(block as u32))
            .collect();
        if !stale.is_empty() {
            session.invalidate(&stale)?;
        }
        self.baked.iter_mut().for_each(|baked| *baked = None);
        self.phase = wanted;
        if let Some(set) = self.phase_set() {
            for adapter in 0..set.adapters().len() {
                self.slots
                    .push(session.attach_lora(set.attach_request(adapter))?);
            }
        }
        Ok(())
    }

    /// Runs one held block of the linear stack with the attached LoRA set.
    pub(super) fn forward(
        &mut self,
        session: &mut Session,
        model: &LinearStack,
        handle: &BlockHandle,
        activations: &mut Activations,
    ) -> Result<Path, WorkloadError> {
        let block = handle.block.index();
        let touched = self.phase_set().filter(|set| set.touches(block));
        let (Some(set), Some(phase)) = (touched, self.phase) else {
            // SAFETY: the handle is held until the caller releases it after this call.
            let bytes = unsafe { block_bytes(handle.ptr, handle.bytes) };
            model.forward_block(block, bytes, activations)?;
            return Ok(Path::Exact);
        };
        if handle.streamed {
            // SAFETY: as above.
            let bytes = unsafe { block_bytes(handle.ptr, handle.bytes) };
            with_packs(session, &self.slots, set, block, |patches| {
                model.forward_block_patched(block, bytes, activations, Some(patches))
            })?;
            return Ok(Path::LowRank);
        }
        if self.baked[block] != Some((handle.generation, phase)) {
            // SAFETY: the handle is held, the block is resident (its range belongs to
            // it alone until evicted, which a held block is not), and the compute
            // thread is the only reader of that range while it holds it.
            let bytes = unsafe {
                std::slice::from_raw_parts_mut(handle.ptr.0 as *mut u8, handle.bytes as usize)
            };
            with_packs(session, &self.slots, set, block, |patches| {
                model.bake_block(block, bytes, patches)
            })?;
            self.baked[block] = Some((handle.generation, phase));
        }
        // SAFETY: as above; the baking borrow has ended.
        let bytes = unsafe { block_bytes(handle.ptr, handle.bytes) };
        model.forward_block(block, bytes, activations)?;
        Ok(Path::Exact)
    }
}

/// Holds `block`'s packs of every adapter that patches it, runs `compute` on the
/// factors read from them, and releases the packs whatever happened.
fn with_packs(
    session: &mut Session,
    slots: &[LoraSlot],
    set: &LoraSet,
    block: usize,
    compute: impl FnOnce(&BlockPatches<'_>) -> Result<(), WorkloadError>,
) -> Result<(), WorkloadError> {
    let adapters = set.adapters_on(block);
    let mut held: Vec<(usize, LoraHandle)> = Vec::with_capacity(adapters.len());
    let mut outcome = Ok(());
    for &adapter in &adapters {
        let Some(&slot) = slots.get(adapter) else {
            outcome = Err(WorkloadError::Model(format!(
                "LoRA adapter {adapter} is not attached"
            )));
            break;
        };
        match session.acquire_lora(slot, BlockId(block as u32)) {
            Ok(handle) => held.push((adapter, handle)),
            Err(error) => {
                outcome = Err(error.into());
                break;
            }
        }
    }
    if outcome.is_ok() {
        let pack = |adapter: usize| {
            let (_, handle) = held.iter().find(|(held, _)| *held == adapter)?;
            let floats = set.pack_bytes(adapter, block) / 4;
            // SAFETY: the pack is held until the releases below; the offloader copied
            // exactly `pack_bytes` bytes of f32 factors there, 256-byte aligned.
            Some(unsafe { std::slice::from_raw_parts(handle.ptr.0 as *const f32, floats) })
        };
        outcome = match set.pack_patches(block, pack) {
            Some(patches) => compute(&patches),
            None => Err(WorkloadError::Model(format!(
                "block {block}: a LoRA pack is missing or too short"
            ))),
        };
    }
    for (_, handle) in held {
        session.release_lora(handle);
    }
    outcome
}

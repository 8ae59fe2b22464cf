//! The `weights` check (`verify = weights | first`): every block's bytes, each time they
//! land in the device tier, against the checksum of the same bytes in the file — the
//! stream-verify mechanism, applied as a run goes. Streamed data then cannot differ
//! from the file, at the cost of one pass of the compute device over the bytes that
//! landed (a resident block once, a streamed one each step), instead of a second,
//! fully-resident forward pass.
//!
//! A block is checked when its residency generation is new (it was loaded again). Its
//! file checksum is computed once, from plain reads of the file, the first time the
//! block lands. Blocks a LoRA adapter patches are checked too: a streamed one keeps
//! the file's bytes (the adapter is a separate low-rank pass), and a resident one is
//! checked as it lands, before the adapter is baked into it.

use stagehand_actors::{BlockHandle, ModelLayout};

use super::FamilyError;
use crate::compute::{BlockView, Compute};
use crate::model::BlockReader;

/// Checks landed blocks against the file.
pub struct LandingCheck<'a> {
    reader: &'a BlockReader<'a>,
    layout: &'a ModelLayout,
    /// Per block: the checksum of its bytes in the file, once computed.
    expected: Vec<Option<u64>>,
    /// Per block: the generation last checked.
    checked: Vec<Option<u32>>,
    /// Landings checked so far.
    pub landings: u64,
    /// Bytes of them.
    pub bytes: u64,
}

impl<'a> LandingCheck<'a> {
    /// A check of the blocks of `layout` (the session's), read from the files by `reader`.
    pub fn new(reader: &'a BlockReader<'a>, layout: &'a ModelLayout) -> Self {
        Self {
            reader,
            layout,
            expected: vec![None; layout.len()],
            checked: vec![None; layout.len()],
            landings: 0,
            bytes: 0,
        }
    }

    /// Checks the held block if it landed since it was last checked; a mismatch is a
    /// [`FamilyError::Corrupt`] naming the block.
    pub fn check<C: Compute>(
        &mut self,
        compute: &C,
        handle: &BlockHandle,
    ) -> Result<(), FamilyError> {
        let block = handle.block.index();
        let Some(info) = self.layout.block(handle.block) else {
            return Ok(());
        };
        if self.checked[block] == Some(handle.generation) {
            return Ok(());
        }
        let expected = match self.expected[block] {
            Some(expected) => expected,
            None => {
                let mut bytes = vec![0u8; info.bytes as usize];
                self.reader.read_extents(&info.extents, &mut bytes)?;
                let expected = crate::compute::checksum::checksum(&bytes);
                self.expected[block] = Some(expected);
                expected
            }
        };
        // SAFETY: the caller holds `handle`: the block is in the compute adapter's
        // memory space (the block source checked it) and stays put while held.
        let view = unsafe { BlockView::new(handle.ptr, handle.bytes) };
        let landed = compute.checksum(&view)?;
        if landed != expected {
            return Err(FamilyError::Corrupt {
                block: info.name.clone(),
                offset: 0,
            });
        }
        self.checked[block] = Some(handle.generation);
        self.landings += 1;
        self.bytes += handle.bytes;
        Ok(())
    }
}

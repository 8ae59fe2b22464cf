//! Errors the compute thread can see.

use crate::bytes::Bytes;
use crate::layout::BlockId;

/// Why a session call failed: what a [`crate::Session`] or [`crate::LocalSession`]
/// method returns to the compute thread. The messages name the flag to change where
/// one would help.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SessionError {
    /// The compute side named a block id past the end of the model's layout.
    #[error("{block} is not in the model: it has {block_count} blocks")]
    UnknownBlock {
        /// The id asked for.
        block: BlockId,
        /// Blocks the model has: valid ids are below this.
        block_count: usize,
    },
    /// The budgets cannot be planned for this model and order: the session did not
    /// start.
    #[error("{0}")]
    Plan(#[from] crate::plan::PlanError),
    /// An activation reservation (or a LoRA region) found no room even after every
    /// resident weight that could give way did.
    #[error("{0}")]
    Activations(#[from] crate::vram_state::ActivationError),
    /// The disk read of a block the compute thread waits for failed.
    #[error("reading {block} failed: {reason}")]
    ReadFailed {
        /// The block whose read failed.
        block: BlockId,
        /// The storage adapter's error, in its words.
        reason: String,
        /// The file the read was of, when the adapter named it.
        file: Option<String>,
        /// The file is no longer the one indexed
        /// ([`StorageError::FileChanged`](crate::StorageError::FileChanged)): its bytes
        /// cannot be trusted, and a retry will not help.
        file_changed: bool,
    },
    /// The host-to-device copy of a block (or of its LoRA pack) failed.
    #[error("copying {block} to the device failed: {reason}")]
    CopyFailed {
        /// The block whose copy failed.
        block: BlockId,
        /// The device adapter's error, in its words.
        reason: String,
    },
    /// Host memory could not be pinned where the session cannot do without it: the
    /// staging ring at start, or an adapter's LoRA pinned set.
    #[error("pinning host memory failed: {0}")]
    PinFailed(String),
    /// A device failure, in the device's own words (they name the device already).
    #[error("{0}")]
    Device(String),
    /// Every miss for a block (or its LoRA pack) was answered, yet each time it was
    /// evicted again (activation pressure) before the compute thread could hold it.
    #[error("{block} could not be made resident after {attempts} attempts")]
    Starved {
        /// The block the compute thread waited for.
        block: BlockId,
        /// Misses sent for it before giving up.
        attempts: u32,
    },
    /// The compute thread waits for a block that has no place in VRAM, and nothing in
    /// flight will make one (no load is landing; the compute thread, waiting, releases
    /// nothing): answered at once instead of waiting forever.
    #[error("{block} ({}) has no place in VRAM and nothing in flight will make one: {reason}; set --vram-budget {} or more", Bytes(*bytes), needed.flag_value_at_least())]
    NoPlace {
        /// The block waited for.
        block: BlockId,
        /// Its size.
        bytes: u64,
        /// What holds the room it needs, and what else would help.
        reason: String,
        /// A budget with room for it beside everything placed now.
        needed: Bytes,
    },
    /// The request cannot be served any more: the actors are draining or gone (the
    /// session is finishing, or their thread ended), or the LoRA adapter waited on
    /// was detached meanwhile.
    #[error("the session has stopped")]
    Stopped,
    /// The owner asked the run to stop (a signal) while the compute thread waited.
    #[error("interrupted: the run was asked to stop")]
    Interrupted,
    #[error("LoRA factors need {} of pinned memory and the pin ceiling has {} left after the staging ring and buffers in use; set --pin-ceiling {} or more, or detach an adapter", Bytes(*requested_bytes), Bytes(*available_bytes), Bytes(ceiling_bytes + requested_bytes.saturating_sub(*available_bytes)).flag_value_at_least())]
    /// An attach's pinned set does not fit under the pin ceiling, even with the
    /// model's pinned cache given way: the pin manager refused it.
    LoraPinCeiling {
        /// The adapter's factors: every pack together.
        requested_bytes: u64,
        /// What the ceiling leaves after the staging ring and buffers in use.
        available_bytes: u64,
        /// The pin ceiling itself.
        ceiling_bytes: u64,
    },
    /// An attach found every slot of the LoRA table taken.
    #[error("at most {max} LoRA adapters can be attached at once; detach one first")]
    TooManyAdapters {
        /// Adapters attached at once, at most ([`crate::MAX_ADAPTERS`]).
        max: usize,
    },
    /// A LoRA request about one adapter was refused: attached twice, a bad pack, a
    /// detach while packs are held, a pack it has none of.
    #[error("LoRA adapter `{name}`: {problem}")]
    Lora {
        /// The adapter's name as given at attach, or `#slot` where only its slot in
        /// the LoRA table is known (a pack demanded of a slot without it).
        name: String,
        /// What was wrong and what to do, as a sentence fragment.
        problem: String,
    },
}

/// Why a disk read failed, as the disk reader hands it to the pin manager.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReadFault {
    /// The storage adapter's error, in its words.
    pub reason: String,
    /// The file the read was of, when the adapter named it.
    pub file: Option<String>,
    /// The file changed since it was indexed.
    pub file_changed: bool,
}

impl ReadFault {
    /// The storage adapter's error.
    pub fn of(error: &crate::StorageError) -> Self {
        Self {
            reason: error.to_string(),
            file: match error {
                crate::StorageError::Io { path, .. }
                | crate::StorageError::FileChanged { path, .. } => Some(path.clone()),
                _ => None,
            },
            file_changed: matches!(error, crate::StorageError::FileChanged { .. }),
        }
    }

    /// The session's error for `block`'s failed read.
    pub fn into_error(self, block: BlockId) -> SessionError {
        SessionError::ReadFailed {
            block,
            reason: self.reason,
            file: self.file,
            file_changed: self.file_changed,
        }
    }
}

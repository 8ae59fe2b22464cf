//! Errors the compute thread can see.

use crate::bytes::Bytes;
use crate::layout::BlockId;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SessionError {
    #[error("{block} is not in the model: it has {block_count} blocks")]
    UnknownBlock { block: BlockId, block_count: usize },
    #[error("{0}")]
    Plan(#[from] crate::plan::PlanError),
    #[error("{0}")]
    Activations(#[from] crate::vram_state::ActivationError),
    #[error("reading {block} failed: {reason}")]
    ReadFailed { block: BlockId, reason: String },
    #[error("copying {block} to the device failed: {reason}")]
    CopyFailed { block: BlockId, reason: String },
    #[error("pinning host memory failed: {0}")]
    PinFailed(String),
    /// A device failure, in the device's own words (they name the device already).
    #[error("{0}")]
    Device(String),
    #[error("{block} could not be made resident after {attempts} attempts")]
    Starved { block: BlockId, attempts: u32 },
    #[error("the session has stopped")]
    Stopped,
    /// The owner asked the run to stop (a signal) while the compute thread waited.
    #[error("interrupted: the run was asked to stop")]
    Interrupted,
    #[error("LoRA factors need {} of pinned memory and the pin ceiling has {} left after the staging ring and buffers in use; set --pin-ceiling {} or more, or detach an adapter", Bytes(*requested_bytes), Bytes(*available_bytes), Bytes(ceiling_bytes + requested_bytes.saturating_sub(*available_bytes)).flag_value_at_least())]
    LoraPinCeiling {
        requested_bytes: u64,
        available_bytes: u64,
        ceiling_bytes: u64,
    },
    #[error("at most {max} LoRA adapters can be attached at once; detach one first")]
    TooManyAdapters { max: usize },
    #[error("LoRA adapter `{name}`: {problem}")]
    Lora { name: String, problem: String },
}

//! Errors the compute thread can see.

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
    #[error("device: {0}")]
    Device(String),
    #[error("{block} could not be made resident after {attempts} attempts")]
    Starved { block: BlockId, attempts: u32 },
    #[error("the session has stopped")]
    Stopped,
    /// The owner asked the run to stop (a signal) while the compute thread waited.
    #[error("interrupted: the run was asked to stop")]
    Interrupted,
    #[error("LoRA factors need {requested_bytes} bytes of pinned memory and the pin ceiling has {available_bytes} left after the staging ring and buffers in use; raise --pin-ceiling or detach an adapter")]
    LoraPinCeiling {
        requested_bytes: u64,
        available_bytes: u64,
    },
    #[error("at most {max} LoRA adapters can be attached at once; detach one first")]
    TooManyAdapters { max: usize },
    #[error("LoRA adapter `{name}`: {problem}")]
    Lora { name: String, problem: String },
}

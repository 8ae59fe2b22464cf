//! What the main job computes on the weights it streams.
//!
//! - `linear_stack`: the generated demo model; a real GEMM forward pass whose output
//!   must equal the fully-resident reference bit for bit.
//! - `stream_verify`: any safetensors checkpoint; every block's bytes are checked
//!   against the file after they have crossed the tiers.
//! - `driver`: runs steps of either over a session and collects the figures.

pub mod bound;
pub mod driver;
pub mod linear_stack;
pub mod lora_set;
mod lora_steps;
pub mod moe;
pub mod moe_model;
pub mod stream_verify;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("{0}")]
    Model(String),
    #[error("{path}: {reason}")]
    Io { path: String, reason: String },
    #[error("{0}")]
    Session(#[from] stagehand_actors::SessionError),
    #[error("output mismatch at step {step}: element {index} is {got}, the fully-resident reference has {expected}")]
    Mismatch {
        step: u64,
        index: usize,
        got: f32,
        expected: f32,
    },
    #[error("{block}: bytes differ from the file at offset {offset} of the block")]
    Corrupt { block: String, offset: u64 },
}

impl From<crate::model::BlockReadError> for WorkloadError {
    fn from(error: crate::model::BlockReadError) -> Self {
        WorkloadError::Io {
            path: error.path.display().to_string(),
            reason: error.reason,
        }
    }
}

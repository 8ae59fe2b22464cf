//! What a run computes on the weights it streams: the model families, written once
//! against the compute port (DESIGN §6), and the one run loop that drives them.
//!
//! - `linear_stack`: the generated demo model; a real GEMM forward pass.
//! - `moe`: the generated mixture-of-experts model; experts acquired as routed.
//! - `encoder`: BERT-family encoders from Hugging Face folders.
//! - `stream_verify`: any safetensors checkpoint; every block's bytes are checked
//!   against the file after they have crossed the tiers. Nothing is computed.
//! - `driver`: runs steps of any of them over a session and checks each against the
//!   family's own fully-resident reference on the same device.

pub mod bert;
pub mod blocks;
pub mod family;
mod host_table;
pub mod linear_stack;
pub mod llama;
pub mod lora_set;
pub mod moe;
pub mod placement;
pub mod stream_verify;

#[derive(Debug, thiserror::Error)]
pub enum FamilyError {
    #[error("{0}")]
    Model(String),
    #[error("{path}: {reason}")]
    Io { path: String, reason: String },
    #[error("{0}")]
    Session(#[from] stagehand_actors::SessionError),
    #[error("{0}")]
    Compute(#[from] crate::compute::ComputeError),
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

impl From<crate::model::BlockReadError> for FamilyError {
    fn from(error: crate::model::BlockReadError) -> Self {
        if error.interrupted {
            // A stop request, not a fault of the file: the run ends at a safe point.
            return FamilyError::Session(stagehand_actors::SessionError::Interrupted);
        }
        FamilyError::Io {
            path: error.path.display().to_string(),
            reason: error.reason,
        }
    }
}

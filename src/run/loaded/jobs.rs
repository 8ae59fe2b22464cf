//! What a kept-loaded model is asked to do, and how it answers: plain values and
//! channels, no HTTP, so an embedder can drive a loaded model without a server.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::families::llama::Sampling;
use crate::families::EncoderInput;

use super::super::RunError;

/// One request to a loaded model.
pub enum Job {
    Embed(EmbedJob),
    Generate(GenerateJob),
}

/// Texts (or token-id lists) to embed.
pub struct EmbedJob {
    pub input: EncoderInput,
    /// The adapter to embed with (a name the model was given with
    /// [`crate::run::Prepared::add_adapter`]); `None`: the model's own weights.
    pub adapter: Option<String>,
    pub reply: flume::Sender<Result<Embedded, RunError>>,
    pub cancel: Cancel,
}

/// Embeddings of one job, in input order.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    pub embeddings: Vec<Vec<f32>>,
    /// Real (not padding) tokens over every input.
    pub prompt_tokens: usize,
    /// Texts of the step this job's texts were embedded in (with other jobs' texts).
    pub batch_texts: usize,
}

/// A prompt to continue.
pub struct GenerateJob {
    pub prompt: Vec<u32>,
    /// The adapter to decode with, as for [`EmbedJob::adapter`].
    pub adapter: Option<String>,
    pub sampling: Sampling,
    /// Tokens to generate at most (the first comes from the prefill).
    pub max_tokens: u64,
    /// Token ids that end the sequence (the model's end-of-text ids).
    pub stop_tokens: Vec<u32>,
    /// Told each token as it is picked, then how the sequence ended. A dropped
    /// receiver cancels the sequence at the next step.
    pub events: flume::Sender<TokenEvent>,
    pub cancel: Cancel,
}

/// What a generation reports, in order: tokens, then one `Finished`, `Refused` or
/// `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenEvent {
    Token(u32),
    Finished(Finished),
    /// The job cannot run on this model as asked (the caller's error: a token out of
    /// the vocabulary, a sequence longer than the model takes).
    Refused(String),
    /// The model could not compute it (its KV pages did not fit beside the others).
    Failed(String),
}

/// How a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-text token (or the caller's stop: it cancels with `Stop`).
    Stop,
    /// `max_tokens` reached.
    Length,
    /// Cancelled: the client went away or the request timed out.
    Cancelled,
}

impl FinishReason {
    /// OpenAI's `finish_reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// A flag the caller sets to end its job at the next step (a disconnect, a timeout,
/// a stop sequence found in the text); the model releases the job's KV pages then.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// The flag itself, for a run that takes a stop flag (a pipeline's stages).
    pub fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.0)
    }
}

/// Sets the flag when dropped unless disarmed: a request handler holds one, so a
/// client that disconnects (its future is dropped) cancels its job.
pub struct CancelOnDrop {
    cancel: Cancel,
    armed: bool,
}

impl CancelOnDrop {
    pub fn new(cancel: Cancel) -> Self {
        Self {
            cancel,
            armed: true,
        }
    }

    /// The job finished: dropping the guard no longer cancels it.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.cancel.cancel();
        }
    }
}

/// How many sequences and tokens a loaded model computes at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Decoders: sequences decoded together (they join and leave between steps).
    pub max_sequences: usize,
    /// Encoders: texts of queued jobs gathered into one step, up to this many tokens.
    pub max_batch_tokens: usize,
    /// Decoders: the longest sequence (prompt + generated) the budgets are sized for.
    pub max_sequence_tokens: u64,
}

impl Default for BatchLimits {
    fn default() -> Self {
        Self {
            max_sequences: 8,
            max_batch_tokens: 4096,
            max_sequence_tokens: 512,
        }
    }
}

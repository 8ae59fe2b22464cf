//! What a decoder run generates from: the llama family's input (see
//! [`crate::families::Extras::with`]).

use super::{ExpertHint, Sampling};

/// The prompt `stagehand run` gives a decoder when none is given.
pub const BUILT_IN_PROMPT: &str = "The quick brown fox jumps over the lazy dog. Then it";

/// What a decoder run generates from.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderInput {
    pub prompt: PromptInput,
    pub sampling: Sampling,
    pub hint: ExpertHint,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    /// Token ids given directly (`--token-ids`), for folders without `tokenizer.json`.
    TokenIds(Vec<u32>),
}

//! A loaded encoder given new texts: a server keeps one [`Encoder`] (its weights placed,
//! its host table read) and swaps the batches its steps embed, request after request.
//! Texts are tokenized as the run's own are (the folder's sentence-transformers
//! limits), batched the same way, and their embeddings come back in input order
//! ([`Facts::output_order`](crate::families::Facts::output_order)).

use super::{from_ids, step_inputs, tokenize, truncated, BertConfig, Encoder, TextLimits, Tokens};
use crate::families::inputs::EncoderInput;
use crate::families::FamilyError;
use crate::model::ModelFolder;

/// The tokens of `input`: texts through the folder's `tokenizer.json` within `limits`
/// (sentence-transformers' `max_seq_length` and `do_lower_case`, never past the
/// model's positions), or token ids cut to the positions.
pub fn input_tokens(
    folder: &ModelFolder,
    config: &BertConfig,
    limits: TextLimits,
    input: &EncoderInput,
) -> Result<Vec<Tokens>, FamilyError> {
    match input {
        EncoderInput::Texts(texts) => {
            if texts.is_empty() {
                return Err(FamilyError::request(
                    "texts",
                    "no text to embed: give one or more texts, or --file".to_string(),
                ));
            }
            let Some(tokenizer) = &folder.tokenizer else {
                return Err(FamilyError::missing_file(&folder.dir.join("tokenizer.json"), format!(
                    "{}: no tokenizer.json in the folder; add it, or give token ids with --token-ids 101,7592,102",
                    folder.dir.display()
                )));
            };
            tokenize(tokenizer, texts, limits)
        }
        EncoderInput::TokenIds(ids) => {
            if ids.is_empty() || ids.iter().any(Vec::is_empty) {
                return Err(FamilyError::request(
                    "token_ids",
                    "--token-ids: every text needs at least one id".to_string(),
                ));
            }
            Ok(from_ids(ids, config.usable_positions()))
        }
    }
}

impl Encoder {
    /// How this encoder's folder cuts and cases texts.
    pub fn limits(&self) -> TextLimits {
        self.limits
    }

    /// Makes the steps embed `tokens`, `batch` texts a step (sorted and padded as
    /// [`Encoder::new`] does), keeping where the weights were placed when the encoder
    /// was opened (the word table stays where it is).
    pub fn set_inputs(&mut self, tokens: &[Tokens], batch: usize) -> Result<(), FamilyError> {
        let (inputs, order) = step_inputs(&self.config, tokens, batch)?;
        self.inputs = inputs;
        self.order = order;
        self.truncated_texts = truncated(tokens);
        Ok(())
    }
}

//! A loaded encoder given new texts: a server keeps one [`Encoder`] (its weights placed,
//! its host table read) and swaps the batches its steps embed, request after request.

use super::{batches, from_ids, tokenize, BertConfig, Encoder, StepInput, Tokens};
use crate::families::inputs::EncoderInput;
use crate::families::FamilyError;
use crate::model::ModelFolder;

/// The tokens of `input`: texts through the folder's `tokenizer.json` (truncated as it
/// says, never past the model's positions), or token ids cut to the positions.
pub fn input_tokens(
    folder: &ModelFolder,
    config: &BertConfig,
    input: &EncoderInput,
) -> Result<Vec<Tokens>, FamilyError> {
    match input {
        EncoderInput::Texts(texts) => {
            if texts.is_empty() {
                return Err(FamilyError::Model(
                    "no text to embed: give one or more texts, or --file".to_string(),
                ));
            }
            let Some(tokenizer) = &folder.tokenizer else {
                return Err(FamilyError::Model(format!(
                    "{}: no tokenizer.json in the folder; add it, or give token ids with --token-ids 101,7592,102",
                    folder.dir.display()
                )));
            };
            tokenize(tokenizer, texts, config.max_positions)
        }
        EncoderInput::TokenIds(ids) => {
            if ids.is_empty() || ids.iter().any(Vec::is_empty) {
                return Err(FamilyError::Model(
                    "--token-ids: every text needs at least one id".to_string(),
                ));
            }
            Ok(from_ids(ids, config.max_positions))
        }
    }
}

impl Encoder {
    /// Makes the steps embed `tokens`, `batch` texts a step, keeping where the weights
    /// were placed when the encoder was opened (the word table stays where it is).
    pub fn set_inputs(&mut self, tokens: &[Tokens], batch: usize) -> Result<(), FamilyError> {
        if tokens.is_empty() {
            return Err(FamilyError::Model("no text to embed".into()));
        }
        if let Some(id) = tokens
            .iter()
            .flat_map(|text| &text.ids)
            .find(|&&id| id as usize >= self.config.vocab)
        {
            return Err(FamilyError::Model(format!(
                "token id {id} is outside the model's vocabulary of {}",
                self.config.vocab
            )));
        }
        self.inputs = batches(tokens, batch, 0)
            .into_iter()
            .map(|batch| {
                let positions = (0..batch.sequences)
                    .flat_map(|_| 0..batch.length as u32)
                    .collect();
                StepInput { batch, positions }
            })
            .collect();
        self.truncated_texts = tokens
            .iter()
            .enumerate()
            .filter(|(_, text)| text.truncated)
            .map(|(position, _)| position)
            .collect();
        Ok(())
    }
}

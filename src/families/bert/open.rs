//! How a BERT folder is recognised and opened, and what the run asks of an encoder.

use stagehand_actors::ModelLayout;

use super::sentence::{self, SentenceFolder};
use super::{Encoder, TextLimits, Tokens};
use crate::compute::TensorSlot;
use crate::families::family::Facts;
use crate::families::inputs::{EncoderInput, WorkloadKind, BUILT_IN_SENTENCES};
use crate::families::registry::{Open, Request};
use crate::families::FamilyError;
use crate::model::ModelIndex;

impl Open for Encoder {
    const NAME: &'static str = "bert";
    const KIND: WorkloadKind = WorkloadKind::Encoder;
    const MODEL_TYPES: &'static [&'static str] = &["bert", "roberta", "xlm-roberta"];
    const ARCHITECTURES: &'static [&'static str] = &["Bert", "Roberta", "XLMRoberta"];

    /// The encoder over a folder, for the texts the run gives (or the built-in
    /// sentences), tokenized by the folder's `tokenizer.json`, or for token ids.
    fn open(request: &Request<'_>) -> Result<Self, FamilyError> {
        let folder = request.folder("an encoder")?;
        let config = super::bert_config(&folder.config_path(), &folder.config)?;
        let sentence = sentence::read(&folder.dir, config.hidden)?;
        let input = request.extras.encoder.clone().unwrap_or_else(|| {
            EncoderInput::Texts(BUILT_IN_SENTENCES.iter().map(|s| s.to_string()).collect())
        });
        let limits = TextLimits {
            max_positions: config.usable_positions(),
            max_length: sentence.max_length.as_ref().map(|length| length.tokens),
            lower_case: sentence.lower_case,
        };
        let tokens: Vec<Tokens> = super::input_tokens(folder, &config, limits, &input)?;
        warn_truncated(&tokens, &sentence, config.usable_positions());
        let mut encoder = Encoder::new(
            request.index,
            config,
            sentence.head,
            &tokens,
            request.batch,
            request.extras.embeddings,
        )?;
        encoder.limits = limits;
        Ok(encoder)
    }
}

/// One line for every text cut short: which, where, and who set the length.
fn warn_truncated(tokens: &[Tokens], sentence: &SentenceFolder, max_positions: usize) {
    let cut: Vec<String> = (tokens.iter().enumerate())
        .filter(|(_, text)| text.truncated)
        .map(|(position, _)| (position + 1).to_string())
        .collect();
    if cut.is_empty() {
        return;
    }
    let limit = match &sentence.max_length {
        Some(length) if length.tokens <= max_positions => {
            format!("{} tokens ({})", length.tokens, length.source)
        }
        _ => format!("the tokenizer's length, at most the model's {max_positions} positions"),
    };
    let texts = if cut.len() == 1 { "text" } else { "texts" };
    tracing::warn!(
        "{texts} {} longer than {limit}: truncated there, as sentence-transformers does",
        cut.join(", ")
    );
}

impl Facts for Encoder {
    fn kind(&self) -> WorkloadKind {
        WorkloadKind::Encoder
    }

    fn describe(&self) -> &'static str {
        self.config.variant.describe()
    }

    fn layout(&self) -> &ModelLayout {
        &self.weights.placement.layout
    }

    fn host_table_bytes(&self) -> u64 {
        Encoder::host_table_bytes(self)
    }

    fn takes_lora(&self) -> bool {
        true
    }

    fn place(&self, _index: &ModelIndex, tensor: usize) -> Option<(usize, TensorSlot)> {
        Encoder::place(self, tensor)
    }

    fn truncated_inputs(&self) -> &[usize] {
        &self.truncated_texts
    }

    fn output_order(&self) -> &[usize] {
        &self.order
    }

    fn reference_key(&self, step: u64) -> u64 {
        step % self.inputs.len().max(1) as u64
    }

    /// The token rows of the first batch (`sequences × padded length`).
    fn tokens_per_step(&self) -> u64 {
        let (sequences, length) = self.batch_shape(0);
        (sequences * length).max(1) as u64
    }
}

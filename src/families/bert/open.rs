//! How a BERT folder is recognised and opened, and what the run asks of an encoder.

use stagehand_actors::ModelLayout;

use super::sentence::{self, SentenceFolder};
use super::{Encoder, TextLimits, Tokens};
use crate::compute::TensorSlot;
use crate::families::family::Facts;
use crate::families::inputs::{EncoderInput, Extras, WorkloadKind, BUILT_IN_SENTENCES};
use crate::families::registry::{Endpoints, Found, Open, Request, StepUnit};
use crate::families::FamilyError;
use crate::model::ModelIndex;

/// Most tokens one described encoder step may have (a bound on the ids made up to
/// describe it; far above any real batch).
const MAX_DESCRIBED_TOKENS: u64 = 1 << 20;

impl Open for Encoder {
    const NAME: &'static str = "bert";
    const KIND: WorkloadKind = WorkloadKind::Encoder;
    const STEP: StepUnit = StepUnit::Batch;
    const ENDPOINTS: Endpoints = Endpoints::Embeddings;
    const MODEL_TYPES: &'static [&'static str] = &["bert", "roberta", "xlm-roberta"];
    const ARCHITECTURES: &'static [&'static str] = &["Bert", "Roberta", "XLMRoberta"];

    /// A measured step embeds `batch` of the built-in sentences.
    fn measured_input(batch: usize, extras: &mut Extras) {
        let texts = BUILT_IN_SENTENCES.iter().cycle().take(batch);
        extras
            .inputs
            .insert(EncoderInput::Texts(texts.map(|s| s.to_string()).collect()));
    }

    /// A described step of `tokens_per_step` tokens: sequences of the model's
    /// longest (`max_position_embeddings`), one batch. The ids themselves do not
    /// change the work, so they are made up.
    fn described_step(
        found: &Found<'_>,
        tokens_per_step: u64,
        extras: &mut Extras,
    ) -> Result<Option<usize>, FamilyError> {
        let Some(folder) = found.folder else {
            return Ok(None);
        };
        if tokens_per_step > MAX_DESCRIBED_TOKENS {
            return Err(FamilyError::request("tokens_per_step", format!(
                "--tokens-per-step {tokens_per_step}: an encoder step of at most {MAX_DESCRIBED_TOKENS} tokens is described (the token ids it embeds are made up to describe it)"
            )));
        }
        let max_positions = folder
            .config
            .get("max_position_embeddings")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(512)
            .max(1);
        let sequences = tokens_per_step.div_ceil(max_positions);
        let ids: Vec<Vec<u32>> = (0..sequences)
            .map(|sequence| {
                let length = (tokens_per_step - sequence * max_positions).min(max_positions);
                vec![0; length as usize]
            })
            .collect();
        extras.inputs.insert(EncoderInput::TokenIds(ids));
        Ok(Some(sequences as usize))
    }

    /// The encoder over a folder, for the texts the run gives (or the built-in
    /// sentences), tokenized by the folder's `tokenizer.json`, or for token ids.
    fn open(request: &Request<'_>) -> Result<Self, FamilyError> {
        let folder = request.folder("an encoder")?;
        let config = super::bert_config(&folder.config_path(), &folder.config)?;
        let sentence = sentence::read(&folder.dir, config.hidden)?;
        let input = request
            .extras
            .input::<EncoderInput>()
            .cloned()
            .unwrap_or_else(|| {
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
            request.extras.input().copied().unwrap_or_default(),
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
        _ => format!("the model's {max_positions} positions (max_position_embeddings)"),
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

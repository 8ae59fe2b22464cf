//! Texts to token batches, with Hugging Face's own tokenizer reading `tokenizer.json`,
//! batched as sentence-transformers batches them: texts sorted by length into batches
//! (shortest first, where sentence-transformers takes the longest first: the first
//! step is the one `verify = first` computes twice, and the shortest batch makes that
//! reference cheapest), each padded on the right to its own longest text — not to the
//! fixed length a `tokenizer.json` may configure (MiniLM's pads every text to 128) —
//! and results given back in input order. Padding is on the right, so the real tokens
//! of every sequence are its prefix; truncation never goes past the model's positions.

use std::path::Path;

use tokenizers::TruncationParams;

use crate::families::FamilyError;

/// Sequences of one step, padded to one length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBatch {
    pub sequences: usize,
    /// Tokens per sequence, padding included.
    pub length: usize,
    /// `sequences × length` token ids.
    pub ids: Vec<u32>,
    pub type_ids: Vec<u32>,
    /// Real (not padding) tokens of each sequence.
    pub lengths: Vec<usize>,
}

/// One text's tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokens {
    pub ids: Vec<u32>,
    pub type_ids: Vec<u32>,
    /// Real tokens: a prefix of `ids`.
    pub length: usize,
    /// The text was longer than the model takes and was cut.
    pub truncated: bool,
}

/// How texts are cut and cased before they are tokenized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextLimits {
    /// Tokens the model's positions take.
    pub max_positions: usize,
    /// Where to truncate (sentence-transformers' `max_seq_length`, or the tokenizer's
    /// `model_max_length`); `None`: at `max_positions`, as sentence-transformers does
    /// for a folder that sets neither. Never past `max_positions`.
    pub max_length: Option<usize>,
    /// Lower-case every text first (sentence-transformers' `do_lower_case`).
    pub lower_case: bool,
}

/// Tokenizes `texts` with `tokenizer.json` within `limits`.
pub fn tokenize(
    path: &Path,
    texts: &[String],
    limits: TextLimits,
) -> Result<Vec<Tokens>, FamilyError> {
    let fail =
        |problem: String| FamilyError::bad_file(path, format!("{}: {problem}", path.display()));
    let mut tokenizer = crate::families::tokenizer_json::read(path).map_err(|error| {
        fail(format!(
            "is not a tokenizer Hugging Face's tokenizers can read ({error})"
        ))
    })?;
    // Where sentence-transformers cuts: the folder's length, else the model's
    // positions, never past them. A tokenizer.json's own `max_length` (MiniLM's and
    // `demo-model`'s say 128) is not where it cuts: it passes its `max_seq_length` to
    // every call, and that defaults to min(max_position_embeddings, the tokenizer's
    // `model_max_length`), the latter read into `max_length` where a folder sets it.
    let max_length = limits
        .max_length
        .unwrap_or(limits.max_positions)
        .min(limits.max_positions);
    let truncation = TruncationParams {
        max_length,
        ..tokenizer.get_truncation().cloned().unwrap_or_default()
    };
    tokenizer
        .with_truncation(Some(truncation))
        .map_err(|error| fail(format!("truncation: {error}")))?;
    // Each text alone: a batch is padded to its own longest text in `batches`.
    tokenizer.with_padding(None);
    // As sentence-transformers' Lowercase normalizer put in front of the tokenizer's own.
    let lowered: Vec<String>;
    let inputs: Vec<&str> = if limits.lower_case {
        lowered = texts.iter().map(|text| text.to_lowercase()).collect();
        lowered.iter().map(String::as_str).collect()
    } else {
        texts.iter().map(String::as_str).collect()
    };
    let encodings = tokenizer.encode_batch(inputs, true).map_err(|error| {
        let message = format!("{}: could not tokenize the input ({error})", path.display());
        FamilyError::request("texts", message)
    })?;
    Ok(encodings
        .into_iter()
        .map(|encoding| {
            let length = encoding
                .get_attention_mask()
                .iter()
                .filter(|&&m| m == 1)
                .count();
            Tokens {
                ids: encoding.get_ids().to_vec(),
                type_ids: encoding.get_type_ids().to_vec(),
                length,
                truncated: !encoding.get_overflowing().is_empty(),
            }
        })
        .collect())
}

/// Raw token ids given by the user (`--token-ids`), cut to the model's positions.
pub fn from_ids(texts: &[Vec<u32>], max_positions: usize) -> Vec<Tokens> {
    texts
        .iter()
        .map(|ids| {
            let kept = ids.len().min(max_positions);
            Tokens {
                ids: ids[..kept].to_vec(),
                type_ids: vec![0; kept],
                length: kept,
                truncated: kept < ids.len(),
            }
        })
        .collect()
}

/// Texts in the order they are batched: shortest first (a stable sort, so texts of
/// one length keep their input order). `order[k]` is the input position of the k-th.
pub fn length_order(tokens: &[Tokens]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..tokens.len()).collect();
    order.sort_by_key(|&text| tokens[text].ids.len());
    order
}

/// Groups texts, taken in `order`, into batches of `batch`, each padded (with `pad_id`)
/// to its longest.
pub fn batches(tokens: &[Tokens], order: &[usize], batch: usize, pad_id: u32) -> Vec<TokenBatch> {
    let sorted: Vec<&Tokens> = order.iter().map(|&text| &tokens[text]).collect();
    sorted
        .chunks(batch.max(1))
        .map(|group| {
            let length = group
                .iter()
                .map(|text| text.ids.len())
                .max()
                .unwrap_or(1)
                .max(1);
            let mut ids = Vec::with_capacity(group.len() * length);
            let mut type_ids = Vec::with_capacity(group.len() * length);
            for text in group.iter() {
                ids.extend(&text.ids);
                ids.resize(ids.len() + length - text.ids.len(), pad_id);
                type_ids.extend(&text.type_ids);
                type_ids.resize(type_ids.len() + length - text.type_ids.len(), 0);
            }
            TokenBatch {
                sequences: group.len(),
                length,
                ids,
                type_ids,
                lengths: group.iter().map(|text| text.length.max(1)).collect(),
            }
        })
        .collect()
}

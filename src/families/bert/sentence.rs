//! What a sentence-transformers folder says about turning texts into embeddings, read
//! as sentence-transformers reads it:
//!
//! - `modules.json`: a Transformer, then a Pooling module (`1_Pooling/config.json`) and
//!   an optional Normalize module (L2 normalisation). Any other module (`Dense`, …)
//!   changes the embedding and is refused by name.
//! - the Pooling config: the modes of sentence-transformers 5 (`pooling_mode`: one name
//!   or a list) or its older booleans (`pooling_mode_mean_tokens`, …); several modes
//!   are concatenated in sentence-transformers' order (cls, max, mean,
//!   mean_sqrt_len_tokens, weightedmean, lasttoken). An unknown mode or key is refused.
//! - the Transformer's `sentence_bert_config.json`: `max_seq_length` (where texts are
//!   truncated; the folders on the Hub say 256 for MiniLM where its `tokenizer.json`
//!   says 128) and `do_lower_case`. sentence-transformers 5 keeps the length as
//!   `model_max_length` in `tokenizer_config.json` instead, which is read when
//!   `max_seq_length` is absent. With neither, sentence-transformers cuts at
//!   `max_position_embeddings` (its default is the smaller of that and the
//!   tokenizer's length, which transformers leaves unlimited without the file), never
//!   at the `tokenizer.json`'s own truncation.

use std::path::Path;

use serde_json::Value;

use crate::families::FamilyError;
use crate::model::read_json;

/// How token states become one embedding, per mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The first token's state.
    Cls,
    /// The element-wise maximum over the real tokens.
    Max,
    /// The mean over the real (not padding) tokens.
    Mean,
    /// The sum over the real tokens divided by the square root of their number.
    MeanSqrtLen,
    /// The mean weighted by position (1, 2, …) over the real tokens.
    WeightedMean,
    /// The last real token's state.
    LastToken,
}

/// sentence-transformers' names of the modes, in the order it concatenates them.
const MODES: [(&str, &str, Pooling); 6] = [
    ("cls", "pooling_mode_cls_token", Pooling::Cls),
    ("max", "pooling_mode_max_tokens", Pooling::Max),
    ("mean", "pooling_mode_mean_tokens", Pooling::Mean),
    (
        "mean_sqrt_len_tokens",
        "pooling_mode_mean_sqrt_len_tokens",
        Pooling::MeanSqrtLen,
    ),
    (
        "weightedmean",
        "pooling_mode_weightedmean_tokens",
        Pooling::WeightedMean,
    ),
    ("lasttoken", "pooling_mode_lasttoken", Pooling::LastToken),
];

/// How sentence-transformers turns token states into one embedding per text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentenceHead {
    /// One or more modes, concatenated in this order.
    pub modes: Vec<Pooling>,
    /// A `Normalize` module follows the pooling: embeddings are L2-normalised.
    pub normalize: bool,
}

impl SentenceHead {
    /// A folder with no `modules.json`: the mean, not normalised (sentence-transformers'
    /// default for a plain transformers folder).
    pub fn plain() -> Self {
        Self {
            modes: vec![Pooling::Mean],
            normalize: false,
        }
    }
}

/// Where texts are cut, and who said so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaxLength {
    pub tokens: usize,
    /// The file and key that set it, for the run's message.
    pub source: String,
}

/// What a folder's sentence-transformers files say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentenceFolder {
    pub head: SentenceHead,
    /// `None`: the model's positions (`max_position_embeddings`), sentence-transformers'
    /// default — not the tokenizer.json's own truncation.
    pub max_length: Option<MaxLength>,
    pub lower_case: bool,
}

/// Keys of `sentence_bert_config.json` that do not change a text embedding: the module
/// layout sentence-transformers 5 records (checked where it could differ), inputs
/// unpadding (the same arithmetic), and lengths for query/document tasks `embed` does
/// not use.
const INERT_SENTENCE_KEYS: [&str; 6] = [
    "unpad_inputs",
    "query_length",
    "document_length",
    "module_output_name",
    "config_args",
    "model_args",
];

/// Reads the sentence-transformers files of `dir` for an encoder of width `hidden`.
pub fn read(dir: &Path, hidden: usize) -> Result<SentenceFolder, FamilyError> {
    let modules_path = dir.join("modules.json");
    if !modules_path.is_file() {
        let max_length = tokenizer_max_length(dir)?;
        return Ok(SentenceFolder {
            head: SentenceHead::plain(),
            max_length,
            lower_case: false,
        });
    }
    let modules = json(&modules_path)?;
    let modules = modules
        .as_array()
        .ok_or_else(|| bad(&modules_path, None, "must be a JSON list of modules".into()))?;
    let mut head = SentenceHead::plain();
    let mut transformer = None;
    let mut pooled = false;
    for module in modules {
        let kind = module.get("type").and_then(Value::as_str).unwrap_or("");
        let path = module.get("path").and_then(Value::as_str).unwrap_or("");
        match kind.rsplit('.').next().unwrap_or("") {
            "Transformer" if transformer.is_none() => transformer = Some(dir.join(path)),
            "Pooling" if !pooled => {
                head.modes = pooling(&dir.join(path).join("config.json"), hidden)?;
                pooled = true;
            }
            "Normalize" => head.normalize = true,
            _ => {
                return Err(bad(&modules_path, None, format!(
                        "module `{kind}` changes the embedding and stagehand does not implement it (it runs a Transformer, a Pooling and a Normalize module)"
                    ),
                ))
            }
        }
    }
    let transformer = transformer.unwrap_or_else(|| dir.to_path_buf());
    let (max_length, lower_case) = transformer_config(&transformer)?;
    let max_length = match max_length {
        Some(length) => Some(length),
        None => tokenizer_max_length(&transformer)?,
    };
    Ok(SentenceFolder {
        head,
        max_length,
        lower_case,
    })
}

fn json(path: &Path) -> Result<Value, FamilyError> {
    read_json(path).map_err(|error| FamilyError::bad_file(path, error.to_string()))
}

/// The sentence-transformers config at `path` refuses `key` (`None`: the whole file).
fn bad(path: &Path, key: Option<&str>, problem: String) -> FamilyError {
    FamilyError::config(path, key, format!("{}: {problem}", path.display()))
}

/// The modes of a Pooling module's config (sentence-transformers' default, the mean,
/// when the file is missing).
fn pooling(path: &Path, hidden: usize) -> Result<Vec<Pooling>, FamilyError> {
    if !path.is_file() {
        return Ok(vec![Pooling::Mean]);
    }
    let config = json(path)?;
    let Some(config) = config.as_object() else {
        return Err(bad(path, None, "must be a JSON object".into()));
    };
    let mut named = None;
    let mut flagged = Vec::new();
    for (key, value) in config {
        match key.as_str() {
            "embedding_dimension" | "word_embedding_dimension" => {
                if value.as_u64() != Some(hidden as u64) {
                    return Err(bad(path, Some(key), format!("`{key}` is {value}, but the encoder's hidden_size is {hidden}"),
                    ));
                }
            }
            // Prompts are not used by `embed`: with none, including them changes nothing.
            "include_prompt" => {}
            "pooling_mode" => named = Some(mode_names(path, value)?),
            _ => match MODES.iter().find(|(_, flag, _)| flag == key) {
                Some((_, _, mode)) if value.as_bool() == Some(true) => flagged.push(*mode),
                Some(_) => {}
                None => {
                    return Err(bad(path, Some(key), format!("`{key}` is not a pooling setting stagehand knows; the modes it implements are {}", mode_list()),
                    ))
                }
            },
        }
    }
    // As sentence-transformers: the named modes win over the old flags (taken in its
    // order, not the file's), and no flag set means the mean.
    flagged.sort_by_key(|mode| MODES.iter().position(|(_, _, known)| known == mode));
    let modes = named.unwrap_or(flagged);
    Ok(if modes.is_empty() {
        vec![Pooling::Mean]
    } else {
        modes
    })
}

fn mode_list() -> String {
    MODES.map(|(name, _, _)| name).join(", ")
}

/// `pooling_mode`: one name or a list of names, kept in the order given.
fn mode_names(path: &Path, value: &Value) -> Result<Vec<Pooling>, FamilyError> {
    let names: Vec<&Value> = match value {
        Value::Array(names) => names.iter().collect(),
        single => vec![single],
    };
    names
        .into_iter()
        .map(|name| {
            let text = name.as_str().unwrap_or_default();
            MODES
                .iter()
                .find(|(mode, _, _)| *mode == text)
                .map(|(_, _, mode)| *mode)
                .ok_or_else(|| {
                    bad(
                        path,
                        Some("pooling_mode"),
                        format!(
                            "`pooling_mode` {name} is not a mode stagehand implements ({})",
                            mode_list()
                        ),
                    )
                })
        })
        .collect()
}

/// `max_seq_length` and `do_lower_case` of the Transformer's `sentence_bert_config.json`.
fn transformer_config(dir: &Path) -> Result<(Option<MaxLength>, bool), FamilyError> {
    let path = dir.join("sentence_bert_config.json");
    if !path.is_file() {
        return Ok((None, false));
    }
    let config = json(&path)?;
    let Some(config) = config.as_object() else {
        return Err(bad(&path, None, "must be a JSON object".into()));
    };
    let mut max_length = None;
    let mut lower_case = false;
    for (key, value) in config {
        match key.as_str() {
            "max_seq_length" => {
                max_length = match value {
                    Value::Null => None,
                    value => Some(MaxLength {
                        tokens: positive(&path, key, value)?,
                        source: "max_seq_length in sentence_bert_config.json".into(),
                    }),
                }
            }
            "do_lower_case" => {
                lower_case = value.as_bool().ok_or_else(|| {
                    bad(&path, Some("do_lower_case"), format!("`do_lower_case` is {value}; expected true or false"))
                })?
            }
            "transformer_task" if value.as_str() == Some("feature-extraction") => {}
            "modality_config" if is_text_forward(value) => {}
            "processing_kwargs" | "tokenizer_args" if is_empty(value) => {}
            key if INERT_SENTENCE_KEYS.contains(&key) => {}
            _ => {
                return Err(bad(&path, Some(key), format!("`{key}` is {value}: stagehand embeds text through the model's last hidden state with no extra tokenizer settings, and does not implement this one"),
                ))
            }
        }
    }
    Ok((max_length, lower_case))
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.values().all(is_empty),
        _ => false,
    }
}

/// sentence-transformers 5's layout for a text model: the forward pass's last hidden state.
fn is_text_forward(value: &Value) -> bool {
    let Some(modalities) = value.as_object() else {
        return false;
    };
    modalities.iter().all(|(modality, config)| {
        modality == "text"
            && config.get("method").and_then(Value::as_str) == Some("forward")
            && config.get("method_output_name").and_then(Value::as_str) == Some("last_hidden_state")
    })
}

fn positive(path: &Path, key: &str, value: &Value) -> Result<usize, FamilyError> {
    value
        .as_u64()
        .filter(|&length| length >= 1)
        .map(|length| length as usize)
        .ok_or_else(|| {
            bad(
                path,
                Some(key),
                format!("`{key}` is {value}; expected a whole number of tokens"),
            )
        })
}

/// Lengths at or above this mean "no limit" in transformers (`VERY_LARGE_INTEGER`).
const NO_LIMIT: u64 = 1 << 40;

/// `model_max_length` of `tokenizer_config.json`, where sentence-transformers 5 and
/// transformers keep the length they truncate at.
fn tokenizer_max_length(dir: &Path) -> Result<Option<MaxLength>, FamilyError> {
    let path = dir.join("tokenizer_config.json");
    if !path.is_file() {
        return Ok(None);
    }
    let config = json(&path)?;
    match config.get("model_max_length") {
        None | Some(Value::Null) => Ok(None),
        Some(value)
            if value
                .as_f64()
                .is_some_and(|length| length >= NO_LIMIT as f64) =>
        {
            Ok(None)
        }
        Some(value) => Ok(Some(MaxLength {
            tokens: positive(&path, "model_max_length", value)?,
            source: "model_max_length in tokenizer_config.json".into(),
        })),
    }
}

#[cfg(test)]
mod tests;

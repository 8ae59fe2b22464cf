//! PEFT's `adapter_config.json`, read as `peft` applies it at inference, and checked
//! against the model the adapter is attached to.
//!
//! Implemented: `r` (must be the factors' rank), `lora_alpha`, `use_rslora` (the scale
//! becomes alpha / √r), `target_modules` (a list of module-name suffixes, a regular
//! expression matched against whole module names, or `all-linear`: each must name at
//! least one weight of the model), `peft_type` `LORA`, `base_model_name_or_path` (see
//! [`check_base`]). Keys that change nothing at inference are listed in [`INERT_KEYS`].
//! Any other key is accepted only at its default (null, false, empty, `"none"`): a key
//! that changes the math and is set (`use_dora`, `modules_to_save`, `bias` other than
//! `"none"`, `fan_in_fan_out`, `rank_pattern`, `alpha_pattern`, `layer_replication`,
//! `lora_bias`, …) is refused by name.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{LoraAlias, LoraError};
use crate::model::{ModelFolder, ModelIndex};

/// Keys that do not change what an adapter computes at inference, and why.
pub const INERT_KEYS: [(&str, &str); 19] = [
    ("lora_dropout", "dropout is off at inference"),
    ("inference_mode", "how peft loads it"),
    ("task_type", "the head peft wraps, not the adapted weights"),
    ("peft_version", "provenance"),
    ("revision", "provenance"),
    ("auto_mapping", "the class peft loads"),
    ("init_lora_weights", "initialisation, before training"),
    ("loftq_config", "initialisation"),
    ("eva_config", "initialisation"),
    ("corda_config", "initialisation"),
    ("lora_ga_config", "initialisation"),
    ("ensure_weight_tying", "training"),
    (
        "layers_to_transform",
        "which layers got factors: the file says",
    ),
    ("layers_pattern", "which layers got factors: the file says"),
    (
        "exclude_modules",
        "which modules got factors: the file says",
    ),
    (
        "megatron_core",
        "the module peft imports for Megatron layers",
    ),
    ("qalora_group_size", "used only with use_qalora"),
    ("base_model_class", "provenance"),
    ("parent_library", "provenance"),
];

/// What a PEFT adapter config says about the math.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PeftConfig {
    pub rank: Option<usize>,
    pub alpha: Option<f32>,
    /// rsLoRA: scale alpha / √r instead of alpha / r.
    pub rslora: bool,
    pub targets: Option<Targets>,
    pub base: Option<String>,
}

/// `target_modules` as PEFT matches it.
#[derive(Debug, Clone, PartialEq)]
pub enum Targets {
    /// Module names equal to one of these, or ending in `.` + one of them.
    Suffixes(Vec<String>),
    /// A regular expression every matched module name matches as a whole.
    Pattern(String),
    /// `all-linear`: every linear layer but the output head.
    AllLinear,
}

fn default_like(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => true,
        Value::String(text) => text.is_empty() || text == "none",
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        Value::Number(_) | Value::Bool(true) => false,
    }
}

/// Parses `text`, the `adapter_config.json` at `config_path`.
pub fn parse(config_path: &Path, text: &str) -> Result<PeftConfig, LoraError> {
    let fail = |reason: String| LoraError::Config {
        path: config_path.to_path_buf(),
        reason,
    };
    let value: Value = serde_json::from_str(text).map_err(|error| fail(error.to_string()))?;
    let Some(object) = value.as_object() else {
        return Err(fail("must be a JSON object".to_string()));
    };
    let mut config = PeftConfig::default();
    for (key, value) in object {
        match key.as_str() {
            "peft_type" if value.as_str() == Some("LORA") => {}
            "peft_type" => {
                return Err(fail(format!(
                    "peft_type {value}: stagehand applies LoRA adapters (\"LORA\") only"
                )))
            }
            "r" => {
                let rank = value.as_u64().filter(|&rank| rank >= 1);
                config.rank = Some(rank.ok_or_else(|| {
                    fail(format!("r {value} is not a rank (a whole number from 1)"))
                })? as usize);
            }
            "lora_alpha" => {
                let alpha = value.as_f64().filter(|alpha| alpha.is_finite());
                config.alpha = Some(alpha.ok_or_else(|| {
                    fail(format!("lora_alpha {value} is not a finite number"))
                })? as f32);
            }
            "use_rslora" => {
                config.rslora = value
                    .as_bool()
                    .ok_or_else(|| fail(format!("use_rslora {value} is not true or false")))?;
            }
            "target_modules" => config.targets = targets(value).map_err(fail)?,
            "base_model_name_or_path" => {
                config.base = value.as_str().filter(|name| !name.is_empty()).map(String::from)
            }
            key if INERT_KEYS.iter().any(|(inert, _)| *inert == key) => {}
            _ if default_like(value) => {}
            _ => {
                return Err(fail(format!(
                    "{key} is {value}: it changes what the adapter computes and stagehand does not implement it (it applies plain LoRA: W + scale·B·A)"
                )))
            }
        }
    }
    Ok(config)
}

fn targets(value: &Value) -> Result<Option<Targets>, String> {
    match value {
        Value::Null => Ok(None),
        Value::String(name) if name == "all-linear" => Ok(Some(Targets::AllLinear)),
        Value::String(pattern) => regex::Regex::new(&format!("^(?:{pattern})$"))
            .map(|_| Some(Targets::Pattern(pattern.clone())))
            .map_err(|error| {
                let detail = error.to_string().lines().last().unwrap_or("").to_string();
                format!("target_modules {value} is not a regular expression ({detail})")
            }),
        Value::Array(names) => names
            .iter()
            .map(|name| {
                name.as_str()
                    .map(String::from)
                    .ok_or_else(|| format!("target_modules holds {name}, not a module name"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|names| Some(Targets::Suffixes(names))),
        _ => Err(format!(
            "target_modules {value} is not a list of module names"
        )),
    }
}

/// Checks that every target of `config` names a weight of `index`: a module of the
/// model is a 2-D `<module>.weight` tensor, or one of `aliases` (its weights in
/// another layout).
pub fn check_targets(
    config_path: &Path,
    config: &PeftConfig,
    index: &ModelIndex,
    aliases: &[LoraAlias],
) -> Result<(), LoraError> {
    // A module of another layout of the same weights is one of the model's modules.
    let modules: Vec<&str> = index
        .tensors
        .iter()
        .filter(|tensor| tensor.shape.len() == 2)
        .filter_map(|tensor| tensor.name.strip_suffix(".weight"))
        .chain(aliases.iter().map(|alias| alias.module.as_str()))
        .collect();
    let unmatched = |target: &str| {
        LoraError::Config {
        path: config_path.to_path_buf(),
        reason: format!(
            "target_modules {target} matches no weight of {} (its modules are named like `{}`): is this an adapter for another model?",
            index.path.display(),
            modules.first().copied().unwrap_or("")
        ),
    }
    };
    match &config.targets {
        None | Some(Targets::AllLinear) => Ok(()),
        Some(Targets::Pattern(pattern)) => {
            let full = regex::Regex::new(&format!("^(?:{pattern})$"))
                .map_err(|_| unmatched(&format!("{pattern:?}")))?;
            match modules.iter().any(|module| full.is_match(module)) {
                true => Ok(()),
                false => Err(unmatched(&format!("{pattern:?}"))),
            }
        }
        Some(Targets::Suffixes(names)) => {
            for name in names {
                let dotted = format!(".{name}");
                let found = modules
                    .iter()
                    .any(|module| *module == name || module.ends_with(&dotted));
                if !found {
                    return Err(unmatched(&format!("\"{name}\"")));
                }
            }
            Ok(())
        }
    }
}

/// Words in a model name and the `model_type`s a model so named can have. The first
/// word found in a name decides (so `distilbert` and `roberta` are not read as `bert`).
const NAMED_ARCHITECTURES: [(&str, &[&str]); 21] = [
    ("distilbert", &["distilbert"]),
    ("deberta", &["deberta", "deberta-v2"]),
    ("camembert", &["camembert"]),
    ("roberta", &["roberta", "xlm-roberta"]),
    ("mpnet", &["mpnet"]),
    ("electra", &["electra"]),
    ("minilm", &["bert"]),
    ("bge-", &["bert", "xlm-roberta"]),
    ("bert", &["bert"]),
    ("tinyllama", &["llama"]),
    ("llama", &["llama"]),
    ("mixtral", &["mixtral"]),
    ("mistral", &["mistral"]),
    ("qwen", &["qwen2", "qwen2_moe", "qwen3", "qwen3_moe"]),
    ("gemma", &["gemma", "gemma2", "gemma3"]),
    ("phi", &["phi", "phi3"]),
    ("gpt2", &["gpt2"]),
    ("falcon", &["falcon"]),
    ("t5", &["t5", "mt5"]),
    ("bloom", &["bloom"]),
    ("deepseek", &["deepseek_v2", "deepseek_v3"]),
];

/// The rule for `base_model_name_or_path` (the Hub name or local path the adapter was
/// trained on): the adapter is refused when the name says it is for another kind of
/// model than the model folder's `config.json` `model_type` — the first architecture
/// word of [`NAMED_ARCHITECTURES`] in the name's last component (`Llama-3.2-1B`,
/// `all-MiniLM-L6-v2`) allows only its model types. A name with no such word, or
/// whose last component is the model folder's own name, is accepted: folders are
/// renamed and snapshot folders are hashes, and the factors' names and shapes are
/// checked against the weights anyway.
pub fn check_base(
    config_path: &Path,
    config: &PeftConfig,
    index: &ModelIndex,
) -> Result<(), LoraError> {
    let Some(base) = &config.base else {
        return Ok(());
    };
    let Ok(Some(folder)) = ModelFolder::find(&index.path) else {
        return Ok(());
    };
    let Some(model_type) = folder.model_type() else {
        return Ok(());
    };
    let folder_name = folder
        .dir
        .file_name()
        .map(|name| name.to_string_lossy().to_string());
    let Some(word) = base_conflict(base, folder_name.as_deref(), &model_type) else {
        return Ok(());
    };
    Err(LoraError::Config {
        path: config_path.to_path_buf(),
        reason: format!(
            "base_model_name_or_path \"{base}\" names a {} model, but {} is a `{model_type}` model (config.json): give the adapter trained for this model",
            word.trim_end_matches('-'),
            folder.dir.display()
        ),
    })
}

/// The architecture word of `base` that rules out `model_type`, if any (see
/// [`check_base`]).
pub fn base_conflict(
    base: &str,
    folder_name: Option<&str>,
    model_type: &str,
) -> Option<&'static str> {
    let last = base
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(base)
        .to_lowercase();
    if folder_name.is_some_and(|name| name.to_lowercase() == last) {
        return None;
    }
    let (word, types) = NAMED_ARCHITECTURES
        .iter()
        .find(|(word, _)| last.contains(word))?;
    (!types.contains(&model_type)).then_some(*word)
}

/// The weights file of a PEFT adapter folder, after checking it has its config.
pub fn folder_weights(dir: &Path) -> Result<PathBuf, LoraError> {
    let fail = |reason: String| LoraError::Io {
        path: dir.to_path_buf(),
        reason,
    };
    if !dir.join("adapter_config.json").is_file() {
        return Err(fail(
            "a folder given to --lora must be a PEFT adapter folder, and it has no adapter_config.json (peft's save_pretrained writes it beside adapter_model.safetensors); give the folder peft saved, or a .safetensors file".to_string(),
        ));
    }
    let weights = dir.join("adapter_model.safetensors");
    if weights.is_file() {
        return Ok(weights);
    }
    if dir.join("adapter_model.bin").is_file() {
        return Err(fail(
            "holds adapter_model.bin (a pickle, which stagehand does not load); save the adapter with safe_serialization=True or convert it to adapter_model.safetensors".to_string(),
        ));
    }
    Err(fail(
        "has adapter_config.json but no adapter_model.safetensors".to_string(),
    ))
}

#[cfg(test)]
mod tests;

//! Reading an adapter file and mapping its modules to the model's tensors.
//!
//! PEFT names a module's factors `<module>.lora_A.weight` / `<module>.lora_B.weight`
//! with `<module>` a dotted path, often under `base_model.model.`; its scale comes from
//! a per-module `<module>.alpha` tensor, `lora_alpha` in the file header's
//! `lora_adapter_metadata` (diffusers' `save_lora_weights`, [`HEADER_CONFIG_KEY`]), or
//! `lora_alpha` in an `adapter_config.json` beside the file. kohya names them `<module>.lora_down.weight` / `.lora_up.weight`
//! (+ `<module>.alpha`) with `<module>` the dotted path flattened with `_` behind a
//! `lora_unet_`-style prefix. Without an alpha, alpha = rank (scale = strength).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

use super::names::BaseNames;
use super::targets::targets;
use super::{Adapter, LoraAlias, LoraError};
use crate::model::ModelIndex;

/// How many unmatched keys an error lists.
const LISTED_KEYS: usize = 5;
/// Adapter files are small; anything above this is not a LoRA we should read whole.
const MAX_ADAPTER_BYTES: u64 = 16 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    Peft,
    Kohya,
}

impl std::fmt::Display for Naming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Naming::Peft => "PEFT (lora_A/lora_B)",
            Naming::Kohya => "kohya (lora_down/lora_up)",
        })
    }
}

impl Naming {
    fn suffixes(self) -> (&'static str, &'static str) {
        match self {
            Naming::Peft => (".lora_A.weight", ".lora_B.weight"),
            Naming::Kohya => (".lora_down.weight", ".lora_up.weight"),
        }
    }
}

/// One module's raw factors as read.
#[derive(Default)]
pub(super) struct Module {
    pub(super) down: Option<(Vec<usize>, Vec<f32>)>,
    pub(super) up: Option<(Vec<usize>, Vec<f32>)>,
    pub(super) alpha: Option<f32>,
}

/// Loads `path` and maps it onto `index`, or onto `aliases` (another layout of the
/// model's weights, [`LoraAlias`]) for a module the model does not name. `name` must be
/// unique among attached adapters.
pub fn load_adapter(
    path: &Path,
    strength: f32,
    name: String,
    index: &ModelIndex,
    aliases: &[LoraAlias],
) -> Result<Adapter, LoraError> {
    let io = |reason: String| LoraError::Io {
        path: path.to_path_buf(),
        reason,
    };
    // A PEFT adapter folder: its adapter_model.safetensors, with the config required.
    let folder_weights;
    let path = if path.is_dir() {
        folder_weights = super::peft::folder_weights(path)?;
        folder_weights.as_path()
    } else {
        path
    };
    // A FIFO or a device is refused at once rather than waited on.
    let bytes = crate::model::read_regular(path, MAX_ADAPTER_BYTES)
        .map_err(|error| io(format!("{error} (a LoRA file is a safetensors file)")))?;
    let config = peft_config_text(path)?;
    parse_adapter(
        path,
        &bytes,
        config.as_deref(),
        strength,
        name,
        index,
        aliases,
    )
}

/// Maps an adapter file's bytes onto `index`; `config` is the text of the
/// `adapter_config.json` beside it, if any. `path` only names the file in errors.
/// (The LoRA fuzz target's entry point.)
pub fn parse_adapter(
    path: &Path,
    bytes: &[u8],
    config: Option<&str>,
    strength: f32,
    name: String,
    index: &ModelIndex,
    aliases: &[LoraAlias],
) -> Result<Adapter, LoraError> {
    let file = SafeTensors::deserialize(bytes).map_err(|error| LoraError::Format {
        path: path.to_path_buf(),
        reason: error.to_string(),
    })?;
    let mut keys: Vec<String> = file.names().into_iter().map(str::to_string).collect();
    keys.sort();
    let naming = guess_naming(&keys).ok_or_else(|| LoraError::UnknownNaming {
        path: path.to_path_buf(),
        first: keys.iter().take(LISTED_KEYS).cloned().collect(),
    })?;
    let modules = read_modules(path, &file, &keys, naming)?;
    // diffusers keeps the LoraConfig in the file's header; it wins over a file beside it.
    let header = header_config(path, bytes, &keys)?;
    let (config, config_path) = match &header {
        Some(text) => (
            Some(text.as_str()),
            PathBuf::from(format!("{} ({HEADER_CONFIG_KEY})", path.display())),
        ),
        None => (config, path.with_file_name("adapter_config.json")),
    };
    let peft = match config {
        Some(text) if naming == Naming::Peft => {
            let peft = super::peft::parse(&config_path, text)?;
            super::peft::check_base(&config_path, &peft, index)?;
            super::peft::check_targets(&config_path, &peft, index, aliases)?;
            only_factors(path, &keys)?;
            peft
        }
        _ => super::peft::PeftConfig::default(),
    };
    let config_alpha = peft.alpha;
    let bases = BaseNames::new(index, aliases);

    let mut unmatched = Vec::new();
    let mut targets = Vec::with_capacity(modules.len());
    for (module_name, module) in &modules {
        let Some(found) = bases.find(module_name, naming) else {
            unmatched.push(module_name.clone());
            continue;
        };
        targets.extend(self::targets(
            path,
            index,
            &bases,
            found,
            module_name,
            module,
            config_alpha,
        )?);
    }
    if !unmatched.is_empty() {
        return Err(LoraError::Unmatched {
            path: path.to_path_buf(),
            model: index.path.clone(),
            naming,
            count: unmatched.len(),
            total: modules.len(),
            hint: block_hint(&unmatched[0], index, aliases),
            first: unmatched.into_iter().take(LISTED_KEYS).collect(),
        });
    }
    if let Some(rank) = peft.rank {
        if let Some(other) = targets.iter().find(|target| target.rank != rank) {
            return Err(LoraError::Config {
                path: config_path,
                reason: format!(
                    "r is {rank}, but the factors of `{}` have rank {} (rank_pattern is not implemented)",
                    other.base, other.rank
                ),
            });
        }
    }
    for target in &mut targets {
        target.rslora = peft.rslora;
    }
    // Adapter order is application order: keep it stable (by base tensor position,
    // then by the rows a piece of a fused weight patches).
    targets.sort_by_key(|target| (target.tensor, target.first_row));
    Ok(Adapter {
        name,
        path: path.to_path_buf(),
        naming,
        strength,
        targets,
    })
}

/// For a dotted `module` that names block N of a list (`…single_transformer_blocks.7.…`):
/// the blocks of that list the model has, in its own names or its aliases', when it
/// has any. (A kohya name's flattened number cannot be told from its words.)
fn block_hint(module: &str, index: &ModelIndex, aliases: &[LoraAlias]) -> Option<String> {
    let components: Vec<&str> = module.split('.').collect();
    let at = components
        .iter()
        .position(|part| super::names::is_number(part))?;
    let list = *components.get(at.checked_sub(1)?)?;
    let names = index
        .tensors
        .iter()
        .map(|tensor| tensor.name.as_str())
        .chain(aliases.iter().map(|alias| alias.module.as_str()));
    let numbers = names.filter_map(|name| {
        let parts: Vec<&str> = name.split('.').collect();
        parts
            .windows(2)
            .find(|pair| pair[0] == list && super::names::is_number(pair[1]))
            .and_then(|pair| pair[1].parse::<usize>().ok())
    });
    let last = numbers.max()?;
    let named: usize = components[at].parse().ok()?;
    if named <= last {
        return None;
    }
    Some(format!(
        "`{module}` names {list} {}, and this model's run from 0 to {last}",
        components[at]
    ))
}

fn guess_naming(keys: &[String]) -> Option<Naming> {
    let count = |naming: Naming| {
        let (down, up) = naming.suffixes();
        keys.iter()
            .filter(|key| key.ends_with(down) || key.ends_with(up))
            .count()
    };
    let (peft, kohya) = (count(Naming::Peft), count(Naming::Kohya));
    match (peft, kohya) {
        (0, 0) => None,
        (peft, kohya) if peft >= kohya => Some(Naming::Peft),
        _ => Some(Naming::Kohya),
    }
}

fn read_modules(
    path: &Path,
    file: &SafeTensors<'_>,
    keys: &[String],
    naming: Naming,
) -> Result<BTreeMap<String, Module>, LoraError> {
    let (down_suffix, up_suffix) = naming.suffixes();
    let mut modules: BTreeMap<String, Module> = BTreeMap::new();
    for key in keys {
        let view = file.tensor(key).map_err(|error| LoraError::Format {
            path: path.to_path_buf(),
            reason: error.to_string(),
        })?;
        if let Some(module) = key.strip_suffix(down_suffix) {
            let values = to_f32(path, key, view.dtype(), view.data())?;
            modules.entry(module.to_string()).or_default().down =
                Some((view.shape().to_vec(), values));
        } else if let Some(module) = key.strip_suffix(up_suffix) {
            let values = to_f32(path, key, view.dtype(), view.data())?;
            modules.entry(module.to_string()).or_default().up =
                Some((view.shape().to_vec(), values));
        } else if let Some(module) = key.strip_suffix(".alpha") {
            let values = to_f32(path, key, view.dtype(), view.data())?;
            let [alpha] = values[..] else {
                return Err(LoraError::Shape {
                    path: path.to_path_buf(),
                    key: key.clone(),
                    problem: format!("alpha must be one value, found {}", values.len()),
                });
            };
            modules.entry(module.to_string()).or_default().alpha = Some(alpha);
        }
        // Other keys (e.g. kohya's text-encoder metadata tensors) are not factors.
    }
    Ok(modules)
}

/// The safetensors header entry where diffusers' `save_lora_weights` (and a model's
/// `save_lora_adapter`) keep the adapter's PEFT `LoraConfig` as JSON: its `r`,
/// `lora_alpha`, `target_modules`, …, each key behind the pipeline component's name
/// (`transformer.lora_alpha`) or, from a model's own save, bare. Such a file has no
/// `.alpha` tensors: without this, alpha = rank would scale the update wrongly.
pub const HEADER_CONFIG_KEY: &str = "lora_adapter_metadata";

/// The adapter's PEFT config from the file's header, as the text of an
/// `adapter_config.json`: the entries of the component whose factors the file holds
/// (the first component of its factor names, `transformer`), with that prefix taken
/// off; or the whole object when its entries are bare. `None` without the entry, or
/// when it describes only other components.
fn header_config(path: &Path, bytes: &[u8], keys: &[String]) -> Result<Option<String>, LoraError> {
    let fail = |reason: String| LoraError::Config {
        path: PathBuf::from(format!("{} ({HEADER_CONFIG_KEY})", path.display())),
        reason,
    };
    let (_, metadata) = SafeTensors::read_metadata(bytes).map_err(|error| LoraError::Format {
        path: path.to_path_buf(),
        reason: error.to_string(),
    })?;
    let Some(text) = metadata
        .metadata()
        .as_ref()
        .and_then(|entries| entries.get(HEADER_CONFIG_KEY))
    else {
        return Ok(None);
    };
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|error| fail(format!("not JSON: {error}")))?;
    let Some(entries) = value.as_object() else {
        return Err(fail("must be a JSON object".to_string()));
    };
    if entries.contains_key("r") || entries.contains_key("peft_type") {
        return Ok(Some(text.clone()));
    }
    let component = keys
        .first()
        .and_then(|key| key.split_once('.'))
        .map_or("", |(first, _)| first);
    let prefix = format!("{component}.");
    let own: serde_json::Map<String, serde_json::Value> = entries
        .iter()
        .filter_map(|(key, value)| Some((key.strip_prefix(&prefix)?.to_string(), value.clone())))
        .collect();
    Ok((!own.is_empty()).then(|| serde_json::Value::Object(own).to_string()))
}

/// Config files are a few hundred bytes; this bounds what is read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The text of the `adapter_config.json` beside `path`, if there is one (PEFT keeps
/// alpha there).
fn peft_config_text(path: &Path) -> Result<Option<String>, LoraError> {
    let config_path = path.with_file_name("adapter_config.json");
    if !config_path.exists() {
        return Ok(None);
    }
    let config_error = |reason: String| LoraError::Config {
        path: config_path.clone(),
        reason,
    };
    let bytes = crate::model::read_regular(&config_path, MAX_CONFIG_BYTES)
        .map_err(|error| config_error(error.to_string()))?;
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| config_error("not UTF-8 text".to_string()))
}

/// A PEFT adapter's file holds its factors only: anything else (DoRA's
/// `lora_magnitude_vector`, trained biases, `lora_embedding_A`, saved modules) changes
/// the model in a way stagehand does not apply, and is refused by name.
fn only_factors(path: &Path, keys: &[String]) -> Result<(), LoraError> {
    let (down, up) = Naming::Peft.suffixes();
    match keys
        .iter()
        .find(|key| !key.ends_with(down) && !key.ends_with(up))
    {
        None => Ok(()),
        Some(key) => Err(LoraError::Shape {
            path: path.to_path_buf(),
            key: key.clone(),
            problem: "is not a lora_A/lora_B factor; stagehand applies plain LoRA and does not implement what this tensor adds".to_string(),
        }),
    }
}

fn to_f32(path: &Path, key: &str, dtype: Dtype, data: &[u8]) -> Result<Vec<f32>, LoraError> {
    let values = match dtype {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
            .collect(),
        other => {
            return Err(LoraError::Dtype {
                path: PathBuf::from(path),
                key: key.to_string(),
                dtype: format!("{other:?}"),
            })
        }
    };
    Ok(values)
}

/// IEEE half → single, exact (every f16 is representable as an f32).
pub(crate) fn f16_to_f32(half: u16) -> f32 {
    let sign = u32::from(half >> 15) << 31;
    let exponent = u32::from((half >> 10) & 0x1f);
    let mantissa = u32::from(half & 0x3ff);
    let bits = match (exponent, mantissa) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: normalise the mantissa.
            let shift = mantissa.leading_zeros() - 21;
            let mantissa = (mantissa << shift) & 0x3ff;
            sign | ((113 - shift) << 23) | (mantissa << 13)
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, _) => sign | 0x7fc0_0000 | (mantissa << 13),
        _ => sign | ((exponent + 112) << 23) | (mantissa << 13),
    };
    f32::from_bits(bits)
}

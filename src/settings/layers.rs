//! Reading each configuration layer into flat (key, value, source) entries.
//!
//! The `config` crate reads the TOML files and the environment; merging is done here,
//! key by key, so every value keeps the name of the layer it came from.

use std::collections::BTreeMap;
use std::path::Path;

use config::{Environment, File, FileFormat, Map, Source as _, Value, ValueKind};

use super::error::{one_line, SettingsError};
use super::keys::{known_key, KEYS};
use super::provenance::Source;

pub(crate) type Entry = (String, Value, Source);

const ENV_PREFIX: &str = "STAGEHAND";
/// Separator of nested keys in variable names. Our keys are flat, so a variable that
/// uses it is always a mistake; the config crate would silently drop such a key if we
/// deserialized straight into the struct, so it is reported instead.
const ENV_NESTING: &str = "__";

pub(crate) fn file_layer(path: &Path, source: Source) -> Result<Vec<Entry>, SettingsError> {
    if !path.exists() {
        return Err(SettingsError::File {
            path: path.to_path_buf(),
            reason: "no such file".to_string(),
        });
    }
    // Read here, not by the config crate, so that a FIFO or a device is refused at
    // once instead of blocking.
    let bytes = crate::os::read_regular(path, MAX_CONFIG_FILE_BYTES).map_err(|error| {
        SettingsError::File {
            path: path.to_path_buf(),
            reason: error.to_string(),
        }
    })?;
    let text = String::from_utf8(bytes).map_err(|_| SettingsError::File {
        path: path.to_path_buf(),
        reason: "not UTF-8 text".to_string(),
    })?;
    text_layer(path, &text, source)
}

/// A configuration file is a page of TOML; this bounds what is read.
const MAX_CONFIG_FILE_BYTES: u64 = 1 << 20;

/// The entries of a TOML file's text; `path` only names it in errors.
pub(crate) fn text_layer(
    path: &Path,
    text: &str,
    source: Source,
) -> Result<Vec<Entry>, SettingsError> {
    let table = File::from_str(text, FileFormat::Toml)
        .required(true)
        .collect()
        .map_err(|error| SettingsError::File {
            path: path.to_path_buf(),
            reason: one_line(&error.to_string()),
        })?;
    let mut entries = Vec::new();
    flatten("", table, &source, &mut entries);
    Ok(entries)
}

/// `STAGEHAND_*` variables that are not settings: the opt-in switch of the GPU test
/// suite and the python with the `openai` client that CI names for the serve test
/// (`.ci/run`), both set around test binaries that in turn start `stagehand`, and
/// the CPU path a test run forces ([`CPU_PATH_ENV`]). Every
/// other `STAGEHAND_*` variable must be a setting, so a typo is reported instead of
/// ignored.
pub const NOT_SETTINGS_ENV: &[&str] = &[
    "STAGEHAND_GPU_TESTS",
    "STAGEHAND_OPENAI_PYTHON",
    CPU_PATH_ENV,
];

/// Caps the CPU backend's lanes below what the CPU has (`portable` or `avx2`), so one
/// machine runs the kernels' lower paths: for tests and diagnosis, not a deployment
/// setting (it changes no result's meaning, only which instructions compute it).
pub const CPU_PATH_ENV: &str = "STAGEHAND_CPU_PATH";

/// `STAGEHAND_*` variables from `env` (name → value). Values are taken verbatim from
/// `env`, not as the config crate guessed their type, so "1e3" stays "1e3".
pub(crate) fn env_layer(env: &BTreeMap<String, String>) -> Result<Vec<Entry>, SettingsError> {
    let source_map: Map<String, String> = env
        .iter()
        .filter(|(name, _)| {
            !NOT_SETTINGS_ENV
                .iter()
                .any(|reserved| name.eq_ignore_ascii_case(reserved))
        })
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let table = Environment::with_prefix(ENV_PREFIX)
        .prefix_separator("_")
        .separator(ENV_NESTING)
        .try_parsing(true)
        .source(Some(source_map))
        .collect()
        .map_err(|error| SettingsError::Environment {
            reason: one_line(&error.to_string()),
        })?;
    let mut flat = Vec::new();
    flatten("", table, &Source::Default, &mut flat);
    let entries = flat
        .into_iter()
        .map(|(key, value, _)| {
            let guessed_name = format!(
                "{ENV_PREFIX}_{}",
                key.replace('.', ENV_NESTING).to_ascii_uppercase()
            );
            let original = env
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(&guessed_name));
            match original {
                Some((name, raw)) => (key, Value::from(raw.as_str()), Source::Env(name.clone())),
                None => (key, value, Source::Env(guessed_name)),
            }
        })
        .collect();
    Ok(entries)
}

/// Nested tables become dotted keys, which are never known settings and so get reported.
fn flatten(prefix: &str, table: Map<String, Value>, source: &Source, out: &mut Vec<Entry>) {
    let mut sorted: Vec<(String, Value)> = table.into_iter().collect();
    sorted.sort_by(|left, right| left.0.cmp(&right.0));
    for (key, value) in sorted {
        let full_key = if prefix.is_empty() {
            key
        } else {
            format!("{prefix}.{key}")
        };
        match value.kind {
            ValueKind::Table(inner) => flatten(&full_key, inner, source, out),
            _ => out.push((full_key, value, source.clone())),
        }
    }
}

/// What the user probably meant by an unknown key, as "; ..." or "".
pub(crate) fn unknown_key_hint(key: &str, source: &Source) -> String {
    let flat = key.replace(['.', '-'], "_");
    if let Some(known) = known_key(&flat) {
        return match source {
            Source::Env(_) => format!(
                "; settings are not nested: use {ENV_PREFIX}_{} (single underscores)",
                known.to_ascii_uppercase()
            ),
            _ => format!("; did you mean `{known}`?"),
        };
    }
    format!("; known settings: {}", KEYS.join(", "))
}

//! Merging the layers: built-in defaults (the shipped `config/default.toml`, compiled
//! in) < `config/default.toml` in the working directory < `--config FILE` <
//! `STAGEHAND_*` environment < flags, then validation.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::args::SettingsArgs;
use super::error::SettingsError;
use super::keys::{apply, decimal_size_note, known_key, value_text};
use super::layers::{env_layer, file_layer, text_layer, unknown_key_hint, Entry};
use super::provenance::{Provenance, Source};
use super::validate::clamp;
use super::Settings;

/// Where the shipped defaults are documented, relative to the working directory: a
/// file there is read as an override of the built-in defaults.
pub const DEFAULT_FILE: &str = "config/default.toml";

/// The shipped defaults, compiled into the binary: an installed `stagehand` behaves
/// the same wherever it runs and whatever happened to the tree it was built from.
/// The file documents every key; `Settings::default()` holds the same values (a test
/// keeps them equal).
pub const BUILT_IN_DEFAULTS_TOML: &str = include_str!("../../config/default.toml");

/// The effective settings and, per key, the layer that set them.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    pub settings: Settings,
    pub provenance: Provenance,
}

/// The inputs of [`load_with`] that come from the process, made explicit so tests can
/// load settings without touching the real environment or working directory.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// `None` skips the default-file layer.
    pub default_file: Option<PathBuf>,
    /// Environment variables, name → value (only `STAGEHAND_*` ones matter).
    pub env: BTreeMap<String, String>,
}

impl LoadOptions {
    /// The real process: `config/default.toml` under the working directory if there
    /// is one, and the process environment.
    pub fn from_process() -> Self {
        let env = std::env::vars_os()
            .filter_map(|(name, value)| {
                let name = name.into_string().ok()?;
                // A non-UTF-8 value of ours still gets reported (lossily) rather than
                // silently dropped.
                name.to_ascii_uppercase()
                    .starts_with("STAGEHAND_")
                    .then(|| (name, value.to_string_lossy().into_owned()))
            })
            .collect();
        Self {
            default_file: find_default_file(),
            env,
        }
    }
}

/// `config/default.toml` under the working directory, if there is one. Never the
/// tree the binary was built from: the built-in defaults are compiled in
/// ([`BUILT_IN_DEFAULTS_TOML`]).
pub fn find_default_file() -> Option<PathBuf> {
    let path = std::env::current_dir().ok()?.join(DEFAULT_FILE);
    path.is_file().then_some(path)
}

/// Loads the settings the way every subcommand does.
pub fn load(args: &SettingsArgs) -> Result<Loaded, SettingsError> {
    load_with(args, &LoadOptions::from_process())
}

pub fn load_with(args: &SettingsArgs, options: &LoadOptions) -> Result<Loaded, SettingsError> {
    let mut layers: Vec<Vec<Entry>> = Vec::with_capacity(5);
    layers.push(text_layer(
        Path::new(DEFAULT_FILE),
        BUILT_IN_DEFAULTS_TOML,
        Source::Default,
    )?);
    if let Some(path) = &options.default_file {
        if path.is_file() {
            layers.push(file_layer(path, Source::DefaultFile(path.clone()))?);
        }
    }
    if let Some(path) = &args.config {
        layers.push(file_layer(path, Source::ConfigFile(path.clone()))?);
    }
    layers.push(env_layer(&options.env)?);
    layers.push(args.entries());
    merge(layers)
}

/// Applies the layers in order (later wins) and validates the result. The settings
/// fuzz target enters here with a TOML text and an environment.
pub fn load_layers(toml: &str, env: &BTreeMap<String, String>) -> Result<Loaded, SettingsError> {
    let path = Path::new("fuzz.toml");
    let layers = vec![
        text_layer(path, toml, Source::ConfigFile(path.to_path_buf()))?,
        env_layer(env)?,
    ];
    merge(layers)
}

fn merge(layers: Vec<Vec<Entry>>) -> Result<Loaded, SettingsError> {
    let mut settings = Settings::default();
    let mut provenance = Provenance::default();
    for (key, value, source) in layers.into_iter().flatten() {
        let Some(known) = known_key(&key) else {
            return Err(SettingsError::UnknownKey {
                hint: unknown_key_hint(&key, &source),
                key,
                value: value_text(&value),
                layer: source,
            });
        };
        let text = value_text(&value);
        let note = decimal_size_note(known, &value);
        apply(&mut settings, known, value).map_err(|reason| SettingsError::BadValue {
            key: key.clone(),
            value: text,
            layer: source.clone(),
            reason,
        })?;
        provenance.set(known, source);
        if let Some(note) = note {
            provenance.note(known, note);
        }
    }

    for (key, note) in clamp(&mut settings) {
        provenance.note(key, note);
    }
    settings.check().map_err(|invalid| {
        let layer = provenance
            .get(invalid.key)
            .map_or(Source::Default, |origin| origin.source.clone());
        SettingsError::BadValue {
            key: invalid.key.to_string(),
            value: invalid.value,
            layer,
            reason: invalid.reason,
        }
    })?;
    settings.choose_prefetch_depth = !provenance.set_by_user("prefetch_depth");
    Ok(Loaded {
        settings,
        provenance,
    })
}

//! Which layer set each setting: what `stagehand config` prints, and what every error
//! message names.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

use super::keys::KEYS;

/// One configuration layer, lowest priority first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "layer", content = "name", rename_all = "snake_case")]
pub enum Source {
    /// Built into the binary (the shipped `config/default.toml`, compiled in).
    Default,
    /// A `config/default.toml` in the working directory, over the built-in defaults.
    DefaultFile(PathBuf),
    /// The file given with `--config`.
    ConfigFile(PathBuf),
    /// A `STAGEHAND_*` environment variable (its name).
    Env(String),
    /// A command-line flag (`--vram-budget`).
    Flag(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => write!(f, "the built-in default"),
            Source::DefaultFile(path) => write!(f, "{}", path.display()),
            Source::ConfigFile(path) => write!(f, "--config {}", path.display()),
            Source::Env(name) => write!(f, "environment variable {name}"),
            Source::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// Where one setting's effective value came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Origin {
    #[serde(flatten)]
    pub source: Source,
    /// Set when validation changed the value (e.g. `ram_floor` raised to its minimum),
    /// or to show a decimal size in binary units ("2GB = 1.86 GiB").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Per key, the layer that set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    origins: BTreeMap<&'static str, Origin>,
}

impl Default for Provenance {
    fn default() -> Self {
        let origins = KEYS
            .iter()
            .map(|&key| {
                (
                    key,
                    Origin {
                        source: Source::Default,
                        note: None,
                    },
                )
            })
            .collect();
        Self { origins }
    }
}

impl Provenance {
    pub fn get(&self, key: &str) -> Option<&Origin> {
        self.origins.get(key)
    }

    /// Whether a layer the user wrote set `key` (a `--config` file, the environment, a
    /// flag): the shipped defaults (built in, or `config/default.toml`) are not a
    /// choice made for this machine.
    pub fn set_by_user(&self, key: &str) -> bool {
        self.get(key).is_some_and(|origin| {
            !matches!(origin.source, Source::Default | Source::DefaultFile(_))
        })
    }

    /// Every key with its origin, in the order of the `Settings` fields.
    /// The keys with a note (a value raised to its minimum, a decimal size
    /// converted), as (key, note): what a command logs once at start.
    pub fn notes(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.iter()
            .filter_map(|(key, origin)| origin.note.as_deref().map(|note| (key, note)))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &Origin)> {
        KEYS.iter()
            .filter_map(|&key| self.origins.get(key).map(|origin| (key, origin)))
    }

    pub(crate) fn set(&mut self, key: &'static str, source: Source) {
        self.origins.insert(key, Origin { source, note: None });
    }

    pub(crate) fn note(&mut self, key: &'static str, note: String) {
        if let Some(origin) = self.origins.get_mut(key) {
            origin.note = Some(note);
        }
    }
}

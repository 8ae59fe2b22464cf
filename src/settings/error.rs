//! Why settings could not be loaded. Each message is one line naming the key, the value
//! and the layer it came from, so the user knows exactly which line or flag to fix.

use std::path::PathBuf;

use super::provenance::Source;

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("unknown setting `{key}` = {value:?} from {layer}{hint}")]
    UnknownKey {
        key: String,
        value: String,
        layer: Source,
        /// Empty, or a sentence starting with "; " that says what was probably meant.
        hint: String,
    },

    #[error("setting `{key}` = {value:?} from {layer}: {reason}")]
    BadValue {
        key: String,
        value: String,
        layer: Source,
        reason: String,
    },

    /// A rule broken by settings built in code (no layer to name).
    #[error("setting `{key}` = {value:?}: {reason}")]
    Invalid {
        key: String,
        value: String,
        reason: String,
    },

    #[error("config file {}: {reason}", path.display())]
    File { path: PathBuf, reason: String },

    #[error("environment: {reason}")]
    Environment { reason: String },
}

/// Collapses a multi-line message (TOML parse errors draw carets) into one line.
pub(crate) fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

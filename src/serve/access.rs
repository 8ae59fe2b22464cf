//! Who may do what: the API key and the admin key compared in constant time, and the
//! model roots a load through the admin endpoints must stay under.
//!
//! The admin endpoints load whatever folder they are given, so they are off unless
//! the operator sets an `[admin]` table: a key of its own (a client holding the API
//! key cannot load models) and the folders loads may come from. A folder is checked
//! after it is canonicalised — `..` resolved, every symlink followed — so neither a
//! `..` nor a symlink inside a root can lead out of it, and the load then opens the
//! canonical path it was checked as.

use std::path::{Path, PathBuf};

use super::config::{AdminConfig, ModelConfig};

/// Whether `given` equals `expected`, in a time that depends on `expected`'s length
/// only: every byte is compared whatever the first difference, so the time an answer
/// takes does not tell a client how much of a key it guessed.
pub fn keys_match(given: &[u8], expected: &[u8]) -> bool {
    let mut difference = given.len() ^ expected.len();
    for (index, &byte) in expected.iter().enumerate() {
        // A shorter `given` is compared against zeros: its length differs already.
        let other = given.get(index).copied().unwrap_or(0);
        difference |= usize::from(byte ^ other);
    }
    // Keeps the compiler from turning the loop into an early exit.
    std::hint::black_box(difference) == 0
}

/// What the admin endpoints may do: their key and the canonical model roots.
#[derive(Debug, Clone)]
pub struct AdminAccess {
    key: String,
    roots: Vec<PathBuf>,
}

/// Why a path given to an admin endpoint is not loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AccessError {
    /// The path does not exist (or cannot be resolved).
    #[error("{key}: {} is not a folder or file the server can open ({source})", path.display())]
    Missing {
        key: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The path resolves outside every model root (through `..`, a symlink, or as
    /// an absolute path elsewhere).
    #[error("{key}: {} resolves to {}, which is outside the server's model roots ({}); put the model under one of them or add its folder to admin.model_roots", path.display(), resolved.display(), roots_list(roots))]
    OutsideRoots {
        key: String,
        path: PathBuf,
        resolved: PathBuf,
        roots: Vec<PathBuf>,
    },
}

fn roots_list(roots: &[PathBuf]) -> String {
    let roots: Vec<String> = roots
        .iter()
        .map(|root| root.display().to_string())
        .collect();
    roots.join(", ")
}

impl AdminAccess {
    /// The `[admin]` table with its roots canonicalised; a root that cannot be is an
    /// error naming `admin.model_roots`.
    pub fn new(config: &AdminConfig) -> Result<Self, String> {
        let roots = config
            .model_roots
            .iter()
            .map(|root| {
                root.canonicalize().map_err(|error| {
                    format!(
                        "admin.model_roots: {} cannot be opened ({error}); name existing folders",
                        root.display()
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            key: config.key.clone(),
            roots,
        })
    }

    /// Whether `given` is the admin key (constant time).
    pub fn key_matches(&self, given: &str) -> bool {
        keys_match(given.as_bytes(), self.key.as_bytes())
    }

    /// `path` canonicalised, if that lies under a model root; `key` names the field.
    pub fn confine(&self, key: &str, path: &Path) -> Result<PathBuf, AccessError> {
        let resolved = path.canonicalize().map_err(|source| AccessError::Missing {
            key: key.to_string(),
            path: path.to_path_buf(),
            source,
        })?;
        // `Path::starts_with` compares whole components: `/models2` is not under
        // `/models`.
        if self.roots.iter().any(|root| resolved.starts_with(root)) {
            return Ok(resolved);
        }
        Err(AccessError::OutsideRoots {
            key: key.to_string(),
            path: path.to_path_buf(),
            resolved,
            roots: self.roots.clone(),
        })
    }

    /// `model` with its folder and every LoRA file it names confined to the roots and
    /// replaced by their canonical paths (what the load then opens).
    pub fn confine_model(&self, mut model: ModelConfig) -> Result<ModelConfig, AccessError> {
        model.folder = self.confine("folder", &model.folder)?;
        for spec in &mut model.lora {
            *spec = self.confine_lora("lora", spec)?;
        }
        for (name, spec) in &mut model.adapters {
            *spec = self.confine_lora(&format!("adapters.{name}"), spec)?;
        }
        if let Some(parts) = &mut model.parts {
            for (key, path) in parts.paths_mut() {
                if let Some(given) = path.as_deref() {
                    *path = Some(self.confine(key, given)?);
                }
            }
        }
        Ok(model)
    }

    /// A `FILE[:STRENGTH]` spec with its file confined; a spec that does not parse is
    /// left as written (the load refuses it and says why).
    fn confine_lora(&self, key: &str, text: &str) -> Result<String, AccessError> {
        let Ok(spec) = crate::lora::LoraSpec::parse(text) else {
            return Ok(text.to_string());
        };
        let resolved = self.confine(key, &spec.path)?;
        Ok(format!("{}:{}", resolved.display(), spec.strength))
    }
}

#[cfg(test)]
#[path = "access_tests.rs"]
mod tests;

//! Reading a `config.json` whose keys the family names: numbers that must be there,
//! numbers with the defaults their Hugging Face class has, and values that change
//! the math refused by name when they are not the ones computed.

use std::path::Path;

use serde_json::{Map, Value};

use super::FamilyError;

/// A config object and where it came from, for messages.
pub struct ConfigJson<'a> {
    path: &'a Path,
    object: &'a Map<String, Value>,
}

impl<'a> ConfigJson<'a> {
    pub fn new(path: &'a Path, config: &'a Value) -> Result<Self, FamilyError> {
        let object = config.as_object().ok_or_else(|| {
            FamilyError::config(
                path,
                None,
                format!("{}: is not a JSON object", path.display()),
            )
        })?;
        Ok(Self { path, object })
    }

    /// An error about `key`.
    pub fn bad(&self, key: &str, message: String) -> FamilyError {
        let message = format!("{}: {message}", self.path.display());
        FamilyError::config(self.path, Some(key), message)
    }

    /// A positive whole number; `default` when the key is absent.
    pub fn count(&self, key: &str, default: Option<usize>) -> Result<usize, FamilyError> {
        match (self.object.get(key), default) {
            (None | Some(Value::Null), Some(default)) => Ok(default),
            (None | Some(Value::Null), None) => Err(self.bad(key, format!("`{key}` is missing"))),
            (Some(value), _) => match value.as_u64() {
                Some(number) if number > 0 => Ok(number as usize),
                _ => Err(self.bad(
                    key,
                    format!("`{key}` is {value}; a positive whole number is expected"),
                )),
            },
        }
    }

    /// A list of positive whole numbers.
    pub fn counts(&self, key: &str) -> Result<Vec<usize>, FamilyError> {
        let list = self.object.get(key).and_then(Value::as_array);
        let numbers: Option<Vec<usize>> = list.and_then(|list| {
            list.iter()
                .map(|value| value.as_u64().filter(|&n| n > 0).map(|n| n as usize))
                .collect()
        });
        match numbers {
            Some(numbers) if !numbers.is_empty() => Ok(numbers),
            _ => Err(self.bad(
                key,
                format!("`{key}` must be a list of positive whole numbers"),
            )),
        }
    }

    /// A number; `default` when absent.
    pub fn float(&self, key: &str, default: f64) -> Result<f64, FamilyError> {
        match self.object.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(value) => value
                .as_f64()
                .ok_or_else(|| self.bad(key, format!("`{key}` is {value}; a number is expected"))),
        }
    }

    /// A whole number that may be negative or absent.
    pub fn integer(&self, key: &str) -> Option<i64> {
        self.object.get(key).and_then(Value::as_i64)
    }

    /// A string; `default` when absent.
    pub fn text(&self, key: &str, default: &'a str) -> &'a str {
        self.object
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or(default)
    }

    /// A boolean; `default` when absent.
    pub fn flag(&self, key: &str, default: bool) -> bool {
        self.object
            .get(key)
            .and_then(Value::as_bool)
            .unwrap_or(default)
    }

    /// Refuses `key` unless it is absent or one of `computed` (what stagehand
    /// computes), naming what it is.
    pub fn require_text(&self, key: &str, computed: &[&str]) -> Result<(), FamilyError> {
        match self.object.get(key).and_then(Value::as_str) {
            Some(value) if !computed.contains(&value) => Err(self.bad(
                key,
                format!(
                    "`{key}` is \"{value}\"; stagehand computes {}",
                    computed
                        .iter()
                        .map(|value| format!("\"{value}\""))
                        .collect::<Vec<_>>()
                        .join(" or ")
                ),
            )),
            _ => Ok(()),
        }
    }
}

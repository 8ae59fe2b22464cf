//! Reading the outside-reference fixtures (`tests/fixtures/*/…/reference.json`, which
//! scripts with PyTorch wrote) and comparing outputs with them.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// `tests/fixtures/<kind>/<name>` in this repository.
pub fn fixture(kind: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(kind)
        .join(name)
}

/// A JSON file, parsed.
pub fn json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|error| {
        panic!("{}: {error}", path.display());
    });
    serde_json::from_str(&text).unwrap()
}

/// A JSON list of numbers as f32.
pub fn floats(value: &Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}

/// A JSON list of lists of numbers as rows of f32.
pub fn float_rows(value: &Value) -> Vec<Vec<f32>> {
    value.as_array().unwrap().iter().map(floats).collect()
}

/// A JSON list of token ids.
pub fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_u64().unwrap() as u32)
        .collect()
}

/// The largest absolute difference between two sets of rows of the same shape.
pub fn largest_difference(ours: &[Vec<f32>], theirs: &[Vec<f32>]) -> f32 {
    assert_eq!(ours.len(), theirs.len(), "rows");
    ours.iter()
        .zip(theirs)
        .flat_map(|(a, b)| {
            assert_eq!(a.len(), b.len(), "row width");
            a.iter().zip(b).map(|(a, b)| (a - b).abs())
        })
        .fold(0.0f32, f32::max)
}

/// The largest absolute difference between `ours` and `theirs`, relative to the
/// largest magnitude of `theirs`.
pub fn relative_difference(ours: &[f32], theirs: &[f32]) -> f32 {
    assert_eq!(ours.len(), theirs.len(), "lengths");
    let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    let largest = ours.iter().zip(theirs).map(|(a, b)| (a - b).abs());
    largest.fold(0f32, f32::max) / scale
}

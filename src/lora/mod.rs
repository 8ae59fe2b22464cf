//! LoRA adapters: loading PEFT and kohya safetensors files against a model's tensors,
//! the merge and low-rank arithmetic, and a generator of test adapters.
//!
//! An adapter patches a base weight `W` (row-major `[out, in]`) with two low-rank
//! factors: `W' = W + s·B·A`, `A` is `[rank, in]`, `B` is `[out, rank]` and
//! `s = strength · alpha / rank` (`alpha / √rank` for rsLoRA). `--lora` takes a file or
//! a PEFT adapter folder (`adapter_config.json` + `adapter_model.safetensors`, as
//! `save_pretrained` writes it), whose config is checked against the model (`peft`).

mod alias;
mod error;
mod generate;
mod load;
mod math;
mod names;
mod peft;
mod precision;
mod targets;

pub use alias::{AliasPiece, LoraAlias};
pub use error::LoraError;
pub use generate::{write_demo_lora, DemoLora, LoraDtype, LoraNaming};
pub use load::{load_adapter, parse_adapter, Naming};
pub use math::{apply_low_rank, merge_into, Factors};
pub use peft::{PeftConfig, Targets, INERT_KEYS as PEFT_INERT_KEYS};
pub use precision::{LORA_BF16_TOLERANCE, LORA_F16_TOLERANCE, LORA_PRECISION_SCALE_LIMIT};

use std::path::PathBuf;

/// `FILE[:STRENGTH]` as given on the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSpec {
    pub path: PathBuf,
    pub strength: f32,
}

/// Strengths beyond this are almost surely a typo (`:10` for `:1.0`).
const MAX_STRENGTH: f32 = 100.0;

impl LoraSpec {
    /// Parses `FILE[:STRENGTH]`; the strength defaults to 1. A `:` followed by
    /// something that is not a number is taken as part of the path.
    pub fn parse(text: &str) -> Result<Self, LoraError> {
        let (path, strength) = match text.rsplit_once(':') {
            Some((path, strength)) => match strength.parse::<f32>() {
                Ok(value) => (path, value),
                Err(_) if strength.chars().any(|c| c.is_ascii_digit()) => {
                    return Err(LoraError::Strength {
                        spec: text.to_string(),
                        problem: format!("`{strength}` is not a number"),
                    })
                }
                Err(_) => (text, 1.0),
            },
            _ => (text, 1.0),
        };
        if !strength.is_finite() || strength.abs() > MAX_STRENGTH {
            return Err(LoraError::Strength {
                spec: text.to_string(),
                problem: format!("must be a finite number within ±{MAX_STRENGTH}"),
            });
        }
        if path.is_empty() {
            return Err(LoraError::Strength {
                spec: text.to_string(),
                problem: "no file given; use FILE[:STRENGTH]".to_string(),
            });
        }
        Ok(Self {
            path: PathBuf::from(path),
            strength,
        })
    }
}

/// One base weight's factors, validated against the model.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraTarget {
    /// Index into `ModelIndex::tensors`.
    pub tensor: usize,
    pub base: String,
    /// The base tensor's block and where it starts in the block's buffer.
    pub block: usize,
    pub block_offset: u64,
    /// The base weight's output rows `first_row .. first_row + out_features` are the
    /// ones patched (all of them, unless the adapter names a piece of a fused weight
    /// through a [`LoraAlias`]); `B` has `out_features` rows.
    pub first_row: usize,
    pub out_features: usize,
    pub in_features: usize,
    pub rank: usize,
    pub alpha: f32,
    /// `[rank, in]`, row-major.
    pub a: Vec<f32>,
    /// `[out, rank]`, row-major.
    pub b: Vec<f32>,
    /// PEFT's `use_rslora`: the scale divides by √rank instead of rank.
    pub rslora: bool,
}

impl LoraTarget {
    /// `s = strength · alpha / rank`, or `strength · alpha / √rank` for rsLoRA.
    pub fn scale(&self, strength: f32) -> f32 {
        let rank = self.rank as f32;
        strength * self.alpha / if self.rslora { rank.sqrt() } else { rank }
    }

    /// Bytes of both factors as f32 (what the pipeline holds for them).
    pub fn bytes(&self) -> u64 {
        ((self.a.len() + self.b.len()) * 4) as u64
    }

    /// The loader's host copy of the factors.
    pub fn factors(&self) -> Factors<'_> {
        Factors {
            a: &self.a,
            b: &self.b,
            out_features: self.out_features,
            in_features: self.in_features,
            rank: self.rank,
        }
    }
}

/// A loaded adapter: every module it patches, mapped to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Adapter {
    /// Unique among attached adapters: the file stem (plus `#n` for repeats).
    pub name: String,
    pub path: PathBuf,
    pub naming: Naming,
    pub strength: f32,
    pub targets: Vec<LoraTarget>,
}

impl Adapter {
    pub fn bytes(&self) -> u64 {
        self.targets.iter().map(LoraTarget::bytes).sum()
    }
}

#[cfg(test)]
mod tests;

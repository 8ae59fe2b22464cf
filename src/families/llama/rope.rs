//! A decoder's rotary position embedding as `config.json` sets it, in either layout
//! transformers writes: version 5's `rope_parameters` object (`rope_theta`,
//! `rope_type` and the scaling fields together), or version 4's top-level
//! `rope_theta` beside a `rope_scaling` object. Both may be present; a value given in
//! both must agree. The frequencies follow transformers' `modeling_rope_utils.py`
//! for `default`, `linear`, `dynamic` (NTK, recomputed from the sequence length),
//! `yarn` (with its attention factor) and `llama3`; `longrope` and any other type
//! are refused by name, and so is a key a type does not define.

use std::collections::BTreeMap;
use std::f64::consts::PI;

use serde_json::Value;

use super::keys::{positive_number, Keys};
use crate::families::FamilyError;

/// The rotary embedding of every layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub kind: RopeKind,
    /// Rotated dimensions of a head (the whole head).
    pub head_dim: usize,
    /// `max_position_embeddings`: `dynamic` scales from it.
    pub max_positions: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RopeKind {
    Default,
    /// Frequencies divided by `factor` (position interpolation).
    Linear {
        factor: f64,
    },
    /// NTK-aware scaling of the base once the sequence outgrows `max_positions`.
    Dynamic {
        factor: f64,
    },
    Yarn(Yarn),
    Llama3(Llama3),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_positions: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// Scales cos and sin, so attention scores by its square.
    pub attention_factor: f64,
    pub truncate: bool,
}

/// Llama 3's scaling (`rope_type: "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3 {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_positions: f64,
}

/// Keys every rope type may carry.
const COMMON_KEYS: &[&str] = &["rope_type", "type", "rope_theta", "partial_rotary_factor"];

/// The keys each implemented type defines beside [`COMMON_KEYS`].
fn type_keys(kind: &str) -> Option<&'static [&'static str]> {
    Some(match kind {
        "default" => &[],
        "linear" | "dynamic" => &["factor"],
        "llama3" => &[
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ],
        "yarn" => &[
            "factor",
            "original_max_position_embeddings",
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "truncate",
        ],
        _ => return None,
    })
}

/// The rope settings of both layouts, merged: key → (value, the object it came from).
struct Settings<'a> {
    keys: &'a Keys<'a>,
    values: BTreeMap<String, (&'a Value, &'static str)>,
}

impl<'a> Settings<'a> {
    fn read(keys: &'a Keys<'a>) -> Result<Self, FamilyError> {
        let mut values: BTreeMap<String, (&'a Value, &'static str)> = BTreeMap::new();
        for source in ["rope_scaling", "rope_parameters"] {
            let Some(object) = keys.get(source) else {
                continue;
            };
            let object = object
                .as_object()
                .ok_or_else(|| keys.bad(source, format!("is {object}; expected an object")))?;
            for (key, value) in object.iter().filter(|(_, value)| !value.is_null()) {
                if let Some((earlier, from)) = values.get(key.as_str()) {
                    if !same(earlier, value) {
                        return Err(keys.bad(
                            &format!("{source}.{key}"),
                            format!("is {value} but `{from}.{key}` is {earlier}; give one"),
                        ));
                    }
                }
                values.insert(key.clone(), (value, source));
            }
        }
        Ok(Self { keys, values })
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.values.get(key).map(|(value, _)| *value)
    }

    /// "rope_parameters.factor": where the key came from, for messages.
    fn name(&self, key: &str) -> String {
        let source = self.values.get(key).map_or("rope_parameters", |(_, s)| s);
        format!("{source}.{key}")
    }

    fn bad(&self, key: &str, problem: impl std::fmt::Display) -> FamilyError {
        self.keys.bad(&self.name(key), problem)
    }

    fn number(&self, key: &str) -> Result<Option<f64>, FamilyError> {
        self.get(key)
            .map(|value| {
                positive_number(value)
                    .ok_or_else(|| self.bad(key, format!("is {value}; expected a positive number")))
            })
            .transpose()
    }

    fn required(&self, key: &str, kind: &str) -> Result<f64, FamilyError> {
        self.number(key)?.ok_or_else(|| {
            self.keys.bad(
                "rope_parameters",
                format!("has rope_type \"{kind}\" but no `{key}`"),
            )
        })
    }

    /// The rope type, given as `rope_type` or its old name `type`, and the key that
    /// gave it (for messages).
    fn kind(&self) -> Result<(String, &'static str), FamilyError> {
        let text = |key: &str| -> Result<Option<&str>, FamilyError> {
            self.get(key)
                .map(|value| {
                    value
                        .as_str()
                        .ok_or_else(|| self.bad(key, format!("is {value}; expected a string")))
                })
                .transpose()
        };
        match (text("rope_type")?, text("type")?) {
            (Some(kind), Some(old)) if kind != old => Err(self.bad(
                "rope_type",
                format!(
                    "is \"{kind}\" but `{}` is \"{old}\"; give one",
                    self.name("type")
                ),
            )),
            (Some(kind), _) => Ok((kind.to_string(), "rope_type")),
            (None, Some(kind)) => Ok((kind.to_string(), "type")),
            (None, None) => Ok(("default".to_string(), "rope_type")),
        }
    }
}

/// Two JSON values that mean the same (numbers compared as numbers: 8 and 8.0).
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(a), Some(b)) => a == b,
        _ => a == b,
    }
}

impl Rope {
    /// The rope of a config; `default_theta` is the family's when neither layout says.
    pub fn from_config(
        keys: &Keys<'_>,
        default_theta: f64,
        head_dim: usize,
        max_positions: usize,
    ) -> Result<Self, FamilyError> {
        let settings = Settings::read(keys)?;
        let theta = theta(keys, &settings, default_theta)?;
        check_partial_rotary(keys, &settings)?;
        let (kind, kind_key) = settings.kind()?;
        if kind == "longrope" {
            return Err(settings.bad(
                kind_key,
                "is \"longrope\" (Phi-3's short and long factors): not implemented; stagehand implements default, linear, dynamic, yarn and llama3",
            ));
        }
        let Some(defined) = type_keys(&kind) else {
            return Err(settings.bad(
                kind_key,
                format!("is \"{kind}\", a rope type stagehand does not know; it implements default, linear, dynamic, yarn and llama3"),
            ));
        };
        if let Some(key) = settings
            .values
            .keys()
            .find(|key| !COMMON_KEYS.contains(&key.as_str()) && !defined.contains(&key.as_str()))
        {
            return Err(settings.bad(
                key,
                format!(
                    "is {}, which rope_type \"{kind}\" does not define; stagehand does not know what it changes",
                    settings.values[key].0
                ),
            ));
        }
        let original = || original_max_positions(keys, &settings, max_positions);
        let kind = match kind.as_str() {
            "linear" => RopeKind::Linear {
                factor: settings.required("factor", &kind)?,
            },
            "dynamic" if head_dim <= 2 => {
                return Err(keys.bad("head_dim", "must be above 2 for dynamic rope scaling"))
            }
            "dynamic" => RopeKind::Dynamic {
                factor: settings.required("factor", &kind)?,
            },
            "llama3" => RopeKind::Llama3(llama3(&settings, original()?)?),
            "yarn" => RopeKind::Yarn(yarn(&settings, original()?, max_positions)?),
            _ => RopeKind::Default,
        };
        Ok(Self {
            theta,
            kind,
            head_dim,
            max_positions,
        })
    }

    /// The rotary frequencies of one head (`head_dim / 2`) for a step whose sequence
    /// is `sequence_length` tokens long (only `dynamic` depends on it).
    pub fn inv_freq(&self, sequence_length: usize) -> Vec<f32> {
        let dim = self.head_dim as f64;
        let base = match self.kind {
            RopeKind::Dynamic { factor } => {
                let limit = self.max_positions as f64;
                let length = (sequence_length as f64).max(limit);
                self.theta * ((factor * length / limit) - (factor - 1.0)).powf(dim / (dim - 2.0))
            }
            _ => self.theta,
        };
        (0..self.head_dim / 2)
            .map(|i| {
                let frequency = 1.0 / base.powf(2.0 * i as f64 / dim);
                let scaled = match &self.kind {
                    RopeKind::Default | RopeKind::Dynamic { .. } => frequency,
                    RopeKind::Linear { factor } => frequency / factor,
                    RopeKind::Llama3(scaling) => scaling.scale(frequency),
                    RopeKind::Yarn(yarn) => yarn.scale(i, frequency, dim, self.theta),
                };
                scaled as f32
            })
            .collect()
    }

    /// What cos and sin are multiplied by (yarn's attention factor; 1 otherwise).
    pub fn attention_factor(&self) -> f64 {
        match &self.kind {
            RopeKind::Yarn(yarn) => yarn.attention_factor,
            _ => 1.0,
        }
    }

    /// Whether the frequencies change with the sequence length.
    pub fn depends_on_length(&self) -> bool {
        matches!(self.kind, RopeKind::Dynamic { .. })
    }

    /// The longest sequence the embedding is defined for: `max_position_embeddings`,
    /// or `factor` times it for dynamic scaling, which exists to go beyond it.
    pub fn position_limit(&self) -> usize {
        match self.kind {
            RopeKind::Dynamic { factor } => (self.max_positions as f64 * factor) as usize,
            _ => self.max_positions,
        }
    }
}

/// `rope_theta`, from `rope_parameters` or the top level (the same when both say).
fn theta(keys: &Keys<'_>, settings: &Settings<'_>, default: f64) -> Result<f64, FamilyError> {
    let inner = settings.number("rope_theta")?;
    let top = keys
        .get("rope_theta")
        .map(|_| keys.positive("rope_theta", default))
        .transpose()?;
    match (inner, top) {
        (Some(inner), Some(top)) if inner != top => Err(settings.bad(
            "rope_theta",
            format!("is {inner} but `rope_theta` is {top}: transformers 5 reads the first, 4 the second; give one"),
        )),
        (Some(theta), _) | (None, Some(theta)) => Ok(theta),
        (None, None) => Ok(default),
    }
}

/// `partial_rotary_factor` (top level or in the rope settings): only 1 is implemented.
fn check_partial_rotary(keys: &Keys<'_>, settings: &Settings<'_>) -> Result<(), FamilyError> {
    let values = [
        (
            "partial_rotary_factor".to_string(),
            keys.get("partial_rotary_factor"),
        ),
        (
            settings.name("partial_rotary_factor"),
            settings.get("partial_rotary_factor"),
        ),
    ];
    for (name, value) in values {
        if let Some(value) = value.filter(|value| value.as_f64() != Some(1.0)) {
            return Err(keys.bad(
                &name,
                format!("is {value}: rotating part of each head is not implemented (Llama-family decoders rotate all of head_dim)"),
            ));
        }
    }
    Ok(())
}

/// `original_max_position_embeddings`: top level (transformers gives it priority) or in
/// the rope settings, else `max_position_embeddings`.
fn original_max_positions(
    keys: &Keys<'_>,
    settings: &Settings<'_>,
    max_positions: usize,
) -> Result<f64, FamilyError> {
    let key = "original_max_position_embeddings";
    let top = keys.optional_size(key)?.map(|size| size as f64);
    let inner = settings.number(key)?;
    match (top, inner) {
        (Some(top), Some(inner)) if top != inner => {
            Err(settings.bad(key, format!("is {inner} but `{key}` is {top}; give one")))
        }
        (Some(value), _) | (None, Some(value)) => Ok(value),
        (None, None) => Ok(max_positions as f64),
    }
}

fn llama3(settings: &Settings<'_>, original: f64) -> Result<Llama3, FamilyError> {
    let kind = "llama3";
    let scaling = Llama3 {
        factor: settings.required("factor", kind)?,
        low_freq_factor: settings.required("low_freq_factor", kind)?,
        high_freq_factor: settings.required("high_freq_factor", kind)?,
        original_max_positions: original,
    };
    if scaling.high_freq_factor <= scaling.low_freq_factor {
        return Err(settings.bad(
            "high_freq_factor",
            format!(
                "is {}; it must be above low_freq_factor {}",
                scaling.high_freq_factor, scaling.low_freq_factor
            ),
        ));
    }
    Ok(scaling)
}

impl Llama3 {
    /// One frequency as Hugging Face scales it: kept above the high-frequency
    /// wavelength, divided by `factor` below the low one, blended between.
    fn scale(&self, frequency: f64) -> f64 {
        let wavelength = 2.0 * PI / frequency;
        let low_wavelength = self.original_max_positions / self.low_freq_factor;
        let high_wavelength = self.original_max_positions / self.high_freq_factor;
        if wavelength < high_wavelength {
            frequency
        } else if wavelength > low_wavelength {
            frequency / self.factor
        } else {
            let smooth = (self.original_max_positions / wavelength - self.low_freq_factor)
                / (self.high_freq_factor - self.low_freq_factor);
            (1.0 - smooth) * frequency / self.factor + smooth * frequency
        }
    }
}

fn yarn(settings: &Settings<'_>, original: f64, max_positions: usize) -> Result<Yarn, FamilyError> {
    let factor = settings
        .number("factor")?
        .unwrap_or(max_positions as f64 / original);
    let mscale = |scale: f64, m: f64| {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * m * scale.ln() + 1.0
        }
    };
    let attention_factor = match settings.number("attention_factor")? {
        Some(given) => given,
        None => match (
            settings.number("mscale")?,
            settings.number("mscale_all_dim")?,
        ) {
            (Some(m), Some(all)) => mscale(factor, m) / mscale(factor, all),
            _ => mscale(factor, 1.0),
        },
    };
    let truncate = match settings.get("truncate") {
        None => true,
        Some(value) => value.as_bool().ok_or_else(|| {
            settings.bad("truncate", format!("is {value}; expected true or false"))
        })?,
    };
    Ok(Yarn {
        factor,
        original_max_positions: original,
        // transformers: `beta_fast or 32`, `beta_slow or 1`.
        beta_fast: settings.number("beta_fast")?.unwrap_or(32.0),
        beta_slow: settings.number("beta_slow")?.unwrap_or(1.0),
        attention_factor,
        truncate,
    })
}

impl Yarn {
    /// Frequency `i` of `dim`: interpolated (divided by `factor`) below the correction
    /// range, extrapolated (kept) above it, ramped linearly across.
    fn scale(&self, i: usize, frequency: f64, dim: f64, base: f64) -> f64 {
        let correction = |rotations: f64| {
            dim * (self.original_max_positions / (rotations * 2.0 * PI)).ln() / (2.0 * base.ln())
        };
        let (mut low, mut high) = (correction(self.beta_fast), correction(self.beta_slow));
        if self.truncate {
            low = low.floor();
            high = high.ceil();
        }
        let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
        if low == high {
            high += 0.001;
        }
        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
        let extrapolation = 1.0 - ramp;
        frequency / self.factor * (1.0 - extrapolation) + frequency * extrapolation
    }
}

#[cfg(test)]
#[path = "rope_tests.rs"]
mod tests;

//! What one step produces, so a step time can be told in the model's own unit, and
//! when that is too slow to be of use.
//!
//! A model description may say (`[output]` in its TOML):
//!
//! ```toml
//! [output]
//! unit = "token"             # a decode step: tokens_per_step tokens → tokens/s
//! # unit = "image"           # a denoising step; one image takes steps_per_output
//! # unit = "video"           #   steps → s/image (s/video)
//! # steps_per_output = 28
//! ```
//!
//! Without it (a checkpoint, or an older description) figures stay per step.

use serde::{Deserialize, Serialize};

/// What a step's work adds up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputUnit {
    /// A decode step: one token for each sequence (`tokens_per_step` of them).
    Token,
    /// One denoising step of an image.
    Image,
    /// One denoising step of a video.
    Video,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepOutput {
    pub unit: OutputUnit,
    /// Image and video: denoising steps per output (the pipeline's usual default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps_per_output: Option<u32>,
}

/// Tokens a "short answer" has, for the decode warning: a few paragraphs.
const SHORT_ANSWER_TOKENS: f64 = 256.0;
/// Slower than this, a decoder is no use interactively: a 256-token answer takes more
/// than 4 minutes (people read at about 5 tokens per second).
pub const SLOW_TOKENS_PER_SECOND: f64 = 1.0;
/// Longer than this per image (10 minutes), nobody iterates on a prompt.
pub const SLOW_SECONDS_PER_IMAGE: f64 = 600.0;
/// Longer than this per video (1 hour), nobody iterates on a prompt either.
pub const SLOW_SECONDS_PER_VIDEO: f64 = 3600.0;
/// Without a unit: a step longer than a minute.
pub const SLOW_SECONDS_PER_STEP: f64 = 60.0;

/// A step time in the model's unit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OutputRate {
    pub value: f64,
    /// "tokens/s", "s/image", "s/video" or "s/step".
    pub unit: &'static str,
}

impl std::fmt::Display for OutputRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.value >= 100.0 || self.value == 0.0 {
            write!(f, "{:.0} {}", self.value, self.unit)
        } else if self.value >= 1.0 {
            write!(f, "{:.2} {}", self.value, self.unit)
        } else {
            write!(f, "{:.3} {}", self.value, self.unit)
        }
    }
}

impl StepOutput {
    pub fn validate(&self) -> Result<(), String> {
        match (self.unit, self.steps_per_output) {
            (OutputUnit::Token, Some(_)) => Err(
                "output: steps_per_output is for image and video models; a decode step yields tokens_per_step tokens".to_string(),
            ),
            (OutputUnit::Image | OutputUnit::Video, None | Some(0)) => Err(
                "output: image and video models need steps_per_output ≥ 1 (denoising steps per output)".to_string(),
            ),
            _ => Ok(()),
        }
    }

    /// `step_seconds` in this unit.
    pub fn rate(output: Option<&Self>, step_seconds: f64, tokens_per_step: u64) -> OutputRate {
        let steps = |output: &Self| f64::from(output.steps_per_output.unwrap_or(1));
        match output {
            Some(output) if output.unit == OutputUnit::Token => OutputRate {
                value: if step_seconds > 0.0 {
                    tokens_per_step as f64 / step_seconds
                } else {
                    f64::INFINITY
                },
                unit: "tokens/s",
            },
            Some(output) if output.unit == OutputUnit::Image => OutputRate {
                value: step_seconds * steps(output),
                unit: "s/image",
            },
            Some(output) => OutputRate {
                value: step_seconds * steps(output),
                unit: "s/video",
            },
            None => OutputRate {
                value: step_seconds,
                unit: "s/step",
            },
        }
    }

    /// A warning when `step_seconds` makes the model impractical to use, saying the
    /// threshold and why; `None` when it is usable.
    pub fn too_slow(
        output: Option<&Self>,
        step_seconds: f64,
        tokens_per_step: u64,
    ) -> Option<String> {
        let rate = Self::rate(output, step_seconds, tokens_per_step);
        match output.map(|output| output.unit) {
            Some(OutputUnit::Token) if rate.value < SLOW_TOKENS_PER_SECOND => Some(format!(
                "impractically slow: {rate}, below {SLOW_TOKENS_PER_SECOND} token/s: a {SHORT_ANSWER_TOKENS:.0}-token answer would take {}",
                duration(SHORT_ANSWER_TOKENS / rate.value.max(f64::MIN_POSITIVE))
            )),
            Some(OutputUnit::Image) if rate.value > SLOW_SECONDS_PER_IMAGE => Some(format!(
                "impractically slow: {} per image, over {} (steps_per_output {})",
                duration(rate.value),
                duration(SLOW_SECONDS_PER_IMAGE),
                output.and_then(|output| output.steps_per_output).unwrap_or(1)
            )),
            Some(OutputUnit::Video) if rate.value > SLOW_SECONDS_PER_VIDEO => Some(format!(
                "impractically slow: {} per video, over {} (steps_per_output {})",
                duration(rate.value),
                duration(SLOW_SECONDS_PER_VIDEO),
                output.and_then(|output| output.steps_per_output).unwrap_or(1)
            )),
            None if step_seconds > SLOW_SECONDS_PER_STEP => Some(format!(
                "impractically slow: {} per step, over {}",
                duration(step_seconds),
                duration(SLOW_SECONDS_PER_STEP)
            )),
            _ => None,
        }
    }
}

/// A duration for people: seconds, minutes or hours.
fn duration(seconds: f64) -> String {
    if seconds >= 2.0 * 3600.0 {
        format!("{:.1} hours", seconds / 3600.0)
    } else if seconds >= 120.0 {
        format!("{:.0} minutes", seconds / 60.0)
    } else {
        format!("{seconds:.0} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: StepOutput = StepOutput {
        unit: OutputUnit::Token,
        steps_per_output: None,
    };
    const IMAGE: StepOutput = StepOutput {
        unit: OutputUnit::Image,
        steps_per_output: Some(28),
    };

    #[test]
    fn steps_are_told_in_the_model_unit() {
        assert_eq!(
            StepOutput::rate(Some(&TOKEN), 0.5, 1).to_string(),
            "2.00 tokens/s"
        );
        assert_eq!(
            StepOutput::rate(Some(&IMAGE), 5.3, 4608).to_string(),
            "148 s/image"
        );
        assert_eq!(StepOutput::rate(None, 0.25, 1).to_string(), "0.250 s/step");
    }

    #[test]
    fn a_step_too_slow_to_use_is_flagged_with_its_threshold() {
        // Mixtral on an HDD: 381 s per token.
        let warning = StepOutput::too_slow(Some(&TOKEN), 381.0, 1).unwrap();
        assert!(warning.contains("below 1 token/s"), "{warning}");
        assert!(warning.contains("27.1 hours"), "{warning}");
        assert!(StepOutput::too_slow(Some(&TOKEN), 0.5, 1).is_none());
        assert!(StepOutput::too_slow(Some(&IMAGE), 5.3, 4608).is_none());
        let warning = StepOutput::too_slow(Some(&IMAGE), 30.0, 4608).unwrap();
        assert!(
            warning.contains("14 minutes per image, over 10 minutes"),
            "{warning}"
        );
        assert!(StepOutput::too_slow(None, 61.0, 1).is_some());
    }

    #[test]
    fn the_unit_and_its_steps_must_agree() {
        assert!(TOKEN.validate().is_ok());
        assert!(IMAGE.validate().is_ok());
        let no_steps = StepOutput {
            steps_per_output: None,
            ..IMAGE
        };
        assert!(no_steps.validate().is_err());
        let token_steps = StepOutput {
            steps_per_output: Some(3),
            ..TOKEN
        };
        assert!(token_steps.validate().is_err());
    }
}

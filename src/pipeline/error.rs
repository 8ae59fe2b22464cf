//! What went wrong making an image or a video, as kinds a caller matches on.

use std::path::PathBuf;

use crate::run::{Budget, RunError};

/// What went wrong making an image or a video.
///
/// Match on the kind; [`is_bad_input`](Self::is_bad_input) says whether the caller
/// can fix it (the CLI's exit 2, serve's 400) and `RunError::from` gives the run's
/// kind (serve answers with it). New kinds may be added, so a `match` needs a `_` arm.
///
/// | kind | bad input | what went wrong |
/// |---|---|---|
/// | [`Layout`](Self::Layout) | yes | the folder is not a pipeline stagehand computes |
/// | [`MissingPart`](Self::MissingPart), [`MissingFile`](Self::MissingFile) | yes | a model the pipeline needs is not there |
/// | [`BadField`](Self::BadField) | yes | a field of the request is refused; `field` names it |
/// | [`BudgetTooSmall`](Self::BudgetTooSmall) | yes | a stage does not fit the VRAM budget even at its smallest |
/// | [`Stage`](Self::Stage) | as its run's | a stage's run could not start or failed: its [`RunError`] |
/// | [`StageOutput`](Self::StageOutput) | no | a stage computed no output, or one of the wrong size: a bug |
/// | [`Output`](Self::Output) | no | the image could not be written |
/// | [`Failed`](Self::Failed) | no | any other failure, in words |
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// The folder is not a pipeline stagehand computes, or is malformed.
    #[error("{}: {problem}", path.display())]
    Layout { path: PathBuf, problem: String },
    /// A model the pipeline needs is not there.
    #[error("the pipeline's {part} is missing: expected {}", expected.display())]
    MissingPart { part: String, expected: PathBuf },
    /// A model given as files lacks a part no file holds.
    #[error("the pipeline's {part} is missing: {} does not hold it; give {flag} ({example})", model.display())]
    MissingFile {
        part: &'static str,
        model: PathBuf,
        flag: &'static str,
        example: &'static str,
    },
    /// A field of the request is refused (a size, a step count, a strength out of
    /// range): `field` names it as the request spells it (`prompt`, `width`,
    /// `steps`, `strength`, `image`).
    #[error("{message}")]
    BadField {
        field: &'static str,
        message: String,
    },
    /// A stage's run failed (its budgets released, as every failed run's are).
    #[error("{stage}: {source}")]
    Stage {
        stage: &'static str,
        #[source]
        source: RunError,
    },
    /// The budget leaves a stage too little room, even at its smallest.
    #[error("the VRAM budget is too small for the {stage} stage even in its smallest tiles: give --vram-budget {} or more", stagehand_actors::Bytes(*least_bytes))]
    BudgetTooSmall {
        stage: &'static str,
        least_bytes: u64,
    },
    /// Stage `stage` ran but computed no output, or one of another size than the
    /// next stage takes: stagehand's own bug, not the caller's input.
    #[error("{message}")]
    StageOutput {
        stage: &'static str,
        message: String,
    },
    /// Any other failure, in words.
    #[error("{0}")]
    Failed(String),
    /// The image could not be written.
    #[error("{}: {reason}", path.display())]
    Output { path: PathBuf, reason: String },
}

impl PipelineError {
    /// Whether the caller can fix this by changing what it gave (the request, the
    /// folder, a budget): the CLI's exit 2, serve's 400.
    pub fn is_bad_input(&self) -> bool {
        match self {
            PipelineError::Stage { source, .. } => source.is_bad_input(),
            PipelineError::StageOutput { .. }
            | PipelineError::Failed(_)
            | PipelineError::Output { .. } => false,
            _ => true,
        }
    }

    /// A refused request `field`.
    pub(crate) fn field(field: &'static str, message: String) -> Self {
        PipelineError::BadField { field, message }
    }
}

impl From<PipelineError> for RunError {
    /// The run's kind of a pipeline's error, its message the pipeline's line (a
    /// stage's names the stage), for serve to answer with.
    fn from(error: PipelineError) -> Self {
        let message = error.to_string();
        match error {
            PipelineError::Stage { source, .. } => source.with_message(message),
            PipelineError::BadField { field, .. } => RunError::BadRequest {
                field: field.to_string(),
                message,
                source: None,
            },
            PipelineError::Layout { ref path, .. } => RunError::UnsupportedModel {
                path: path.clone(),
                found: "a folder that is not a pipeline stagehand computes".to_string(),
                message,
                source: Some(Box::new(error)),
            },
            PipelineError::MissingPart {
                expected: ref path, ..
            }
            | PipelineError::MissingFile {
                model: ref path, ..
            } => RunError::MissingFile {
                path: path.clone(),
                message,
                source: Some(Box::new(error)),
            },
            PipelineError::BudgetTooSmall { least_bytes, .. } => RunError::BudgetTooSmall {
                budget: Budget::Vram,
                // The budget the stage was given is not at hand: what was asked is
                // below `least_bytes`, which is what the caller acts on.
                given_bytes: 0,
                least_bytes,
                message,
                source: None,
            },
            PipelineError::Output { ref path, .. } => RunError::Io {
                path: path.clone(),
                message,
                source: Some(Box::new(error)),
            },
            // A stage's output of the wrong size, a thread that panicked, a replay
            // that does not add up: stagehand's own.
            PipelineError::StageOutput { .. } | PipelineError::Failed(_) => RunError::Internal {
                message,
                source: Some(Box::new(error)),
            },
        }
    }
}

//! A Flux pipeline's parts on disk: the diffusers folder `save_pretrained` writes
//! (`model_index.json` naming `text_encoder/` CLIP, `text_encoder_2/` T5,
//! `transformer/`, `vae/`, their tokenizers and the scheduler), each part refused by
//! name when it is missing.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::model::CheckpointPart;

use super::PipelineError;

/// The pipeline classes computed here, by `model_index.json` `_class_name`.
const FLUX_PIPELINES: &[&str] = &["FluxPipeline", "FluxImg2ImgPipeline"];

/// Where each model of a Flux pipeline is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FluxParts {
    /// What the user named: the pipeline folder, the all-in-one checkpoint or the
    /// transformer's file.
    pub dir: PathBuf,
    /// CLIP's text encoder: the pooled vector.
    pub clip: PipelinePart,
    /// T5's encoder: the per-token states.
    pub t5: PipelinePart,
    pub transformer: PipelinePart,
    pub vae: PipelinePart,
}

/// One model of a pipeline: where it is and how to read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelinePart {
    /// Its folder (diffusers' layout) or file.
    pub path: PathBuf,
    /// The tensors of `path` that are this model, where the file holds others too.
    pub part: Option<CheckpointPart>,
    /// A text encoder's tokenizer folder, where it is not beside the encoder.
    pub tokenizer: Option<PathBuf>,
}

impl PipelinePart {
    /// A whole folder or file.
    pub fn whole(path: PathBuf) -> Self {
        Self {
            path,
            part: None,
            tokenizer: None,
        }
    }

    /// The bytes of its weights: the part's tensors, or the folder's or file's
    /// checkpoints (0 where they cannot be read).
    pub fn bytes(&self) -> u64 {
        let folder = match self.part {
            Some(_) => None,
            None => crate::model::ModelFolder::find(&self.path).ok().flatten(),
        };
        let checkpoint = folder
            .as_ref()
            .map_or(self.path.as_path(), |folder| folder.checkpoint.as_path());
        let index = crate::run::open_index(checkpoint, None, self.part.as_ref(), folder.is_none());
        index.map_or(0, |index| index.total_bytes())
    }
}

impl FluxParts {
    /// The parts of the pipeline folder `dir`.
    pub fn folder(dir: &Path) -> Result<Self, PipelineError> {
        let index_path = dir.join("model_index.json");
        let text = std::fs::read_to_string(&index_path).map_err(|error| {
            PipelineError::Layout {
                path: dir.to_path_buf(),
                problem: format!(
                    "no model_index.json ({error}); give a diffusers pipeline folder (the one `save_pretrained` writes, holding transformer/, vae/, text_encoder/ …)"
                ),
            }
        })?;
        let index: Value = serde_json::from_str(&text).map_err(|error| PipelineError::Layout {
            path: index_path.clone(),
            problem: format!("is not JSON ({error})"),
        })?;
        let class = index
            .get("_class_name")
            .and_then(Value::as_str)
            .unwrap_or("(none)");
        if !FLUX_PIPELINES.contains(&class) {
            return Err(PipelineError::Layout {
                path: index_path,
                problem: format!(
                    "_class_name is \"{class}\"; stagehand makes images with {}",
                    FLUX_PIPELINES.join(" and ")
                ),
            });
        }
        let part = |name: &str| -> Result<PipelinePart, PipelineError> {
            let listed = index
                .get(name)
                .and_then(Value::as_array)
                .is_some_and(|pair| pair.iter().all(|entry| !entry.is_null()));
            let path = dir.join(name);
            if !listed || !path.join("config.json").is_file() {
                return Err(PipelineError::MissingPart {
                    part: name.to_string(),
                    expected: path.join("config.json"),
                });
            }
            Ok(PipelinePart::whole(path))
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            clip: part("text_encoder")?,
            t5: part("text_encoder_2")?,
            transformer: part("transformer")?,
            vae: part("vae")?,
        })
    }

    /// The parts of the pipeline `path` ([`FluxParts::locate`] with no file given).
    pub fn open(path: &Path) -> Result<Self, PipelineError> {
        Self::locate(path, &super::PartFiles::default())
    }
}

//! A Flux pipeline's parts on disk: the diffusers folder `save_pretrained` writes
//! (`model_index.json` naming `text_encoder/` CLIP, `text_encoder_2/` T5,
//! `transformer/`, `vae/`, their tokenizers and the scheduler), each part refused by
//! name when it is missing.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::PipelineError;

/// The pipeline classes computed here, by `model_index.json` `_class_name`.
const FLUX_PIPELINES: &[&str] = &["FluxPipeline", "FluxImg2ImgPipeline"];

/// Where each model of a Flux pipeline is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FluxParts {
    pub dir: PathBuf,
    /// CLIP's text encoder: the pooled vector.
    pub clip: PathBuf,
    /// T5's encoder: the per-token states.
    pub t5: PathBuf,
    pub transformer: PathBuf,
    pub vae: PathBuf,
}

impl FluxParts {
    /// The parts of the pipeline folder `dir`.
    pub fn open(dir: &Path) -> Result<Self, PipelineError> {
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
        let part = |name: &str| -> Result<PathBuf, PipelineError> {
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
            Ok(path)
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            clip: part("text_encoder")?,
            t5: part("text_encoder_2")?,
            transformer: part("transformer")?,
            vae: part("vae")?,
        })
    }

    /// Whether `dir` is a pipeline folder (it has `model_index.json`).
    pub fn is_pipeline(dir: &Path) -> bool {
        dir.join("model_index.json").is_file()
    }
}

//! A Flux pipeline from the files ComfyUI users have: the transformer's file
//! (`flux1-dev.safetensors` or its FP8, in Black Forest Labs' names), `clip_l`,
//! `t5xxl_fp16` / `t5xxl_fp8_e4m3fn_scaled` and `ae.safetensors` (the autoencoder in
//! its original names) as separate files; or an all-in-one checkpoint holding them
//! side by side (`model.diffusion_model.`, `text_encoders.clip_l.transformer.`,
//! `text_encoders.t5xxl.transformer.`, `vae.`). A file named for a part replaces the
//! all-in-one's (or the pipeline folder's) part; a part found nowhere is refused
//! naming the flag that gives it.

use std::path::{Path, PathBuf};

use super::folder::{FluxParts, PipelinePart};
use super::PipelineError;
use crate::model::{CheckpointPart, ModelIndex, PartNames};

/// The files given for a pipeline's parts (`stagehand image --clip … --t5 … --vae …`),
/// and the tokenizer folders of text encoders given as files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartFiles {
    pub clip: Option<PathBuf>,
    pub t5: Option<PathBuf>,
    pub vae: Option<PathBuf>,
    /// CLIP's tokenizer: `vocab.json` + `merges.txt` or `tokenizer.json` (ComfyUI's
    /// `comfy/sd1_tokenizer`).
    pub clip_tokenizer: Option<PathBuf>,
    /// T5's tokenizer: `tokenizer.json` (ComfyUI's `comfy/text_encoders/t5_tokenizer`).
    pub t5_tokenizer: Option<PathBuf>,
    /// Only the weights are read (`simulate` describes the parts from their headers):
    /// a text encoder given as a file needs no tokenizer.
    pub weights_only: bool,
}

/// The prefixes of ComfyUI's all-in-one Flux checkpoints.
const TRANSFORMER_PREFIX: &str = "model.diffusion_model.";
const CLIP_PREFIX: &str = "text_encoders.clip_l.transformer.";
const T5_PREFIX: &str = "text_encoders.t5xxl.transformer.";
const VAE_PREFIXES: &[&str] = &["vae.", "first_stage_model."];

/// A Flux transformer's own first tensors, in Black Forest Labs' or diffusers' names.
const TRANSFORMER_NAMES: &[&str] = &["img_in.weight", "x_embedder.weight"];

/// What a part that is missing is and where people have it.
struct Missing {
    part: &'static str,
    flag: &'static str,
    example: &'static str,
}

const CLIP: Missing = Missing {
    part: "CLIP text encoder",
    flag: "--clip",
    example: "ComfyUI's models/text_encoders/clip_l.safetensors",
};
const T5: Missing = Missing {
    part: "T5 encoder",
    flag: "--t5",
    example: "ComfyUI's models/text_encoders/t5xxl_fp16.safetensors",
};
const VAE: Missing = Missing {
    part: "VAE",
    flag: "--vae",
    example: "ComfyUI's models/vae/ae.safetensors",
};
const CLIP_TOKENIZER: Missing = Missing {
    part: "CLIP tokenizer",
    flag: "--clip-tokenizer",
    example: "a folder with vocab.json and merges.txt, as ComfyUI's comfy/sd1_tokenizer",
};
const T5_TOKENIZER: Missing = Missing {
    part: "T5 tokenizer",
    flag: "--t5-tokenizer",
    example: "a folder with tokenizer.json, as ComfyUI's comfy/text_encoders/t5_tokenizer",
};

impl Missing {
    fn error(&self, model: &Path) -> PipelineError {
        PipelineError::MissingFile {
            part: self.part,
            model: model.to_path_buf(),
            flag: self.flag,
            example: self.example,
        }
    }
}

impl FluxParts {
    /// The parts of the pipeline `model` (a diffusers folder, an all-in-one
    /// checkpoint, or the transformer's file), with `files` in place of its own.
    pub fn locate(model: &Path, files: &PartFiles) -> Result<Self, PipelineError> {
        let given = [&files.clip, &files.t5, &files.vae];
        if let Some(file) = given.into_iter().flatten().find(|file| !file.is_file()) {
            return Err(PipelineError::Layout {
                path: file.clone(),
                problem: "is not a file; give a part's .safetensors file".into(),
            });
        }
        if model.is_dir() {
            return Self::folder(model).map(|parts| parts.replaced(files));
        }
        if !model.exists() {
            return Err(PipelineError::Layout {
                path: model.to_path_buf(),
                problem: "does not exist; give a diffusers pipeline folder (model_index.json, transformer/, vae/ …), a ComfyUI all-in-one checkpoint, or the transformer's file with --clip, --t5 and --vae".into(),
            });
        }
        let index = ModelIndex::open(model, None).map_err(|error| PipelineError::Layout {
            path: model.to_path_buf(),
            problem: error.to_string(),
        })?;
        let has_prefix = |prefix: &str| {
            index
                .tensors
                .iter()
                .any(|tensor| tensor.name.starts_with(prefix))
        };
        let transformer = if has_prefix(TRANSFORMER_PREFIX) {
            within(model, TRANSFORMER_PREFIX, PartNames::AsIs)
        } else if TRANSFORMER_NAMES
            .iter()
            .any(|name| index.tensor(name).is_some())
        {
            PipelinePart::whole(model.to_path_buf())
        } else {
            return Err(PipelineError::Layout {
                path: model.to_path_buf(),
                problem: format!(
                    "is neither a diffusers pipeline folder nor a Flux checkpoint (no `{TRANSFORMER_PREFIX}` tensors, nor the transformer's own `img_in`/`x_embedder`)"
                ),
            });
        };
        let clip = text_part(
            files.clip.as_ref(),
            has_prefix(CLIP_PREFIX),
            model,
            CLIP_PREFIX,
        )
        .ok_or_else(|| CLIP.error(model))?;
        let t5 = text_part(files.t5.as_ref(), has_prefix(T5_PREFIX), model, T5_PREFIX)
            .ok_or_else(|| T5.error(model))?;
        let vae = match &files.vae {
            Some(file) => PipelinePart::whole(file.clone()),
            None => {
                let prefix = (VAE_PREFIXES.iter().copied())
                    .find(|prefix| has_prefix(prefix))
                    .ok_or_else(|| VAE.error(model))?;
                // The all-in-one's autoencoder keeps its original names.
                let ldm = has_prefix(&format!("{prefix}decoder.up."))
                    || has_prefix(&format!("{prefix}encoder.down."));
                let names = if ldm {
                    PartNames::LdmAutoencoder
                } else {
                    PartNames::AsIs
                };
                within(model, prefix, names)
            }
        };
        Ok(Self {
            dir: model.to_path_buf(),
            clip: tokenized(
                clip,
                (files.clip_tokenizer.as_ref(), files),
                &CLIP_TOKENIZER,
                model,
            )?,
            t5: tokenized(
                t5,
                (files.t5_tokenizer.as_ref(), files),
                &T5_TOKENIZER,
                model,
            )?,
            transformer,
            vae,
        })
    }

    /// The folder's parts with the files given in place of its own; a text encoder
    /// given as a file takes the folder's tokenizer unless one is given.
    fn replaced(mut self, files: &PartFiles) -> Self {
        let dir = self.dir.clone();
        let replace =
            |part: &mut PipelinePart, file: &Option<PathBuf>, tokenizer: Option<PathBuf>| {
                if let Some(file) = file {
                    *part = PipelinePart {
                        path: file.clone(),
                        part: None,
                        tokenizer: None,
                    };
                }
                if tokenizer.is_some() {
                    part.tokenizer = tokenizer;
                }
            };
        let folder_tokenizer = |given: &Option<PathBuf>, file: &Option<PathBuf>, name: &str| {
            given
                .clone()
                .or_else(|| file.as_ref().map(|_| dir.join(name)))
        };
        let clip_tokenizer = folder_tokenizer(&files.clip_tokenizer, &files.clip, "tokenizer");
        let t5_tokenizer = folder_tokenizer(&files.t5_tokenizer, &files.t5, "tokenizer_2");
        replace(&mut self.clip, &files.clip, clip_tokenizer);
        replace(&mut self.t5, &files.t5, t5_tokenizer);
        replace(&mut self.vae, &files.vae, None);
        self
    }

    /// Whether `path` is a pipeline: a folder with `model_index.json`, or a file
    /// holding a transformer and a text encoder side by side (ComfyUI's all-in-one).
    pub fn is_pipeline(path: &Path) -> bool {
        if path.is_dir() {
            return path.join("model_index.json").is_file();
        }
        ModelIndex::open(path, None).is_ok_and(|index| {
            [TRANSFORMER_PREFIX, CLIP_PREFIX].iter().all(|prefix| {
                index
                    .tensors
                    .iter()
                    .any(|tensor| tensor.name.starts_with(prefix))
            })
        })
    }
}

fn within(model: &Path, prefix: &str, names: PartNames) -> PipelinePart {
    PipelinePart {
        path: model.to_path_buf(),
        part: Some(CheckpointPart::under(prefix, names)),
        tokenizer: None,
    }
}

/// A text encoder's part: the file given for it, else the all-in-one's.
fn text_part(
    file: Option<&PathBuf>,
    in_model: bool,
    model: &Path,
    prefix: &str,
) -> Option<PipelinePart> {
    match file {
        Some(file) => Some(PipelinePart::whole(file.clone())),
        None => in_model.then(|| within(model, prefix, PartNames::AsIs)),
    }
}

/// A text encoder from a file, with its tokenizer's folder (which a file lacks;
/// refused without one unless only the weights are read).
fn tokenized(
    part: PipelinePart,
    (tokenizer, files): (Option<&PathBuf>, &PartFiles),
    missing: &Missing,
    model: &Path,
) -> Result<PipelinePart, PipelineError> {
    if tokenizer.is_none() && !files.weights_only {
        return Err(missing.error(model));
    }
    Ok(PipelinePart {
        tokenizer: tokenizer.cloned(),
        ..part
    })
}

//! A Wan pipeline from the files ComfyUI users have: the transformer's file
//! (`diffusion_models/wan2.2_t2v_high_noise_14B_fp16.safetensors`, in Wan-AI's
//! original names, bare or under `model.diffusion_model.`; diffusers' names read too)
//! and, for Wan 2.2 A14B, the low-noise expert's (`--model-2`); umT5 as a file
//! (`text_encoders/umt5_xxl_fp16.safetensors`, transformers' names) with its
//! tokenizer's folder; the VAE's file (`vae/wan_2.1_vae.safetensors`, or Wan 2.2's,
//! in its original names) or diffusers folder; and the scheduler's config. A part
//! not given is refused naming the flag that gives it.
//!
//! What the files do not say is what the published pipelines say: two experts switch
//! at `boundary_ratio` 0.875 for text-to-video and 0.9 for image-to-video (a
//! transformer taking more channels than it gives), as Wan 2.2's `model_index.json`.

use std::path::{Path, PathBuf};

use super::super::{PipelineError, PipelinePart};
use super::WanParts;
use crate::families::wan_vae::WanVaeConfig;
use crate::model::{CheckpointPart, ModelIndex, PartNames};

/// The files given for a Wan pipeline's parts (`stagehand video --model-2 … --umt5 …
/// --umt5-tokenizer … --vae … --scheduler …`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VideoFiles {
    /// The low-noise expert (Wan 2.2 A14B's `transformer_2`).
    pub model_2: Option<PathBuf>,
    /// umT5's encoder, a file or a folder.
    pub umt5: Option<PathBuf>,
    /// umT5's tokenizer folder (`tokenizer.json`), for umT5 given as a file.
    pub umt5_tokenizer: Option<PathBuf>,
    /// The VAE (`AutoencoderKLWan`): its diffusers folder or its single file.
    pub vae: Option<PathBuf>,
    /// A `scheduler_config.json` (UniPC or flow-matching Euler).
    pub scheduler: Option<PathBuf>,
}

impl VideoFiles {
    /// Whether any part was given.
    pub fn any(&self) -> bool {
        [
            &self.model_2,
            &self.umt5,
            &self.umt5_tokenizer,
            &self.vae,
            &self.scheduler,
        ]
        .iter()
        .any(|file| file.is_some())
    }
}

/// ComfyUI's marker of a scaled-FP8 file (`<prefix>scaled_fp8`).
const MARKER: &str = "scaled_fp8";

/// The published pipelines' boundaries between the experts.
const T2V_BOUNDARY_RATIO: f64 = 0.875;
const I2V_BOUNDARY_RATIO: f64 = 0.9;
/// The latent channels of Wan 2.2's VAE, TI2V-5B's (Wan 2.1's VAE has 16).
const TI2V_CHANNELS: usize = 48;

fn missing(
    model: &Path,
    part: &'static str,
    flag: &'static str,
    example: &'static str,
) -> PipelineError {
    PipelineError::MissingFile {
        part,
        model: model.to_path_buf(),
        flag,
        example,
    }
}

impl WanParts {
    /// The parts of `model` (a diffusers Wan pipeline folder, or the transformer's
    /// file) with `files` for the rest; in a folder, a part given replaces its own.
    pub fn locate(model: &Path, files: &VideoFiles) -> Result<Self, PipelineError> {
        if model.is_dir() {
            return Self::folder(model).and_then(|parts| parts.replaced(files));
        }
        if !model.exists() {
            return Err(PipelineError::Layout {
                path: model.to_path_buf(),
                problem: "does not exist; give a diffusers Wan pipeline folder (model_index.json, transformer/, vae/ …) or a WAN transformer's file with --umt5, --umt5-tokenizer, --vae and --scheduler".into(),
            });
        }
        let transformer = transformer_part(model)?;
        let [in_channels, out_channels] = channels(&transformer)?;
        let image_to_video = in_channels > out_channels;
        let transformer_2 = match &files.model_2 {
            Some(file) => Some(transformer_part(file)?),
            None => None,
        };
        let boundary_ratio = transformer_2.as_ref().map(|_| match image_to_video {
            true => I2V_BOUNDARY_RATIO,
            false => T2V_BOUNDARY_RATIO,
        });
        let umt5 = files.umt5.clone().ok_or_else(|| {
            missing(
                model,
                "umT5 text encoder",
                "--umt5",
                "ComfyUI's models/text_encoders/umt5_xxl_fp16.safetensors",
            )
        })?;
        let tokenizer = files.umt5_tokenizer.clone().ok_or_else(|| {
            missing(model, "umT5 tokenizer", "--umt5-tokenizer", "a folder with umT5's tokenizer.json (google/umt5-xxl's, or a Wan pipeline's tokenizer/)")
        })?;
        let vae = files.vae.clone().ok_or_else(|| {
            missing(model, "WAN VAE", "--vae", "ComfyUI's models/vae/wan_2.1_vae.safetensors (wan2.2_vae.safetensors for TI2V-5B), or a Wan pipeline's vae/ folder")
        })?;
        let scheduler = files.scheduler.clone().ok_or_else(|| {
            missing(model, "scheduler", "--scheduler", "a Wan pipeline's scheduler/scheduler_config.json (UniPCMultistepScheduler or FlowMatchEulerDiscreteScheduler)")
        })?;
        // A file carries no model_index.json: TI2V-5B is the one WAN whose noise has
        // the 2.2 VAE's 48 channels and takes no image channels beside it, and every
        // published one samples with its timestep per token.
        let expand_timesteps = out_channels == TI2V_CHANNELS && in_channels == out_channels;
        let vae = vae_part(vae)?;
        let vae_scale = vae_scale(&vae)?;
        let parts = Self {
            dir: model.to_path_buf(),
            text_encoder: PipelinePart {
                tokenizer: Some(tokenizer),
                ..PipelinePart::whole(umt5)
            },
            transformer,
            transformer_2,
            vae,
            scheduler,
            boundary_ratio,
            latent_channels: out_channels,
            image_to_video,
            expand_timesteps,
            vae_scale,
        };
        parts.check_files()?;
        Ok(parts)
    }

    /// The folder's parts with the given ones in their place.
    fn replaced(mut self, files: &VideoFiles) -> Result<Self, PipelineError> {
        if let Some(file) = &files.model_2 {
            if self.transformer_2.is_none() {
                return Err(PipelineError::Layout {
                    path: self.dir.clone(),
                    problem: "--model-2 replaces a pipeline's transformer_2, and this one has none (no boundary_ratio); give the high-noise expert's file as --model instead".into(),
                });
            }
            self.transformer_2 = Some(transformer_part(file)?);
        }
        if let Some(file) = &files.umt5 {
            self.text_encoder.path = file.clone();
        }
        if let Some(dir) = &files.umt5_tokenizer {
            self.text_encoder.tokenizer = Some(dir.clone());
        }
        if let Some(vae) = &files.vae {
            self.vae = vae_part(vae.clone())?;
        }
        if let Some(file) = &files.scheduler {
            self.scheduler = file.clone();
        }
        self.check_files()?;
        if files.vae.is_some() {
            self.vae_scale = vae_scale(&self.vae)?;
        }
        Ok(self)
    }

    /// Every part given is there.
    fn check_files(&self) -> Result<(), PipelineError> {
        let paths = [
            Some(&self.text_encoder.path),
            self.text_encoder.tokenizer.as_ref(),
            Some(&self.vae.path),
            Some(&self.scheduler),
        ];
        match paths.into_iter().flatten().find(|path| !path.exists()) {
            Some(path) => Err(PipelineError::Layout {
                path: path.clone(),
                problem: "does not exist".into(),
            }),
            None => Ok(()),
        }
    }
}

/// A WAN transformer's file: in the original names (read renamed), or diffusers'.
fn transformer_part(file: &Path) -> Result<PipelinePart, PipelineError> {
    let layout = |problem: String| PipelineError::Layout {
        path: file.to_path_buf(),
        problem,
    };
    if !file.is_file() {
        return Err(layout("is not a file; give a WAN transformer's .safetensors file (ComfyUI's models/diffusion_models/wan2.2_*.safetensors) or a diffusers Wan pipeline folder".into()));
    }
    let index = ModelIndex::open(file, None).map_err(|error| layout(error.to_string()))?;
    let part = CheckpointPart::implied(&index);
    let diffusers = index
        .tensor("condition_embedder.time_proj.weight")
        .is_some();
    if part.is_none() && !diffusers {
        return Err(layout("is not a WAN transformer: neither Wan-AI's names (head.head, blocks.0.self_attn.q, bare or under model.diffusion_model.) nor diffusers' (condition_embedder.time_proj)".into()));
    }
    check_marker(&index).map_err(layout)?;
    // Refused here, not after the text encoder has run: what the family would refuse.
    let named = match &part {
        Some(within) => ModelIndex::open_part(file, None, within),
        None => Ok(index),
    }
    .map_err(|error| layout(error.to_string()))?;
    crate::families::wan::check_file(&named).map_err(|error| {
        let message = error.to_string();
        let prefix = format!("{}: ", file.display());
        layout(
            message
                .strip_prefix(&prefix)
                .unwrap_or(&message)
                .to_string(),
        )
    })?;
    Ok(PipelinePart {
        part,
        ..PipelinePart::whole(file.to_path_buf())
    })
}

/// ComfyUI's `scaled_fp8` marker names the FP8 format of the file's weights (an F32
/// marker reads as E4M3, as ComfyUI reads it), and ComfyUI makes every Linear weight
/// that format as it loads: a weight stored in the other format would be converted
/// there, not computed as stored, so such a file is refused.
fn check_marker(index: &ModelIndex) -> Result<(), String> {
    let is_marker = |name: &str| name == MARKER || name.ends_with(&format!(".{MARKER}"));
    let Some(marker) = index.tensors.iter().find(|tensor| is_marker(&tensor.name)) else {
        return Ok(());
    };
    let format = match marker.dtype.as_str() {
        "F32" => "F8_E4M3",
        other => other,
    };
    if !matches!(format, "F8_E4M3" | "F8_E5M2") {
        return Err(format!(
            "its marker `{}` is {}; ComfyUI's scaled_fp8 marker is an F8_E4M3 or F8_E5M2 tensor (or F32, read as F8_E4M3) naming the weights' format",
            marker.name, marker.dtype
        ));
    }
    let other = (index.tensors.iter())
        .find(|tensor| tensor.dtype.starts_with("F8_") && tensor.dtype != format);
    match other {
        Some(tensor) => Err(format!(
            "tensor `{}` is {} but the marker `{}` says the weights are {format}; ComfyUI would convert it to {format} as it loads, which is not computed here: use a file whose FP8 weights are the marker's format",
            tensor.name, tensor.dtype, marker.name
        )),
        None => Ok(()),
    }
}

/// The VAE: its diffusers folder, or its single file — in Wan-AI's original names
/// (ComfyUI's `vae/wan_2.1_vae.safetensors`, `vae/wan2.2_vae.safetensors`: read
/// renamed, [`PartNames::WanVae`]) or diffusers' — whose config the family infers
/// from its shapes. Another file is refused by name.
fn vae_part(path: PathBuf) -> Result<PipelinePart, PipelineError> {
    if !path.is_file() {
        return Ok(PipelinePart::whole(path));
    }
    let layout = |problem: String| PipelineError::Layout {
        path: path.clone(),
        problem,
    };
    let index = ModelIndex::open(&path, None).map_err(|error| layout(error.to_string()))?;
    let part = match CheckpointPart::implied(&index) {
        Some(part) if part.names == PartNames::WanVae => Some(part),
        _ if crate::families::wan_vae::is_wan_vae(&index) => None,
        _ => return Err(layout("is not a WAN VAE: neither Wan-AI's names (decoder.middle.0.residual.0.gamma …: ComfyUI's vae/wan_2.1_vae.safetensors or wan2.2_vae.safetensors) nor diffusers' (decoder.norm_out.gamma …); give the VAE's file or a Wan pipeline's vae/ folder".into())),
    };
    Ok(PipelinePart {
        part,
        ..PipelinePart::whole(path)
    })
}

/// Pixels per latent position of the VAE: its folder's config, or for a file the
/// config the family infers from its shapes (a diffusers file beside its
/// `config.json` is read with that, as a run reads it).
fn vae_scale(vae: &PipelinePart) -> Result<usize, PipelineError> {
    let folder = match vae.path.is_dir() {
        true => Some(vae.path.as_path()),
        false => (vae.path.parent())
            .filter(|dir| vae.part.is_none() && dir.join("config.json").is_file()),
    };
    if let Some(folder) = folder {
        return super::folder::vae_scale(folder);
    }
    let layout = |problem: String| PipelineError::Layout {
        path: vae.path.clone(),
        problem,
    };
    let index = crate::run::open_index(&vae.path, None, vae.part.as_ref(), true)
        .map_err(|error| layout(error.to_string()))?;
    let config = crate::families::wan_vae::inferred_config(&index)
        .and_then(|json| WanVaeConfig::from_json(&vae.path, &json))
        .map_err(|error| layout(error.to_string()))?;
    Ok(config.pixel_scale())
}

/// A transformer part's channels in and out, from its patch embedding and output.
fn channels(part: &PipelinePart) -> Result<[usize; 2], PipelineError> {
    let layout = |problem: String| PipelineError::Layout {
        path: part.path.clone(),
        problem,
    };
    let index = match &part.part {
        Some(within) => ModelIndex::open_part(&part.path, None, within),
        None => ModelIndex::open(&part.path, None),
    }
    .map_err(|error| layout(error.to_string()))?;
    crate::families::wan::transformer_channels(&index).map_err(layout)
}

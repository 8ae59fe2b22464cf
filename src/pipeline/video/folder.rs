//! A Wan pipeline's parts on disk: the diffusers folder `save_pretrained` writes for
//! `WanPipeline` (`model_index.json` naming `text_encoder/` umT5, `tokenizer/`,
//! `transformer/`, optionally `transformer_2/` with `boundary_ratio` — Wan 2.2 A14B's
//! two experts — `vae/` and `scheduler/`), each part refused by name when missing;
//! or the one it writes for `WanImageToVideoPipeline` (Wan 2.2 I2V-A14B: the same
//! parts, the transformers taking the image's condition beside the noise, no image
//! encoder).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::super::{PipelineError, PipelinePart};

/// The pipeline classes computed here, by `model_index.json` `_class_name`.
const WAN_PIPELINES: &[&str] = &["WanPipeline", "WanImageToVideoPipeline"];

/// Where each model of a Wan pipeline is.
#[derive(Debug, Clone, PartialEq)]
pub struct WanParts {
    pub dir: PathBuf,
    /// umT5, with its tokenizer folder.
    pub text_encoder: PipelinePart,
    /// The (high-noise, with two experts) transformer.
    pub transformer: PipelinePart,
    /// The low-noise expert, taking the steps below the boundary.
    pub transformer_2: Option<PipelinePart>,
    pub vae: PipelinePart,
    /// `scheduler/scheduler_config.json`.
    pub scheduler: PathBuf,
    /// The share of the training timesteps above which the first expert denoises.
    pub boundary_ratio: Option<f64>,
    /// The noise's channels (the transformer's `out_channels`).
    pub latent_channels: usize,
    /// An image-to-video pipeline: the transformer's other `in_channels` are the
    /// image's condition (4 of mask, the rest the encoded frames), or (with
    /// `expand_timesteps`) the image stands for the first latent frame.
    pub image_to_video: bool,
    /// TI2V-5B's `expand_timesteps`: a timestep per latent token, so that a given
    /// first frame (`--image`) stays at timestep 0 while the others are denoised.
    pub expand_timesteps: bool,
    /// Pixels per latent position along each side (the VAE's
    /// `scale_factor_spatial`: 8, or 16 for Wan 2.2's 48-channel VAE).
    pub vae_scale: usize,
}

impl WanParts {
    /// Whether `dir` is a diffusers Wan pipeline (`model_index.json` names a `Wan…`
    /// class): a folder to open as one, its other faults then refused by name.
    pub fn is_pipeline(dir: &Path) -> bool {
        let Ok(text) = std::fs::read_to_string(dir.join("model_index.json")) else {
            return false;
        };
        serde_json::from_str::<Value>(&text).is_ok_and(|index| {
            (index.get("_class_name").and_then(Value::as_str))
                .is_some_and(|class| class.starts_with("Wan"))
        })
    }

    /// The parts of the pipeline folder `dir`.
    pub fn folder(dir: &Path) -> Result<Self, PipelineError> {
        let layout = |path: &Path, problem: String| PipelineError::Layout {
            path: path.to_path_buf(),
            problem,
        };
        let index_path = dir.join("model_index.json");
        let (index, class) = read_index(dir, &index_path)?;
        let image_to_video = class == "WanImageToVideoPipeline";
        let listed = |name: &str| {
            index
                .get(name)
                .and_then(Value::as_array)
                .is_some_and(|pair| pair.iter().all(|entry| !entry.is_null()))
        };
        let part = |name: &str| -> Result<PipelinePart, PipelineError> {
            let path = dir.join(name);
            if !listed(name) || !path.join("config.json").is_file() {
                return Err(PipelineError::MissingPart {
                    part: name.to_string(),
                    expected: path.join("config.json"),
                });
            }
            Ok(PipelinePart::whole(path))
        };
        let boundary_ratio = match index.get("boundary_ratio") {
            None | Some(Value::Null) => None,
            Some(value) => match value.as_f64() {
                Some(ratio) if (0.0..=1.0).contains(&ratio) => Some(ratio),
                _ => {
                    return Err(layout(
                        &index_path,
                        format!("\"boundary_ratio\": {value} is not a number in [0, 1]"),
                    ))
                }
            },
        };
        let transformer_2 = match listed("transformer_2") {
            true => Some(part("transformer_2")?),
            false => None,
        };
        if boundary_ratio.is_some() != transformer_2.is_some() {
            return Err(layout(
                &index_path,
                "\"boundary_ratio\" and transformer_2 come together (two experts) or not at all"
                    .into(),
            ));
        }
        let scheduler = dir.join("scheduler").join("scheduler_config.json");
        if !scheduler.is_file() {
            return Err(PipelineError::MissingPart {
                part: "scheduler".into(),
                expected: scheduler,
            });
        }
        let transformer = part("transformer")?;
        let expand_timesteps = index.get("expand_timesteps").and_then(Value::as_bool) == Some(true);
        let latent_channels = noise_channels(&transformer.path, &class, expand_timesteps)?;
        let vae = part("vae")?;
        let vae_scale = vae_scale(&vae.path)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            text_encoder: PipelinePart {
                tokenizer: Some(dir.join("tokenizer")),
                ..part("text_encoder")?
            },
            transformer,
            transformer_2,
            vae,
            scheduler,
            boundary_ratio,
            latent_channels,
            image_to_video,
            expand_timesteps,
            vae_scale,
        })
    }
}

/// `model_index.json` of `dir` and its `_class_name`, refused unless a Wan pipeline
/// computed here.
fn read_index(dir: &Path, index_path: &Path) -> Result<(Value, String), PipelineError> {
    let layout = |path: &Path, problem: String| PipelineError::Layout {
        path: path.to_path_buf(),
        problem,
    };
    let text = std::fs::read_to_string(index_path).map_err(|error| {
        layout(dir, format!("no model_index.json ({error}); give a diffusers Wan pipeline folder (the one `save_pretrained` writes, holding transformer/, vae/, text_encoder/ …)"))
    })?;
    let index: Value = serde_json::from_str(&text)
        .map_err(|error| layout(index_path, format!("is not JSON ({error})")))?;
    let class = index
        .get("_class_name")
        .and_then(Value::as_str)
        .unwrap_or("(none)")
        .to_string();
    if !WAN_PIPELINES.contains(&class.as_str()) {
        return Err(layout(
            index_path,
            format!(
                "_class_name is \"{class}\"; stagehand makes videos with {}",
                WAN_PIPELINES.join(" and ")
            ),
        ));
    }
    let image_encoder = index.get("image_encoder").and_then(Value::as_array);
    if image_encoder.is_some_and(|pair| pair.iter().any(|entry| !entry.is_null())) {
        return Err(layout(index_path, "names an image_encoder: Wan 2.1's CLIP image conditioning (image_embeds, the transformer's image_dim) is not computed; Wan 2.2 I2V-A14B needs none".into()));
    }
    Ok((index, class))
}

/// Pixels per latent position of the `vae/` folder (its config's
/// `scale_factor_spatial`, as the VAE family reads and checks it).
pub(super) fn vae_scale(vae: &Path) -> Result<usize, PipelineError> {
    let path = vae.join("config.json");
    let problem = |problem: String| PipelineError::Layout {
        path: path.clone(),
        problem,
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|error| problem(format!("cannot be read ({error})")))?;
    let config: Value =
        serde_json::from_str(&text).map_err(|error| problem(format!("is not JSON ({error})")))?;
    let config = crate::families::wan_vae::WanVaeConfig::from_json(&path, &config)
        .map_err(|error| problem(error.to_string()))?;
    Ok(config.pixel_scale())
}

/// The noise's channels of a `class` pipeline's transformer folder: all its
/// `in_channels` for text-to-video and TI2V (`expand_timesteps`: the image replaces
/// the first frame); for image-to-video the rest are the condition (a mask of 4 and
/// the VAE's latent), so there are more than 4 of them.
fn noise_channels(transformer: &Path, class: &str, expand: bool) -> Result<usize, PipelineError> {
    let [in_channels, out_channels] = channels(transformer)?;
    let condition = in_channels.saturating_sub(out_channels);
    let (fits, takes) = match class == "WanImageToVideoPipeline" && !expand {
        true => (
            condition > 4,
            "the noise and the image's condition (Wan 2.2 I2V: 36 = 16 + 4 + 16)",
        ),
        false => (
            condition == 0,
            "as many channels as it gives (text-to-video)",
        ),
    };
    if !fits {
        return Err(PipelineError::Layout {
            path: transformer.join("config.json"),
            problem: format!("in_channels {in_channels}, out_channels {out_channels}: a {class} transformer takes {takes}"),
        });
    }
    Ok(out_channels)
}

/// `in_channels` and `out_channels` (diffusers: `out_channels or in_channels`) of a
/// transformer folder's config.json.
fn channels(folder: &Path) -> Result<[usize; 2], PipelineError> {
    let path = folder.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|error| PipelineError::Layout {
        path: path.clone(),
        problem: format!("cannot be read ({error})"),
    })?;
    let config: Value = serde_json::from_str(&text).map_err(|error| PipelineError::Layout {
        path: path.clone(),
        problem: format!("is not JSON ({error})"),
    })?;
    let count = |key: &str| config.get(key).and_then(Value::as_u64).filter(|&n| n > 0);
    match count("in_channels") {
        Some(input) => Ok([input, count("out_channels").unwrap_or(input)].map(|n| n as usize)),
        None => Err(PipelineError::Layout {
            path,
            problem: "has no positive \"in_channels\"".into(),
        }),
    }
}

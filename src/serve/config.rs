//! The serve config file (TOML): where to listen, the limits, and the models, each
//! with its folder, optional LoRA adapters, budgets and limits. Unknown keys are
//! refused by name; relative paths are relative to the file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// `HOST:PORT` to listen on; 127.0.0.1 unless told otherwise.
    #[serde(default = "default_bind")]
    pub bind: String,
    /// Clients must send `Authorization: Bearer KEY` when set.
    #[serde(default)]
    pub api_key: Option<String>,
    /// The admin endpoints (`/admin/models`): off without this table.
    #[serde(default)]
    pub admin: Option<AdminConfig>,
    /// A settings file (as `--config` of the other commands) every model starts from.
    #[serde(default)]
    pub settings: Option<PathBuf>,
    #[serde(default)]
    pub limits: Limits,
    /// One VRAM budget and pin ceiling every model shares (ranked by recency of use);
    /// without it each model has its own.
    #[serde(default)]
    pub budget: Option<SharedBudgetConfig>,
    #[serde(default)]
    pub models: Vec<ModelConfig>,
}

/// `[admin]`: who may load and unload models while the server runs, and from where.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// The admin endpoints take `Authorization: Bearer KEY` with this key, never the
    /// `api_key`.
    pub key: String,
    /// The folders loads may come from: a model's folder and its LoRA files must lie
    /// under one of them once `..` and symlinks are resolved. Relative paths are
    /// relative to the config file.
    pub model_roots: Vec<PathBuf>,
}

impl AdminConfig {
    /// Checks what the types cannot; each message names the key.
    fn validate(&self, api_key: Option<&str>) -> Result<(), String> {
        if self.key.is_empty() {
            return Err(
                "admin.key is empty: set a key, or remove the [admin] table to keep the admin endpoints off"
                    .into(),
            );
        }
        if api_key.is_some_and(|api_key| {
            super::access::keys_match(api_key.as_bytes(), self.key.as_bytes())
        }) {
            return Err(
                "admin.key is the api_key: give the admin endpoints a key of their own, so a client cannot load models"
                    .into(),
            );
        }
        if self.model_roots.is_empty() {
            return Err(
                "admin.model_roots is empty: name the folders the admin endpoints may load models from"
                    .into(),
            );
        }
        if let Some(root) = self.model_roots.iter().find(|root| !root.is_dir()) {
            return Err(format!(
                "admin.model_roots: {} is not a folder",
                root.display()
            ));
        }
        Ok(())
    }
}

/// `[budget]`: the budgets the models share.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SharedBudgetConfig {
    /// VRAM every model together may use (`"24GiB"`).
    pub vram_budget: String,
    /// Pinned RAM every model together may hold; default: what the host can spare.
    #[serde(default)]
    pub pin_ceiling: Option<String>,
}

impl SharedBudgetConfig {
    /// The shared VRAM budget and pin ceiling in bytes (`None`: the host's spare RAM).
    pub fn bytes(&self) -> Result<(u64, Option<u64>), String> {
        let parse = |key: &str, text: &str| {
            text.parse::<bytesize::ByteSize>()
                .ok()
                .map(|size| size.as_u64())
                .filter(|&bytes| bytes > 0)
                .ok_or_else(|| {
                    format!(
                        "budget.{key} = \"{text}\" is not a size above 0 (for example \"24GiB\")"
                    )
                })
        };
        let vram = parse("vram_budget", &self.vram_budget)?;
        let pin = self
            .pin_ceiling
            .as_deref()
            .map(|text| parse("pin_ceiling", text))
            .transpose()?;
        Ok((vram, pin))
    }
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            bind: default_bind(),
            api_key: None,
            admin: None,
            settings: None,
            limits: Limits::default(),
            budget: None,
            models: Vec::new(),
        }
    }
}

fn default_bind() -> String {
    "127.0.0.1:8080".to_string()
}

/// Limits of every request (a model may lower `max_tokens` and `queue_depth`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Requests waiting per model; past it, 429 with `Retry-After`.
    pub queue_depth: usize,
    /// A request that has not finished by then is cancelled (504).
    pub request_timeout_seconds: f64,
    /// After SIGTERM: how long in-flight requests may still run.
    pub drain_seconds: f64,
    /// Largest request body (413 above).
    pub max_body_bytes: usize,
    /// Longest prompt in tokens (400 above).
    pub max_prompt_tokens: usize,
    /// Largest `max_tokens` a request may ask (400 above); the default when it asks none.
    pub max_tokens: u64,
    /// Most inputs in one embeddings request (400 above).
    pub max_inputs: usize,
    /// Most images one images request asks (`n`, 400 above).
    pub max_images: usize,
    /// Largest image, in pixels (`size`, 400 above).
    pub max_image_pixels: usize,
    /// Most denoising steps an images request asks (`num_inference_steps`, 400 above).
    pub max_image_steps: usize,
    /// Most frames one video asks (`seconds` or `num_frames`, 400 above).
    pub max_video_frames: usize,
    /// Largest video frame, in pixels (`size`, 400 above).
    pub max_video_pixels: usize,
    /// Most denoising steps a video asks (`num_inference_steps`, 400 above).
    pub max_video_steps: usize,
    /// Video jobs the server keeps (queued, running and finished together): a new one
    /// drops the oldest finished one; with none finished to drop, 429.
    pub max_video_jobs: usize,
    /// Bytes of finished MP4s the server keeps: past it the oldest finished jobs are
    /// dropped (their ids then 404).
    pub max_video_bytes: usize,
    /// Largest `input_reference` (an image-to-video's first frame, a PNG) a video
    /// request sends (413 above); `POST /v1/videos` takes a body this much larger
    /// (as base64, a third more) than `max_body_bytes`.
    pub max_input_reference_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            queue_depth: 64,
            request_timeout_seconds: 300.0,
            drain_seconds: 30.0,
            max_body_bytes: 2 << 20,
            max_prompt_tokens: 2048,
            max_tokens: 256,
            max_inputs: 256,
            max_images: 4,
            max_image_pixels: 2048 * 2048,
            max_image_steps: 100,
            // Wan 2.2's 81 frames (five seconds at 16 fps) and half again.
            max_video_frames: 121,
            max_video_pixels: 1280 * 720,
            max_video_steps: 100,
            max_video_jobs: 64,
            max_video_bytes: 256 << 20,
            // A 1280×720 RGB frame is 2.7 MB raw: any PNG of the largest frame fits.
            max_input_reference_bytes: 8 << 20,
        }
    }
}

/// One served model.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The name clients ask for (`"model": NAME`).
    pub name: String,
    /// The Hugging Face folder (an encoder or a decoder), a diffusers Flux pipeline
    /// folder (an image model: `/v1/images/generations`) or a diffusers Wan pipeline
    /// folder (a video model: `/v1/videos`).
    pub folder: PathBuf,
    /// LoRA adapters attached for the model's whole life (`FILE` or `FILE:STRENGTH`).
    #[serde(default)]
    pub lora: Vec<String>,
    /// Adapters a request chooses by name, `"model": "NAME:ADAPTER"` (`FILE` or
    /// `FILE:STRENGTH`, applied after `lora`); the base is never reloaded to switch.
    #[serde(default)]
    pub adapters: BTreeMap<String, String>,
    /// This model's VRAM budget (`"2GiB"`); default: the settings' policy.
    #[serde(default)]
    pub vram_budget: Option<String>,
    /// This model's pin ceiling; default: the settings' policy.
    #[serde(default)]
    pub pin_ceiling: Option<String>,
    /// Decoders: sequences decoded together.
    #[serde(default = "default_sequences")]
    pub max_sequences: usize,
    /// Encoders: padded tokens gathered into one step from queued requests.
    #[serde(default = "default_batch_tokens")]
    pub max_batch_tokens: usize,
    /// Lowers the server's `max_tokens` for this model.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Lowers the server's `queue_depth` for this model.
    #[serde(default)]
    pub queue_depth: Option<usize>,
    /// An image model from ComfyUI's files: `folder` names the transformer's file (or
    /// an all-in-one checkpoint) and this table the other parts, as `stagehand image`'s
    /// flags of the same names.
    #[serde(default)]
    pub parts: Option<PartsConfig>,
}

/// `[models.parts]`: the files of an image pipeline's parts and the tokenizer folders
/// of text encoders given as files (see `stagehand image --help`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PartsConfig {
    pub clip: Option<PathBuf>,
    pub t5: Option<PathBuf>,
    pub vae: Option<PathBuf>,
    pub clip_tokenizer: Option<PathBuf>,
    pub t5_tokenizer: Option<PathBuf>,
}

impl PartsConfig {
    /// Every path of the table, with its key (`parts.clip`).
    pub fn paths_mut(&mut self) -> [(&'static str, &mut Option<PathBuf>); 5] {
        [
            ("parts.clip", &mut self.clip),
            ("parts.t5", &mut self.t5),
            ("parts.vae", &mut self.vae),
            ("parts.clip_tokenizer", &mut self.clip_tokenizer),
            ("parts.t5_tokenizer", &mut self.t5_tokenizer),
        ]
    }

    /// The pipeline's [`crate::pipeline::PartFiles`].
    pub fn files(&self) -> crate::pipeline::PartFiles {
        crate::pipeline::PartFiles {
            clip: self.clip.clone(),
            t5: self.t5.clone(),
            vae: self.vae.clone(),
            clip_tokenizer: self.clip_tokenizer.clone(),
            t5_tokenizer: self.t5_tokenizer.clone(),
            weights_only: false,
        }
    }
}

fn default_sequences() -> usize {
    8
}

fn default_batch_tokens() -> usize {
    8192
}

impl ModelConfig {
    /// A model served from `folder` under the folder's name, with the defaults.
    pub fn from_folder(folder: &Path) -> Self {
        let name = folder.file_name().map_or("model".to_string(), |name| {
            name.to_string_lossy().into_owned()
        });
        Self {
            name,
            folder: folder.to_path_buf(),
            lora: Vec::new(),
            adapters: BTreeMap::new(),
            vram_budget: None,
            pin_ceiling: None,
            max_sequences: default_sequences(),
            max_batch_tokens: default_batch_tokens(),
            max_tokens: None,
            queue_depth: None,
            parts: None,
        }
    }
}

/// `FILE[:STRENGTH]` with a relative `FILE` made relative to the config's folder
/// (left as written when it does not parse: loading says why).
fn relative_spec(text: &str, relative: &impl Fn(&Path) -> PathBuf) -> String {
    match crate::lora::LoraSpec::parse(text) {
        Ok(spec) if spec.path.is_relative() => {
            format!("{}:{}", relative(&spec.path).display(), spec.strength)
        }
        _ => text.to_string(),
    }
}

impl ServeConfig {
    /// Reads `path`, paths in it made relative to its folder.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("{}: {error}", path.display()))?;
        let mut config: ServeConfig = toml::from_str(&text)
            .map_err(|error| format!("{}: {}", path.display(), error.message()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let relative = |file: &Path| {
            if file.is_absolute() {
                file.to_path_buf()
            } else {
                base.join(file)
            }
        };
        config.settings = config.settings.as_deref().map(relative);
        if let Some(admin) = &mut config.admin {
            for root in &mut admin.model_roots {
                *root = relative(root);
            }
        }
        for model in &mut config.models {
            model.folder = relative(&model.folder);
            let specs = model.lora.iter_mut().chain(model.adapters.values_mut());
            for spec in specs {
                *spec = relative_spec(spec, &relative);
            }
            if let Some(parts) = &mut model.parts {
                for (_, path) in parts.paths_mut() {
                    *path = path.as_deref().map(relative);
                }
            }
        }
        Ok(config)
    }

    /// The listen address, parsed.
    pub fn bind_addr(&self) -> Result<SocketAddr, String> {
        self.bind.parse().map_err(|_| {
            format!(
                "bind = \"{}\" is not HOST:PORT (for example 127.0.0.1:8080)",
                self.bind
            )
        })
    }

    /// A model's own budgets are refused beside a shared `[budget]`.
    pub(super) fn fits_the_budget(&self, model: &ModelConfig) -> Result<(), String> {
        let own = model.vram_budget.is_some() || model.pin_ceiling.is_some();
        if self.budget.is_some() && own {
            return Err(format!(
                "models.{}: vram_budget and pin_ceiling cannot be set beside a shared [budget] (each model takes its share of it); remove them or the [budget] table",
                model.name
            ));
        }
        Ok(())
    }

    /// Checks what the types cannot; each message names the key.
    pub fn validate(&self) -> Result<(), String> {
        self.bind_addr()?;
        if self.models.is_empty() {
            return Err(
                "no model to serve: add a [[models]] table (name, folder) or pass --model DIR"
                    .into(),
            );
        }
        let limits = &self.limits;
        let positive = [
            ("limits.queue_depth", limits.queue_depth as f64),
            (
                "limits.request_timeout_seconds",
                limits.request_timeout_seconds,
            ),
            ("limits.max_body_bytes", limits.max_body_bytes as f64),
            ("limits.max_prompt_tokens", limits.max_prompt_tokens as f64),
            ("limits.max_tokens", limits.max_tokens as f64),
            ("limits.max_inputs", limits.max_inputs as f64),
            ("limits.max_images", limits.max_images as f64),
            ("limits.max_image_pixels", limits.max_image_pixels as f64),
            ("limits.max_image_steps", limits.max_image_steps as f64),
            ("limits.max_video_frames", limits.max_video_frames as f64),
            ("limits.max_video_pixels", limits.max_video_pixels as f64),
            ("limits.max_video_steps", limits.max_video_steps as f64),
            ("limits.max_video_jobs", limits.max_video_jobs as f64),
            ("limits.max_video_bytes", limits.max_video_bytes as f64),
            (
                "limits.max_input_reference_bytes",
                limits.max_input_reference_bytes as f64,
            ),
        ];
        if let Some((key, _)) = positive
            .iter()
            .find(|(_, value)| value.is_nan() || *value <= 0.0)
        {
            return Err(format!("{key} must be above 0"));
        }
        if limits.drain_seconds.is_nan() || limits.drain_seconds < 0.0 {
            return Err("limits.drain_seconds must be 0 or more".into());
        }
        if self.api_key.as_deref() == Some("") {
            return Err("api_key is empty: remove it to serve without a key".into());
        }
        if let Some(admin) = &self.admin {
            admin.validate(self.api_key.as_deref())?;
        }
        if let Some(budget) = &self.budget {
            budget.bytes()?;
        }
        for (index, model) in self.models.iter().enumerate() {
            validate_model(model)?;
            self.fits_the_budget(model)?;
            if self.models[..index]
                .iter()
                .any(|other| other.name == model.name)
            {
                return Err(format!("models: the name \"{}\" is used twice", model.name));
            }
        }
        Ok(())
    }
}

pub(super) fn validate_model(model: &ModelConfig) -> Result<(), String> {
    let name = &model.name;
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(format!(
            "models: name \"{name}\" must be non-empty, without spaces"
        ));
    }
    // A file only as an image pipeline's (ComfyUI's all-in-one checkpoint, or the
    // transformer's file beside [models.parts]).
    let pipeline_file = model.folder.is_file()
        && (model.parts.is_some() || crate::pipeline::FluxParts::is_pipeline(&model.folder));
    if !model.folder.is_dir() && !pipeline_file {
        return Err(format!(
            "models.{name}.folder: {} is not a folder (a file only as an image pipeline's: ComfyUI's all-in-one checkpoint, or the transformer's file with [models.parts])",
            model.folder.display()
        ));
    }
    if model.max_sequences == 0 || model.max_batch_tokens == 0 {
        return Err(format!(
            "models.{name}: max_sequences and max_batch_tokens must be above 0"
        ));
    }
    if model.max_tokens == Some(0) || model.queue_depth == Some(0) {
        return Err(format!(
            "models.{name}: max_tokens and queue_depth must be above 0"
        ));
    }
    Ok(())
}

//! What a WAN transformer computes on: a latent video, the timestep and the text
//! encoder's states — the arguments of diffusers' `WanTransformer3DModel.forward`
//! (`hidden_states` `[1, C, F, H, W]`, `timestep`, `encoder_hidden_states`
//! `[1, L, text_dim]`). A run that names none computes a seeded one.
//!
//! An image-to-video transformer (Wan 2.2 I2V-A14B: `in_channels` 36, `out_channels`
//! 16) takes the noise and, after it on the channel axis, the image's condition —
//! WanImageToVideoPipeline's `torch.cat([latents, condition], dim=1)` — so a sampling
//! moves only the noise's channels and the condition rides along unchanged.

use crate::families::flux::gaussian;
use crate::families::FamilyError;

use super::config::WanConfig;
use super::embed::Grid;
use super::first_frame::FirstFrame;

/// One velocity to compute, given by the caller (a pipeline, a test).
#[derive(Debug, Clone, PartialEq)]
pub struct WanInput {
    /// `[channels, frames, height, width]` values, and those sizes.
    pub latent: Vec<f32>,
    pub frames: usize,
    pub height: usize,
    pub width: usize,
    /// The scheduler's timestep, 0–1000 (diffusers passes it unscaled).
    pub timestep: f32,
    /// `[tokens, text_dim]` text states.
    pub context: Vec<f32>,
    /// Classifier-free guidance: the velocity is `u + scale·(c − u)` of the prompt's
    /// (`context`) and the negative prompt's; `None`: the prompt's alone.
    pub guidance: Option<Guidance>,
    /// `[in_channels − channels of latent, frames, height, width]` values put after
    /// the latent's channels (an image-to-video pipeline's mask and encoded image);
    /// `None`: the latent is the model's whole input.
    pub condition: Option<Vec<f32>>,
    /// TI2V-5B's image-to-video: the encoded image standing for the first latent
    /// frame, whose tokens are at timestep 0 ([`FirstFrame`]); `None`: every token
    /// at the step's timestep.
    pub first_frame: Option<FirstFrame>,
}

/// The negative prompt's states (`[tokens, text_dim]`, as many tokens as the
/// prompt's) and the guidance scale (diffusers' `guidance_scale`).
#[derive(Debug, Clone, PartialEq)]
pub struct Guidance {
    pub negative: Vec<f32>,
    pub scale: f32,
}

impl WanInput {
    /// A seeded input of `frames × height × width` latent pixels and `tokens` text
    /// tokens at timestep 500: what a run computes without one.
    pub fn seeded(config: &WanConfig, [frames, height, width]: [usize; 3], tokens: usize) -> Self {
        let values = config.in_channels * frames * height * width;
        Self {
            latent: gaussian(values, 7),
            frames,
            height,
            width,
            timestep: 500.0,
            context: gaussian(tokens * config.text_dim, 11),
            guidance: None,
            condition: None,
            first_frame: None,
        }
    }

    /// The same, guided by a seeded negative prompt at WanPipeline's default scale
    /// (5.0): what a described step computes.
    pub fn seeded_guided(config: &WanConfig, latent: [usize; 3], tokens: usize) -> Self {
        Self {
            guidance: Some(Guidance {
                negative: gaussian(tokens * config.text_dim, 13),
                scale: 5.0,
            }),
            ..Self::seeded(config, latent, tokens)
        }
    }

    /// The patch grid of this input for `config`, checked: the latent has the
    /// model's channels, each size divides by the patch, no axis outgrows the rope.
    pub fn grid(&self, config: &WanConfig) -> Result<Grid, FamilyError> {
        let grid = Grid {
            channels: config.in_channels,
            frames: self.frames,
            height: self.height,
            width: self.width,
            patch: config.patch,
        };
        let sizes = [self.frames, self.height, self.width];
        let plane: usize = sizes.iter().product();
        let condition = self.condition.as_ref().map_or(0, Vec::len);
        if self.latent.len() + condition != config.in_channels * plane {
            return Err(FamilyError::request("latent", format!(
                "the latent has {} values and the condition {condition}; [{}, {}, {}, {}] (the model's in_channels, frames, height, width) has {}",
                self.latent.len(),
                config.in_channels,
                self.frames,
                self.height,
                self.width,
                config.in_channels * plane
            )));
        }
        if condition > 0 && self.latent.len() != config.out_channels * plane {
            return Err(FamilyError::request("latent", format!(
                "the noise has {} values; with a condition it has the model's out_channels {} ({} values)",
                self.latent.len(),
                config.out_channels,
                config.out_channels * plane
            )));
        }
        let fits = sizes
            .iter()
            .zip(config.patch)
            .all(|(&size, patch)| size > 0 && size % patch == 0);
        if !fits {
            return Err(FamilyError::request("latent", format!(
                "a latent of {} frames, {} × {}: each must be a positive multiple of the patch {:?}",
                self.frames, self.height, self.width, config.patch
            )));
        }
        if let Some(patches) = grid
            .patches()
            .into_iter()
            .find(|&patches| patches > config.rope_max_seq_len)
        {
            return Err(FamilyError::request(
                "latent",
                format!(
                "{patches} patches along one axis: the rope has {} positions (rope_max_seq_len)",
                config.rope_max_seq_len
            ),
            ));
        }
        self.check_first_frame(config, plane)?;
        if !self.timestep.is_finite() {
            return Err(FamilyError::request(
                "timestep",
                format!("timestep {} is not a number", self.timestep),
            ));
        }
        Ok(grid)
    }

    /// The model's input for `latent` (this input's noise, or a sampling's later
    /// one): the latent's channels, then the condition's; or the latent with its
    /// first frame the image's (TI2V).
    pub fn joined<'a>(&self, latent: &'a [f32]) -> std::borrow::Cow<'a, [f32]> {
        if let Some(first) = &self.first_frame {
            let plane = self.height * self.width;
            let channels = latent.len() / (self.frames * plane).max(1);
            return std::borrow::Cow::Owned(first.replace(latent, (channels, self.frames)));
        }
        match &self.condition {
            None => std::borrow::Cow::Borrowed(latent),
            Some(condition) => std::borrow::Cow::Owned([latent, condition].concat()),
        }
    }

    /// A first frame is one latent frame of the noise's channels, alone (no
    /// channel condition), over a patch of one frame (its tokens are its own).
    fn check_first_frame(&self, config: &WanConfig, plane: usize) -> Result<(), FamilyError> {
        let Some(first) = &self.first_frame else {
            return Ok(());
        };
        let frame = config.in_channels * self.height * self.width;
        if first.latent.len() != frame || self.condition.is_some() || config.patch[0] != 1 {
            return Err(FamilyError::request("image", format!(
                "a first frame of {} values (TI2V's image): [{}, {}, {}] is {frame}, with no channel condition and a patch of one frame (patch {:?}); {plane} positions a frame",
                first.latent.len(),
                config.in_channels,
                self.height,
                self.width,
                config.patch
            )));
        }
        Ok(())
    }

    /// Text tokens, checked against the model's `text_dim` (the negative prompt's as
    /// many as the prompt's).
    pub fn text_tokens(&self, config: &WanConfig) -> Result<usize, FamilyError> {
        let tokens = self.context.len() / config.text_dim;
        if tokens == 0 || tokens * config.text_dim != self.context.len() {
            return Err(FamilyError::request("context", format!(
                "the text states have {} values; whole rows of text_dim {} are expected (at least one)",
                self.context.len(),
                config.text_dim
            )));
        }
        if let Some(guidance) = &self.guidance {
            if guidance.negative.len() != self.context.len() || !guidance.scale.is_finite() {
                return Err(FamilyError::request("negative_prompt", format!(
                    "the negative prompt's states have {} values, the prompt's {}: both are padded to the same length (--max-sequence-length); the guidance scale is {}",
                    guidance.negative.len(),
                    self.context.len(),
                    guidance.scale
                )));
            }
        }
        Ok(tokens)
    }
}

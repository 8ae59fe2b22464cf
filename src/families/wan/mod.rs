//! WAN 2.x video diffusion transformers (`WanTransformer3DModel` as diffusers writes
//! it: Wan 2.2 T2V-A14B's experts, I2V-A14B's, TI2V-5B), written once against the
//! compute port.
//!
//! One step computes the transformer's velocity for the input latent at its
//! timestep, or, given a [`WanSample`], takes one denoising step of a schedule (the
//! UniPC solver of `scheduler`) from the latent the step before left. With
//! classifier-free guidance the prompt's and the negative prompt's passes run block
//! by block under one acquire of each block, so every streamed weight serves both
//! (diffusers runs them as two whole passes). The expert hand-over belongs to the
//! video pipeline. The pass: the latent cut into
//! 1×2×2 patches through `patch_embedding` (a Conv3d whose kernel equals its stride,
//! so a product over flattened patches); the umT5 states through the text embedder
//! (Linear, GELU-tanh, Linear); the timestep's 256 sinusoidal frequencies through
//! the time embedder (Linear, SiLU, Linear) and `time_proj` to six modulation
//! vectors. Each block: LayerNorm without affine modulated by
//! `scale_shift_table + time`, self-attention with RMS norm on q and k across all
//! heads and the three-axis rope (frames, rows, columns) on interleaved pairs, gated;
//! an affine LayerNorm and cross-attention to the text states (q/k RMS-normed, no
//! rope); the modulated GELU-tanh feed-forward, gated. Then the output norm
//! modulated by `scale_shift_table + temb`, `proj_out` and the patches put back.
//! Every transformer block is a block the session streams; the embedders are the
//! first block and the output layer the last, as Flux places its own.

mod config;
mod demo;
mod embed;
mod first_frame;
mod fp8;
mod input;
mod layers;
mod open;
mod sample;
pub mod scheduler;
mod single_file;
mod step;
mod weights;
mod working_set;

pub use config::{WanConfig, QK_NORM};
pub use demo::{WanDemo, WanPreset};
pub use embed::Grid;
pub use first_frame::FirstFrame;
pub use input::{Guidance, WanInput};
pub use open::CLASS_NAME;
pub use sample::{guided, high_noise_steps, DeferredSample, NoStart, SampleStart, WanSample};
pub use single_file::{check_file, transformer_channels, HEAD_DIM_METADATA};
pub use working_set::activations_at;

use self::weights::WanWeights;
use crate::families::FamilyError;
use crate::model::ModelIndex;

/// A WAN transformer with the input it computes the velocity of.
pub struct Wan {
    pub config: WanConfig,
    weights: WanWeights,
    input: WanInput,
    /// Sampling: the schedule's share this run takes (its shape only, when its
    /// start is deferred).
    sample: Option<WanSample>,
    /// The share's start, given after the run opened (the video pipeline's low-noise
    /// expert, opened during the high-noise expert's last step).
    deferred: Option<DeferredSample>,
    pub grid: Grid,
    /// Video tokens, text tokens.
    pub tokens: usize,
    pub text: usize,
    /// The latent's patches and the rope table, over `max(tokens, text)` rows.
    patches: Vec<f32>,
    table: Vec<f32>,
}

impl Wan {
    pub fn new(
        index: &ModelIndex,
        config: WanConfig,
        input: WanInput,
        sample: Option<WanSample>,
    ) -> Result<Self, FamilyError> {
        let weights = WanWeights::place(index, &config)?;
        let grid = input.grid(&config)?;
        let text = input.text_tokens(&config)?;
        let tokens = grid.tokens();
        let rows = tokens.max(text);
        let patches = grid.patchify(&input.joined(&input.latent), rows);
        let table = grid.rope_table(config.rope_axes(), rows);
        Ok(Self {
            config,
            weights,
            input,
            sample,
            deferred: None,
            grid,
            tokens,
            text,
            patches,
            table,
        })
    }

    /// Bytes of every activation tensor of a step, reserved before its first block.
    pub fn working_set_bytes(&self) -> u64 {
        self.activations().reserved_bytes
    }

    /// What a step reserves, and the working set of each kind of block.
    pub fn activations(&self) -> crate::families::Activations {
        let mut activations = activations_at(&self.config, self.tokens, self.text, self.guided());
        if let Some(rows) = self.first_frame_rows() {
            activations.reserved_bytes += first_frame::first_time_bytes(rows, self.config.dim());
        }
        activations
    }

    /// Token rows of the first latent frame when they are at timestep 0 (TI2V's
    /// image-to-video).
    pub fn first_frame_rows(&self) -> Option<usize> {
        let [_, rows, cols] = self.grid.patches();
        self.input.first_frame.as_ref().map(|_| rows * cols)
    }

    /// The step runs the negative prompt's pass too.
    pub fn guided(&self) -> bool {
        self.input.guidance.is_some()
    }

    /// The same model whose share's start arrives through `deferred` before its first
    /// step computes.
    pub fn with_deferred(mut self, deferred: DeferredSample) -> Self {
        self.deferred = Some(deferred);
        self
    }

    /// The share the steps take: the deferred one once its start arrived.
    fn share(&self) -> Option<&WanSample> {
        let taken = self.deferred.as_ref().and_then(DeferredSample::taken);
        taken.or(self.sample.as_ref())
    }

    /// Waits for a deferred share's start (once; at once when there is none).
    fn take_start(&self) -> Result<(), FamilyError> {
        let (Some(deferred), Some(shape)) = (&self.deferred, &self.sample) else {
            return Ok(());
        };
        match deferred.take(shape) {
            Ok(_) => Ok(()),
            Err(NoStart::Stopped) => Err(FamilyError::Session(
                stagehand_actors::SessionError::Interrupted,
            )),
            // The pipeline returns the first share's own error when it failed, so
            // either of these reaching a caller is a fault of the pipeline's wiring.
            Err(NoStart::Abandoned) => Err(FamilyError::internal(
                "the sampling's start never came: the steps before this share ended without it"
                    .into(),
            )),
            Err(NoStart::Mismatched) => Err(FamilyError::internal(
                "the sampling's start is a latent of another size than the share's".into(),
            )),
        }
    }

    /// The run samples (a [`WanSample`]) rather than computing one velocity.
    pub fn sampling(&self) -> bool {
        self.sample.is_some()
    }

    /// Steps of one sample: the schedule's share a sampling run takes, else 1.
    pub fn steps_per_sample(&self) -> usize {
        self.share().map_or(1, |sample| sample.steps)
    }
}

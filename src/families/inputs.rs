//! What a run gives a family besides its checkpoint: which kind of work it asks for,
//! the texts or prompt to compute on, LoRA adapters and the MoE knobs.

use crate::lora::LoraSpec;

use super::bert::EmbeddingPlacement;
use super::llama::{ExpertHint, Sampling};
use super::moe::HintMode;

/// The kind of work a run asks for (`--workload`); every family is of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum WorkloadKind {
    /// The model's own: the family its config.json names, linear-stack or moe for a
    /// generated model, stream-verify for a bare checkpoint.
    Auto,
    LinearStack,
    /// Stream and checksum every block against the file; computes nothing.
    StreamVerify,
    /// An encoder from a Hugging Face folder (BERT family): batches of texts.
    Encoder,
    /// A decoder from a Hugging Face folder (Llama family): a prompt, then a token a step.
    Decoder,
    /// The generated mixture-of-experts model: experts acquired as routed, through an
    /// expert cache with speculative prefetch.
    Moe,
    /// A diffusion transformer (Flux): a denoising step a step, the latent carried on.
    Diffusion,
    /// A pipeline's text encoder (CLIP, T5): a prompt's states, padded to one length.
    TextEncoder,
    /// A pipeline's image autoencoder (the VAE): a latent decoded to pixels.
    Autoencoder,
    /// The same autoencoder's encoder: an image to the latent image-to-image starts
    /// from.
    ImageEncoder,
}

impl WorkloadKind {
    /// A generated demo model (its budgets default so that both tiers stream).
    pub fn is_generated(self) -> bool {
        matches!(self, WorkloadKind::LinearStack | WorkloadKind::Moe)
    }

    /// "an encoder", "a decoder", …: for messages.
    pub fn with_article(self) -> &'static str {
        match self {
            WorkloadKind::Auto => "a model",
            WorkloadKind::LinearStack => "the linear-stack demo model",
            WorkloadKind::StreamVerify => "a checkpoint to stream and check",
            WorkloadKind::Encoder => "an encoder",
            WorkloadKind::Decoder => "a decoder",
            WorkloadKind::Moe => "the generated MoE model",
            WorkloadKind::Diffusion => "a diffusion transformer",
            WorkloadKind::TextEncoder => "a text encoder",
            WorkloadKind::Autoencoder => "an image autoencoder",
            WorkloadKind::ImageEncoder => "an image encoder",
        }
    }
}

/// What a run adds to its workload: LoRA adapters, the MoE knobs, an encoder's texts,
/// a decoder's prompt.
#[derive(Debug, Clone, Default)]
pub struct Extras {
    pub loras: Vec<LoraSpec>,
    pub moe: MoeOptions,
    /// What an encoder embeds; `None`: the built-in sentences.
    pub encoder: Option<EncoderInput>,
    /// What a decoder generates from; `None`: the built-in prompt, greedy.
    pub decoder: Option<DecoderInput>,
    /// Read headers only (no tensor data): to describe a model, not to run it.
    pub headers_only: bool,
    pub embeddings: EmbeddingPlacement,
    /// What a diffusion transformer samples; `None`: a seeded conditioning at a small
    /// default resolution (1024² with 512 text tokens when only headers are read).
    pub diffusion: Option<super::flux::SampleInput>,
    /// The tokens a text encoder pads every prompt to, where the model does not fix
    /// it (T5: diffusers' `max_sequence_length`); `None`: the family's default.
    pub prompt_length: Option<usize>,
    /// What an image autoencoder decodes; `None`: a seeded latent of a small image.
    pub latent: Option<super::vae::LatentInput>,
    /// What an image encoder encodes; `None`: a seeded 64² image.
    pub image: Option<super::vae::ImageInput>,
    /// The model is this part of the checkpoint (a model of an all-in-one file, an
    /// autoencoder in its original names), not the whole file or folder; its family
    /// reads its config from the tensors' shapes.
    pub part: Option<crate::model::CheckpointPart>,
    /// Where a text encoder given as a bare file finds its tokenizer (a folder with
    /// `tokenizer.json`, or CLIP's `vocab.json` + `merges.txt`).
    pub tokenizer: Option<std::path::PathBuf>,
}

/// The expert cache's knobs (generated MoE and the MoE decoders).
#[derive(Debug, Clone, Copy)]
pub struct MoeOptions {
    pub policy: stagehand_actors::ExpertPolicy,
    pub hint: HintMode,
    /// Expert cache slots; `None`: as many as the budget leaves after the dense blocks.
    pub slots: Option<u32>,
}

impl Default for MoeOptions {
    fn default() -> Self {
        Self {
            policy: stagehand_actors::ExpertPolicy::default(),
            hint: HintMode::NextLayer,
            slots: None,
        }
    }
}

/// The prompt `stagehand run` gives a decoder when none is given.
pub const BUILT_IN_PROMPT: &str = "The quick brown fox jumps over the lazy dog. Then it";

/// The prompt a text encoder encodes when none is given.
pub const BUILT_IN_IMAGE_PROMPT: &str = "A photo of a red fox sitting in the snow, highly detailed";

/// Sentences `stagehand run` embeds with an encoder when no text is given: the two
/// of the sentence-transformers similarity example first.
pub const BUILT_IN_SENTENCES: &[&str] = &[
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "A man is riding a horse.",
    "Two men pushed carts through the woods.",
    "A woman is playing violin.",
    "The cat sits outside.",
    "Weights stream from disk to pinned memory to the device just ahead of compute.",
];

/// What a decoder run generates from.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderInput {
    pub prompt: PromptInput,
    pub sampling: Sampling,
    pub hint: ExpertHint,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    /// Token ids given directly (`--token-ids`), for folders without `tokenizer.json`.
    TokenIds(Vec<u32>),
}

/// What an encoder run embeds.
#[derive(Debug, Clone, PartialEq)]
pub enum EncoderInput {
    Texts(Vec<String>),
    /// Token ids given directly (`--token-ids`), for folders without `tokenizer.json`.
    TokenIds(Vec<Vec<u32>>),
}

//! What a run gives a family besides its checkpoint: which kind of work it asks for,
//! LoRA adapters, the MoE knobs, and the family's inputs by type ([`Inputs`]): the
//! texts and prompts that several families share are declared here, the rest in
//! each family's folder.

use std::any::{Any, TypeId};
use std::sync::Arc;

use crate::lora::LoraSpec;

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

/// What a run adds to its workload: LoRA adapters, the MoE knobs, which part of a
/// checkpoint is the model, and the family's own inputs ([`Inputs`]).
#[derive(Debug, Clone, Default)]
pub struct Extras {
    pub loras: Vec<LoraSpec>,
    pub moe: MoeOptions,
    /// Read headers only (no tensor data): to describe a model, not to run it.
    pub headers_only: bool,
    /// The model is this part of the checkpoint (a model of an all-in-one file, an
    /// autoencoder in its original names), not the whole file or folder; its family
    /// reads its config from the tensors' shapes.
    pub part: Option<crate::model::CheckpointPart>,
    /// Where a text encoder given as a bare file finds its tokenizer (a folder with
    /// `tokenizer.json`, or CLIP's `vocab.json` + `merges.txt`).
    pub tokenizer: Option<std::path::PathBuf>,
    /// What the family computes on (an encoder's texts, a decoder's prompt, a
    /// diffusion transformer's latent…), by type; a family takes its built-in input
    /// for a type it finds none of.
    pub inputs: Inputs,
}

impl Extras {
    /// These extras with `input` among the family's inputs (replacing one of its type).
    pub fn with<T: Any + Send + Sync>(mut self, input: T) -> Self {
        self.inputs.insert(input);
        self
    }

    /// The input of type `T` the run gave, if any.
    pub fn input<T: Any>(&self) -> Option<&T> {
        self.inputs.get()
    }
}

/// A family's inputs, one value of each type. Each family declares the types it reads
/// beside its forward pass (`llama::DecoderInput`, `flux::SampleInput`, …; the texts
/// several encoders take are [`EncoderInput`]), so a new
/// family brings its inputs in its own folder instead of a field here; callers put
/// them in with [`Extras::with`], as `http::Extensions` carries a request's extras.
#[derive(Clone, Default)]
pub struct Inputs {
    /// At most one entry per type; a handful a run, so a list beats a map.
    values: Vec<InputValue>,
}

#[derive(Clone)]
struct InputValue {
    type_id: TypeId,
    type_name: &'static str,
    value: Arc<dyn Any + Send + Sync>,
}

impl Inputs {
    /// Puts `input` in, replacing an input of the same type.
    pub fn insert<T: Any + Send + Sync>(&mut self, input: T) {
        let entry = InputValue {
            type_id: TypeId::of::<T>(),
            type_name: std::any::type_name::<T>(),
            value: Arc::new(input),
        };
        match self
            .values
            .iter_mut()
            .find(|value| value.type_id == entry.type_id)
        {
            Some(slot) => *slot = entry,
            None => self.values.push(entry),
        }
    }

    /// The input of type `T`, if one was put in.
    pub fn get<T: Any>(&self) -> Option<&T> {
        let wanted = TypeId::of::<T>();
        self.values
            .iter()
            .find(|value| value.type_id == wanted)
            .and_then(|value| value.value.downcast_ref())
    }
}

impl std::fmt::Debug for Inputs {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_list()
            .entries(self.values.iter().map(|value| value.type_name))
            .finish()
    }
}

/// The tokens a text encoder pads every prompt to, where the model does not fix it
/// (T5: diffusers' `max_sequence_length`); without it, the family's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptLength(pub usize);

/// A text encoder neither attends to its prompts' padding nor keeps it: the
/// tokenizer's attention mask masks the padded keys and the padded rows of the states
/// are zero, as WanPipeline encodes with umT5. Without it, T5 attends to the padding
/// as FluxPipeline's does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaddingMasked;

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

/// What an encoder run embeds.
#[derive(Debug, Clone, PartialEq)]
pub enum EncoderInput {
    Texts(Vec<String>),
    /// Token ids given directly (`--token-ids`), for folders without `tokenizer.json`.
    TokenIds(Vec<Vec<u32>>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_is_found_by_its_type_and_a_second_of_a_type_replaces_the_first() {
        // Proves the typed inputs keep one value per type, hand each family only its
        // own type, and say which types they hold when printed.
        let extras = Extras::default()
            .with(EncoderInput::TokenIds(vec![vec![1]]))
            .with(PromptLength(77))
            .with(EncoderInput::Texts(vec!["a fox".to_string()]));
        assert_eq!(
            extras.input::<EncoderInput>(),
            Some(&EncoderInput::Texts(vec!["a fox".to_string()]))
        );
        assert_eq!(extras.input::<PromptLength>(), Some(&PromptLength(77)));
        assert_eq!(extras.input::<String>(), None);
        let printed = format!("{:?}", extras.inputs);
        assert!(printed.contains("EncoderInput") && printed.contains("PromptLength"));
        assert_eq!(printed.matches("EncoderInput").count(), 1, "{printed}");
    }
}

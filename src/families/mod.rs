//! The model families stagehand computes, each written once against the compute port
//! (DESIGN §6) in its own folder, and the registry that lists them.
//!
//! - [`linear_stack`]: the generated demo model; a real GEMM forward pass.
//! - [`moe`]: the generated mixture-of-experts model; experts acquired as routed.
//! - [`bert`]: BERT-family encoders from Hugging Face folders.
//! - [`llama`]: Llama-family decoders (Llama, Mistral, Qwen2, Qwen3, and the mixtures
//!   of experts Mixtral, Qwen2-MoE and Qwen3-MoE).
//! - [`flux`]: Flux.1 diffusion transformers (original, ComfyUI and diffusers layouts).
//! - [`clip`], [`t5`]: the text encoders of a prompt-to-image pipeline.
//! - [`vae`]: the image autoencoder that turns a latent into pixels.
//! - [`wan_vae`]: the WAN video autoencoder that turns a latent video into frames.
//! - [`stream_verify`]: any safetensors checkpoint; every block's bytes are checked
//!   against the file after they have crossed the tiers. Nothing is computed.
//!
//! What every family answers is [`Facts`] and [`Family`] ([`family`]); how it is found
//! and opened, what `serve` answers with it ([`Endpoints`]) and, for a generated
//! family, the demo a run takes without a model, [`Open`] ([`registry`]). A family's
//! inputs are types of its own folder, carried by type in [`Extras::with`] (the texts
//! several encoders share are [`EncoderInput`]). Adding a family is its folder, its
//! `mod` line here and one line of the registry's `families!` list; the run, serve,
//! bench, validate and the simulator ask the registry, never match on the kind. Beside them, what families share: the block
//! source they are written against ([`blocks`]), LoRA sets ([`lora_set`]), tensor
//! placement in blocks ([`placement`]), host embedding tables, the KV cache's pages.

pub mod activations;
pub mod bert;
pub mod blocks;
pub mod clip;
mod config_json;
mod error;
pub mod family;
pub mod flux;
mod from_files;
mod host_table;
pub mod inputs;
mod kv_cache;
pub mod landing;
pub mod linear_stack;
pub mod llama;
pub mod lora_set;
pub mod moe;
pub mod placement;
pub mod prompt_tokens;
pub mod record;
pub mod registry;
mod shapes;
pub mod stream_verify;
pub mod t5;
pub mod tiling;
pub mod tokenizer_json;
pub mod vae;
mod walk;
pub mod wan;
pub mod wan_vae;

pub use activations::{Activations, BlockKindPeak, DescribedReserve, DescribedWorkload};
pub use family::{Decoded, ExpertNeeds, ExpertStep, Facts, Family, StepOutput};
pub use inputs::{
    EncoderInput, Extras, Inputs, MoeOptions, PaddingMasked, PromptLength, WorkloadKind,
    BUILT_IN_SENTENCES,
};
pub use kv_cache::KvCache;
pub use llama::{DecoderInput, PromptInput, BUILT_IN_PROMPT};
pub use registry::{
    demo_writer, find, generated, named, supported_model_types, DemoWriter, Endpoints, Entry,
    Found, Model, Open, Request, StepUnit, Visit, REGISTRY,
};

pub use error::FamilyError;

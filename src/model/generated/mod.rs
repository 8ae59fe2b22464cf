//! What generated Hugging Face model folders share (no model hub is reachable
//! offline): the safetensors writer of seeded weights and `tokenizer.json` files that
//! Hugging Face's `tokenizers` reads. Each family writes its own folders with real
//! shapes and names beside its code (`families::bert::demo`, `families::llama::demo`,
//! `families::flux`).

mod quantized;
mod tokenizer;
mod writer;

pub use quantized::{quantize_awq, quantize_int8, quantized_linear, QuantFormat, AWQ_GROUP_SIZE};
pub use tokenizer::{
    byte_level_tokenizer_json, chat_tokenizer_config_json, minimum_vocabulary, tokenizer_json,
};
pub use writer::{
    write_atomically, write_checkpoint, write_model_folder, write_single, TensorSpec, Values,
};

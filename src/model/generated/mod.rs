//! Generated Hugging Face model folders with real shapes and names (no model hub is
//! reachable offline): seeded weights, a real `config.json` and a `tokenizer.json`
//! that Hugging Face's `tokenizers` reads.

mod bert;
mod decoder;
mod decoder_shape;
mod decoder_tensors;
mod quantized;
mod tokenizer;
mod writer;

pub use bert::{write_bert_folder, write_bert_lora, BertDemo, BertPreset, BertShape};
pub use decoder::{write_decoder_folder, DecoderArch, DecoderDemo, DecoderPreset};
pub use decoder_shape::{DecoderShape, MoeShape};
pub use quantized::{quantize_awq, quantize_int8, quantized_linear, QuantFormat, AWQ_GROUP_SIZE};
pub use tokenizer::{
    byte_level_tokenizer_json, chat_tokenizer_config_json, minimum_vocabulary, tokenizer_json,
};
pub use writer::{write_atomically, write_checkpoint, write_single, TensorSpec, Values};

//! Why an adapter could not be loaded or applied. Each message names the file and the
//! key at fault and says what to do.

use std::path::PathBuf;

use super::load::Naming;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LoraError {
    #[error("--lora {spec}: strength {problem}")]
    Strength { spec: String, problem: String },
    #[error("{}: cannot read the LoRA file: {reason}", path.display())]
    Io { path: PathBuf, reason: String },
    #[error("{}: not a safetensors LoRA file: {reason}", path.display())]
    Format { path: PathBuf, reason: String },
    #[error("{}: no LoRA keys found (expected PEFT `…lora_A.weight`/`…lora_B.weight` or kohya `…lora_down.weight`/`…lora_up.weight`); first keys: {}", path.display(), first.join(", "))]
    UnknownNaming { path: PathBuf, first: Vec<String> },
    #[error("{}: {count} of {total} LoRA modules match no tensor of {} (naming guessed: {naming}); first unmatched: {} — {}is this an adapter for a different model?", path.display(), model.display(), first.join(", "), hint.as_deref().map(|hint| format!("{hint}: ")).unwrap_or_default())]
    Unmatched {
        path: PathBuf,
        model: PathBuf,
        naming: Naming,
        count: usize,
        total: usize,
        first: Vec<String>,
        /// What the model has where the first unmatched module names a block it
        /// lacks (`single_transformer_blocks` 0 to 1).
        hint: Option<String>,
    },
    #[error("{}: `{module}` has {present} but no {missing}", path.display())]
    MissingFactor {
        path: PathBuf,
        module: String,
        present: String,
        missing: String,
    },
    #[error("{}: `{key}`: {problem}", path.display())]
    Shape {
        path: PathBuf,
        key: String,
        problem: String,
    },
    #[error("{}: `{module}` has rank 0: an adapter needs at least one rank", path.display())]
    RankZero { path: PathBuf, module: String },
    #[error("{}: `{key}` holds a non-finite value ({value}) at element {index}: refusing to apply it", path.display())]
    NonFinite {
        path: PathBuf,
        key: String,
        index: usize,
        value: f32,
    },
    #[error("{}: `{key}` is {dtype}; LoRA factors must be F32, F16 or BF16", path.display())]
    Dtype {
        path: PathBuf,
        key: String,
        dtype: String,
    },
    /// `path` is the `adapter_config.json`.
    #[error("{}: {reason}", path.display())]
    Config { path: PathBuf, reason: String },
    #[error("{}: `{base}` is {dtype}: the CPU backend applies LoRA to F32 weights only", path.display())]
    BaseDtype {
        path: PathBuf,
        base: String,
        dtype: String,
    },
    #[error("LoRA adapter `{name}` is already attached; detach it first or give another file")]
    AlreadyAttached { name: String },
}

#![warn(missing_docs)]

//! stagehand streams model weights disk → pinned host RAM → VRAM just ahead of the
//! compute that needs them, inside hard memory budgets, so models larger than the
//! GPU's memory run close to the speed they would if they fitted.
//!
//! # Two ways to embed it
//!
//! **Run a model family stagehand computes** (BERT encoders, Llama-family decoders,
//! the generated demo models): open a model folder, choose budgets and a device, run
//! steps, read the report. Every streamed step is checked against the fully-resident
//! pass, bit for bit.
//!
//! ```no_run
//! use std::path::Path;
//! use stagehand::{BudgetAsk, EncoderInput, Extras, RunPlan, Settings, WorkloadKind};
//!
//! # fn main() -> Result<(), stagehand::RunError> {
//! let settings = Settings::default();
//! let extras = Extras::default().with(EncoderInput::Texts(vec!["A man is eating food.".into()]));
//! let folder = Path::new("models/all-MiniLM-L6-v2");
//! let model = stagehand::prepare_with(folder, WorkloadKind::Encoder, 32, &settings, false, &extras)?;
//! let budgets = stagehand::budgets_for(&model, &settings, BudgetAsk::steps(1));
//! let plan = RunPlan {
//!     keep_outputs: true,
//!     ..RunPlan::new(&settings, budgets, 1)
//! };
//! let outcome = stagehand::execute(&model, plan)?;
//! assert_eq!(outcome.report.verified_steps, 1);
//! # Ok(()) }
//! ```
//!
//! **Drive your own forward pass** through the block-prefetch API, as ComfyUI's
//! block prefetch gives a model: give the blocks (tensors grouped by layer, from the
//! checkpoint's index) and their order in a step, then `acquire` each block before its
//! compute and `release` it after; the actors prefetch the next ones meanwhile.
//!
//! ```no_run
//! use std::path::Path;
//! use stagehand::{BlockId, ModelIndex, Settings};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let settings = Settings::default();
//! let index = ModelIndex::open(Path::new("model.safetensors"), None)?;
//! let budgets = stagehand::Budgets {
//!     vram_budget_bytes: 1 << 30,
//!     pin_ceiling_bytes: 2 << 30,
//! };
//! let order: Vec<BlockId> = (0..index.blocks.len() as u32).map(BlockId).collect();
//! let mut session = stagehand::block_session(&index, &settings, budgets, order.clone())?;
//! for &block in &order {
//!     let handle = session.acquire(block)?;
//!     let bytes = session.host_bytes(&handle).expect("the CPU backend's blocks are host memory");
//!     // ... your own compute on `bytes` ...
//!     # let _ = bytes;
//!     session.release(handle);
//! }
//! session.step_done();
//! let stats = session.finish();
//! assert_eq!(stats.vram.used_bytes, 0);
//! # Ok(()) }
//! ```
//!
//! `examples/` has both, runnable: `cargo run --example embed`, `--example
//! generate`, `--example block_prefetch`.
//!
//! # Errors
//!
//! A run's [`RunError`] is a kind to match on, not a sentence to parse: a budget too
//! small names the budget and the least value that works, a corrupt or changed
//! checkpoint, an unsupported model, a missing file, a refused setting, a missing CPU
//! or GPU capability, a device failure, a cancelled run each have their own kind, with
//! the cause behind it as [`std::error::Error::source`]. Its `Display` is the one line
//! the CLI prints, and [`RunError::exit_code`] the CLI's exit status.
//!
//! ```no_run
//! use stagehand::{Budget, Budgets, RunError, RunPlan, Settings, WorkloadKind};
//!
//! # fn main() -> Result<(), RunError> {
//! let settings = Settings::default();
//! let model = stagehand::prepare(std::path::Path::new("model"), WorkloadKind::Auto, 1, &settings, false)?;
//! let mut budgets = Budgets { vram_budget_bytes: 1 << 20, pin_ceiling_bytes: 1 << 30 };
//! let outcome = match stagehand::execute(&model, RunPlan::new(&settings, budgets, 1)) {
//!     Err(RunError::BudgetTooSmall { budget: Budget::Vram, least_bytes, .. }) => {
//!         budgets.vram_budget_bytes = least_bytes;
//!         stagehand::execute(&model, RunPlan::new(&settings, budgets, 1))?
//!     }
//!     other => other?,
//! };
//! # let _ = outcome;
//! # Ok(()) }
//! ```
//!
//! # The layers
//!
//! The modules below are the library's parts, bottom up (docs/architecture.md "Architecture"; a
//! test keeps each importing only its own layer and below): [`os`] and [`signals`];
//! the compute port ([`compute`]), the model index ([`model`]) and [`settings`]; the
//! adapters ([`device`], [`storage`], [`telemetry`], the simulated device [`sim`]);
//! the model [`families`] and [`lora`]; the [`run`]; and the tools over runs
//! ([`simulate`], [`calibrate`]). The scheduling itself is the [`actors`] crate. The
//! modules are public for the binary and the tests and are not a stable API; the
//! items re-exported here are.

#[doc(hidden)]
pub mod calibrate;
#[doc(hidden)]
pub mod compute;
#[doc(hidden)]
pub mod device;
#[doc(hidden)]
pub mod families;
#[doc(hidden)]
pub mod lora;
#[doc(hidden)]
pub mod model;
#[doc(hidden)]
pub mod os;
#[doc(hidden)]
pub mod pipeline;
#[doc(hidden)]
pub mod run;
#[cfg(feature = "serve")]
#[doc(hidden)]
pub mod serve;
#[doc(hidden)]
pub mod settings;
#[doc(hidden)]
pub mod signals;
#[doc(hidden)]
pub mod sim;
#[doc(hidden)]
pub mod simulate;
#[doc(hidden)]
pub mod storage;
#[doc(hidden)]
pub mod telemetry;

#[doc(hidden)]
pub use simulate::harness;
/// The scheduler: the actors, their session, and the ports adapters plug into.
pub use stagehand_actors as actors;

/// A hold on one block in the device tier, from [`Session::acquire`].
pub use stagehand_actors::BlockHandle;
/// A step's position in the model: one block (a layer's tensors).
pub use stagehand_actors::BlockId;
/// The compute thread's side of the actors: acquire and release blocks.
pub use stagehand_actors::Session;
/// The counters a session ends with ([`Session::finish`]).
pub use stagehand_actors::StatsSnapshot;

/// A safetensors checkpoint's tensors, where their bytes live and how they group into
/// blocks.
pub use model::ModelIndex;
/// Every deployment setting (budgets, device, prefetch depth), with its defaults.
pub use settings::Settings;

/// A weight's storage dtype.
pub use compute::DType;
/// Greedy or seeded temperature / top-p sampling of a decoder's next token, and
/// what a mixture-of-experts decoder hints to the expert cache.
pub use families::llama::{ExpertHint, Sampling};
/// What a run gives a family beside its checkpoint: texts, a prompt, LoRA adapters.
pub use families::{DecoderInput, EncoderInput, Extras, PromptInput, WorkloadKind};

/// What a run measured: step times, bytes per link, verification.
pub use run::report::RunReport;
/// Runs on the CPU backend ([`execute`]) or a CUDA device ([`execute_cuda`]).
pub use run::{block_session, execute, execute_cuda, Budget, Outcome, RunError, RunPlan};
/// The budgets a run uses, and the one policy that chooses them.
pub use run::{budgets_for, BudgetAsk, Budgets};
/// A model opened for runs: [`prepare`] / [`prepare_with`].
pub use run::{prepare, prepare_with, Prepared};

/// See [`write_linear_stack`].
pub use families::bert::{write_bert_folder, BertDemo, BertPreset};
/// See [`write_linear_stack`].
pub use families::llama::{write_decoder_folder, DecoderArch, DecoderDemo, DecoderPreset};
/// Generated checkpoints with real names and shapes (seeded weights), to try
/// stagehand without a download: BERT and Llama-family folders, the linear stack.
pub use model::demo::{write_linear_stack, DemoSpec};

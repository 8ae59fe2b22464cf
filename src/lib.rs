//! stagehand: streams model weights disk → pinned host RAM → VRAM just ahead of the
//! compute that needs them, inside hard memory budgets.
//!
//! The scheduling lives in the `stagehand-actors` crate; this crate holds the
//! application around it: settings, the safetensors model index, the storage and
//! device adapters, workloads, telemetry, the simulator and the CLI.

pub mod calibrate;
pub mod compute;
pub mod device;
pub mod families;
pub mod lora;
pub mod model;
pub mod os;
pub mod run;
pub mod settings;
pub mod signals;
pub mod sim;
pub mod simulate;
pub mod storage;
pub mod telemetry;

pub use simulate::harness;
pub use stagehand_actors as actors;

//! The simulator (`stagehand simulate`): model descriptions, the fit check, and runs of
//! the real actors on the simulated device ([`crate::sim`]) in virtual time, against
//! two baselines, with the prefetch depth it recommends.

mod depth;
mod described_reserve;
mod fit;
mod from_folder;
mod from_index;
pub mod harness;
mod mix;
mod model;
mod output;
mod policy;
mod reuse;
mod run;
mod simulation;
mod steady;

pub use crate::families::KvCache;
pub use depth::{
    candidate_depths, pick_depth, search_prefetch_depth, DepthCandidate, AUTO_DEPTH_MAX,
    SEARCH_STEPS, TIE_RELATIVE,
};
pub use fit::{Bottleneck, FitCheck, FitFailure, FitSettings, RAM_FLOOR_MIN_BYTES};
pub use mix::{simulate_mix, MixError, MixModel, MixPrediction};
pub use model::{BlockDesc, ExpertDesc, ModelDescription};
pub use output::{OutputRate, OutputUnit, StepOutput};
pub use policy::Policy;
pub use run::{run_policy, PolicyRun, RunOptions, SimRunError, MAX_STEPS};
pub use simulation::{
    simulate, BaselineFigures, DepthAdvice, PolicyFigures, SimulateOptions, Simulation,
};
pub use steady::{steady_window, LinkBytes, SteadyBytes};

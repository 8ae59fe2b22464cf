//! The sampler a WAN run steps with, whichever class the folder names: one type for
//! the pipeline, the run's share and the expert hand-over, so none of them matches on
//! the scheduler.

use super::{EulerConfig, FlowEuler, UniPc, UniPcConfig};

/// A `scheduler_config.json` read: the solver it configures.
#[derive(Debug, Clone, PartialEq)]
pub enum SolverConfig {
    UniPc(UniPcConfig),
    Euler(EulerConfig),
}

impl SolverConfig {
    /// The training timesteps T (the boundary between experts is a ratio of it).
    pub fn train_timesteps(&self) -> usize {
        match self {
            Self::UniPc(config) => config.train_timesteps,
            Self::Euler(config) => config.train_timesteps,
        }
    }

    /// The solver of a run of `steps` steps.
    pub fn solver(&self, steps: usize) -> Solver {
        match self {
            Self::UniPc(config) => Solver::UniPc(UniPc::new(config.clone(), steps)),
            Self::Euler(config) => Solver::Euler(FlowEuler::new(config, steps)),
        }
    }
}

/// One sampling run's solver and its state between steps.
#[derive(Debug, Clone)]
pub enum Solver {
    UniPc(UniPc),
    Euler(FlowEuler),
}

impl Solver {
    /// The timesteps the model sees, one a step, as the f32 the transformer takes
    /// (UniPC's integers are exact in f32).
    pub fn timesteps(&self) -> Vec<f32> {
        match self {
            Self::UniPc(solver) => solver.timesteps().iter().map(|&t| t as f32).collect(),
            Self::Euler(solver) => solver.timesteps().to_vec(),
        }
    }

    /// The timestep of step `index`, when the schedule has one.
    pub fn timestep(&self, index: usize) -> Option<f32> {
        match self {
            Self::UniPc(solver) => solver.timesteps().get(index).map(|&t| t as f32),
            Self::Euler(solver) => solver.timesteps().get(index).copied(),
        }
    }

    /// The steps taken so far.
    pub fn steps_taken(&self) -> usize {
        match self {
            Self::UniPc(solver) => solver.steps_taken(),
            Self::Euler(solver) => solver.steps_taken(),
        }
    }

    /// One step of the velocity `output` from `sample`.
    pub fn step(&mut self, output: &[f32], sample: &mut Vec<f32>) -> Result<(), String> {
        match self {
            Self::UniPc(solver) => solver.step(output, sample),
            Self::Euler(solver) => solver.step(output, sample),
        }
    }
}

impl From<UniPc> for Solver {
    fn from(solver: UniPc) -> Self {
        Self::UniPc(solver)
    }
}

impl From<FlowEuler> for Solver {
    fn from(solver: FlowEuler) -> Self {
        Self::Euler(solver)
    }
}

//! A WAN run that samples: its share of a schedule's denoising steps, each the
//! (guided) velocity of the latent the step before left, stepped by the folder's
//! solver (UniPC or flow-matching Euler).
//! The run's step output is the step's velocity (after guidance), so whoever drives
//! the run (the video pipeline) can replay the solver over them and hand the latent
//! and the solver's state to the next expert at the boundary.

use super::input::WanInput;
use super::scheduler::Solver;

/// `steps` denoising steps from `input.latent`, with `solver` as the earlier steps
/// left it (`input.timestep` is ignored: each step takes the solver's).
#[derive(Debug, Clone)]
pub struct WanSample {
    pub input: WanInput,
    pub solver: Solver,
    pub steps: usize,
}

impl WanSample {
    /// The latent and the solver after the share's steps, from the run's outputs
    /// (each step's guided velocity, in step order): the run's own arithmetic again,
    /// so the next expert starts where this one ended, bit for bit.
    pub fn replay<'a>(
        &self,
        velocities: impl IntoIterator<Item = &'a [f32]>,
    ) -> Result<(Vec<f32>, Solver), String> {
        let mut sampler = Sampler::new(self);
        let mut taken = 0;
        for velocity in velocities.into_iter().take(self.steps) {
            sampler.solver.step(velocity, &mut sampler.latent)?;
            taken += 1;
        }
        if taken != self.steps {
            return Err(format!(
                "the run computed {taken} of its {} steps",
                self.steps
            ));
        }
        Ok((sampler.latent, sampler.solver))
    }
}

/// Of `timesteps` (descending), how many the high-noise expert takes: those at or
/// above `boundary_ratio × train_timesteps` (WanPipeline's `boundary_timestep`),
/// compared in f32 as torch compares a timestep tensor with a Python float.
pub fn high_noise_steps(timesteps: &[f32], boundary_ratio: f64, train_timesteps: usize) -> usize {
    let boundary = (boundary_ratio * train_timesteps as f64) as f32;
    timesteps.iter().take_while(|&&t| t >= boundary).count()
}

/// A sampling run's latent and solver between its steps.
#[derive(Debug, Clone)]
pub struct Sampler {
    pub latent: Vec<f32>,
    pub solver: Solver,
    /// The solver's steps taken when the run's share began.
    first: usize,
}

impl Sampler {
    pub fn new(sample: &WanSample) -> Self {
        Self {
            latent: sample.input.latent.clone(),
            solver: sample.solver.clone(),
            first: sample.solver.steps_taken(),
        }
    }

    /// The share is done: a longer run starts it again from the same latent.
    pub fn done(&self, steps: usize) -> bool {
        self.solver.steps_taken() >= self.first + steps
    }

    /// The timestep the next step computes at.
    pub fn timestep(&self) -> Option<f32> {
        self.solver.timestep(self.solver.steps_taken())
    }
}

/// `u + scale·(c − u)`, element by element, as WanPipeline combines its two passes.
pub fn guided(conditional: &[f32], unconditional: &[f32], scale: f32) -> Vec<f32> {
    conditional
        .iter()
        .zip(unconditional)
        .map(|(c, u)| u + scale * (c - u))
        .collect()
}

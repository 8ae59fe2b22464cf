//! Flow-matching Euler as diffusers' `WanPipeline` drives `FlowMatchEulerDiscreteScheduler`
//! with a static `shift` (no `mu`): the scheduler's own table of T training sigmas
//! shifted in f32 (σ′ = s·σ / (1 + (s − 1)·σ)) gives σ_max and σ_min; `set_timesteps(N)`
//! spaces N timesteps linearly from σ_max·T to σ_min·T (NumPy, f64), divides by T and
//! shifts them again (f64, as diffusers does: the shift is applied twice), then keeps
//! the sigmas as f32 and the timesteps as σ·T in f32, and appends a final sigma of 0.
//! Each step is Flux's Euler update ([`crate::families::flux::euler_step`]).

use crate::families::flux::euler_step;

/// What `scheduler_config.json` sets of the sampler.
#[derive(Debug, Clone, PartialEq)]
pub struct EulerConfig {
    pub train_timesteps: usize,
    pub shift: f64,
}

/// One sampling run's flow-matching Euler: the schedule of `steps` steps and where it is.
#[derive(Debug, Clone)]
pub struct FlowEuler {
    sigmas: Vec<f32>,
    timesteps: Vec<f32>,
    step_index: usize,
}

impl FlowEuler {
    /// The sampler of `steps` steps (at least 1).
    pub fn new(config: &EulerConfig, steps: usize) -> Self {
        let (sigmas, timesteps) = schedule(config, steps.max(1));
        Self {
            sigmas,
            timesteps,
            step_index: 0,
        }
    }

    /// The timesteps the model sees, one a step (σ·T, not truncated).
    pub fn timesteps(&self) -> &[f32] {
        &self.timesteps
    }

    /// The sigmas, one a step and the final 0.
    pub fn sigmas(&self) -> &[f32] {
        &self.sigmas
    }

    /// The steps taken so far.
    pub fn steps_taken(&self) -> usize {
        self.step_index
    }

    /// One step: the velocity `output` at the current step moves `sample` to the next
    /// step's sigma. A finished schedule or an output of another length is an error.
    pub fn step(&mut self, output: &[f32], sample: &mut [f32]) -> Result<(), String> {
        let index = self.step_index;
        super::check_step(index, self.timesteps.len(), output.len(), sample.len())?;
        euler_step(sample, output, self.sigmas[index], self.sigmas[index + 1]);
        self.step_index += 1;
        Ok(())
    }
}

/// The sigmas (`steps` and the final 0) and timesteps of `steps` steps.
fn schedule(config: &EulerConfig, steps: usize) -> (Vec<f32>, Vec<f32>) {
    let train = config.train_timesteps as f64;
    let shift = config.shift;
    // The constructor's table, in torch's f32: σ = t / T for t = T … 1, shifted.
    let (shift_f32, shift_less_one_f32) = (shift as f32, (shift - 1.0) as f32);
    let table = |sigma: f32| shift_f32 * sigma / (1.0 + shift_less_one_f32 * sigma);
    let train_f32 = train as f32;
    // The table's first entry is T / T: exactly 1.
    let sigma_max = f64::from(table(1.0));
    let sigma_min = f64::from(table(1.0 / train_f32));
    // np.linspace(σ_max·T, σ_min·T, N): i·step + start, the last exactly the stop.
    let (start, stop) = (sigma_max * train, sigma_min * train);
    let step = match steps {
        1 => 0.0,
        _ => (stop - start) / (steps - 1) as f64,
    };
    let mut sigmas: Vec<f32> = (0..steps)
        .map(|i| match i + 1 == steps && steps > 1 {
            true => stop,
            false => i as f64 * step + start,
        })
        .map(|timestep| timestep / train)
        .map(|sigma| (shift * sigma / (1.0 + (shift - 1.0) * sigma)) as f32)
        .collect();
    let timesteps = sigmas.iter().map(|sigma| sigma * train_f32).collect();
    sigmas.push(0.0);
    (sigmas, timesteps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unshifted_schedule_is_linear_and_ends_at_zero() {
        // Proves shift 1 spaces the sigmas linearly from 1 to 1/T and steps the sample
        // by (σ_next − σ)·v, ending at σ = 0 after every step is taken.
        let config = EulerConfig {
            train_timesteps: 1000,
            shift: 1.0,
        };
        let mut euler = FlowEuler::new(&config, 4);
        assert_eq!(euler.sigmas().first(), Some(&1.0));
        assert_eq!(euler.sigmas().last(), Some(&0.0));
        assert!((euler.sigmas()[3] - 0.001).abs() < 1e-7);
        assert_eq!(euler.timesteps()[0], 1000.0);
        let mut sample = vec![1.0f32; 3];
        for _ in 0..4 {
            euler.step(&[1.0; 3], &mut sample).expect("steps");
        }
        // Σ (σ_next − σ) = −1: a constant velocity of 1 moves the sample by −1.
        assert!(sample.iter().all(|value| value.abs() < 1e-6));
        assert!(euler.step(&[1.0; 3], &mut sample).is_err());
    }
}

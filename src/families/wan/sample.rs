//! A WAN run that samples: its share of a schedule's denoising steps, each the
//! (guided) velocity of the latent the step before left, stepped by the folder's
//! solver (UniPC or flow-matching Euler).
//! The run's step output is the step's velocity (after guidance), so whoever drives
//! the run (the video pipeline) can replay the solver over them and hand the latent
//! and the solver's state to the next expert at the boundary.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

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

/// Where a sampling run's share starts: the latent and the solver the steps before it
/// left (the high-noise expert's last step, for the low-noise expert).
#[derive(Debug, Clone)]
pub struct SampleStart {
    pub latent: Vec<f32>,
    pub solver: Solver,
}

/// A [`WanSample`] whose start arrives after the run opened: the run is opened (its
/// session started, its first blocks loading) with the share's shape — every input
/// but the latent and the solver's state, which the expert before it is still
/// computing — and its first step waits for the [`SampleStart`] through a one-shot
/// channel. The wait ends early when `stop` is set or the sender is dropped (the
/// expert before it stopped or failed). Once taken, the start is the run's for good:
/// a check of the first step after the run computes from it too.
#[derive(Clone)]
pub struct DeferredSample {
    inner: Arc<Deferred>,
}

struct Deferred {
    start: flume::Receiver<SampleStart>,
    stop: Arc<AtomicBool>,
    taken: OnceLock<WanSample>,
}

/// How often the wait for the start looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(20);

/// What the waiting run found instead of its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoStart {
    /// The stop flag was set.
    Stopped,
    /// The sender went away without sending (the expert before it failed).
    Abandoned,
    /// The start does not fit the share's shape (a latent of another size).
    Mismatched,
}

impl DeferredSample {
    /// A deferred start, and the sender that gives it.
    pub fn channel(stop: Arc<AtomicBool>) -> (flume::Sender<SampleStart>, Self) {
        let (sender, start) = flume::bounded(1);
        let inner = Arc::new(Deferred {
            start,
            stop,
            taken: OnceLock::new(),
        });
        (sender, Self { inner })
    }

    /// The share with its start, once taken.
    pub fn taken(&self) -> Option<&WanSample> {
        self.inner.taken.get()
    }

    /// The share `shape` with its start: waits for it the first time.
    pub fn take(&self, shape: &WanSample) -> Result<&WanSample, NoStart> {
        if let Some(sample) = self.inner.taken.get() {
            return Ok(sample);
        }
        let start = loop {
            if self.inner.stop.load(Ordering::SeqCst) {
                return Err(NoStart::Stopped);
            }
            match self.inner.start.recv_timeout(STOP_POLL) {
                Ok(start) => break start,
                Err(flume::RecvTimeoutError::Timeout) => continue,
                Err(flume::RecvTimeoutError::Disconnected) => return Err(NoStart::Abandoned),
            }
        };
        if start.latent.len() != shape.input.latent.len() {
            return Err(NoStart::Mismatched);
        }
        let sample = WanSample {
            input: WanInput {
                latent: start.latent,
                ..shape.input.clone()
            },
            solver: start.solver,
            steps: shape.steps,
        };
        Ok(self.inner.taken.get_or_init(|| sample))
    }
}

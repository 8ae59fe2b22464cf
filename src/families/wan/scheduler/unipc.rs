//! UniPC, the multistep predictor–corrector Wan 2.2 samples with, as diffusers'
//! `UniPCMultistepScheduler` computes it with flow sigmas (`use_flow_sigmas`,
//! `prediction_type: flow_prediction`, `predict_x0`): the sigmas linear from 1 to
//! 1/T, shifted (σ′ = s·σ / (1 + (s − 1)·σ)), the first nudged below 1 so its log is
//! finite; timesteps σ·T truncated to integers. Each step converts the velocity to a
//! clean-sample prediction (x₀ = x − σ·v), corrects the sample the last predictor
//! made with it (UniC), then predicts the next sample from the last `order`
//! predictions (UniP) in the log-SNR λ = ln((1 − σ)/σ). The per-element arithmetic
//! runs in f32 in diffusers' order, the schedule in f64 as NumPy computes it, so a
//! run follows diffusers' samples to float rounding.

use std::collections::VecDeque;

/// UniP/UniC's B(h): `bh1` is h, `bh2` is eʰ − 1 (diffusers' default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Bh1,
    Bh2,
}

/// The sigma after the last step: 0 (`zero`), or the last step's own (`sigma_min`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalSigma {
    Zero,
    SigmaMin,
}

/// What `scheduler_config.json` sets of the solver (see `super::SchedulerConfig`).
#[derive(Debug, Clone, PartialEq)]
pub struct UniPcConfig {
    pub train_timesteps: usize,
    pub flow_shift: f64,
    pub solver_order: usize,
    pub variant: Variant,
    /// Lower the order over the last steps (`lower_order_final`).
    pub lower_order_final: bool,
    /// Steps whose following corrector is skipped (`disable_corrector`).
    pub disable_corrector: Vec<usize>,
    pub final_sigma: FinalSigma,
}

/// One sampling run's solver: the schedule of `steps` steps and the predictions so far.
#[derive(Debug, Clone)]
pub struct UniPc {
    config: UniPcConfig,
    sigmas: Vec<f32>,
    timesteps: Vec<i64>,
    /// The last `solver_order` clean-sample predictions, newest last.
    predictions: VecDeque<Vec<f32>>,
    /// The sample the last predictor started from (the corrector's `x`).
    last_sample: Option<Vec<f32>>,
    /// The order the last predictor ran at (the next corrector's).
    last_order: usize,
    warm_steps: usize,
    step_index: usize,
}

impl UniPc {
    /// The solver of `steps` steps (at least 1).
    pub fn new(config: UniPcConfig, steps: usize) -> Self {
        let (sigmas, timesteps) = flow_schedule(&config, steps.max(1));
        Self {
            config,
            sigmas,
            timesteps,
            predictions: VecDeque::new(),
            last_sample: None,
            last_order: 0,
            warm_steps: 0,
            step_index: 0,
        }
    }

    /// The timesteps the model sees, one a step (σ·T truncated).
    pub fn timesteps(&self) -> &[i64] {
        &self.timesteps
    }

    /// The sigmas, one a step and the final one.
    pub fn sigmas(&self) -> &[f32] {
        &self.sigmas
    }

    /// The steps taken so far.
    pub fn steps_taken(&self) -> usize {
        self.step_index
    }

    /// One step: the model's velocity `output` at the current step's timestep moves
    /// `sample` to the next step's. Panics never: a finished schedule or a length
    /// that is not the sample's is an error.
    pub fn step(&mut self, output: &[f32], sample: &mut Vec<f32>) -> Result<(), String> {
        let index = self.step_index;
        super::check_step(index, self.timesteps.len(), output.len(), sample.len())?;
        let sigma = self.sigmas[index];
        let prediction: Vec<f32> = sample
            .iter()
            .zip(output)
            .map(|(x, v)| x - sigma * v)
            .collect();
        let corrects = index > 0 && !self.config.disable_corrector.contains(&(index - 1));
        if let (true, Some(last)) = (corrects, self.last_sample.as_deref()) {
            *sample = self.corrected(&prediction, last, sample, self.last_order);
        }
        if self.predictions.len() == self.config.solver_order {
            self.predictions.pop_front();
        }
        self.predictions.push_back(prediction);
        let order = match self.config.lower_order_final {
            true => self.config.solver_order.min(self.timesteps.len() - index),
            false => self.config.solver_order,
        };
        let order = order.min(self.warm_steps + 1);
        self.last_order = order;
        self.last_sample = Some(sample.clone());
        *sample = self.predicted(sample, order);
        self.warm_steps = (self.warm_steps + 1).min(self.config.solver_order);
        self.step_index += 1;
        Ok(())
    }

    /// UniP: the next sample from `x` at the current step, of order `order`.
    fn predicted(&self, x: &[f32], order: usize) -> Vec<f32> {
        let index = self.step_index;
        let terms = self.terms(index + 1, index, order, |i| index - i);
        let rhos = match order {
            1 => Vec::new(),
            2 => vec![0.5],
            _ => solve(&terms.r_matrix(order - 1), &terms.b[..order - 1]),
        };
        let newest = self.newest();
        x.iter()
            .enumerate()
            .map(|(at, &x)| {
                let base = terms.ratio * x - terms.alpha_phi * newest[at];
                if rhos.is_empty() {
                    return base;
                }
                base - terms.alpha_b * terms.residual(&rhos, at, newest[at])
            })
            .collect()
    }

    /// UniC: the sample `this` the last predictor made from `last`, corrected with the
    /// model's prediction at it.
    fn corrected(&self, prediction: &[f32], last: &[f32], this: &[f32], order: usize) -> Vec<f32> {
        let index = self.step_index;
        let terms = self.terms(index, index - 1, order, |i| index - (i + 1));
        let rhos = match order {
            1 => vec![0.5],
            _ => solve(&terms.r_matrix(order), &terms.b),
        };
        let (differences, last_rho) = rhos.split_at(rhos.len() - 1);
        let newest = self.newest();
        (0..this.len())
            .map(|at| {
                let base = terms.ratio * last[at] - terms.alpha_phi * newest[at];
                let earlier = match differences.is_empty() {
                    true => 0.0,
                    false => terms.residual(differences, at, newest[at]),
                };
                let correction = earlier + last_rho[0] * (prediction[at] - newest[at]);
                base - terms.alpha_b * correction
            })
            .collect()
    }

    fn newest(&self) -> &[f32] {
        self.predictions.back().map_or(&[], Vec::as_slice)
    }

    /// The coefficients of an update from sigma index `from` to `to` of `order`:
    /// `earlier(i)` is the sigma index of the prediction i before the newest.
    fn terms(
        &self,
        to: usize,
        from: usize,
        order: usize,
        earlier: impl Fn(usize) -> usize,
    ) -> Terms<'_> {
        let (alpha_t, sigma_t) = (1.0 - self.sigmas[to], self.sigmas[to]);
        let lambda_from = lambda(self.sigmas[from]);
        let h = lambda(sigma_t) - lambda_from;
        let mut rks = Vec::with_capacity(order);
        let mut older = Vec::with_capacity(order);
        for i in 1..order {
            rks.push((lambda(self.sigmas[earlier(i)]) - lambda_from) / h);
            older.push(&self.predictions[self.predictions.len() - 1 - i][..]);
        }
        rks.push(1.0);
        let hh = -h;
        let h_phi_1 = hh.exp_m1();
        let b_h = match self.config.variant {
            Variant::Bh1 => hh,
            Variant::Bh2 => hh.exp_m1(),
        };
        let mut b = Vec::with_capacity(order);
        let (mut h_phi_k, mut factorial) = (h_phi_1 / hh - 1.0, 1u64);
        for i in 1..=order as u64 {
            b.push(h_phi_k * factorial as f32 / b_h);
            factorial *= i + 1;
            h_phi_k = h_phi_k / hh - (1.0 / factorial as f64) as f32;
        }
        Terms {
            ratio: sigma_t / self.sigmas[from],
            alpha_phi: alpha_t * h_phi_1,
            alpha_b: alpha_t * b_h,
            rks,
            older,
            b,
        }
    }
}

/// The scalars and earlier predictions of one update.
struct Terms<'a> {
    ratio: f32,
    alpha_phi: f32,
    alpha_b: f32,
    /// The earlier predictions' λ distances over h, then 1.
    rks: Vec<f32>,
    older: Vec<&'a [f32]>,
    b: Vec<f32>,
}

impl Terms<'_> {
    /// The first `size` rows and columns of R (row i: rks to the power i).
    fn r_matrix(&self, size: usize) -> Vec<Vec<f32>> {
        (0..size)
            .map(|power| {
                self.rks[..size]
                    .iter()
                    .map(|rk| rk.powi(power as i32))
                    .collect()
            })
            .collect()
    }

    /// Σₖ ρₖ·Dₖ at one element, Dₖ = (mₖ − m₀)/rₖ.
    fn residual(&self, rhos: &[f32], at: usize, newest: f32) -> f32 {
        rhos.iter()
            .zip(&self.older)
            .zip(&self.rks)
            .map(|((rho, older), rk)| rho * ((older[at] - newest) / rk))
            .sum()
    }
}

/// λ = ln α − ln σ of a flow sigma (α = 1 − σ), in f32 as torch computes it.
fn lambda(sigma: f32) -> f32 {
    (1.0 - sigma).ln() - sigma.ln()
}

/// The schedule of `steps` flow steps: the sigmas (f32) and the timesteps.
fn flow_schedule(config: &UniPcConfig, steps: usize) -> (Vec<f32>, Vec<i64>) {
    let train = config.train_timesteps as f64;
    // NumPy's linspace(1, 1/T, steps + 1) without its last value: i·step + start.
    let step = (1.0 / train - 1.0) / steps as f64;
    let shift = config.flow_shift;
    let mut shifted: Vec<f64> = (0..steps)
        .map(|i| i as f64 * step + 1.0)
        .map(|sigma| shift * sigma / (1.0 + (shift - 1.0) * sigma))
        .collect();
    if (shifted[0] - 1.0).abs() < 1e-6 {
        shifted[0] -= 1e-6;
    }
    let timesteps = shifted.iter().map(|sigma| (sigma * train) as i64).collect();
    let last = match config.final_sigma {
        FinalSigma::Zero => 0.0,
        FinalSigma::SigmaMin => shifted[steps - 1],
    };
    let sigmas = shifted
        .iter()
        .chain([&last])
        .map(|&sigma| sigma as f32)
        .collect();
    (sigmas, timesteps)
}

/// x with A·x = b, by elimination with partial pivoting (the orders here are 2 or 3).
fn solve(a: &[Vec<f32>], b: &[f32]) -> Vec<f32> {
    let size = b.len();
    let mut rows: Vec<Vec<f64>> = a
        .iter()
        .zip(b)
        .map(|(row, &value)| {
            row.iter()
                .map(|&v| v as f64)
                .chain([value as f64])
                .collect()
        })
        .collect();
    for column in 0..size {
        let pivot = (column..size)
            .max_by(|&i, &j| rows[i][column].abs().total_cmp(&rows[j][column].abs()))
            .unwrap_or(column);
        rows.swap(column, pivot);
        let (upper, lower) = rows.split_at_mut(column + 1);
        let pivot_row = &upper[column];
        for row in lower {
            let factor = row[column] / pivot_row[column];
            for (value, above) in row.iter_mut().zip(pivot_row).skip(column) {
                *value -= factor * above;
            }
        }
    }
    let mut x = vec![0.0f64; size];
    for row in (0..size).rev() {
        let known: f64 = (row + 1..size).map(|k| rows[row][k] * x[k]).sum();
        x[row] = (rows[row][size] - known) / rows[row][row];
    }
    x.into_iter().map(|value| value as f32).collect()
}

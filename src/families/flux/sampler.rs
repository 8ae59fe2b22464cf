//! The flow-matching Euler sampler as diffusers' `FluxPipeline` drives
//! `FlowMatchEulerDiscreteScheduler`: sigmas linear from 1 to 1/N, for dev shifted by
//! the resolution (μ linear in the image tokens, 0.5 at 256 to 1.15 at 4096; σ′ =
//! e^μ / (e^μ + 1/σ − 1)), schnell unshifted; a final sigma of 0; each step
//! `x ← x + (σ_next − σ)·v`. Image-to-image (`strength` s < 1) starts at step
//! N − ⌊N·s⌋ of the same schedule from `σ·noise + (1 − σ)·image`.
//!
//! The step itself ([`euler_step`]) is the scheduler's whatever its schedule: WAN's
//! flow-matching Euler (`families::wan::scheduler`) takes it from here.

/// The resolution-dependent shift μ of Flux dev at `image_tokens`.
pub fn mu(image_tokens: usize) -> f64 {
    let (base_tokens, max_tokens, base_shift, max_shift) = (256.0, 4096.0, 0.5, 1.15);
    let slope = (max_shift - base_shift) / (max_tokens - base_tokens);
    let intercept = base_shift - slope * base_tokens;
    image_tokens as f64 * slope + intercept
}

/// The sigmas of `steps` steps and the final 0 (`steps + 1` values), shifted by μ when
/// `shifted` (dev), computed in f32 as the scheduler does.
pub fn sigmas(steps: usize, image_tokens: usize, shifted: bool) -> Vec<f32> {
    let mut sigmas: Vec<f32> = (0..steps)
        .map(|i| {
            let last = 1.0 / steps as f64;
            let value = if steps == 1 {
                1.0
            } else {
                1.0 + (last - 1.0) * i as f64 / (steps - 1) as f64
            };
            value as f32
        })
        .collect();
    if shifted {
        let e = mu(image_tokens).exp() as f32;
        for sigma in &mut sigmas {
            *sigma = e / (e + (1.0 / *sigma - 1.0));
        }
    }
    sigmas.push(0.0);
    sigmas
}

/// The first step image-to-image runs at `strength` of `steps` (0 for a full run), in
/// f64 as the pipeline computes `int(N − min(N·strength, N))`.
pub fn first_step(steps: usize, strength: f64) -> usize {
    let init = (steps as f64 * strength).min(steps as f64);
    (steps as f64 - init).max(0.0) as usize
}

/// One step of `FlowMatchEulerDiscreteScheduler.step`: `x ← x + (σ_next − σ)·v`, in f32
/// as diffusers computes it (the difference first, then one multiply-add an element).
pub fn euler_step(sample: &mut [f32], velocity: &[f32], sigma: f32, next: f32) {
    let dt = next - sigma;
    for (value, velocity) in sample.iter_mut().zip(velocity) {
        *value += dt * velocity;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shift_is_flux_devs_at_both_ends() {
        // Proves μ is 0.5 at 256 image tokens and 1.15 at 4096, and the schedule
        // starts at 1 and ends at 0 either way.
        assert!((mu(256) - 0.5).abs() < 1e-12 && (mu(4096) - 1.15).abs() < 1e-12);
        let shifted = sigmas(4, 4096, true);
        let plain = sigmas(4, 4096, false);
        assert_eq!(plain, [1.0, 0.75, 0.5, 0.25, 0.0]);
        assert_eq!((shifted[0], shifted[4]), (1.0, 0.0));
        // Shifted sigmas stay higher: more of the steps at high noise.
        assert!(shifted[1..4].iter().zip(&plain[1..4]).all(|(s, p)| s > p));
        assert_eq!(first_step(10, 0.6), 4);
        assert_eq!(first_step(4, 1.0), 0);
    }
}

//! The diffusion-transformer operations of the compute port (`Compute::diffusion`:
//! adaptive LayerNorm, gated add, SiLU, GELU-tanh, interleaved rope, write_cols)
//! against plain f64 references of their definitions, for any adapter that has them;
//! and their shape checks. An adapter without them must refuse by name.

use stagehand::compute::{Compute, ComputeError};

use super::ops::{normalised_difference, seeded};

/// Largest normalised difference from the f64 reference (f32 kernels, one pass each).
pub const TOLERANCE: f32 = 1e-5;

/// Each operation's name and its normalised difference from the reference.
pub fn diffusion_misses<C: Compute>(compute: &C) -> Result<Vec<(String, f32)>, ComputeError> {
    let kernels = compute.diffusion()?;
    let (rows, cols) = (5, 24);
    let x_values = seeded(rows * cols, 1, 2.0);
    let shift_values = seeded(cols, 2, 0.5);
    let scale_values = seeded(cols, 3, 0.5);
    let tensor = |values: &[f32], rows: usize, cols: usize| -> Result<C::Tensor, ComputeError> {
        let mut tensor = compute.tensor(rows, cols)?;
        compute.write(&mut tensor, values)?;
        Ok(tensor)
    };
    let x = tensor(&x_values, rows, cols)?;
    let shift = tensor(&shift_values, 1, cols)?;
    let scale = tensor(&scale_values, 1, cols)?;
    let mut results = Vec::new();
    let mut y = compute.tensor(rows, cols)?;
    kernels.adaptive_norm(&x, &shift, &scale, 1e-6, &mut y)?;
    let expected: Vec<f32> = x_values
        .chunks(cols)
        .flat_map(|row| {
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / cols as f64;
            let var = row
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / cols as f64;
            let inverse = 1.0 / (var + 1e-6).sqrt();
            row.iter()
                .zip(shift_values.iter().zip(&scale_values))
                .map(move |(&v, (&s, &c))| {
                    ((f64::from(v) - mean) * inverse * (1.0 + f64::from(c)) + f64::from(s)) as f32
                })
                .collect::<Vec<_>>()
        })
        .collect();
    results.push((
        "adaptive_norm".to_string(),
        normalised_difference(&compute.read(&y)?, &expected),
    ));
    let mut gated = tensor(&x_values, rows, cols)?;
    let y_values = seeded(rows * cols, 4, 1.0);
    kernels.add_gated(&mut gated, &tensor(&y_values, rows, cols)?, &scale)?;
    let expected: Vec<f32> = (0..rows * cols)
        .map(|i| {
            (f64::from(x_values[i]) + f64::from(scale_values[i % cols]) * f64::from(y_values[i]))
                as f32
        })
        .collect();
    results.push((
        "add_gated".to_string(),
        normalised_difference(&compute.read(&gated)?, &expected),
    ));
    let mut silu = tensor(&x_values, rows, cols)?;
    kernels.silu(&mut silu)?;
    let expected: Vec<f32> = x_values
        .iter()
        .map(|&v| {
            let v = f64::from(v);
            (v / (1.0 + (-v).exp())) as f32
        })
        .collect();
    results.push((
        "silu".to_string(),
        normalised_difference(&compute.read(&silu)?, &expected),
    ));
    let mut gelu = tensor(&x_values, rows, cols)?;
    kernels.gelu_tanh(&mut gelu)?;
    let expected: Vec<f32> = x_values
        .iter()
        .map(|&v| {
            let v = f64::from(v);
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3));
            (0.5 * v * (1.0 + inner.tanh())) as f32
        })
        .collect();
    results.push((
        "gelu_tanh".to_string(),
        normalised_difference(&compute.read(&gelu)?, &expected),
    ));
    let (heads, head_dim) = (3, 8);
    let angles = seeded(rows * head_dim / 2, 5, 3.0);
    let table_values: Vec<f32> = angles.iter().flat_map(|a| [a.cos(), a.sin()]).collect();
    let mut roped = tensor(&x_values, rows, cols)?;
    kernels.rope_pairs(&mut roped, heads, &tensor(&table_values, rows, head_dim)?)?;
    let mut expected = x_values.clone();
    for row in 0..rows {
        for head in 0..heads {
            for pair in 0..head_dim / 2 {
                let at = row * cols + head * head_dim + 2 * pair;
                let angle = f64::from(angles[row * head_dim / 2 + pair]);
                let (re, im) = (f64::from(x_values[at]), f64::from(x_values[at + 1]));
                expected[at] = (re * angle.cos() - im * angle.sin()) as f32;
                expected[at + 1] = (im * angle.cos() + re * angle.sin()) as f32;
            }
        }
    }
    results.push((
        "rope_pairs".to_string(),
        normalised_difference(&compute.read(&roped)?, &expected),
    ));
    let mut wide = compute.tensor(rows, cols + 4)?;
    kernels.write_cols(&mut wide, 4, &x)?;
    let expected: Vec<f32> = x_values
        .chunks(cols)
        .flat_map(|row| [0.0; 4].iter().chain(row).copied().collect::<Vec<_>>())
        .collect();
    results.push((
        "write_cols".to_string(),
        normalised_difference(&compute.read(&wide)?, &expected),
    ));
    Ok(results)
}

/// Shapes that do not fit are refused, never read out of bounds.
pub fn diffusion_shape_errors<C: Compute>(compute: &C) -> Result<usize, ComputeError> {
    let kernels = compute.diffusion()?;
    let x = compute.tensor(4, 8)?;
    let mut y = compute.tensor(4, 8)?;
    let wrong = compute.tensor(1, 7)?;
    let mut refused = 0;
    refused += usize::from(
        kernels
            .adaptive_norm(&x, &wrong, &wrong, 1e-6, &mut y)
            .is_err(),
    );
    refused += usize::from(kernels.add_gated(&mut y, &x, &wrong).is_err());
    refused += usize::from(kernels.rope_pairs(&mut y, 3, &x).is_err());
    refused += usize::from(kernels.write_cols(&mut y, 2, &x).is_err());
    Ok(refused)
}

//! What a Flux step computes on the host, once per step or once per run: the
//! sinusoidal timestep embedding, the three-axis rope table, the latent's 2×2 packing,
//! and seeded Gaussian noise.

use super::config::ROPE_THETA;

/// Frequencies of the timestep (and guidance) embedding.
pub const TIME_FREQUENCIES: usize = 256;

/// `[cos(t·1000·f_i) …, sin(t·1000·f_i) …]` with `f_i = 10000^(−i/128)`, in f32 as
/// diffusers' `get_timestep_embedding(flip_sin_to_cos=True)` and the original
/// `timestep_embedding(time_factor=1000)` compute it.
pub fn timestep_embedding(t: f32) -> Vec<f32> {
    crate::families::activations::sinusoidal_embedding(t * 1000.0, TIME_FREQUENCIES)
}

/// The rope table of `rows` token ids (`ids[r]` = (index, row, column)): per row,
/// `head_dim` values, (cos, sin) of each interleaved pair, the axes' pairs one after
/// the other. Angles in f64, as both reference implementations compute them.
pub fn rope_table(ids: &[[f32; 3]], axes: &[usize]) -> Vec<f32> {
    let head_dim: usize = axes.iter().sum();
    let mut table = Vec::with_capacity(ids.len() * head_dim);
    for id in ids {
        for (axis, &dim) in axes.iter().enumerate() {
            let position = f64::from(id[axis]);
            for pair in 0..dim / 2 {
                let frequency = 1.0 / ROPE_THETA.powf((2 * pair) as f64 / dim as f64);
                let angle = position * frequency;
                table.push(angle.cos() as f32);
                table.push(angle.sin() as f32);
            }
        }
    }
    table
}

/// The ids of `text` text tokens (zeros) then of an image of `rows × cols` tokens
/// (0, row, column).
pub fn token_ids(text: usize, rows: usize, cols: usize) -> Vec<[f32; 3]> {
    let mut ids = vec![[0.0; 3]; text];
    for row in 0..rows {
        for col in 0..cols {
            ids.push([0.0, row as f32, col as f32]);
        }
    }
    ids
}

/// Every (packed, latent) index pair of a latent `[channels, 2·rows, 2·cols]` packed
/// into `rows·cols` tokens of `channels·4` values: token (i, j), value `c·4 + 2a + b`
/// is `latent[c][2i + a][2j + b]` (diffusers' `_pack_latents`, the original's
/// `rearrange`).
fn packing(channels: usize, rows: usize, cols: usize) -> impl Iterator<Item = (usize, usize)> {
    let (height, width) = (2 * rows, 2 * cols);
    (0..rows * cols).flat_map(move |token| {
        let (i, j) = (token / cols, token % cols);
        (0..channels * 4).map(move |value| {
            let (c, a, b) = (value / 4, value % 4 / 2, value % 2);
            (
                token * channels * 4 + value,
                (c * height + 2 * i + a) * width + 2 * j + b,
            )
        })
    })
}

/// A latent `[channels, 2·rows, 2·cols]` packed into `rows·cols` tokens of
/// `channels·4` values: token (i, j), value `c·4 + 2a + b` is `latent[c][2i + a][2j + b]`.
pub fn pack(latent: &[f32], channels: usize, rows: usize, cols: usize) -> Vec<f32> {
    let mut packed = vec![0.0; latent.len()];
    for (to, from) in packing(channels, rows, cols) {
        packed[to] = latent[from];
    }
    packed
}

/// The inverse of [`pack`].
pub fn unpack(packed: &[f32], channels: usize, rows: usize, cols: usize) -> Vec<f32> {
    let mut latent = vec![0.0; packed.len()];
    for (from, to) in packing(channels, rows, cols) {
        latent[to] = packed[from];
    }
    latent
}

/// `count` standard normal values from `seed` (SplitMix64, Box–Muller): the same
/// values for the same seed on every machine.
pub fn gaussian(count: usize, seed: u64) -> Vec<f32> {
    let mut state = seed ^ 0xF1C5_5EED_0000_0000;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        // 53 random bits in (0, 1].
        (((z ^ (z >> 31)) >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    };
    let mut values = Vec::with_capacity(count + 1);
    while values.len() < count {
        let (u, v) = (next(), next());
        let radius = (-2.0 * u.ln()).sqrt();
        let angle = std::f64::consts::TAU * v;
        values.push((radius * angle.cos()) as f32);
        values.push((radius * angle.sin()) as f32);
    }
    values.truncate(count);
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_round_trips_and_places_a_2x2_patch_in_one_token() {
        // Proves pack/unpack are inverse and pack puts each 2×2 patch of a channel
        // into four neighbouring values of its token.
        let (channels, rows, cols) = (3, 2, 3);
        let latent: Vec<f32> = (0..channels * 4 * rows * cols).map(|v| v as f32).collect();
        let packed = pack(&latent, channels, rows, cols);
        assert_eq!(unpack(&packed, channels, rows, cols), latent);
        // Token (1, 2), channel 1: rows 2..4, columns 4..6 of channel 1 (width 6).
        let token = (cols + 2) * channels * 4 + 4;
        let at = |c: usize, y: usize, x: usize| latent[(c * 4 + y) * 6 + x];
        assert_eq!(
            &packed[token..token + 4],
            &[at(1, 2, 4), at(1, 2, 5), at(1, 3, 4), at(1, 3, 5)]
        );
    }

    #[test]
    fn seeded_noise_is_standard_normal_and_repeats() {
        // Proves the noise is reproducible and has mean ≈ 0, variance ≈ 1.
        let values = gaussian(20_001, 7);
        assert_eq!(values, gaussian(20_001, 7));
        assert_ne!(values, gaussian(20_001, 8));
        let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / values.len() as f64;
        let variance = values
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / values.len() as f64;
        assert!(
            mean.abs() < 0.03 && (variance - 1.0).abs() < 0.05,
            "{mean} {variance}"
        );
    }

    #[test]
    fn text_rows_of_the_rope_table_are_the_identity() {
        // Proves text ids (all zero) rotate by nothing: cos 1, sin 0.
        let table = rope_table(&token_ids(1, 1, 2), &[2, 2, 4]);
        assert_eq!(&table[..8], &[1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]);
        // Image token (0, 0, 1), the third row: the column axis (its last 4 values, 2
        // pairs) turns by 1 and 1/100.
        let column = &table[3 * 8 - 4..3 * 8];
        assert!((column[0] - 1f32.cos()).abs() < 1e-7 && (column[1] - 1f32.sin()).abs() < 1e-7);
        assert!((column[3] - 0.01f32.sin()).abs() < 1e-7);
    }
}

//! What a WAN step computes on the host, once a run: the latent cut into patches
//! (the Conv3d whose kernel equals its stride, as rows of a product), the velocity
//! put back together from them, the three-axis rope table and the sinusoidal
//! timestep embedding.

/// Rotary base of WAN's rope.
pub const ROPE_THETA: f64 = 10_000.0;

/// A latent `[channels, frames, height, width]` and its patch grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    pub channels: usize,
    pub frames: usize,
    pub height: usize,
    pub width: usize,
    /// Frames, rows and columns of one patch.
    pub patch: [usize; 3],
}

impl Grid {
    /// Patches along frames, rows and columns.
    pub fn patches(&self) -> [usize; 3] {
        [
            self.frames / self.patch[0],
            self.height / self.patch[1],
            self.width / self.patch[2],
        ]
    }

    /// Tokens: one per patch, frames outermost, then rows, then columns (diffusers'
    /// `flatten(2)` of the Conv3d output).
    pub fn tokens(&self) -> usize {
        self.patches().iter().product()
    }

    fn patch_values(&self) -> usize {
        self.patch.iter().product()
    }

    /// Every (token value, latent index) pair of a latent of `channels` channels:
    /// token `(f, i, j)`'s value `((c·pt + a)·ph + b)·pw + e` (the Conv3d kernel's
    /// `[c, a, b, e]` order) when `channels_last` is false, or `((a·ph + b)·pw + e)·C
    /// + c` (diffusers' unpatchify of `proj_out`) when true, is
    ///   `latent[c][f·pt + a][i·ph + b][j·pw + e]`.
    fn pairs(&self, channels: usize, channels_last: bool) -> Vec<(usize, usize)> {
        let [frames, rows, cols] = self.patches();
        let [pt, ph, pw] = self.patch;
        let per_token = channels * self.patch_values();
        let mut pairs = Vec::with_capacity(self.tokens() * per_token);
        for token in 0..frames * rows * cols {
            let (f, i, j) = (token / (rows * cols), token / cols % rows, token % cols);
            for c in 0..channels {
                for a in 0..pt {
                    for b in 0..ph {
                        for e in 0..pw {
                            let offset = (a * ph + b) * pw + e;
                            let value = match channels_last {
                                false => c * self.patch_values() + offset,
                                true => offset * channels + c,
                            };
                            let latent =
                                ((c * self.frames + f * pt + a) * self.height + i * ph + b)
                                    * self.width
                                    + j * pw
                                    + e;
                            pairs.push((token * per_token + value, latent));
                        }
                    }
                }
            }
        }
        pairs
    }

    /// The latent as `rows ≥ tokens` rows of patch values (rows past the tokens zero).
    pub fn patchify(&self, latent: &[f32], rows: usize) -> Vec<f32> {
        let per_token = self.channels * self.patch_values();
        let mut patches = vec![0.0; rows * per_token];
        for (patch, index) in self.pairs(self.channels, false) {
            patches[patch] = latent[index];
        }
        patches
    }

    /// The velocity `[channels_out, frames, height, width]` from the first tokens of
    /// `proj_out`'s rows.
    pub fn unpatchify(&self, rows: &[f32], channels_out: usize) -> Vec<f32> {
        let mut velocity = vec![0.0; channels_out * self.frames * self.height * self.width];
        for (patch, index) in self.pairs(channels_out, true) {
            velocity[index] = rows[patch];
        }
        velocity
    }

    /// The rope table of `rows ≥ tokens` rows: per token `(f, i, j)`, `head_dim`
    /// values, (cos, sin) of each interleaved pair, the frame axis's pairs at
    /// position `f`, then the row axis's at `i`, the column axis's at `j`. Angles in
    /// f64 as diffusers' `get_1d_rotary_pos_embed` computes them. Rows past the tokens
    /// turn by nothing.
    pub fn rope_table(&self, axes: [usize; 3], rows: usize) -> Vec<f32> {
        let head_dim: usize = axes.iter().sum();
        let [frames, height, width] = self.patches();
        let mut table = Vec::with_capacity(rows * head_dim);
        for token in 0..frames * height * width {
            let position = [
                token / (height * width),
                token / width % height,
                token % width,
            ];
            for (axis, &dim) in axes.iter().enumerate() {
                for pair in 0..dim / 2 {
                    let frequency = 1.0 / ROPE_THETA.powf((2 * pair) as f64 / dim as f64);
                    let angle = position[axis] as f64 * frequency;
                    table.push(angle.cos() as f32);
                    table.push(angle.sin() as f32);
                }
            }
        }
        for _ in self.tokens()..rows {
            for _ in 0..head_dim / 2 {
                table.extend([1.0, 0.0]);
            }
        }
        table
    }
}

/// `[cos(t·f_i) …, sin(t·f_i) …]` with `f_i = exp(−ln(10000)·i/half)` over `dim`
/// frequencies, in f32 as diffusers' `Timesteps(flip_sin_to_cos=True,
/// downscale_freq_shift=0)` computes it (WAN takes the timestep unscaled, 0–1000).
pub fn timestep_embedding(t: f32, dim: usize) -> Vec<f32> {
    crate::families::activations::sinusoidal_embedding(t, dim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_go_back_where_they_came_from_and_the_rope_follows_the_grid() {
        // Proves unpatchify inverts patchify when the channels are ordered as the
        // product leaves them, and the table turns token (f, i, j) by f on the frame
        // axis, i on rows and j on columns, padding rows not at all.
        let grid = Grid {
            channels: 3,
            frames: 2,
            height: 4,
            width: 6,
            patch: [1, 2, 2],
        };
        assert_eq!(grid.tokens(), 2 * 2 * 3);
        let latent: Vec<f32> = (0..3 * 2 * 4 * 6).map(|v| v as f32).collect();
        let patches = grid.patchify(&latent, grid.tokens());
        // Token 0, value of channel 1, (a, b, e) = (0, 1, 0): latent[1][0][1][0].
        assert_eq!(patches[4 + 2], latent[(4 * 6) * 2 + 6]);
        let per_token = 12;
        let mut channels_last = vec![0.0; patches.len()];
        for token in 0..grid.tokens() {
            for c in 0..3 {
                for offset in 0..4 {
                    channels_last[token * per_token + offset * 3 + c] =
                        patches[token * per_token + c * 4 + offset];
                }
            }
        }
        assert_eq!(grid.unpatchify(&channels_last, 3), latent);
        let table = grid.rope_table([4, 2, 2], grid.tokens() + 1);
        // Token (1, 1, 2) is 1·6 + 1·3 + 2 = 11: frame pair 0 turns by 1 radian.
        let row = &table[11 * 8..12 * 8];
        assert_eq!((row[0], row[1]), (1f64.cos() as f32, 1f64.sin() as f32));
        assert_eq!((row[6], row[7]), (2f64.cos() as f32, 2f64.sin() as f32));
        assert_eq!(&table[12 * 8..], &[1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]);
    }
}

//! The sentence head on an encoder's final token states, as sentence-transformers'
//! Pooling and Normalize modules compute it: one embedding per sequence, the modes
//! concatenated in the head's order, over the real tokens of each (padding is on the
//! right, so they are the sequence's prefix).

use super::sentence::{Pooling, SentenceHead};
use super::tokens::TokenBatch;

/// `states`: `sequences × length` rows of `hidden` values. Returns
/// `sequences × (modes × hidden)` values.
pub fn pool(head: &SentenceHead, states: &[f32], batch: &TokenBatch, hidden: usize) -> Vec<f32> {
    let width = head.modes.len() * hidden;
    let mut pooled = vec![0.0f32; batch.sequences * width];
    for (sequence, out) in pooled.chunks_exact_mut(width).enumerate() {
        let first = sequence * batch.length;
        let real = batch.lengths[sequence].clamp(1, batch.length);
        let rows = &states[first * hidden..(first + real) * hidden];
        for (mode, out) in head.modes.iter().zip(out.chunks_exact_mut(hidden)) {
            pool_one(*mode, rows, hidden, out);
        }
        if head.normalize {
            // As torch.nn.functional.normalize: divide by max(‖v‖, 1e-12).
            let norm = out.iter().map(|value| value * value).sum::<f32>().sqrt();
            let norm = norm.max(1e-12);
            out.iter_mut().for_each(|value| *value /= norm);
        }
    }
    pooled
}

/// One mode over `rows` (the real tokens' states) into `out` (`hidden` values).
fn pool_one(mode: Pooling, rows: &[f32], hidden: usize, out: &mut [f32]) {
    let tokens = rows.chunks_exact(hidden);
    let count = tokens.len() as f32;
    match mode {
        Pooling::Cls => out.copy_from_slice(&rows[..hidden]),
        Pooling::LastToken => out.copy_from_slice(&rows[rows.len() - hidden..]),
        Pooling::Max => {
            out.fill(f32::NEG_INFINITY);
            for row in tokens {
                out.iter_mut()
                    .zip(row)
                    .for_each(|(out, &value)| *out = out.max(value));
            }
        }
        Pooling::Mean | Pooling::MeanSqrtLen => {
            for row in tokens {
                out.iter_mut()
                    .zip(row)
                    .for_each(|(out, value)| *out += value);
            }
            let divisor = if mode == Pooling::Mean {
                count
            } else {
                count.sqrt()
            };
            out.iter_mut().for_each(|value| *value /= divisor);
        }
        Pooling::WeightedMean => {
            // Position weights 1, 2, … from the first real token.
            let mut weights = 0.0f32;
            for (position, row) in tokens.enumerate() {
                let weight = (position + 1) as f32;
                weights += weight;
                out.iter_mut()
                    .zip(row)
                    .for_each(|(out, value)| *out += value * weight);
            }
            out.iter_mut().for_each(|value| *value /= weights);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_pools_only_the_real_tokens() {
        // Proves every mode reads the real tokens of a padded sequence and the modes concatenate in order.
        let batch = TokenBatch {
            sequences: 1,
            length: 3,
            ids: vec![1, 2, 0],
            type_ids: vec![0; 3],
            lengths: vec![2],
        };
        // Token states (hidden 2): [1, -4], [3, 2], and padding [100, 100].
        let states = [1.0, -4.0, 3.0, 2.0, 100.0, 100.0];
        let modes = vec![
            Pooling::Cls,
            Pooling::Max,
            Pooling::Mean,
            Pooling::MeanSqrtLen,
            Pooling::WeightedMean,
            Pooling::LastToken,
        ];
        let head = SentenceHead {
            modes,
            normalize: false,
        };
        let pooled = pool(&head, &states, &batch, 2);
        let root = 2f32.sqrt();
        let expected = [
            1.0,
            -4.0,
            3.0,
            2.0,
            2.0,
            -1.0,
            4.0 / root,
            -2.0 / root,
            7.0 / 3.0,
            0.0,
            3.0,
            2.0,
        ];
        assert_eq!(pooled, expected);
        let normalized = pool(
            &SentenceHead {
                modes: vec![Pooling::Cls],
                normalize: true,
            },
            &states,
            &batch,
            2,
        );
        let norm = 17f32.sqrt();
        assert_eq!(normalized, [1.0 / norm, -4.0 / norm]);
    }
}

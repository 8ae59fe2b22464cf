//! The activation tensors of a WAN step, in the order the step allocates them, each
//! with the kinds of block it is live in: the one list the step's state is
//! allocated from, its reservation summed from, and each kind's working set summed
//! from.
//!
//! Token rows are `max(video tokens, text tokens)`: cross-attention runs as one
//! attention of that many rows whose keys past the text are masked, so a tiny video
//! with a long prompt pads its token rows (never attended to) rather than its keys.
//! Self-attention's q, k, v are reused by cross-attention once self-attention is
//! done (the text's k and v are written into the first rows of k and v), and rope
//! is applied in place, q before k, so neither adds a tensor.
//!
//! A guided step (classifier-free guidance) runs the prompt's and the negative
//! prompt's passes block by block under one acquire of each block, so it keeps a
//! second residual stream, projected text and text states; the scratch tensors serve
//! both passes.

use crate::families::{Activations, BlockKindPeak};

use super::config::WanConfig;

/// A kind of block of a WAN step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Embedders,
    Block,
    Output,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Embedders, Kind::Block, Kind::Output];

    fn describe(self) -> &'static str {
        match self {
            Kind::Embedders => "embedders",
            Kind::Block => "transformer block",
            Kind::Output => "output layer",
        }
    }
}

use Kind::{Block, Embedders, Output};

const EVERY: &[Kind] = &Kind::ALL;

/// One activation tensor: `[rows, cols]` f32 and the kinds of block it is live in.
#[derive(Debug, Clone, Copy)]
struct Tensor {
    rows: usize,
    cols: usize,
    live: &'static [Kind],
}

fn tensor(rows: usize, cols: usize, live: &'static [Kind]) -> Tensor {
    Tensor { rows, cols, live }
}

/// Every tensor of a step over `tokens` video tokens and `text` text tokens (and the
/// negative prompt's pass when `guided`), in `step::Acts`' field order.
fn tensors(config: &WanConfig, tokens: usize, text: usize, guided: bool) -> Vec<Tensor> {
    let (dim, rows) = (config.dim(), tokens.max(text));
    let mut tensors = vec![
        tensor(rows, config.patch_in(), &[Embedders]), // patches
        tensor(text, config.text_dim, &[Embedders]),   // context
        tensor(1, config.freq_dim, &[Embedders]),      // frequencies
        tensor(1, dim, &[Embedders, Output]),          // temb
        tensor(1, dim, &[Embedders]),                  // temb_silu
    ];
    // The blocks' modulation from the time embedding, six vectors.
    tensors.extend([tensor(1, dim, &[Embedders, Block]); 6]);
    tensors.push(tensor(text, dim, &[Embedders, Block])); // text: projected states
    tensors.extend([tensor(text, dim, &[Embedders, Block]); 2]); // text_a, text_b
    tensors.extend([tensor(1, dim, &[Block, Output]); 6]); // mods
    tensors.extend([
        tensor(rows, dim, EVERY),            // x
        tensor(rows, dim, &[Block, Output]), // normed
    ]);
    tensors.extend([tensor(rows, dim, &[Block]); 5]); // q, k, v, attn, proj
    tensors.extend([
        tensor(rows, config.ffn_dim, &[Block]),      // hidden
        tensor(rows, config.patch_out(), &[Output]), // out
        tensor(rows, config.head_dim, &[Block]),     // table
    ]);
    if guided {
        tensors.extend([
            tensor(rows, dim, EVERY),                    // the negative pass's x
            tensor(text, dim, &[Embedders, Block]),      // its text
            tensor(text, config.text_dim, &[Embedders]), // its context
        ]);
    }
    tensors
}

/// The shapes of every tensor of a step, in allocation order.
pub fn shapes(config: &WanConfig, tokens: usize, text: usize, guided: bool) -> Vec<(usize, usize)> {
    tensors(config, tokens, text, guided)
        .iter()
        .map(|tensor| (tensor.rows, tensor.cols))
        .collect()
}

/// What a step of a model of `config` over `tokens` video and `text` text tokens
/// (`guided`: with the negative prompt's pass) reserves, and each kind of block's
/// working set.
pub fn activations_at(config: &WanConfig, tokens: usize, text: usize, guided: bool) -> Activations {
    let tensors = tensors(config, tokens, text, guided);
    let bytes = |tensor: &Tensor| (tensor.rows * tensor.cols * 4) as u64;
    let peaks = Kind::ALL
        .into_iter()
        .map(|kind| BlockKindPeak {
            kind: kind.describe().to_string(),
            blocks: match kind {
                Kind::Block => config.layers as u64,
                Kind::Embedders | Kind::Output => 1,
            },
            bytes: tensors
                .iter()
                .filter(|tensor| tensor.live.contains(&kind))
                .map(bytes)
                .sum(),
        })
        .collect();
    Activations {
        reserved_bytes: tensors.iter().map(bytes).sum(),
        peaks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::wan::WanPreset;

    #[test]
    fn each_kind_holds_the_tensors_it_uses_at_a14b_sizes() {
        // Proves the working sets of a Wan 2.2 A14B expert at 81 frames of 480 × 832
        // (32 760 video tokens) with 512 umT5 tokens, summed by hand from what each
        // kind of block reads and writes, and that the step reserves every tensor once.
        let config = WanPreset::A14b.config();
        let (tokens, text) = (32_760u64, 512u64);
        let (dim, ffn) = (5120u64, 13_824u64);
        let f32s = |rows: u64, cols: u64| rows * cols * 4;
        let vector = f32s(1, dim);
        let text_states = 3 * f32s(text, dim);
        let embedders = f32s(tokens, 64)
            + f32s(text, 4096)
            + f32s(1, 256)
            + 2 * vector
            + 6 * vector
            + text_states
            + f32s(tokens, dim);
        let block = 6 * vector
            + text_states
            + 6 * vector
            + 7 * f32s(tokens, dim)
            + f32s(tokens, ffn)
            + f32s(tokens, 128);
        let output = vector + 6 * vector + 2 * f32s(tokens, dim) + f32s(tokens, 64);
        let activations = activations_at(&config, tokens as usize, text as usize, false);
        let peaks: Vec<(&str, u64, u64)> = activations
            .peaks
            .iter()
            .map(|peak| (peak.kind.as_str(), peak.blocks, peak.bytes))
            .collect();
        assert_eq!(
            peaks,
            [
                ("embedders", 1, embedders),
                ("transformer block", 40, block),
                ("output layer", 1, output)
            ]
        );
        let reserved = f32s(tokens, 64) * 2
            + f32s(text, 4096)
            + f32s(1, 256)
            + 14 * vector
            + text_states
            + 7 * f32s(tokens, dim)
            + f32s(tokens, ffn)
            + f32s(tokens, 128);
        assert_eq!(activations.reserved_bytes, reserved);
        // Guidance adds the negative pass's residual stream, projected text and states.
        let guided = activations_at(&config, tokens as usize, text as usize, true);
        let extra = f32s(tokens, dim) + f32s(text, dim) + f32s(text, 4096);
        assert_eq!(guided.reserved_bytes, reserved + extra);
        assert_eq!(
            guided.peaks[1].bytes,
            block + f32s(tokens, dim) + f32s(text, dim)
        );
    }
}

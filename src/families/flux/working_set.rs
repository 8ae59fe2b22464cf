//! The activation tensors of a Flux step, in the order the step allocates them, each
//! with the kinds of block it is live in: the one list the step's state is allocated
//! from ([`shapes`]), its reservation is summed from, and each kind's working set is
//! summed from ([`activations`]).
//!
//! A tensor is live in a block when the block reads or writes it, or when it holds a
//! value a later block reads: the conditioning and the rope table are written once a
//! run and read every step; `silu(vec)` from the embedders to the final layer; the
//! streams' states from the embedders to the last double block; the joint state from
//! there to the final layer. Rope is applied in place on interleaved pairs, q before
//! k, so it adds no tensor (ComfyUI's rope makes a copy of q, then of k); attention
//! keeps one tile of scores a thread, and the kernels' own scratch (a transposed key
//! head a thread, a LoRA's `x·Aᵀ`) is not counted.

use crate::families::{Activations, BlockKindPeak};

use super::config::FluxConfig;
use super::embed::TIME_FREQUENCIES;
use super::Flux;

/// A kind of block of a Flux step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Embedders,
    Double,
    Single,
    Final,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Embedders, Kind::Double, Kind::Single, Kind::Final];

    pub fn describe(self) -> &'static str {
        match self {
            Kind::Embedders => "embedders",
            Kind::Double => "double block",
            Kind::Single => "single block",
            Kind::Final => "final layer",
        }
    }
}

use Kind::{Double, Embedders, Final, Single};

/// Live in every block.
const EVERY: &[Kind] = &Kind::ALL;

/// One activation tensor: `[rows, cols]` f32 and the kinds of block it is live in.
#[derive(Debug, Clone, Copy)]
pub struct Tensor {
    pub rows: usize,
    pub cols: usize,
    pub live: &'static [Kind],
}

impl Tensor {
    fn bytes(&self) -> u64 {
        (self.rows * self.cols * 4) as u64
    }
}

fn tensor(rows: usize, cols: usize, live: &'static [Kind]) -> Tensor {
    Tensor { rows, cols, live }
}

/// Every tensor of a step over `text` and `image` tokens, in allocation order: the
/// step's own (see `step::Acts`), then the image stream's and the text stream's (see
/// `layers::StreamActs`).
fn tensors(config: &FluxConfig, text: usize, image: usize) -> Vec<Tensor> {
    let (hidden, mlp) = (config.hidden(), config.mlp);
    let rows = text + image;
    let mut tensors = vec![
        tensor(image, config.in_channels, &[Embedders]), // latent
        tensor(text, config.context_dim, EVERY),         // context
        tensor(1, config.pooled_dim, EVERY),             // pooled
        tensor(1, TIME_FREQUENCIES, &[Embedders]),       // frequencies
        tensor(1, hidden, &[Embedders]),                 // embed_hidden
        tensor(1, hidden, &[Embedders]),                 // embed_out
        tensor(1, hidden, EVERY),                        // vec: silu(vec)
    ];
    // q, k, v and attention over both streams.
    tensors.extend([tensor(rows, hidden, &[Double, Single]); 4]);
    tensors.extend([
        tensor(rows, hidden, &[Single, Final]),      // joint
        tensor(rows, hidden, &[Single]),             // joint_normed
        tensor(rows, mlp, &[Single]),                // joint_hidden
        tensor(rows, hidden + mlp, &[Single]),       // concat
        tensor(rows, hidden, &[Single]),             // joint_out
        tensor(image, config.in_channels, &[Final]), // out: the velocity
        tensor(rows, config.head_dim, EVERY),        // table
        tensor(1, 1, EVERY),                         // scratch
    ]);
    tensors.extend(stream(image, config, Stream::Image));
    tensors.extend(stream(text, config, Stream::Text));
    tensors
}

/// Which stream of a double block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    /// The image stream, whose state and first modulations the single blocks and
    /// the final layer use too.
    Image,
    Text,
}

/// A stream's tensors in `StreamActs`' field order.
fn stream(rows: usize, config: &FluxConfig, which: Stream) -> Vec<Tensor> {
    let hidden = config.hidden();
    let image = which == Stream::Image;
    let pick = |image_live: &'static [Kind], text_live: &'static [Kind]| match image {
        true => image_live,
        false => text_live,
    };
    let mut tensors = vec![
        // x: the stream's state, from the embedders on; the final layer's input.
        tensor(
            rows,
            hidden,
            pick(&[Embedders, Double, Final], &[Embedders, Double]),
        ),
        // normed: the final layer's adaLN too.
        tensor(rows, hidden, pick(&[Double, Final], &[Double])),
    ];
    // q, k, v, attention, the projection's output.
    tensors.extend([tensor(rows, hidden, &[Double]); 5]);
    tensors.push(tensor(rows, config.mlp, &[Double])); // the MLP's hidden state
                                                       // shift, scale, gate of the attention (a single block's and the final layer's
                                                       // modulations too); shift, scale, gate of the MLP.
    let first_two = pick(&[Double, Single, Final], &[Double]);
    tensors.extend([tensor(1, hidden, first_two); 2]);
    tensors.push(tensor(1, hidden, pick(&[Double, Single], &[Double])));
    tensors.extend([tensor(1, hidden, &[Double]); 3]);
    tensors
}

/// The shapes of every tensor of a step, in allocation order.
pub fn shapes(flux: &Flux) -> Vec<(usize, usize)> {
    tensors(&flux.config, flux.text_tokens(), flux.image_tokens())
        .iter()
        .map(|tensor| (tensor.rows, tensor.cols))
        .collect()
}

/// What a step reserves, and each kind of block's working set.
pub fn activations(flux: &Flux) -> Activations {
    activations_at(&flux.config, flux.text_tokens(), flux.image_tokens())
}

/// What a step of a model of `config` over `text` and `image` tokens reserves, and
/// each kind of block's working set (a description's step, without the weights).
pub fn activations_at(config: &FluxConfig, text: usize, image: usize) -> Activations {
    let tensors = tensors(config, text, image);
    let blocks = |kind: Kind| match kind {
        Kind::Double => config.double_blocks as u64,
        Kind::Single => config.single_blocks as u64,
        Kind::Embedders | Kind::Final => 1,
    };
    let peaks = Kind::ALL
        .into_iter()
        .map(|kind| BlockKindPeak {
            kind: kind.describe().to_string(),
            blocks: blocks(kind),
            bytes: tensors
                .iter()
                .filter(|tensor| tensor.live.contains(&kind))
                .map(Tensor::bytes)
                .sum(),
        })
        .collect();
    Activations {
        reserved_bytes: tensors.iter().map(Tensor::bytes).sum(),
        peaks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_holds_the_tensors_it_uses_at_flux_dev_sizes() {
        // Proves the working sets of Flux.1-dev at 1024² with 512 T5 tokens, summed by
        // hand from what each kind of block reads and writes, and that the step
        // reserves every tensor once.
        let config = FluxConfig {
            in_channels: 64,
            double_blocks: 19,
            single_blocks: 38,
            heads: 24,
            head_dim: 128,
            context_dim: 4096,
            pooled_dim: 768,
            guidance: true,
            axes: vec![16, 56, 56],
            mlp: 12288,
        };
        let (text, image) = (512u64, 4096u64);
        let (hidden, mlp, rows) = (3072u64, 12288u64, text + image);
        let f32s = |rows: u64, cols: u64| rows * cols * 4;
        let vector = f32s(1, hidden);
        // Live in every block: the conditioning, silu(vec), the rope table, scratch.
        let every = f32s(text, 4096) + f32s(1, 768) + vector + f32s(rows, 128) + 4;
        let stream = |tokens: u64| 7 * f32s(tokens, hidden) + f32s(tokens, mlp) + 6 * vector;
        let joint_qkv = 4 * f32s(rows, hidden);
        let embedders = every
            + f32s(image, 64)
            + f32s(1, 256)
            + 2 * vector
            + f32s(image, hidden)
            + f32s(text, hidden);
        let double = every + stream(image) + stream(text) + joint_qkv;
        let single = every
            + 3 * vector
            + joint_qkv
            + 3 * f32s(rows, hidden)
            + f32s(rows, mlp)
            + f32s(rows, hidden + mlp);
        let last =
            every + f32s(rows, hidden) + 2 * f32s(image, hidden) + 2 * vector + f32s(image, 64);
        let activations = activations_at(&config, text as usize, image as usize);
        let peaks: Vec<(&str, u64, u64)> = activations
            .peaks
            .iter()
            .map(|peak| (peak.kind.as_str(), peak.blocks, peak.bytes))
            .collect();
        assert_eq!(
            peaks,
            [
                ("embedders", 1, embedders),
                ("double block", 19, double),
                ("single block", 38, single),
                ("final layer", 1, last)
            ]
        );
        let own = f32s(image, 64)
            + f32s(1, 256)
            + 2 * vector
            + joint_qkv
            + 3 * f32s(rows, hidden)
            + f32s(rows, mlp)
            + f32s(rows, hidden + mlp)
            + f32s(image, 64);
        let reserved = every + own + stream(image) + stream(text);
        assert_eq!(activations.reserved_bytes, reserved);
    }
}

//! Generated LoRA adapters for generated Flux transformers, in kohya's naming (the
//! fused original weights: `lora_unet_double_blocks_0_img_attn_qkv`) or diffusers/PEFT
//! naming (`transformer.transformer_blocks.0.attn.to_q`, the unfused pieces).
//!
//! Both namings of one seed are the same update: the factors are drawn per original
//! module, and the PEFT adapter writes each of its diffusers pieces with that
//! module's `A` and its rows of `B` (for `norm_out.linear`, whose halves diffusers
//! stores as scale then shift, `B`'s halves swapped). [`write_flux_lora_own_down`]
//! instead gives every PEFT piece its own `A`, as a trainer of the diffusers model
//! does; no kohya adapter equals that one.

use std::path::Path;

use super::demo::FluxShape;
use super::embed::gaussian;
use crate::lora::LoraDtype;

/// How a generated adapter names its modules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FluxLoraNaming {
    Kohya,
    Peft,
}

/// Packed latent channels, `img_in`'s input.
const IN_CHANNELS: usize = 64;

/// One module of the original layout an adapter patches: its stem, `[out, in]`, and
/// its diffusers pieces with their output rows in the original row order.
struct Module {
    stem: String,
    input: usize,
    pieces: Vec<(String, usize)>,
    /// diffusers stores the two halves of the rows swapped (`norm_out.linear`).
    swapped: bool,
}

impl Module {
    fn out(&self) -> usize {
        self.pieces.iter().map(|(_, rows)| rows).sum()
    }
}

/// The modules the demo adapter patches on a model of `shape`: the fused attention
/// weights and `linear1` (every piece), modulations (the final one too), an MLP, a
/// projection and the image embedder, in the first and last blocks of each kind.
fn modules(shape: &FluxShape) -> Vec<Module> {
    let (hidden, mlp) = (shape.hidden(), 4 * shape.hidden());
    let (last_double, last_single) = (shape.double_blocks - 1, shape.single_blocks - 1);
    let module = |stem: String, input: usize, pieces: Vec<(String, usize)>| Module {
        stem,
        input,
        pieces,
        swapped: false,
    };
    let split = |at: String, names: &[&str], rows: &[usize]| -> Vec<(String, usize)> {
        names
            .iter()
            .zip(rows)
            .map(|(name, rows)| (format!("{at}.{name}"), *rows))
            .collect()
    };
    let thirds = [hidden; 3];
    let double = |block: usize| format!("transformer_blocks.{block}");
    let single = |block: usize| format!("single_transformer_blocks.{block}");
    vec![
        module(
            "img_in".into(),
            IN_CHANNELS,
            vec![("x_embedder".into(), hidden)],
        ),
        module(
            "double_blocks.0.img_attn.qkv".into(),
            hidden,
            split(
                format!("{}.attn", double(0)),
                &["to_q", "to_k", "to_v"],
                &thirds,
            ),
        ),
        module(
            "double_blocks.0.txt_attn.qkv".into(),
            hidden,
            split(
                format!("{}.attn", double(0)),
                &["add_q_proj", "add_k_proj", "add_v_proj"],
                &thirds,
            ),
        ),
        module(
            "double_blocks.0.img_attn.proj".into(),
            hidden,
            vec![(format!("{}.attn.to_out.0", double(0)), hidden)],
        ),
        module(
            format!("double_blocks.{last_double}.img_mod.lin"),
            hidden,
            vec![(format!("{}.norm1.linear", double(last_double)), 6 * hidden)],
        ),
        module(
            format!("double_blocks.{last_double}.txt_mlp.0"),
            hidden,
            vec![(
                format!("{}.ff_context.net.0.proj", double(last_double)),
                mlp,
            )],
        ),
        module(
            "single_blocks.0.linear1".into(),
            hidden,
            split(
                single(0),
                &["attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"],
                &[hidden, hidden, hidden, mlp],
            ),
        ),
        module(
            "single_blocks.0.modulation.lin".into(),
            hidden,
            vec![(format!("{}.norm.linear", single(0)), 3 * hidden)],
        ),
        module(
            format!("single_blocks.{last_single}.linear2"),
            hidden + mlp,
            vec![(format!("{}.proj_out", single(last_single)), hidden)],
        ),
        Module {
            swapped: true,
            ..module(
                "final_layer.adaLN_modulation.1".into(),
                hidden,
                vec![("norm_out.linear".into(), 2 * hidden)],
            )
        },
    ]
}

/// The modules an adapter of `naming` patches on a model of `shape`, with the
/// `[out, in]` of their factors' product.
pub fn lora_modules(shape: &FluxShape, naming: FluxLoraNaming) -> Vec<(String, usize, usize)> {
    modules(shape)
        .into_iter()
        .flat_map(|module| match naming {
            FluxLoraNaming::Kohya => vec![(kohya_name(&module.stem), module.out(), module.input)],
            FluxLoraNaming::Peft => module
                .pieces
                .iter()
                .map(|(piece, rows)| (peft_name(piece), *rows, module.input))
                .collect(),
        })
        .collect()
}

fn kohya_name(stem: &str) -> String {
    format!("lora_unet_{}", stem.replace('.', "_"))
}

fn peft_name(piece: &str) -> String {
    format!("transformer.{piece}")
}

/// Writes a rank-`rank` adapter (F32 factors, alpha = rank / 2) with seeded factors;
/// the kohya and PEFT adapters of one seed are the same update.
pub fn write_flux_lora(
    path: &Path,
    shape: &FluxShape,
    naming: FluxLoraNaming,
    rank: usize,
    seed: u64,
) -> std::io::Result<()> {
    write_flux_lora_in(path, shape, naming, rank, seed, LoraDtype::F32).map(|_| ())
}

/// [`write_flux_lora`] with the factors (and alphas) stored as `dtype`: the same
/// seeded values rounded to nearest. Returns the bytes written.
pub fn write_flux_lora_in(
    path: &Path,
    shape: &FluxShape,
    naming: FluxLoraNaming,
    rank: usize,
    seed: u64,
    dtype: LoraDtype,
) -> std::io::Result<u64> {
    write(path, shape, naming, (rank, dtype), seed, Down::Shared)
}

/// Writes a rank-`rank` PEFT adapter whose pieces of a fused weight each have their
/// own seeded `A`.
pub fn write_flux_lora_own_down(
    path: &Path,
    shape: &FluxShape,
    rank: usize,
    seed: u64,
) -> std::io::Result<()> {
    write(
        path,
        shape,
        FluxLoraNaming::Peft,
        (rank, LoraDtype::F32),
        seed,
        Down::PerPiece,
    )
    .map(|_| ())
}

/// Whether a fused weight's PEFT pieces share its `A`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Down {
    Shared,
    PerPiece,
}

/// Factors of one module: `A` `[rank, in]` then `B` `[out, rank]`, row-major.
fn factors(rank: usize, out: usize, input: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let a_scale = 1.0 / (input as f32).sqrt();
    let a = gaussian(rank * input, seed)
        .iter()
        .map(|v| v * a_scale)
        .collect();
    let b = gaussian(out * rank, seed.wrapping_add(1))
        .iter()
        .map(|v| v * 0.05)
        .collect();
    (a, b)
}

/// A tensor to write: name, shape, values.
type Tensor = (String, Vec<usize>, Vec<f32>);

fn write(
    path: &Path,
    shape: &FluxShape,
    naming: FluxLoraNaming,
    (rank, dtype): (usize, LoraDtype),
    seed: u64,
    down: Down,
) -> std::io::Result<u64> {
    let mut tensors: Vec<Tensor> = Vec::new();
    let alpha = vec![rank as f32 / 2.0];
    for (number, module) in modules(shape).iter().enumerate() {
        let seed = seed.wrapping_add(number as u64 * 2);
        let (a, b) = factors(rank, module.out(), module.input, seed);
        if naming == FluxLoraNaming::Kohya {
            let name = kohya_name(&module.stem);
            tensors.push((
                format!("{name}.lora_down.weight"),
                vec![rank, module.input],
                a,
            ));
            tensors.push((
                format!("{name}.lora_up.weight"),
                vec![module.out(), rank],
                b,
            ));
            tensors.push((format!("{name}.alpha"), vec![], alpha.clone()));
            continue;
        }
        let b = if module.swapped {
            let half = b.len() / 2;
            [&b[half..], &b[..half]].concat()
        } else {
            b
        };
        let mut first = 0;
        for (piece_number, (piece, rows)) in module.pieces.iter().enumerate() {
            let a = match down {
                Down::Shared => a.clone(),
                // Seeds far from the modules' own (two a module).
                Down::PerPiece => {
                    let seed = seed.wrapping_add(1 << 20).wrapping_add(piece_number as u64);
                    factors(rank, 0, module.input, seed).0
                }
            };
            let name = peft_name(piece);
            let b = b[first * rank..(first + rows) * rank].to_vec();
            tensors.push((format!("{name}.lora_A.weight"), vec![rank, module.input], a));
            tensors.push((format!("{name}.lora_B.weight"), vec![*rows, rank], b));
            tensors.push((format!("{name}.alpha"), vec![], alpha.clone()));
            first += rows;
        }
    }
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(name, shape, values)| {
            let data = dtype.encode(&values);
            (name, shape, data)
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(name, shape, data)| {
            safetensors::tensor::TensorView::new(dtype.safetensors(), shape.clone(), data)
                .map(|view| (name.clone(), view))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(std::io::Error::other)?;
    let file = safetensors::serialize(views, None).map_err(std::io::Error::other)?;
    crate::os::write_atomically(path, |mut out| std::io::Write::write_all(&mut out, &file))?;
    Ok(file.len() as u64)
}

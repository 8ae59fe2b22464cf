//! Adapters named for the other Flux layout: a PEFT/diffusers-named adapter
//! (`transformer_blocks.0.attn.to_q`) on an original or ComfyUI checkpoint, and a
//! kohya/original-named one (`double_blocks.0.img_attn.qkv`) on a diffusers folder, as
//! ComfyUI maps diffusers LoRA keys onto its original-layout models (`comfy/lora.py`,
//! `comfy/utils.py` `flux_to_diffusers`: a key and the row slice of the fused weight
//! it patches).
//!
//! Every linear has one row space, the original layout's; each layout splits it into
//! its pieces (one for a linear neither splits). A module of the other layout covers
//! a run of those rows, and lands on each of this checkpoint's pieces it overlaps: a
//! diffusers `attn.to_v` on the rows `[2h, 3h)` of an original `img_attn.qkv`, a
//! single block's `proj_mlp` on `linear1`'s rows from `3h`; an original qkv on
//! diffusers' `to_q`, `to_k`, `to_v`, each taking its third of `B`. The final
//! modulation is the one weight the two layouts store in another row order (diffusers'
//! `norm_out.linear` holds scale before shift): its halves of `B` swap.

use crate::lora::{AliasPiece, LoraAlias};

use super::names::{Layout, Names};
use super::weights::LinearName;

/// The final modulation, whose shift and scale halves diffusers stores swapped.
const FINAL_MODULATION: &str = "final_layer.adaLN_modulation.1";

/// The other layout's modules of every linear of a checkpoint named by `names`.
pub fn aliases(names: Names, linears: &[LinearName]) -> Vec<LoraAlias> {
    let other = Names {
        layout: match names.layout {
            Layout::Diffusers => Layout::Original,
            Layout::Original | Layout::ComfyUi => Layout::Diffusers,
        },
    };
    linears
        .iter()
        .flat_map(|linear| {
            let own = runs(names.pieces(&linear.stem), &linear.parts);
            let theirs = runs(other.pieces(&linear.stem), &linear.parts);
            let swapped = linear.stem == FINAL_MODULATION;
            theirs
                .into_iter()
                .map(move |(module, rows)| alias(module, rows, &own, swapped))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Each piece's stem with the run of original rows it holds.
fn runs(stems: Vec<String>, parts: &[usize]) -> Vec<(String, std::ops::Range<usize>)> {
    let rows: Vec<usize> = match stems.len() {
        1 => vec![parts.iter().sum()],
        _ => parts.to_vec(),
    };
    let mut first = 0;
    stems
        .into_iter()
        .zip(rows)
        .map(|(stem, rows)| {
            let run = first..first + rows;
            first += rows;
            (stem, run)
        })
        .collect()
}

/// The module `module` of the other layout, holding original rows `rows`, on this
/// checkpoint's pieces `own`.
fn alias(
    module: String,
    rows: std::ops::Range<usize>,
    own: &[(String, std::ops::Range<usize>)],
    swapped: bool,
) -> LoraAlias {
    if swapped {
        // One tensor in both layouts; B's first half lands on the weight's second.
        let (tensor, _) = &own[0];
        let half = rows.len() / 2;
        let piece = |b_first, first_row| AliasPiece {
            tensor: format!("{tensor}.weight"),
            b_first,
            first_row,
            rows: half,
        };
        return LoraAlias {
            module,
            pieces: vec![piece(0, half), piece(half, 0)],
        };
    }
    let pieces = own
        .iter()
        .filter_map(|(tensor, held)| {
            let first = rows.start.max(held.start);
            let end = rows.end.min(held.end);
            (first < end).then(|| AliasPiece {
                tensor: format!("{tensor}.weight"),
                b_first: first - rows.start,
                first_row: first - held.start,
                rows: end - first,
            })
        })
        .collect();
    LoraAlias { module, pieces }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linear(stem: &str, parts: &[usize]) -> LinearName {
        LinearName {
            stem: stem.into(),
            parts: parts.to_vec(),
        }
    }

    fn piece(tensor: &str, b_first: usize, first_row: usize, rows: usize) -> AliasPiece {
        AliasPiece {
            tensor: tensor.into(),
            b_first,
            first_row,
            rows,
        }
    }

    #[test]
    fn diffusers_pieces_land_on_their_rows_of_the_fused_weights() {
        // Proves the slices ComfyUI's flux_to_diffusers gives (to_q/k/v thirds of
        // qkv, proj_mlp after them in linear1) under the ComfyUI prefix, and the final
        // modulation's swapped halves.
        let names = Names {
            layout: Layout::ComfyUi,
        };
        let linears = [
            linear("double_blocks.0.img_attn.qkv", &[8, 8, 8]),
            linear("single_blocks.1.linear1", &[8, 8, 8, 32]),
            linear("single_blocks.1.linear2", &[8]),
            linear(FINAL_MODULATION, &[16]),
        ];
        let aliases = aliases(names, &linears);
        let find = |module: &str| {
            aliases
                .iter()
                .find(|alias| alias.module == module)
                .map(|alias| alias.pieces.clone())
                .unwrap_or_else(|| panic!("no alias {module}"))
        };
        let qkv = "model.diffusion_model.double_blocks.0.img_attn.qkv.weight";
        assert_eq!(
            find("transformer_blocks.0.attn.to_k"),
            [piece(qkv, 0, 8, 8)]
        );
        let linear1 = "model.diffusion_model.single_blocks.1.linear1.weight";
        assert_eq!(
            find("single_transformer_blocks.1.proj_mlp"),
            [piece(linear1, 0, 24, 32)]
        );
        assert_eq!(
            find("single_transformer_blocks.1.proj_out"),
            [piece(
                "model.diffusion_model.single_blocks.1.linear2.weight",
                0,
                0,
                8
            )]
        );
        let modulation = "model.diffusion_model.final_layer.adaLN_modulation.1.weight";
        assert_eq!(
            find("norm_out.linear"),
            [piece(modulation, 0, 8, 8), piece(modulation, 8, 0, 8)]
        );
    }

    #[test]
    fn a_fused_original_weight_splits_its_rows_across_diffusers_pieces() {
        // Proves a kohya qkv or linear1 on a diffusers folder gives each piece its run
        // of B, and renames an unfused linear whole.
        let names = Names {
            layout: Layout::Diffusers,
        };
        let linears = [
            linear("double_blocks.2.txt_attn.qkv", &[8, 8, 8]),
            linear("single_blocks.0.linear1", &[8, 8, 8, 32]),
            linear("double_blocks.2.img_mod.lin", &[48]),
        ];
        let aliases = aliases(names, &linears);
        assert_eq!(aliases.len(), 3);
        let at = "transformer_blocks.2.attn";
        assert_eq!(aliases[0].module, "double_blocks.2.txt_attn.qkv");
        assert_eq!(
            aliases[0].pieces,
            [
                piece(&format!("{at}.add_q_proj.weight"), 0, 0, 8),
                piece(&format!("{at}.add_k_proj.weight"), 8, 0, 8),
                piece(&format!("{at}.add_v_proj.weight"), 16, 0, 8),
            ]
        );
        assert_eq!(aliases[1].b_rows(), 56);
        assert_eq!(
            aliases[1].pieces[3],
            piece("single_transformer_blocks.0.proj_mlp.weight", 24, 0, 32)
        );
        assert_eq!(
            aliases[2].pieces,
            [piece("transformer_blocks.2.norm1.linear.weight", 0, 0, 48)]
        );
    }
}

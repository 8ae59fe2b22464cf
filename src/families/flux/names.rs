//! The three ways Flux checkpoints name their tensors, behind one vocabulary: the
//! family asks for the original (Black Forest Labs) names, and [`Names`] answers with
//! the checkpoint's own.
//!
//! - original: `double_blocks.N.img_attn.qkv.weight`, `single_blocks.N.linear1`, …
//! - ComfyUI single files: the same under `model.diffusion_model.`;
//! - diffusers (`FluxTransformer2DModel`): `transformer_blocks.N.attn.to_q`, …, where a
//!   fused original weight (a block's qkv, a single block's `linear1`) is several
//!   tensors, its *pieces*, stacked by output rows in this order; and `norm_out.linear`
//!   stores the final modulation's scale half before its shift half.

use crate::model::ModelIndex;

/// How the checkpoint names its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Layout {
    /// Black Forest Labs' names (`double_blocks.N.img_attn.qkv`), one file.
    Original,
    /// The original names under `model.diffusion_model.`, one file (with a VAE tensor).
    #[cfg_attr(feature = "cli", value(name = "comfyui"))]
    ComfyUi,
    /// diffusers' `transformer/` folder (`config.json`, `transformer_blocks.N.attn.to_q`).
    Diffusers,
}

impl Layout {
    pub fn describe(self) -> &'static str {
        match self {
            Layout::Original => "original",
            Layout::ComfyUi => "comfyui",
            Layout::Diffusers => "diffusers",
        }
    }
}

/// The ComfyUI prefix of a diffusion model inside a single-file checkpoint.
pub const COMFY_PREFIX: &str = "model.diffusion_model.";

#[derive(Debug, Clone, Copy)]
pub struct Names {
    pub layout: Layout,
}

impl Names {
    /// The layout `index` is in, if it looks like a Flux transformer at all.
    pub fn detect(index: &ModelIndex) -> Option<Self> {
        let layout = if index.tensor("x_embedder.weight").is_some()
            && index.tensor("context_embedder.weight").is_some()
        {
            Layout::Diffusers
        } else if has_original(index, "") {
            Layout::Original
        } else if has_original(index, COMFY_PREFIX) {
            Layout::ComfyUi
        } else {
            return None;
        };
        Some(Self { layout })
    }

    /// The checkpoint's name of a tensor of the original layout that is one tensor in
    /// every layout (biases and weights of unfused linears, norm scales).
    pub fn full(&self, original: &str) -> String {
        match self.layout {
            Layout::Original => original.to_string(),
            Layout::ComfyUi => format!("{COMFY_PREFIX}{original}"),
            Layout::Diffusers => diffusers_name(original),
        }
    }

    /// The stems (names without `.weight`/`.bias`) of the tensors that make up the
    /// original linear `stem`, stacked by output rows.
    pub fn pieces(&self, stem: &str) -> Vec<String> {
        if self.layout != Layout::Diffusers {
            return vec![self.full(stem)];
        }
        let Some((block, rest)) = split_block(stem) else {
            return vec![diffusers_name(stem)];
        };
        let (kind, number) = block;
        let fused: Option<&[&str]> = match (kind, rest) {
            ("double_blocks", "img_attn.qkv") => Some(&["attn.to_q", "attn.to_k", "attn.to_v"]),
            ("double_blocks", "txt_attn.qkv") => {
                Some(&["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"])
            }
            ("single_blocks", "linear1") => {
                Some(&["attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"])
            }
            _ => None,
        };
        match fused {
            Some(pieces) => pieces
                .iter()
                .map(|piece| format!("{}.{number}.{piece}", diffusers_block(kind)))
                .collect(),
            None => vec![diffusers_name(stem)],
        }
    }

    /// Whether the final modulation stores scale before shift (diffusers).
    pub fn scale_first(&self) -> bool {
        self.layout == Layout::Diffusers
    }

    /// Numbered blocks of a kind (`double_blocks` or `single_blocks`, original names)
    /// in the checkpoint: one more than the largest number found.
    pub fn count(&self, index: &ModelIndex, kind: &str) -> usize {
        let prefix = match self.layout {
            Layout::Original => format!("{kind}."),
            Layout::ComfyUi => format!("{COMFY_PREFIX}{kind}."),
            Layout::Diffusers => format!("{}.", diffusers_block(kind)),
        };
        index
            .tensors
            .iter()
            .filter_map(|tensor| {
                let rest = tensor.name.strip_prefix(&prefix)?;
                rest.split('.').next()?.parse::<usize>().ok()
            })
            .max()
            .map_or(0, |largest| largest + 1)
    }
}

/// The embedders and a double block's qkv under `prefix`: a Flux transformer.
fn has_original(index: &ModelIndex, prefix: &str) -> bool {
    [
        "img_in.weight",
        "txt_in.weight",
        "double_blocks.0.img_attn.qkv.weight",
    ]
    .iter()
    .all(|name| index.tensor(&format!("{prefix}{name}")).is_some())
}

fn diffusers_block(kind: &str) -> &'static str {
    if kind == "double_blocks" {
        "transformer_blocks"
    } else {
        "single_transformer_blocks"
    }
}

/// `double_blocks.3.img_mod.lin` → `(("double_blocks", "3"), "img_mod.lin")`.
fn split_block(name: &str) -> Option<((&str, &str), &str)> {
    let (kind, rest) = name.split_once('.')?;
    if kind != "double_blocks" && kind != "single_blocks" {
        return None;
    }
    let (number, rest) = rest.split_once('.')?;
    Some(((kind, number), rest))
}

/// Original names of the unfused tensors → diffusers', as diffusers'
/// `convert_flux_transformer_checkpoint_to_diffusers` maps them.
const HEAD: &[(&str, &str)] = &[
    ("img_in", "x_embedder"),
    ("txt_in", "context_embedder"),
    (
        "time_in.in_layer",
        "time_text_embed.timestep_embedder.linear_1",
    ),
    (
        "time_in.out_layer",
        "time_text_embed.timestep_embedder.linear_2",
    ),
    (
        "vector_in.in_layer",
        "time_text_embed.text_embedder.linear_1",
    ),
    (
        "vector_in.out_layer",
        "time_text_embed.text_embedder.linear_2",
    ),
    (
        "guidance_in.in_layer",
        "time_text_embed.guidance_embedder.linear_1",
    ),
    (
        "guidance_in.out_layer",
        "time_text_embed.guidance_embedder.linear_2",
    ),
    ("final_layer.adaLN_modulation.1", "norm_out.linear"),
    ("final_layer.linear", "proj_out"),
];

const DOUBLE: &[(&str, &str)] = &[
    ("img_mod.lin", "norm1.linear"),
    ("txt_mod.lin", "norm1_context.linear"),
    ("img_attn.norm.query_norm.scale", "attn.norm_q.weight"),
    ("img_attn.norm.key_norm.scale", "attn.norm_k.weight"),
    ("txt_attn.norm.query_norm.scale", "attn.norm_added_q.weight"),
    ("txt_attn.norm.key_norm.scale", "attn.norm_added_k.weight"),
    ("img_attn.proj", "attn.to_out.0"),
    ("txt_attn.proj", "attn.to_add_out"),
    ("img_mlp.0", "ff.net.0.proj"),
    ("img_mlp.2", "ff.net.2"),
    ("txt_mlp.0", "ff_context.net.0.proj"),
    ("txt_mlp.2", "ff_context.net.2"),
];

const SINGLE: &[(&str, &str)] = &[
    ("modulation.lin", "norm.linear"),
    ("norm.query_norm.scale", "attn.norm_q.weight"),
    ("norm.key_norm.scale", "attn.norm_k.weight"),
    ("linear2", "proj_out"),
];

/// Maps `table`'s stems, keeping a `.weight`/`.bias` suffix.
fn mapped(table: &[(&str, &str)], name: &str) -> Option<String> {
    table.iter().find_map(|(original, diffusers)| {
        if name == *original {
            return Some(diffusers.to_string());
        }
        let suffix = name.strip_prefix(original)?.strip_prefix('.')?;
        Some(format!("{diffusers}.{suffix}"))
    })
}

fn diffusers_name(original: &str) -> String {
    match split_block(original) {
        Some(((kind, number), rest)) => {
            let table = if kind == "double_blocks" {
                DOUBLE
            } else {
                SINGLE
            };
            let rest = mapped(table, rest).unwrap_or_else(|| rest.to_string());
            format!("{}.{number}.{rest}", diffusers_block(kind))
        }
        None => mapped(HEAD, original).unwrap_or_else(|| original.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn original_names_map_to_diffusers_names() {
        // Proves the name table against names diffusers' own checkpoints use.
        let names = Names {
            layout: Layout::Diffusers,
        };
        assert_eq!(names.full("img_in.weight"), "x_embedder.weight");
        assert_eq!(
            names.full("double_blocks.3.txt_attn.norm.key_norm.scale"),
            "transformer_blocks.3.attn.norm_added_k.weight"
        );
        assert_eq!(
            names.full("single_blocks.0.linear2.bias"),
            "single_transformer_blocks.0.proj_out.bias"
        );
        assert_eq!(
            names.pieces("single_blocks.7.linear1"),
            [
                "single_transformer_blocks.7.attn.to_q",
                "single_transformer_blocks.7.attn.to_k",
                "single_transformer_blocks.7.attn.to_v",
                "single_transformer_blocks.7.proj_mlp"
            ]
        );
        assert_eq!(
            names.full("final_layer.adaLN_modulation.1.weight"),
            "norm_out.linear.weight"
        );
        let comfy = Names {
            layout: Layout::ComfyUi,
        };
        assert_eq!(
            comfy.pieces("double_blocks.0.img_attn.qkv"),
            ["model.diffusion_model.double_blocks.0.img_attn.qkv"]
        );
    }
}

//! The WAN transformer's original (Wan-AI) names as diffusers names them: the
//! renames of diffusers' `convert_wan_transformer_to_diffusers` (0.42.1,
//! `loaders/single_file_utils.py`), applied in its order as string replacements, so a
//! ComfyUI `diffusion_models/wan2.2_*.safetensors` file reads as the
//! `WanTransformer3DModel` folder's tensors. Every original tensor is one diffusers
//! tensor (nothing is fused or split), so the bytes are read where they lie.

/// diffusers' table, in its order (Wan 2.1's image embedder and image k/v are named
/// too, so that a file holding them is refused by the family as the folder is).
const RENAMES: &[(&str, &str)] = &[
    (
        "time_embedding.0",
        "condition_embedder.time_embedder.linear_1",
    ),
    (
        "time_embedding.2",
        "condition_embedder.time_embedder.linear_2",
    ),
    (
        "text_embedding.0",
        "condition_embedder.text_embedder.linear_1",
    ),
    (
        "text_embedding.2",
        "condition_embedder.text_embedder.linear_2",
    ),
    ("time_projection.1", "condition_embedder.time_proj"),
    ("cross_attn", "attn2"),
    ("self_attn", "attn1"),
    (".o.", ".to_out.0."),
    (".q.", ".to_q."),
    (".k.", ".to_k."),
    (".v.", ".to_v."),
    (".k_img.", ".add_k_proj."),
    (".v_img.", ".add_v_proj."),
    (".norm_k_img.", ".norm_added_k."),
    ("head.modulation", "scale_shift_table"),
    ("head.head", "proj_out"),
    ("modulation", "scale_shift_table"),
    ("ffn.0", "ffn.net.0.proj"),
    ("ffn.2", "ffn.net.2"),
    // The original's norm3 (before cross-attention, affine) is diffusers' norm2.
    ("norm2", "norm__placeholder"),
    ("norm3", "norm2"),
    ("norm__placeholder", "norm3"),
    ("img_emb.proj.0", "condition_embedder.image_embedder.norm1"),
    (
        "img_emb.proj.1",
        "condition_embedder.image_embedder.ff.net.0.proj",
    ),
    (
        "img_emb.proj.3",
        "condition_embedder.image_embedder.ff.net.2",
    ),
    ("img_emb.proj.4", "condition_embedder.image_embedder.norm2"),
];

/// diffusers' name of an original WAN transformer tensor.
pub(crate) fn wan_to_diffusers(name: &str) -> String {
    RENAMES
        .iter()
        .fold(name.to_string(), |name, (old, new)| name.replace(old, new))
}

/// Wan-AI's name of a diffusers WAN transformer tensor: the renames undone in reverse
/// order, so that a message about a file in the original names names its tensor as
/// the file does. The output layer's table is the one name two renames share.
pub(crate) fn diffusers_to_wan(name: &str) -> String {
    if name == "scale_shift_table" {
        return "head.modulation".into();
    }
    RENAMES
        .iter()
        .rev()
        .fold(name.to_string(), |name, (old, new)| name.replace(new, old))
}

/// Whether `names` (a checkpoint's, after `prefix`) are an original WAN transformer's.
pub(crate) fn is_original_wan<'a>(prefix: &str, mut names: impl Iterator<Item = &'a str>) -> bool {
    let (head, query) = (
        format!("{prefix}head.head.weight"),
        format!("{prefix}blocks.0.self_attn.q.weight"),
    );
    let (mut has_head, mut has_query) = (false, false);
    names.all(|name| {
        has_head |= name == head;
        has_query |= name == query;
        !(has_head && has_query)
    });
    has_head && has_query
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn original_names_become_diffusers_names() {
        // Proves the table maps each kind of original tensor to the name diffusers'
        // conversion gives it (norm3 ↔ norm2 swapped, `.o.` to `to_out.0`), and back.
        let cases = [
            ("patch_embedding.weight", "patch_embedding.weight"),
            (
                "time_embedding.0.weight",
                "condition_embedder.time_embedder.linear_1.weight",
            ),
            (
                "text_embedding.2.bias",
                "condition_embedder.text_embedder.linear_2.bias",
            ),
            (
                "time_projection.1.weight",
                "condition_embedder.time_proj.weight",
            ),
            ("blocks.3.self_attn.q.weight", "blocks.3.attn1.to_q.weight"),
            ("blocks.3.self_attn.o.bias", "blocks.3.attn1.to_out.0.bias"),
            (
                "blocks.3.cross_attn.norm_k.weight",
                "blocks.3.attn2.norm_k.weight",
            ),
            ("blocks.3.norm3.weight", "blocks.3.norm2.weight"),
            ("blocks.3.modulation", "blocks.3.scale_shift_table"),
            ("blocks.3.ffn.0.weight", "blocks.3.ffn.net.0.proj.weight"),
            ("blocks.3.ffn.2.bias", "blocks.3.ffn.net.2.bias"),
            ("head.head.weight", "proj_out.weight"),
            ("head.modulation", "scale_shift_table"),
        ];
        for (original, diffusers) in cases {
            assert_eq!(wan_to_diffusers(original), diffusers, "{original}");
            assert_eq!(diffusers_to_wan(diffusers), original, "{diffusers}");
        }
        let names = ["head.head.weight", "blocks.0.self_attn.q.weight"];
        assert!(is_original_wan("", names.into_iter()));
        assert!(!is_original_wan(
            "model.diffusion_model.",
            names.into_iter()
        ));
    }
}

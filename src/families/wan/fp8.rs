//! ComfyUI's scaled FP8 in a WAN transformer (`wan2.2_*_fp8_scaled.safetensors`), and
//! what the family refuses of it.
//!
//! ComfyUI computes such a file with `scaled_fp8_ops` (`comfy/ops.py`): only its
//! `Linear` layers read a per-tensor `scale_weight`, and without FP8 matrix
//! multiplication a Linear's weight is widened and multiplied by that scale before the
//! product (`weight × scale_weight`); the Conv3d patch embedding, the norms, the
//! modulation tables and the biases are `manual_cast` layers, cast to the compute
//! dtype with no scale. So the family computes an FP8 weight (E4M3 or E5M2) of a
//! Linear as `stored × scale` in f32, where the placement puts the scale beside it
//! ([`crate::families::placement::PlacementBuilder::add_weight`]), and refuses by name
//! what has no such reference: an FP8 tensor that is not a Linear's weight (ComfyUI
//! would cast it without its scale), an FP8 weight without a scale (an unscaled file's
//! values are not checked against anything here), and a scale that is not one F32
//! value. Messages name a tensor as Wan-AI's files do and as diffusers does.

use crate::families::FamilyError;
use crate::model::{diffusers_to_wan, ModelIndex, TensorInfo};

/// The scale names a Linear's FP8 weight may carry: ComfyUI's older `scale_weight`
/// and its newer per-layer format's `weight_scale`.
const SCALES: [&str; 2] = ["scale_weight", "weight_scale"];

fn is_fp8(tensor: &TensorInfo) -> bool {
    tensor.dtype.starts_with("F8_")
}

/// `name` as a message writes it: the original name, and diffusers' when it differs.
fn named(name: &str) -> String {
    let original = diffusers_to_wan(name);
    match original == name {
        true => format!("`{name}`"),
        false => format!("`{original}` (diffusers' `{name}`)"),
    }
}

/// Tensor `name` of `index` is stored as `dtype`, which is not computed there.
fn bad(index: &ModelIndex, (name, dtype): (&str, &str), message: String) -> FamilyError {
    let message = format!("{}: {message}", index.path.display());
    FamilyError::tensor_dtype(&index.path, name, dtype, message)
}

/// A tensor the family computes as stored (a Conv3d kernel, a bias, a norm, a
/// modulation table) is not FP8.
pub(super) fn check_stored(index: &ModelIndex, name: &str) -> Result<(), FamilyError> {
    let Some(tensor) = index.tensor(name).filter(|tensor| is_fp8(tensor)) else {
        return Ok(());
    };
    let what = match name.starts_with("patch_embedding.") {
        true => "the patch embedding is a Conv3d, which ComfyUI casts without a scale (scaled_fp8_ops scales only Linear layers)",
        false => "ComfyUI's scaled FP8 stores only Linear weights in FP8, and casts any other tensor without a scale",
    };
    Err(bad(
        index,
        (name, &tensor.dtype),
        format!(
            "tensor {} is {}: {what}, so there is no reference for computing it; use a file with that tensor in F32, F16 or BF16 (the fp16 file, wan2.2_*_fp16.safetensors)",
            named(name),
            tensor.dtype
        ),
    ))
}

/// A Linear's weight `<stem>.weight`: F32, F16 or BF16, or FP8 with its one F32 scale.
pub(super) fn check_linear(index: &ModelIndex, name: &str) -> Result<(), FamilyError> {
    let Some(tensor) = index.tensor(name) else {
        return Ok(());
    };
    if !is_fp8(tensor) {
        return match tensor.dtype.as_str() {
            "F32" | "F16" | "BF16" => Ok(()),
            other => Err(bad(
                index,
                (name, other),
                format!(
                    "tensor {} is {other}; the WAN family computes Linear weights in F32, F16, BF16 or ComfyUI's scaled FP8 (F8_E4M3 or F8_E5M2 with a scale_weight)",
                    named(name)
                ),
            )),
        };
    }
    let stem = name.strip_suffix(".weight").unwrap_or(name);
    let scale = SCALES
        .iter()
        .find_map(|suffix| index.tensor(&format!("{stem}.{suffix}")));
    let Some(scale) = scale else {
        let scale_name = format!("{stem}.scale_weight");
        return Err(FamilyError::missing_tensor(&index.path, &scale_name, format!(
            "{}: {}",
            index.path.display(),
            format_args!(
                "tensor {} is {} with no scale (`{}.scale_weight` beside it): ComfyUI's scaled FP8 file gives every FP8 weight its F32 scale_weight, and an unscaled FP8 file is not computed; use the fp8_scaled or the fp16 file",
                named(name),
                tensor.dtype,
                diffusers_to_wan(name).trim_end_matches(".weight")
            ),
        )));
    };
    let values: usize = scale.shape.iter().product();
    if scale.dtype != "F32" || values != 1 {
        let problem = format!(
            "the scale {} of FP8 tensor {} is {} {:?}; ComfyUI's scaled FP8 scales a weight by one F32 value (shape [] or [1]); a per-row or block scale is not computed",
            named(&scale.name),
            named(name),
            scale.dtype,
            scale.shape
        );
        return Err(match scale.dtype.as_str() {
            "F32" => {
                let message = format!("{}: {problem}", index.path.display());
                let shapes = (&[1][..], &scale.shape[..]);
                FamilyError::tensor_shape(&index.path, &scale.name, shapes, message)
            }
            other => bad(index, (&scale.name, other), problem),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::named;

    #[test]
    fn a_tensor_is_named_as_the_original_file_names_it() {
        // Proves messages give Wan-AI's name first and diffusers' beside it, and one
        // name where the two agree.
        assert_eq!(
            named("blocks.0.attn1.to_q.weight"),
            "`blocks.0.self_attn.q.weight` (diffusers' `blocks.0.attn1.to_q.weight`)"
        );
        assert_eq!(named("patch_embedding.weight"), "`patch_embedding.weight`");
    }
}

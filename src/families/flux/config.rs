//! A Flux transformer's sizes: from diffusers' `transformer/config.json`
//! (`_class_name: FluxTransformer2DModel`), or inferred from the tensor shapes of a
//! bare original or ComfyUI checkpoint — and, either way, checked against the shapes.

use std::path::Path;

use serde_json::Value;

use super::names::Names;
use crate::families::FamilyError;
use crate::model::ModelIndex;

/// The safetensors metadata key a generated checkpoint records its rope axes under
/// (a bare checkpoint's shapes do not say how the head splits over the three axes).
pub const AXES_METADATA: &str = "stagehand.flux.axes_dims_rope";

/// Rotary base of Flux's three-axis rope.
pub const ROPE_THETA: f64 = 10_000.0;

/// Every `config.json` key of `FluxTransformer2DModel`, and what is done with it.
const READ_KEYS: &[&str] = &[
    "in_channels",
    "out_channels",
    "num_layers",
    "num_single_layers",
    "attention_head_dim",
    "num_attention_heads",
    "joint_attention_dim",
    "pooled_projection_dim",
    "guidance_embeds",
    "axes_dims_rope",
    "patch_size",
];
/// Keys that change nothing computed: bookkeeping of diffusers.
const IGNORED_KEYS: &[&str] = &["_class_name", "_diffusers_version", "_name_or_path"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FluxConfig {
    /// Packed latent channels (16 latent channels × 2×2).
    pub in_channels: usize,
    pub double_blocks: usize,
    pub single_blocks: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// T5 hidden width and the pooled CLIP vector's.
    pub context_dim: usize,
    pub pooled_dim: usize,
    pub guidance: bool,
    pub axes: Vec<usize>,
    /// The MLP's hidden width (4 × hidden in every Flux).
    pub mlp: usize,
}

/// `config.json`'s `key` refused (`None`: the whole file, or a config inferred from a
/// checkpoint's shapes at `path`).
fn bad(path: &Path, key: Option<&str>, message: String) -> FamilyError {
    FamilyError::config(path, key, format!("{}: {message}", path.display()))
}

impl FluxConfig {
    pub fn hidden(&self) -> usize {
        self.heads * self.head_dim
    }

    /// From diffusers' `config.json`. Unknown keys and values that change the math
    /// stagehand does not compute (a patch size other than 1, other output channels)
    /// are refused by name.
    pub fn from_json(path: &Path, config: &Value) -> Result<Self, FamilyError> {
        let object = config
            .as_object()
            .ok_or_else(|| bad(path, None, "is not a JSON object".into()))?;
        if let Some(key) = object
            .keys()
            .find(|key| !READ_KEYS.contains(&key.as_str()) && !IGNORED_KEYS.contains(&key.as_str()))
        {
            return Err(bad(path, Some(key), format!("key `{key}` is not one FluxTransformer2DModel reads; remove it or fix its name"),
            ));
        }
        let number = |key: &str, default: Option<usize>| -> Result<usize, FamilyError> {
            match object.get(key) {
                Some(value) => value
                    .as_u64()
                    .filter(|&value| value > 0)
                    .map(|value| value as usize)
                    .ok_or_else(|| {
                        bad(
                            path,
                            Some(key),
                            format!("`{key}` is {value}; it must be a positive integer"),
                        )
                    }),
                None => default.ok_or_else(|| bad(path, Some(key), format!("`{key}` is missing"))),
            }
        };
        let in_channels = number("in_channels", Some(64))?;
        if number("patch_size", Some(1))? != 1 {
            return Err(bad(
                path,
                Some("patch_size"),
                "`patch_size` other than 1 is not Flux.1's; stagehand computes patch_size 1".into(),
            ));
        }
        if let Some(out) = object.get("out_channels").filter(|value| !value.is_null()) {
            if out.as_u64() != Some(in_channels as u64) {
                return Err(bad(path, Some("out_channels"), format!("`out_channels` {out} differs from `in_channels` {in_channels}; the sampler needs the same")));
            }
        }
        let head_dim = number("attention_head_dim", Some(128))?;
        let axes = match object.get("axes_dims_rope") {
            Some(value) => axes_of(value).ok_or_else(|| {
                bad(
                    path,
                    Some("axes_dims_rope"),
                    format!(
                        "`axes_dims_rope` is {value}; it must be a list of three even integers"
                    ),
                )
            })?,
            None => vec![16, 56, 56],
        };
        let guidance = match object.get("guidance_embeds") {
            Some(value) => value.as_bool().ok_or_else(|| {
                bad(
                    path,
                    Some("guidance_embeds"),
                    format!("`guidance_embeds` is {value}; true or false"),
                )
            })?,
            None => false,
        };
        let heads = number("num_attention_heads", Some(24))?;
        let config = Self {
            in_channels,
            double_blocks: number("num_layers", Some(19))?,
            single_blocks: number("num_single_layers", Some(38))?,
            heads,
            head_dim,
            context_dim: number("joint_attention_dim", Some(4096))?,
            pooled_dim: number("pooled_projection_dim", Some(768))?,
            guidance,
            axes,
            mlp: 4 * heads * head_dim,
        };
        config.check_axes(path)?;
        Ok(config)
    }

    /// From the shapes of an original-layout (or ComfyUI) checkpoint.
    pub fn infer(index: &ModelIndex, names: &Names) -> Result<Self, FamilyError> {
        let path = &index.path;
        let shape = |name: &str| -> Result<Vec<usize>, FamilyError> {
            index
                .tensor(&names.full(name))
                .map(|tensor| tensor.shape.clone())
                .ok_or_else(|| {
                    let name = names.full(name);
                    let message = format!(
                        "{}: tensor `{name}` is missing; is this a Flux checkpoint?",
                        path.display()
                    );
                    FamilyError::missing_tensor(path, &name, message)
                })
        };
        // An awq_w4a16 weight (it has group zeros) stores two inputs a byte.
        let packed = |name: &str| {
            let stem = name.trim_end_matches(".weight");
            ["weight_zeros", "weight_zero"].iter().any(|zeros| {
                index
                    .tensor(&names.full(&format!("{stem}.{zeros}")))
                    .is_some()
            })
        };
        let matrix = |name: &str| -> Result<(usize, usize), FamilyError> {
            match shape(name)?[..] {
                [rows, cols] if packed(name) => Ok((rows, 2 * cols)),
                [rows, cols] => Ok((rows, cols)),
                ref other => {
                    let name = names.full(name);
                    let message = format!(
                        "{}: tensor `{name}` has shape {other:?}; expected a matrix",
                        path.display()
                    );
                    Err(FamilyError::tensor_shape(
                        path,
                        &name,
                        (&[], other),
                        message,
                    ))
                }
            }
        };
        let (hidden, in_channels) = matrix("img_in.weight")?;
        let head_dim = shape("double_blocks.0.img_attn.norm.query_norm.scale")?
            .first()
            .copied()
            .unwrap_or(0);
        if head_dim == 0 || hidden % head_dim != 0 {
            return Err(bad(
                path,
                None,
                format!(
                    "the query norm's {head_dim} values do not divide the hidden width {hidden}"
                ),
            ));
        }
        let axes = match index.metadata.get(AXES_METADATA) {
            Some(text) => serde_json::from_str::<Value>(text)
                .ok()
                .as_ref()
                .and_then(axes_of)
                .ok_or_else(|| {
                    bad(
                        path,
                        None,
                        format!(
                            "metadata `{AXES_METADATA}` is `{text}`; a list of three even integers"
                        ),
                    )
                })?,
            None if head_dim == 128 => vec![16, 56, 56],
            None => {
                return Err(bad(path, None, format!("a head of {head_dim} is not Flux.1's 128, and the checkpoint does not say how its rope splits it (metadata `{AXES_METADATA}`); use a diffusers folder with axes_dims_rope")));
            }
        };
        let config = Self {
            in_channels,
            double_blocks: names.count(index, "double_blocks"),
            single_blocks: names.count(index, "single_blocks"),
            heads: hidden / head_dim,
            head_dim,
            context_dim: matrix("txt_in.weight")?.1,
            pooled_dim: matrix("vector_in.in_layer.weight")?.1,
            guidance: index
                .tensor(&names.full("guidance_in.in_layer.weight"))
                .is_some(),
            axes,
            mlp: matrix("double_blocks.0.img_mlp.0.weight")?.0,
        };
        config.check_axes(path)?;
        Ok(config)
    }

    fn check_axes(&self, path: &Path) -> Result<(), FamilyError> {
        if self.axes.iter().sum::<usize>() != self.head_dim {
            return Err(bad(
                path,
                None,
                format!(
                    "rope axes {:?} sum to {}, but a head has {} values",
                    self.axes,
                    self.axes.iter().sum::<usize>(),
                    self.head_dim
                ),
            ));
        }
        Ok(())
    }
}

fn axes_of(value: &Value) -> Option<Vec<usize>> {
    let axes: Vec<usize> = value
        .as_array()?
        .iter()
        .map(|axis| axis.as_u64().map(|axis| axis as usize))
        .collect::<Option<_>>()?;
    (axes.len() == 3 && axes.iter().all(|axis| axis % 2 == 0)).then_some(axes)
}

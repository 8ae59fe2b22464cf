//! Quantized checkpoints as ComfyUI writes them, checked before any weight is placed.
//!
//! Two marks say a layer is quantized: the older scaled FP8 (`F8_E4M3`/`F8_E5M2`
//! weights, a per-layer `scale_weight`, and a `scaled_fp8` marker tensor), and the
//! newer per-layer format (`<layer>.weight_scale`, `<layer>.input_scale`, and a
//! `<layer>.comfy_quant` U8 tensor holding JSON such as `{"format": "float8_e4m3fn"}`,
//! or the same per layer under `_quantization_metadata` in the header). Four formats
//! are computed, each dequantised in the cast, so they move at their stored bytes on
//! every link. The layouts are what ComfyUI reads (Comfy-Org/ComfyUI: `QUANT_ALGOS` in
//! `comfy/quant_ops.py`, `_load_quantized_module` in `comfy/ops.py`, which pops
//! `weight_scale` and, for AWQ, `weight_zeros` and `group_size`) and how comfy-kitchen
//! dequantises them (`comfy_kitchen/tensor`: `TensorWiseINT8Layout`,
//! `TensorCoreAWQW4A16Layout`, whose docstring gives the packing and the formula; some
//! ComfyUI versions list the AWQ parameter as `weight_zero`, so both names are read):
//!
//! - `float8_e4m3fn`, `float8_e5m2`: FP8 weights, one F32 `weight_scale`;
//!   `stored × scale`.
//! - `int8_tensorwise`: an `I8 [out, in]` weight and one F32 `weight_scale`
//!   (max |w| / 127 when quantized); `stored × scale`. The `convrot` variant (a
//!   Hadamard rotation of the inputs) and per-row scales are refused.
//! - `awq_w4a16`: an `I8 [out, in / 2]` weight of packed unsigned 4-bit codes (element
//!   `2j` in the low nibble), `weight_scale` and `weight_zeros` (ComfyUI's names;
//!   `weight_zero` is read too) of `[in / group_size, out]` in BF16, F16 or F32, and
//!   `group_size` from the JSON (64 unless it says otherwise); `(q − 8)·scale + zero`
//!   (see [`crate::compute::quant`]).
//!
//! `input_scale` is what ComfyUI quantises activations with for an FP8 matmul, and
//! `linear_dtype` picks the matmul's precision (ComfyUI reads it only for
//! `convrot_w4a4`, a format stagehand refuses): stagehand keeps activations in f32 and
//! computes every format in f32 from the dequantised weight, so both are ignored, the
//! latter said in a warning. Any other format (nvfp4, mxfp8, convrot_w4a4, …) is
//! refused by name.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::families::FamilyError;
use crate::model::{BlockReader, ModelIndex};

/// The formats stagehand computes, with the safetensors dtype their weights have.
const IMPLEMENTED: &[(&str, &str)] = &[
    ("float8_e4m3fn", "F8_E4M3"),
    ("float8_e5m2", "F8_E5M2"),
    ("int8_tensorwise", "I8"),
    ("awq_w4a16", "I8"),
];

/// ComfyUI's `awq_w4a16` group size when the JSON names none.
const AWQ_GROUP_SIZE: u64 = 64;

/// The header key of the newer format's per-layer metadata.
pub const METADATA_KEY: &str = "_quantization_metadata";

/// Largest `comfy_quant` JSON read (real ones are a few dozen bytes).
const MAX_JSON_BYTES: u64 = 1 << 16;

/// The checkpoint's quantization metadata is malformed or disagrees with itself.
fn bad(index: &ModelIndex, message: String) -> FamilyError {
    FamilyError::bad_file(&index.path, format!("{}: {message}", index.path.display()))
}

/// A quantization `format` stagehand does not compute.
fn unsupported(index: &ModelIndex, format: &str, message: String) -> FamilyError {
    FamilyError::Unsupported {
        path: index.path.clone(),
        found: format.to_string(),
        message: format!("{}: {message}", index.path.display()),
    }
}

/// Every layer's declared format, checked: implemented, and its weight of the dtype
/// the format stores. `headers_only`: the `comfy_quant` tensors' bytes are not read
/// (a description), only the header's metadata.
pub fn check(index: &ModelIndex, headers_only: bool) -> Result<(), FamilyError> {
    let mut declared: Vec<(String, Value)> = Vec::new();
    if let Some(text) = index.metadata.get(METADATA_KEY) {
        let metadata: Value = serde_json::from_str(text).map_err(|error| {
            bad(
                index,
                format!("header `{METADATA_KEY}` is not JSON ({error})"),
            )
        })?;
        let layers = metadata.get("layers").unwrap_or(&metadata);
        if let Some(layers) = layers.as_object() {
            declared.extend(
                layers
                    .iter()
                    .map(|(layer, value)| (layer.clone(), value.clone())),
            );
        }
    }
    if !headers_only {
        declared.extend(comfy_quant_tensors(index)?);
    }
    let mut ignored: BTreeMap<(String, String), (usize, String)> = BTreeMap::new();
    for (layer, value) in declared {
        let format = value.get("format").and_then(Value::as_str).ok_or_else(|| {
            bad(
                index,
                format!("layer `{layer}`: its quantization metadata {value} names no \"format\""),
            )
        })?;
        let Some((_, dtype)) = IMPLEMENTED.iter().find(|(name, _)| *name == format) else {
            let known: Vec<&str> = IMPLEMENTED.iter().map(|(name, _)| *name).collect();
            return Err(unsupported(
                index,
                format,
                format!(
                    "layer `{layer}` is quantized as `{format}`, a format stagehand does not implement (it computes {}); dequantize the checkpoint or use one of those",
                    known.join(", ")
                ),
            ));
        };
        let weight = format!("{layer}.weight");
        if let Some(tensor) = index
            .tensor(&weight)
            .filter(|tensor| tensor.dtype != *dtype)
        {
            let message = format!(
                "{}: layer `{layer}` declares `{format}` but `{weight}` is {}",
                index.path.display(),
                tensor.dtype
            );
            return Err(FamilyError::tensor_dtype(
                &index.path,
                &weight,
                &tensor.dtype,
                message,
            ));
        }
        check_variant(index, &layer, format, &value)?;
        if let Some(linear_dtype) = value.get("linear_dtype") {
            let key = (format.to_string(), linear_dtype.to_string());
            let (count, _) = ignored.entry(key).or_insert((0, layer.clone()));
            *count += 1;
        }
    }
    // One warning per (format, linear_dtype), not one per layer.
    for ((format, linear_dtype), (count, first)) in ignored {
        tracing::warn!(
            "comfy_quant linear_dtype {linear_dtype} of {count} {format} layer(s) (`{first}`, …) is ignored; stagehand computes {format} in f32 from the dequantised weight"
        );
    }
    Ok(())
}

/// What a format's JSON may add: int8's `convrot` rotation (refused), AWQ's
/// `group_size` (checked against the shapes of its scales).
fn check_variant(
    index: &ModelIndex,
    layer: &str,
    format: &str,
    value: &Value,
) -> Result<(), FamilyError> {
    let params = value.get("params").unwrap_or(&Value::Null);
    let key = |name: &str| value.get(name).or_else(|| params.get(name));
    if format == "int8_tensorwise" && key("convrot").and_then(Value::as_bool) == Some(true) {
        return Err(unsupported(
            index,
            "int8_tensorwise with convrot",
            format!("layer `{layer}` is quantized as `int8_tensorwise` with `convrot` (a Hadamard rotation of its inputs), a variant stagehand does not implement; use a plain int8_tensorwise checkpoint"),
        ));
    }
    if format != "awq_w4a16" {
        return Ok(());
    }
    let declared = match key("group_size") {
        None => AWQ_GROUP_SIZE,
        Some(size) => size.as_u64().filter(|size| *size > 0).ok_or_else(|| {
            bad(
                index,
                format!("layer `{layer}`: awq_w4a16 group_size {size} is not a positive integer"),
            )
        })?,
    };
    let zeros = ["weight_zeros", "weight_zero"]
        .iter()
        .any(|name| index.tensor(&format!("{layer}.{name}")).is_some());
    if !zeros {
        let message = format!(
            "{}: layer `{layer}` is awq_w4a16 but has no `{layer}.weight_zeros`",
            index.path.display()
        );
        let zeros = format!("{layer}.weight_zeros");
        return Err(FamilyError::missing_tensor(&index.path, &zeros, message));
    }
    let (weight, scale) = (
        index.tensor(&format!("{layer}.weight")),
        index.tensor(&format!("{layer}.weight_scale")),
    );
    if let (Some(weight), Some(scale)) = (weight, scale) {
        let stored = match (&weight.shape[..], &scale.shape[..]) {
            ([_, packed], [groups, _]) if *groups > 0 => Some((2 * packed / groups) as u64),
            _ => None,
        };
        if stored != Some(declared) {
            return Err(bad(
                index,
                format!(
                    "layer `{layer}` declares awq_w4a16 groups of {declared} inputs, but `{layer}.weight` {:?} and `{layer}.weight_scale` {:?} make groups of {}",
                    weight.shape,
                    scale.shape,
                    stored.map_or("no whole size".to_string(), |size| size.to_string())
                ),
            ));
        }
    }
    Ok(())
}

/// The JSON of every `<layer>.comfy_quant` tensor, by layer.
fn comfy_quant_tensors(index: &ModelIndex) -> Result<Vec<(String, Value)>, FamilyError> {
    let tensors: Vec<_> = index
        .tensors
        .iter()
        .filter(|tensor| tensor.name.ends_with(".comfy_quant"))
        .collect();
    if tensors.is_empty() {
        return Ok(Vec::new());
    }
    let reader = BlockReader::open(index)?;
    let mut declared = Vec::with_capacity(tensors.len());
    for tensor in tensors {
        let layer = tensor.name.trim_end_matches(".comfy_quant").to_string();
        if tensor.bytes > MAX_JSON_BYTES {
            return Err(bad(
                index,
                format!(
                    "`{}` is {} bytes; a comfy_quant JSON is a few dozen",
                    tensor.name, tensor.bytes
                ),
            ));
        }
        let mut bytes = vec![0u8; tensor.bytes as usize];
        let extent = stagehand_actors::Extent {
            file: stagehand_actors::FileId(tensor.file as u32),
            offset: tensor.offset,
            length: tensor.bytes,
        };
        reader.read_extents(&[extent], &mut bytes)?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|error| {
            bad(
                index,
                format!("`{}` does not hold JSON ({error})", tensor.name),
            )
        })?;
        declared.push((layer, value));
    }
    Ok(declared)
}

//! Quantized checkpoints as ComfyUI writes them, checked before any weight is placed.
//!
//! Two marks say a layer is quantized: the older scaled FP8 (`F8_E4M3`/`F8_E5M2`
//! weights, a per-layer `scale_weight`, and a `scaled_fp8` marker tensor), and the
//! newer per-layer format (`<layer>.weight_scale`, `<layer>.input_scale`, and a
//! `<layer>.comfy_quant` U8 tensor holding JSON such as `{"format": "float8_e4m3fn"}`,
//! or the same per layer under `_quantization_metadata` in the header). Both FP8
//! formats are dequantised in the cast (`stored × scale`), so they move at their
//! stored bytes on every link. `input_scale` is what ComfyUI quantises activations
//! with for an FP8 matmul; stagehand keeps activations in f32 and ignores it, as it
//! ignores `linear_dtype` (said in a warning). Any other format is refused by name.

use serde_json::Value;

use crate::families::FamilyError;
use crate::model::{BlockReader, ModelIndex};

/// The formats stagehand computes, with the safetensors dtype their weights have.
const IMPLEMENTED: &[(&str, &str)] = &[("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")];

/// The header key of the newer format's per-layer metadata.
pub const METADATA_KEY: &str = "_quantization_metadata";

/// Largest `comfy_quant` JSON read (real ones are a few dozen bytes).
const MAX_JSON_BYTES: u64 = 1 << 16;

fn bad(index: &ModelIndex, message: String) -> FamilyError {
    FamilyError::Model(format!("{}: {message}", index.path.display()))
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
    for (layer, value) in declared {
        let format = value.get("format").and_then(Value::as_str).ok_or_else(|| {
            bad(
                index,
                format!("layer `{layer}`: its quantization metadata {value} names no \"format\""),
            )
        })?;
        let Some((_, dtype)) = IMPLEMENTED.iter().find(|(name, _)| *name == format) else {
            let known: Vec<&str> = IMPLEMENTED.iter().map(|(name, _)| *name).collect();
            return Err(bad(
                index,
                format!(
                    "layer `{layer}` is quantized as `{format}`, a format stagehand does not implement (it computes {}); dequantize the checkpoint or use an FP8 one",
                    known.join(" and ")
                ),
            ));
        };
        let weight = format!("{layer}.weight");
        if let Some(tensor) = index
            .tensor(&weight)
            .filter(|tensor| tensor.dtype != *dtype)
        {
            return Err(bad(
                index,
                format!(
                    "layer `{layer}` declares `{format}` but `{weight}` is {}",
                    tensor.dtype
                ),
            ));
        }
        if let Some(linear_dtype) = value.get("linear_dtype") {
            tracing::warn!(
                "layer `{layer}`: comfy_quant linear_dtype {linear_dtype} is ignored; stagehand computes in f32 from the dequantised weight"
            );
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

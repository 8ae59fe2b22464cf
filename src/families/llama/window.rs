//! Sliding-window attention as each family's transformers class reads it from
//! `config.json` (`sliding_window`, `use_sliding_window`, `max_window_layers`,
//! `layer_types`). stagehand does not implement the window: attention always sees
//! the whole sequence, which is the same computation while the sequence fits in the
//! window. A model whose layers slide is therefore run only up to its window; a
//! prompt or a `--max-tokens` that would go past it is refused naming the keys.

use super::config::Variant;
use super::keys::Keys;
use crate::families::FamilyError;

/// The shortest window any layer attends through, and the settings that make it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingWindow {
    pub tokens: usize,
    /// The keys that set it, for messages: "`sliding_window` 4096 (layers 28..31)".
    pub because: String,
}

impl SlidingWindow {
    /// Why a sequence of `tokens` tokens is refused.
    pub fn refusal(&self, tokens: usize) -> String {
        format!(
            "a sequence of {tokens} tokens is longer than the window its layers attend through, {}: sliding-window attention is not implemented, so stagehand runs such a model only up to its window",
            self.because
        )
    }
}

/// The window of `variant`'s layers; `None` when no layer slides.
pub fn sliding_window(
    keys: &Keys<'_>,
    variant: Variant,
    layers: usize,
) -> Result<Option<SlidingWindow>, FamilyError> {
    let use_window = keys.flag("use_sliding_window", false)?;
    let listed = match keys.get("layer_types") {
        Some(types) if reads_layer_types(variant) => Some(listed_layers(keys, types, layers)?),
        _ => None,
    };
    let window = match variant {
        Variant::Llama => None,
        // Mistral's default is a 4096 window; Mixtral's none.
        Variant::Mistral => match keys.get("sliding_window") {
            None if keys.config.get("sliding_window").is_none() => Some(4096),
            _ => keys.optional_size("sliding_window")?,
        },
        Variant::Mixtral => keys.optional_size("sliding_window")?,
        // Qwen2-MoE writes 0 for "none".
        Variant::Qwen2Moe if keys.get("sliding_window").and_then(|v| v.as_u64()) == Some(0) => None,
        _ if !use_window => None,
        _ => Some(keys.optional_size("sliding_window")?.unwrap_or(4096)),
    };
    let Some(tokens) = window else {
        return Ok(None);
    };
    let sliding = match listed {
        Some(listed) => listed,
        None => sliding_layers(keys, variant, layers, use_window)?,
    };
    let Some((&first, &last)) = sliding.first().zip(sliding.last()) else {
        return Ok(None);
    };
    let which = if sliding.len() == layers {
        "every layer".to_string()
    } else {
        format!("layers {first}..={last}")
    };
    Ok(Some(SlidingWindow {
        tokens,
        because: format!("`sliding_window` {tokens} ({which})"),
    }))
}

/// Whether `variant`'s transformers class takes its sliding layers from `layer_types`.
fn reads_layer_types(variant: Variant) -> bool {
    matches!(variant, Variant::Qwen2 | Variant::Qwen3 | Variant::Qwen2Moe)
}

/// The layers that slide when a window is set and `layer_types` does not list them.
fn sliding_layers(
    keys: &Keys<'_>,
    variant: Variant,
    layers: usize,
    use_window: bool,
) -> Result<Vec<usize>, FamilyError> {
    let max_window_layers = keys.optional_size("max_window_layers")?.unwrap_or(28);
    Ok((0..layers)
        .filter(|&layer| match variant {
            Variant::Qwen2 | Variant::Qwen3 => layer >= max_window_layers,
            // transformers' default layer_types for Qwen2-MoE: every other layer below
            // max_window_layers.
            Variant::Qwen2Moe => use_window && (layer + 1) % 2 == 1 && layer < max_window_layers,
            _ => true,
        })
        .collect())
}

/// `layer_types`: one of "full_attention" / "sliding_attention" per layer.
fn listed_layers(
    keys: &Keys<'_>,
    types: &serde_json::Value,
    layers: usize,
) -> Result<Vec<usize>, FamilyError> {
    let list = types
        .as_array()
        .filter(|list| list.len() == layers)
        .ok_or_else(|| {
            keys.bad(
                "layer_types",
                format!("is {types}; expected one entry per layer ({layers})"),
            )
        })?;
    let mut sliding = Vec::new();
    for (layer, kind) in list.iter().enumerate() {
        match kind.as_str() {
            Some("full_attention") => {}
            Some("sliding_attention") => sliding.push(layer),
            _ => {
                return Err(keys.bad(
                    "layer_types",
                    format!("has {kind} at layer {layer}; stagehand knows \"full_attention\" and \"sliding_attention\""),
                ))
            }
        }
    }
    Ok(sliding)
}

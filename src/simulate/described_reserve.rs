//! A model description's `[activations]`: what a step reserves beside the weights at a
//! stated workload, from a family's own code (the one `simulate --model` runs on a
//! checkpoint, through the registry) or, for a model no family computes, a stated
//! number and its formula.

use serde::Deserialize;

use crate::families::{Activations, DescribedWorkload, KvCache};

/// `[activations]`: what a step reserves beside the weights at a stated workload.
/// Either a family of the registry computes it from the model's published
/// `config.json` (the code `simulate --model` runs on a checkpoint), or, for a model
/// no family computes, a number with the formula it came from.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ActivationsFile {
    family: Option<String>,
    /// The published `config.json`, as a table.
    config: Option<toml::Table>,
    width: Option<u64>,
    height: Option<u64>,
    text_tokens: Option<u64>,
    context_tokens: Option<u64>,
    reserved_bytes: Option<u64>,
    formula: Option<String>,
}

/// What `[activations]` gives: a KV cache, activation tensors, and their basis.
type Reserve = (Option<KvCache>, Option<Activations>, String);

impl ActivationsFile {
    pub(super) fn reserve(self) -> Result<Reserve, String> {
        match (self.family.clone(), self.reserved_bytes) {
            (Some(family), None) => self.computed_by(&family),
            (None, Some(reserved_bytes)) => {
                let formula = self.formula.ok_or(
                    "activations: `formula` is needed beside `reserved_bytes` (how the number was computed)",
                )?;
                let activations = Activations {
                    reserved_bytes,
                    peaks: Vec::new(),
                };
                Ok((None, Some(activations), format!("by a formula, not by a family of stagehand: {formula}")))
            }
            _ => Err("activations: give exactly one of `family` (with `config`) or `reserved_bytes` (with `formula`)".to_string()),
        }
    }

    fn computed_by(self, family: &str) -> Result<Reserve, String> {
        let entry = crate::families::named(family).ok_or_else(|| {
            format!("activations: `family = \"{family}\"` is not a family stagehand computes")
        })?;
        let config = self.config.ok_or(
            "activations: `config` (the model's config.json as a table) is needed beside `family`",
        )?;
        let config =
            serde_json::to_value(config).map_err(|error| format!("activations: {error}"))?;
        let workload = DescribedWorkload {
            width: self.width,
            height: self.height,
            text_tokens: self.text_tokens,
            context_tokens: self.context_tokens,
        };
        let reserve = entry
            .described_reserve(&config, &workload)
            .map_err(|error| format!("activations: {error}"))?
            .ok_or_else(|| {
                format!(
                    "activations: the {family} family reserves nothing it computes from a config"
                )
            })?;
        let at = match (
            workload.width,
            workload.height,
            workload.text_tokens,
            workload.context_tokens,
        ) {
            (Some(width), Some(height), Some(text), _) => {
                format!("at {width}×{height} with {text} text tokens")
            }
            (_, _, _, Some(context)) => format!("for a {context}-token context"),
            _ => String::new(),
        };
        Ok((
            reserve.kv_cache,
            reserve.activations,
            format!("computed {at} by the {family} family's own code"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::model::ModelDescription;

    #[test]
    fn every_shipped_description_states_what_a_step_reserves_beside_the_weights() {
        // Proves the fit of a shipped model counts its activations: each description
        // carries them, and says where they come from.
        for name in ModelDescription::builtin_names() {
            let model = ModelDescription::load(name).unwrap();
            assert!(
                model.activation_reserve_bytes() > 0,
                "{name}: no activations"
            );
            assert!(model.reserve_basis.is_some(), "{name}: no basis");
        }
    }

    #[test]
    fn flux_dev_and_the_decoders_reserve_what_their_family_computes() {
        // Proves the Flux and Llama descriptions go through the families' own code:
        // Flux.1-dev at 1024² with 512 tokens reserves the 1.44 GiB `sample` reserves,
        // and Llama 3 8B's KV cache is 2 × 8 heads × 128 × 32 layers × 4 B a token.
        let flux = ModelDescription::load("flux1-dev").unwrap();
        let reserved = flux.activations.as_ref().unwrap().reserved_bytes;
        assert_eq!(stagehand_actors::Bytes(reserved).to_string(), "1.44 GiB");
        assert!(flux.reserve_basis.unwrap().contains("flux family"));
        let llama = ModelDescription::load("llama3-8b").unwrap();
        let kv = llama.kv_cache.unwrap();
        assert_eq!(kv.bytes_per_token, 2 * 8 * 128 * 32 * 4);
        assert_eq!((kv.prompt_tokens, kv.page_tokens), (4096, 64));
        assert_eq!(llama.activation_reserve_bytes(), 4160 * kv.bytes_per_token);
    }

    #[test]
    fn the_stated_formulas_of_the_models_no_family_computes_add_up() {
        // Proves the numbers in sdxl-unet.toml and wan2.2-14b.toml are their comments'
        // formulas (f32 values × 4 B).
        let sdxl_skips =
            320 * 16384 * 3 + 320 * 4096 + 640 * 4096 * 2 + 640 * 1024 + 1280 * 1024 * 2;
        let sdxl_layer = 11 * 4096 * 640 + 4096 * 5120 + 4096 * 2560;
        let sdxl = 2 * 4 * (sdxl_skips + sdxl_layer + 77 * 2048);
        let tokens: u64 = 21 * 30 * 52;
        let wan = 4
            * (10 * tokens * 5120
                + tokens * 13824
                + 2 * 512 * 5120
                + 512 * 4096
                + 512 * 5120
                + tokens * 128
                + 3 * tokens * 64);
        for (name, bytes) in [("sdxl-unet", sdxl), ("wan2.2-14b", wan)] {
            let model = ModelDescription::load(name).unwrap();
            assert_eq!(model.activation_reserve_bytes(), bytes, "{name}");
            assert!(model.reserve_basis.unwrap().contains("formula"), "{name}");
        }
    }

    #[test]
    fn an_activations_table_names_what_is_wrong() {
        // Proves a description's [activations] is refused by name: an unknown family,
        // a missing workload size, both forms at once.
        let base = "dtype = \"bf16\"\ntokens_per_step = 1\nblock_count = 2\nbytes_per_block = 1\nflops_per_token_per_block = 1.0\n";
        let cases = [
            (
                "[activations]\nfamily = \"unet\"\nconfig = {}\n",
                "not a family",
            ),
            (
                "[activations]\nfamily = \"llama\"\n[activations.config]\nmodel_type = \"llama\"\n",
                "`hidden_size` is missing",
            ),
            ("[activations]\nreserved_bytes = 4\n", "formula"),
            (
                "[activations]\nfamily = \"flux\"\nreserved_bytes = 4\n",
                "exactly one",
            ),
        ];
        for (table, expected) in cases {
            let message = ModelDescription::parse("x", "x.toml", &format!("{base}{table}"))
                .unwrap_err()
                .to_string();
            assert!(message.contains(expected), "{table}: {message}");
        }
    }
}

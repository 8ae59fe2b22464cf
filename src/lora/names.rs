//! How an adapter's module names find the model's weights: by the model's own tensor
//! names first, then by the aliases its family lists for another layout of the same
//! weights ([`LoraAlias`]), each looked up dotted (PEFT) or flattened (kohya).

use std::collections::HashMap;

use super::load::Naming;
use super::LoraAlias;
use crate::model::ModelIndex;

/// kohya module prefixes, longest first so `lora_te1_` wins over `lora_te_`.
const KOHYA_PREFIXES: [&str; 7] = [
    "lora_transformer_",
    "lora_unet_",
    "lora_te1_",
    "lora_te2_",
    "lora_te_",
    "lora_",
    "",
];

/// Where a ComfyUI single file keeps its diffusion model, which adapters trained on
/// the bare model omit.
const COMFY_UNDER: &str = "model.diffusion_model.";

/// What a module name was found as.
#[derive(Debug, Clone, Copy)]
pub enum Found<'a> {
    /// A weight of the model, by position in the index.
    Own(usize),
    /// A module of another layout.
    Alias(&'a LoraAlias),
}

/// The model's tensor names and its aliases, dotted and flattened, for both namings'
/// lookups.
pub struct BaseNames<'a> {
    dotted: HashMap<String, usize>,
    flattened: HashMap<String, usize>,
    aliases: &'a [LoraAlias],
    alias_dotted: HashMap<String, usize>,
    alias_flattened: HashMap<String, usize>,
}

impl<'a> BaseNames<'a> {
    pub fn new(index: &ModelIndex, aliases: &'a [LoraAlias]) -> Self {
        let mut dotted = HashMap::new();
        let mut flattened = HashMap::new();
        for (position, tensor) in index.tensors.iter().enumerate() {
            dotted.insert(tensor.name.clone(), position);
            if let Some(module) = tensor.name.strip_suffix(".weight") {
                flattened.insert(module.replace('.', "_"), position);
            }
        }
        let mut alias_dotted = HashMap::new();
        let mut alias_flattened = HashMap::new();
        for (position, alias) in aliases.iter().enumerate() {
            alias_dotted.insert(format!("{}.weight", alias.module), position);
            alias_flattened.insert(alias.module.replace('.', "_"), position);
        }
        Self {
            dotted,
            flattened,
            aliases,
            alias_dotted,
            alias_flattened,
        }
    }

    /// The tensor named `name` exactly.
    pub fn tensor(&self, name: &str) -> Option<usize> {
        self.dotted.get(name).copied()
    }

    /// Where `module` lands: the model's own names win over its aliases.
    pub fn find(&self, module: &str, naming: Naming) -> Option<Found<'a>> {
        if let Some(tensor) = lookup(module, naming, &self.dotted, &self.flattened) {
            return Some(Found::Own(tensor));
        }
        lookup(module, naming, &self.alias_dotted, &self.alias_flattened)
            .map(|alias| Found::Alias(&self.aliases[alias]))
    }
}

/// Whether a dotted name's component is a block's (or list entry's) number.
pub fn is_number(component: &str) -> bool {
    !component.is_empty() && component.bytes().all(|byte| byte.is_ascii_digit())
}

/// `module` in one vocabulary: for PEFT the full path, then with leading components
/// (`base_model.model.`, `transformer.`, …) dropped one at a time, each also under a
/// ComfyUI file's prefix, but never a block's number; for kohya the name behind its
/// prefix, flattened.
fn lookup(
    module: &str,
    naming: Naming,
    dotted: &HashMap<String, usize>,
    flattened: &HashMap<String, usize>,
) -> Option<usize> {
    match naming {
        Naming::Peft => {
            let mut rest = module;
            loop {
                for under in ["", COMFY_UNDER] {
                    if let Some(&found) = dotted.get(&format!("{under}{rest}.weight")) {
                        return Some(found);
                    }
                }
                let (dropped, next) = rest.split_once('.')?;
                // A block's number says which block: the name without it is another
                // module (`single_transformer_blocks.7.proj_out` of a model with two
                // single blocks is not Flux's final `proj_out`).
                if is_number(dropped) {
                    return None;
                }
                rest = next;
            }
        }
        Naming::Kohya => {
            let comfy = COMFY_UNDER.replace('.', "_");
            KOHYA_PREFIXES.iter().find_map(|prefix| {
                let rest = module.strip_prefix(prefix)?;
                flattened
                    .get(rest)
                    .or_else(|| flattened.get(&format!("{comfy}{rest}")))
                    .copied()
            })
        }
    }
}

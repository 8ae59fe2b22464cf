//! Grouping tensors into blocks by name, and ordering the blocks as a forward pass
//! walks them.
//!
//! A block is the unit the scheduler moves: one transformer layer, plus a `head` for
//! what comes before the first layer and a `tail` for everything else.

use std::collections::HashMap;
use std::sync::OnceLock;

use regex::Regex;

use super::error::IndexError;

/// The numbered-layer prefixes of common checkpoints. Matched at the start of a name or
/// after a dot, so `double_blocks.3.` is not mistaken for `blocks.3.`.
const BUILT_IN_PATTERN: &str = r"(?:^|\.)(?:layers|blocks|block|h|layer|double_blocks|single_blocks|transformer_blocks|single_transformer_blocks)\.(\d{1,18})(?:\.|$)";

/// Mixture-of-experts tensors: `experts.N.` anywhere (covers `block_sparse_moe.experts.N.`
/// and `mlp.experts.N.`).
const EXPERT_PATTERN: &str = r"(?:^|\.)experts\.(\d{1,9})(?:\.|$)";

pub(crate) const HEAD_BLOCK: &str = "head";
pub(crate) const TAIL_BLOCK: &str = "tail";

/// Where a tensor belongs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BlockKey {
    /// Tensors of one group are numbered together (`model.layers.`); groups are
    /// ordered by where they first appear in the files.
    group: String,
    name: String,
    index: Option<u64>,
}

pub(crate) struct BlockMatcher {
    regex: Regex,
    built_in: bool,
    experts: Regex,
}

/// A fixed pattern, compiled once per process (a clone of a `Regex` shares it).
fn compiled(
    cell: &'static OnceLock<Result<Regex, String>>,
    pattern: &'static str,
) -> Result<Regex, IndexError> {
    cell.get_or_init(|| Regex::new(pattern).map_err(|error| error.to_string()))
        .clone()
        .map_err(|problem| IndexError::BlockPattern {
            pattern: pattern.to_string(),
            problem,
        })
}

impl BlockMatcher {
    pub fn new(custom_pattern: Option<&str>) -> Result<Self, IndexError> {
        static EXPERTS: OnceLock<Result<Regex, String>> = OnceLock::new();
        static BUILT_IN: OnceLock<Result<Regex, String>> = OnceLock::new();
        let experts = compiled(&EXPERTS, EXPERT_PATTERN)?;
        let Some(pattern) = custom_pattern else {
            let regex = compiled(&BUILT_IN, BUILT_IN_PATTERN)?;
            return Ok(Self {
                regex,
                built_in: true,
                experts,
            });
        };
        let regex = Regex::new(pattern).map_err(|error| IndexError::BlockPattern {
            pattern: pattern.to_string(),
            // The regex crate's messages span several lines; keep ours to one.
            problem: format!(
                "not a valid regex: {}",
                error.to_string().lines().last().unwrap_or("")
            ),
        })?;
        if regex.captures_len() < 2 {
            return Err(IndexError::BlockPattern {
                pattern: pattern.to_string(),
                problem:
                    "needs a capture group; its text is the block key, e.g. `layers\\.(\\d+)\\.`"
                        .to_string(),
            });
        }
        Ok(Self {
            regex,
            built_in: false,
            experts,
        })
    }

    fn key(&self, tensor_name: &str) -> Option<BlockKey> {
        let captures = self.regex.captures(tensor_name)?;
        let key = captures.get(1)?;
        if self.built_in {
            let index = key.as_str().parse::<u64>().ok()?;
            return Some(BlockKey {
                group: tensor_name[..key.start()].to_string(),
                name: tensor_name[..key.end()].to_string(),
                index: Some(index),
            });
        }
        Some(BlockKey {
            group: String::new(),
            name: key.as_str().to_string(),
            index: key.as_str().parse::<u64>().ok(),
        })
    }

    pub fn expert(&self, tensor_name: &str) -> Option<u32> {
        let captures = self.experts.captures(tensor_name)?;
        captures.get(1)?.as_str().parse().ok()
    }
}

/// The result of grouping: block names and indices in forward order, and for each
/// tensor (in the order given) the position of its block.
pub(crate) struct Grouping {
    pub blocks: Vec<(String, Option<u64>)>,
    pub block_of_tensor: Vec<usize>,
}

/// Groups tensor names (given in file order) into blocks ordered head, numbered blocks
/// (by group in order of first appearance, then by index), tail.
pub(crate) fn group(matcher: &BlockMatcher, names_in_file_order: &[&str]) -> Grouping {
    const HEAD: usize = usize::MAX;
    const TAIL: usize = usize::MAX - 1;
    let mut keys: Vec<BlockKey> = Vec::new();
    let mut key_position: HashMap<(String, String), usize> = HashMap::new();
    let mut group_rank: HashMap<String, usize> = HashMap::new();
    let mut seen_block = false;
    let mut provisional = Vec::with_capacity(names_in_file_order.len());
    for name in names_in_file_order {
        let Some(key) = matcher.key(name) else {
            provisional.push(if seen_block { TAIL } else { HEAD });
            continue;
        };
        seen_block = true;
        let next_rank = group_rank.len();
        group_rank.entry(key.group.clone()).or_insert(next_rank);
        let lookup = (key.group.clone(), key.name.clone());
        let position = *key_position.entry(lookup).or_insert_with(|| {
            keys.push(key);
            keys.len() - 1
        });
        provisional.push(position);
    }

    // Forward order: group rank, then numeric index (unnumbered custom keys last), then
    // first appearance.
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by_key(|&position| {
        let key = &keys[position];
        (
            group_rank.get(&key.group).copied().unwrap_or(usize::MAX),
            key.index.is_none(),
            key.index.unwrap_or(0),
            position,
        )
    });

    let has_head = provisional.contains(&HEAD);
    let has_tail = provisional.contains(&TAIL);
    let mut blocks = Vec::with_capacity(keys.len() + 2);
    let mut final_position = vec![0usize; keys.len()];
    if has_head {
        blocks.push((HEAD_BLOCK.to_string(), None));
    }
    for &position in &order {
        final_position[position] = blocks.len();
        blocks.push((keys[position].name.clone(), keys[position].index));
    }
    let tail_position = blocks.len();
    if has_tail {
        blocks.push((TAIL_BLOCK.to_string(), None));
    }
    let block_of_tensor = provisional
        .iter()
        .map(|&position| match position {
            HEAD => 0,
            TAIL => tail_position,
            numbered => final_position[numbered],
        })
        .collect();
    Grouping {
        blocks,
        block_of_tensor,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(grouping: &Grouping) -> Vec<&str> {
        grouping
            .blocks
            .iter()
            .map(|(name, _)| name.as_str())
            .collect()
    }

    #[test]
    fn llama_names_group_by_layer_in_numeric_order() {
        // Proves numbered layers sort numerically (2 before 10) between head and tail.
        let matcher = BlockMatcher::new(None).expect("built-in pattern compiles");
        let tensors = [
            "model.embed_tokens.weight",
            "model.layers.10.mlp.weight",
            "model.layers.2.mlp.weight",
            "model.layers.2.attn.weight",
            "model.norm.weight",
        ];
        let grouping = group(&matcher, &tensors);
        assert_eq!(
            names(&grouping),
            ["head", "model.layers.2", "model.layers.10", "tail"]
        );
        assert_eq!(grouping.block_of_tensor, [0, 2, 1, 1, 3]);
    }

    #[test]
    fn double_and_single_blocks_are_separate_groups() {
        // Proves `double_blocks.0` and `single_blocks.0` are different blocks, double first.
        let matcher = BlockMatcher::new(None).expect("built-in pattern compiles");
        let tensors = [
            "double_blocks.1.img_attn.weight",
            "double_blocks.0.img_attn.weight",
            "final_layer.linear.weight",
            "single_blocks.0.linear1.weight",
        ];
        let grouping = group(&matcher, &tensors);
        assert_eq!(
            names(&grouping),
            [
                "double_blocks.0",
                "double_blocks.1",
                "single_blocks.0",
                "tail"
            ]
        );
    }

    #[test]
    fn custom_pattern_keys_blocks_by_first_capture() {
        // Proves a user regex overrides the prefixes and its first group is the key.
        let matcher = BlockMatcher::new(Some(r"^stage(\d+)_")).expect("valid pattern");
        let tensors = ["stem.w", "stage1_a.w", "stage0_a.w", "stage1_b.w"];
        let grouping = group(&matcher, &tensors);
        assert_eq!(names(&grouping), ["head", "0", "1"]);
        assert_eq!(grouping.block_of_tensor, [0, 2, 1, 2]);
    }

    #[test]
    fn pattern_without_capture_group_is_rejected() {
        // Proves a regex with no group is refused with a message saying why.
        let Err(error) = BlockMatcher::new(Some(r"layers\.\d+")) else {
            panic!("a pattern without a capture group must be rejected");
        };
        assert!(error.to_string().contains("capture group"), "{error}");
    }

    #[test]
    fn experts_are_recognised_inside_their_layer() {
        // Proves expert tensors keep their layer's block and record the expert number.
        let matcher = BlockMatcher::new(None).expect("built-in pattern compiles");
        let name = "model.layers.3.block_sparse_moe.experts.7.w1.weight";
        assert_eq!(matcher.expert(name), Some(7));
        assert_eq!(matcher.expert("model.layers.3.mlp.gate.weight"), None);
        let grouping = group(&matcher, &[name]);
        assert_eq!(names(&grouping), ["model.layers.3"]);
    }
}

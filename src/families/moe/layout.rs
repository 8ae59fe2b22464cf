//! The generated mixture-of-experts demo model as the scheduler sees it: dense blocks
//! in the step order, each expert a unit of its own outside it.

use stagehand_actors::{BlockId, BlockLayout, Extent, FileId, ModelLayout};

use crate::families::FamilyError;
use crate::model::demo_moe::MoeSpec;
use crate::model::ModelIndex;

/// The scheduler's units: dense blocks `0..layers` (the step order), then each expert
/// as its own unit at `layers + layer·experts + expert`.
#[derive(Debug, Clone)]
pub struct MoeLayout {
    pub spec: MoeSpec,
    pub layout: ModelLayout,
    /// Where the router starts inside a dense block's buffer.
    pub router_offset: u64,
}

impl MoeLayout {
    pub fn new(index: &ModelIndex, spec: MoeSpec) -> Result<Self, FamilyError> {
        let extent = |name: &str, shape: [u32; 2]| -> Result<Extent, FamilyError> {
            let tensor = index.tensor(name).ok_or_else(|| {
                FamilyError::missing_tensor(
                    &index.path,
                    name,
                    format!("{}: tensor {name} is missing", index.path.display()),
                )
            })?;
            let expected = [shape[0] as usize, shape[1] as usize];
            if tensor.dtype != "F32" || tensor.shape != expected {
                let message = format!(
                    "{name}: expected F32 {expected:?}, found {} {:?}",
                    tensor.dtype, tensor.shape
                );
                let wanted = ("F32", &expected[..]);
                return Err(FamilyError::tensor_not(
                    &index.path,
                    tensor,
                    wanted,
                    message,
                ));
            }
            Ok(Extent {
                file: FileId(tensor.file as u32),
                offset: tensor.offset,
                length: tensor.bytes,
            })
        };
        let mut blocks = Vec::new();
        for layer in 0..spec.layers {
            let dense = extent(&MoeSpec::dense_name(layer), [spec.dim, spec.dim])?;
            let router = extent(&MoeSpec::router_name(layer), [spec.experts, spec.dim])?;
            blocks.push(BlockLayout::new(
                format!("layers.{layer}"),
                vec![dense, router],
            ));
        }
        for layer in 0..spec.layers {
            for expert in 0..spec.experts {
                let weight = extent(&MoeSpec::expert_name(layer, expert), [spec.dim, spec.dim])?;
                blocks.push(BlockLayout::new(
                    format!("layers.{layer}.experts.{expert}"),
                    vec![weight],
                ));
            }
        }
        Ok(Self {
            spec,
            layout: ModelLayout { blocks },
            router_offset: spec.expert_bytes(),
        })
    }

    pub fn dense_block(&self, layer: u32) -> BlockId {
        BlockId(layer)
    }

    pub fn expert_block(&self, layer: u32, expert: u32) -> BlockId {
        BlockId(self.spec.layers + layer * self.spec.experts + expert)
    }

    pub fn order(&self) -> Vec<BlockId> {
        (0..self.spec.layers).map(BlockId).collect()
    }

    pub fn dense_bytes(&self) -> u64 {
        self.layout.blocks[0].bytes
    }
}

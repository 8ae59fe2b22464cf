//! A step's activations beside the weights, as a family computes them from the shapes
//! of the tensors its blocks use: what a run reserves through the activation path,
//! and the working set of each kind of block. `stagehand sample` reports them and the
//! simulator's description of the same model carries them, from the same function.

use serde::Serialize;

/// A step's activation tensors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Activations {
    /// Every tensor of a step: what a run allocates once and reserves before its first
    /// block.
    pub reserved_bytes: u64,
    /// Each kind of block, in step order, with the bytes of the tensors live while
    /// one block of that kind runs (those it reads or writes, and those holding values
    /// a later block reads).
    pub peaks: Vec<BlockKindPeak>,
}

/// The working set of one kind of block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockKindPeak {
    /// "embedders", "double block", …
    pub kind: String,
    /// Blocks of this kind in a step.
    pub blocks: u64,
    pub bytes: u64,
}

impl Activations {
    /// The largest working set of any kind of block.
    pub fn peak_bytes(&self) -> u64 {
        self.peaks.iter().map(|peak| peak.bytes).max().unwrap_or(0)
    }

    /// `embedders 1.20 MiB, double block 3.40 MiB, …`, for summaries.
    pub fn describe_peaks(&self) -> String {
        let peaks: Vec<String> = self
            .peaks
            .iter()
            .map(|peak| format!("{} {}", peak.kind, stagehand_actors::Bytes(peak.bytes)))
            .collect();
        peaks.join(", ")
    }
}

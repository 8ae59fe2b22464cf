//! The small linear-stack demo model the end-to-end tests run: big enough to stream
//! through a budget below its size, small enough that a debug build computes a step in
//! milliseconds.

use std::path::{Path, PathBuf};

use stagehand::model::demo::{write_linear_stack, DemoSpec};

/// 8 blocks × 2 layers × 256×256 f32 = 8 × 512 KiB (4 MiB in all).
pub fn small_demo_spec() -> DemoSpec {
    DemoSpec {
        blocks: 8,
        layers_per_block: 2,
        dim: 256,
        seed: 7,
    }
}

/// Writes the small demo model into `dir`; returns the model file.
pub fn small_demo_model(dir: &Path) -> PathBuf {
    write_linear_stack(dir, &small_demo_spec()).expect("demo model is written")
}

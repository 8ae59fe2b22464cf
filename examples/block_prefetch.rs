//! An engine that keeps its own model code and lets stagehand move the weights: the
//! block-prefetch API (the shape ComfyUI's "block prefetch" gives a model). The
//! engine names each step's blocks in order, then for each block `acquire`s it (the
//! actors have usually loaded it already), computes on its bytes, and `release`s it;
//! meanwhile the next blocks stream disk → pinned RAM → VRAM inside the budgets.
//!
//!     cargo run --example block_prefetch [STEPS]
//!
//! The model is the generated linear stack (blocks of f32 `dim × dim` layers, each
//! `x ← x·Wᵀ` then an RMS norm). The engine's forward pass is its own plain loops; it
//! checks every streamed step against the same pass over the file's bytes.

use std::error::Error;

use stagehand::{BlockId, Budgets, DemoSpec, ModelIndex, Settings};

fn main() -> Result<(), Box<dyn Error>> {
    let steps: u64 = match std::env::args().nth(1) {
        Some(steps) => steps.parse()?,
        None => 3,
    };
    let scratch =
        std::env::temp_dir().join(format!("stagehand-block-prefetch-{}", std::process::id()));
    let spec = DemoSpec {
        blocks: 8,
        layers_per_block: 2,
        dim: 128,
        seed: 11,
    };
    let path = stagehand::write_linear_stack(&scratch, &spec)?;
    let index = ModelIndex::open(&path, None)?;
    let block_bytes = spec.block_bytes();
    // VRAM for 3 of the 8 blocks and pinned RAM for 4: most of the model streams.
    let budgets = Budgets {
        vram_budget_bytes: 3 * block_bytes,
        pin_ceiling_bytes: 4 * block_bytes,
    };
    let settings = Settings {
        prefetch_depth: 1,
        ..Settings::default()
    };
    let order: Vec<BlockId> = (0..spec.blocks).map(BlockId).collect();
    let expected = resident_pass(&index, &spec)?;
    let mut session = stagehand::block_session(&index, &settings, budgets, order.clone())?;
    let mut verified = 0;
    for _ in 0..steps {
        let mut x = input(&spec);
        for &block in &order {
            let handle = session.acquire(block)?;
            let bytes = session
                .host_bytes(&handle)
                .ok_or("the CPU backend keeps blocks in host memory")?;
            forward_block(&spec, bytes, &mut x);
            session.release(handle);
        }
        session.step_done();
        verified += u64::from(x == expected);
    }
    let stats = session.finish();
    println!(
        "{steps} steps over {} blocks: {verified} equal to the resident pass bit for bit; {} copied to VRAM, {} read from disk; budgets back to {} VRAM and {} pinned",
        spec.blocks,
        stagehand::actors::Bytes(stats.pinned_to_vram.model_bytes),
        stagehand::actors::Bytes(stats.disk_to_pinned.model_bytes),
        stagehand::actors::Bytes(stats.vram.used_bytes),
        stagehand::actors::Bytes(stats.pinned.used_bytes),
    );
    let _ = std::fs::remove_dir_all(&scratch);
    if verified != steps {
        return Err("a streamed step differed from the resident pass".into());
    }
    Ok(())
}

/// The step's input: the same every step.
fn input(spec: &DemoSpec) -> Vec<f32> {
    (0..spec.dim).map(|i| (i as f32 * 0.37).sin()).collect()
}

/// The engine's own compute of one block: each layer `x ← rmsnorm(x·Wᵀ)`, with `W`
/// read from the block's bytes (f32, row-major, the layers one after another).
fn forward_block(spec: &DemoSpec, bytes: &[u8], x: &mut Vec<f32>) {
    let dim = spec.dim as usize;
    for layer in bytes.chunks_exact(dim * dim * 4) {
        let mut y: Vec<f32> = layer
            .chunks_exact(dim * 4)
            .map(|row| {
                row.chunks_exact(4)
                    .zip(x.iter())
                    .map(|(w, x)| f32::from_le_bytes([w[0], w[1], w[2], w[3]]) * x)
                    .sum()
            })
            .collect();
        let mean_square = y.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let scale = 1.0 / (mean_square + 1e-6).sqrt();
        y.iter_mut().for_each(|v| *v *= scale);
        *x = y;
    }
}

/// The same pass over the blocks read straight from the file.
fn resident_pass(index: &ModelIndex, spec: &DemoSpec) -> Result<Vec<f32>, Box<dyn Error>> {
    let mut x = input(spec);
    for block in &index.blocks {
        let mut bytes = Vec::with_capacity(block.bytes as usize);
        for extent in &block.extents {
            let file = &index.files[extent.file.0 as usize];
            let mut part = vec![0u8; extent.length as usize];
            std::os::unix::fs::FileExt::read_exact_at(
                &std::fs::File::open(&file.path)?,
                &mut part,
                extent.offset,
            )?;
            bytes.extend_from_slice(&part);
        }
        forward_block(spec, &bytes, &mut x);
    }
    Ok(x)
}

//! `stagehand demo-model --out DIR`: writes the deterministic linear-stack model that
//! `stagehand run` streams.

use std::path::PathBuf;
use std::time::Instant;

use bytesize::ByteSize;

use super::{CommandResult, Failure};
use crate::lora::{write_demo_lora, DemoLora, LoraDtype};
use crate::model::demo::{write_linear_stack, DemoError, DemoSpec};

#[derive(Debug, clap::Args)]
pub struct DemoModelArgs {
    /// Folder to write linear-stack.safetensors into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Number of blocks (the unit the scheduler streams).
    #[arg(long, default_value_t = DemoSpec::default().blocks)]
    pub blocks: u32,
    /// Linear layers per block.
    #[arg(long, default_value_t = DemoSpec::default().layers_per_block)]
    pub layers_per_block: u32,
    /// Width of every layer: each weight is dim x dim f32.
    #[arg(long, default_value_t = DemoSpec::default().dim)]
    pub dim: u32,
    /// Seed of the weights; the same seed always writes the same bytes.
    #[arg(long, default_value_t = DemoSpec::default().seed)]
    pub seed: u64,
    /// Also write a PEFT-style LoRA adapter for this model here, for `run --lora FILE`.
    #[arg(long, value_name = "FILE")]
    pub lora_out: Option<PathBuf>,
    /// Rank of the adapter written with --lora-out.
    #[arg(long, default_value_t = 8)]
    pub lora_rank: usize,
    /// Precision of the adapter's factors: the same seeded values, rounded to nearest.
    #[arg(long, value_enum, default_value_t = LoraDtype::F32)]
    pub lora_dtype: LoraDtype,
}

pub fn execute(args: DemoModelArgs) -> CommandResult {
    let spec = DemoSpec {
        blocks: args.blocks,
        layers_per_block: args.layers_per_block,
        dim: args.dim,
        seed: args.seed,
    };
    let lora = DemoLora {
        rank: args.lora_rank,
        dtype: args.lora_dtype,
        ..DemoLora::default()
    };
    if let Some(lora_path) = &args.lora_out {
        // Refused before the model is written, not after.
        lora.validate(lora_path, &spec)
            .map_err(Failure::bad_input)?;
    }
    let started = Instant::now();
    let path = write_linear_stack(&args.out, &spec).map_err(|error| match error {
        DemoError::InvalidSpec(_) => Failure::bad_input(error),
        DemoError::Io { .. } => Failure::run_failed(error),
    })?;
    println!(
        "wrote {} ({} blocks x {} layers x {}x{} f32 = {}, seed {}) in {:.2} s",
        path.display(),
        spec.blocks,
        spec.layers_per_block,
        spec.dim,
        spec.dim,
        ByteSize::b(spec.total_bytes()),
        spec.seed,
        started.elapsed().as_secs_f64()
    );
    if let Some(lora_path) = &args.lora_out {
        let bytes = write_demo_lora(lora_path, &spec, &lora).map_err(Failure::bad_input)?;
        println!(
            "wrote {} (rank {} {:?} LoRA, {}); try: stagehand run --model {} --lora {}:0.8",
            lora_path.display(),
            lora.rank,
            lora.dtype,
            ByteSize::b(bytes),
            path.display(),
            lora_path.display()
        );
    }
    Ok(())
}

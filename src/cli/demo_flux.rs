//! `stagehand demo-model --arch flux`: a generated Flux transformer in one of the
//! three layouts, and with `--cond-out` a conditioning file for `stagehand sample`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use stagehand_actors::Bytes;

use super::{CommandResult, Failure};
use stagehand::compute::DType;
use stagehand::families::flux::{write_conditioning, FluxDemo, FluxPreset, Layout};

#[derive(Debug, clap::Args)]
pub struct FluxArgs {
    /// `--arch flux`: the shapes (tiny, tiny-schnell, small; full-depth: Flux's 19 + 38 blocks at width 256).
    #[arg(long, value_enum, default_value = "tiny")]
    pub flux_preset: FluxPreset,
    /// `--arch flux`: how the checkpoint names its tensors.
    #[arg(long, value_enum, default_value = "diffusers")]
    pub layout: Layout,
    /// `--arch flux`: also write a seeded conditioning file (T5 states and pooled vector) here.
    #[arg(long, value_name = "FILE")]
    pub cond_out: Option<PathBuf>,
    /// Text tokens of the conditioning file written with --cond-out.
    #[arg(long, default_value_t = 64)]
    pub cond_tokens: usize,
}

pub fn write(out: &Path, args: &FluxArgs, dtype: DType, seed: u64) -> CommandResult {
    let quantized = matches!(dtype, DType::F8E4M3 | DType::I8 | DType::U4);
    if quantized && args.layout == Layout::Diffusers {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--dtype fp8, int8 and awq write ComfyUI's quantized formats (a scale per layer), which diffusers folders do not hold; use --layout original or comfyui"
        )));
    }
    if args.cond_tokens == 0 {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--cond-tokens must be at least 1"
        )));
    }
    let demo = FluxDemo {
        preset: args.flux_preset,
        layout: args.layout,
        dtype,
        seed,
    };
    let started = Instant::now();
    let path = demo
        .write(out)
        .map_err(|error| Failure::run_failed(anyhow::anyhow!("{}: {error}", out.display())))?;
    let shape = args.flux_preset.shape();
    println!(
        "wrote {} (Flux {:?}, {} layout: {} double + {} single blocks of {}, {} heads of {}, guidance {}, {dtype} weights = {}, seed {seed}) in {:.2} s",
        path.display(),
        args.flux_preset,
        args.layout.describe(),
        shape.double_blocks,
        shape.single_blocks,
        shape.hidden(),
        shape.heads,
        shape.head_dim,
        if shape.guidance { "yes (dev)" } else { "no (schnell)" },
        Bytes(demo.weight_bytes()),
        started.elapsed().as_secs_f64()
    );
    if let Some(cond) = &args.cond_out {
        write_conditioning(cond, &shape, args.cond_tokens, seed ^ 0xc0_4d)
            .map_err(|error| Failure::run_failed(anyhow::anyhow!("{}: {error}", cond.display())))?;
        println!(
            "wrote {} ({} text tokens of {}, pooled {}); try: stagehand sample --model {} --cond {} --width 256 --height 256 --steps 4 --out latent.safetensors",
            cond.display(),
            args.cond_tokens,
            shape.context_dim,
            shape.pooled_dim,
            path.display(),
            cond.display()
        );
    }
    Ok(())
}

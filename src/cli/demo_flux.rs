//! `stagehand demo-model --arch flux`: a generated Flux transformer in one of the
//! three layouts, with `--cond-out` a conditioning file for `stagehand sample`, and
//! with `--lora-out` a seeded kohya-named adapter for it (`stagehand sample --lora`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use stagehand_actors::Bytes;

use super::{CommandResult, Failure};
use stagehand::compute::DType;
use stagehand::families::flux::{
    lora_modules, write_conditioning, write_flux_lora_in, FluxDemo, FluxLoraNaming, FluxPreset,
    Layout,
};
use stagehand::lora::LoraDtype;

#[derive(Debug, clap::Args)]
pub struct FluxArgs {
    /// `--arch flux`: the shapes (tiny, tiny-schnell, small; full-depth: Flux's 19 + 38 blocks at width 256; full-depth-wide: the same at width 1024 with Flux's head size, 2.4 GiB in BF16; dev: FLUX.1-dev's own shape, 22.2 GiB in BF16, 11.1 GiB in FP8).
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

/// `--lora-out FILE` for a Flux model: where, of what rank, in what dtype.
pub struct FluxLoraOut<'a> {
    pub path: &'a Path,
    pub rank: usize,
    pub dtype: LoraDtype,
}

pub fn write(
    out: &Path,
    args: &FluxArgs,
    dtype: DType,
    seed: u64,
    lora: Option<FluxLoraOut<'_>>,
) -> CommandResult {
    let refuse = |message: String| Err(Failure::bad_input(anyhow::anyhow!(message)));
    let quantized = matches!(dtype, DType::F8E4M3 | DType::I8 | DType::U4);
    if quantized && args.layout == Layout::Diffusers {
        return refuse(
            "--dtype fp8, int8 and awq write ComfyUI's quantized formats (a scale per layer), which diffusers folders do not hold; use --layout original or comfyui".to_string(),
        );
    }
    if args.cond_tokens == 0 {
        return refuse("--cond-tokens must be at least 1".to_string());
    }
    let shape = args.flux_preset.shape();
    if let Some(lora) = &lora {
        // Refused before the model is written, not after.
        if matches!(dtype, DType::I8 | DType::U4) {
            return refuse(
                "--lora-out: stagehand does not patch integer-quantized weights (--dtype int8, awq) with a LoRA; use --dtype bf16, f16, f32 or fp8".to_string(),
            );
        }
        if lora.rank > shape.hidden() {
            return refuse(format!(
                "--lora-rank must be between 1 and the hidden size {} of --flux-preset {:?}",
                shape.hidden(),
                args.flux_preset
            ));
        }
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
    if let Some(lora) = lora {
        write_lora(&lora, &shape, seed, &path, args.cond_out.as_deref())?;
    }
    Ok(())
}

/// Writes the kohya-named adapter (the original layout's module names, which
/// stagehand maps onto any layout) and says how to sample with it.
fn write_lora(
    lora: &FluxLoraOut<'_>,
    shape: &stagehand::families::flux::FluxShape,
    seed: u64,
    model: &Path,
    cond: Option<&Path>,
) -> CommandResult {
    let naming = FluxLoraNaming::Kohya;
    let bytes = write_flux_lora_in(
        lora.path,
        shape,
        naming,
        lora.rank,
        seed ^ super::demo_model::LORA_SEED_MIX,
        lora.dtype,
    )
    .map_err(|error| Failure::run_failed(anyhow::anyhow!("{}: {error}", lora.path.display())))?;
    let cond = cond.map_or_else(
        || "FILE (write one with --cond-out)".to_string(),
        |cond| cond.display().to_string(),
    );
    println!(
        "wrote {} (kohya rank {} {:?} LoRA on {} modules, {}); try: stagehand sample --model {} --cond {cond} --lora {}:0.8 --width 256 --height 256 --steps 4 --out latent.safetensors",
        lora.path.display(),
        lora.rank,
        lora.dtype,
        lora_modules(shape, naming).len(),
        Bytes(bytes),
        model.display(),
        lora.path.display()
    );
    Ok(())
}

//! `stagehand demo-model --out DIR`: writes the deterministic linear-stack model that
//! `stagehand run` streams, or (`--arch bert`) a Hugging Face encoder folder with real
//! BERT shapes and names and seeded weights.

use std::path::PathBuf;
use std::time::Instant;

use stagehand_actors::Bytes;

use super::{CommandResult, Failure};
use stagehand::compute::DType;
use stagehand::families::bert::{write_bert_folder, write_bert_lora, BertDemo, BertPreset};
use stagehand::families::llama::{write_decoder_folder, DecoderArch, DecoderDemo, DecoderPreset};
use stagehand::families::t5::{Umt5Demo, Umt5Preset};
use stagehand::families::wan::{WanDemo, WanPreset};
use stagehand::lora::{write_demo_lora, DemoLora, LoraDtype};
use stagehand::model::demo::{write_linear_stack, DemoError, DemoSpec};

/// Which model `demo-model` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    /// The linear-stack demo model (one safetensors file).
    LinearStack,
    /// A BERT encoder folder (config.json, weights, tokenizer.json, sentence-transformers head).
    Bert,
    /// A RoBERTa encoder folder (`--preset base`: roberta-base's shapes, 514 positions).
    Roberta,
    /// A Llama decoder folder (byte-level tokenizer.json; `1b` has Llama-3.2-1B's shapes).
    Llama,
    /// A Mixtral decoder folder: 8 experts, top-2.
    Mixtral,
    /// A Qwen3 decoder folder (per-head q/k norms; `1b` has Qwen3-0.6B's shapes).
    Qwen3,
    /// A Qwen3-MoE decoder folder: top-4 of 16 (small: 32) experts, renormalised.
    Qwen3Moe,
    /// A Qwen2-MoE decoder folder: top-4 of 12 (small: 20) experts and a shared expert.
    Qwen2Moe,
    /// A Flux.1 diffusion transformer (`--flux-preset`, `--layout`; `--cond-out` writes a conditioning file).
    Flux,
    /// A WAN 2.2 video transformer as diffusers writes it (`--wan-preset`).
    Wan,
    /// A umT5 text encoder folder as transformers writes it (`--umt5-preset`; no tokenizer).
    Umt5,
}

/// Storage dtype of a generated folder's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DTypeArg {
    F32,
    F16,
    Bf16,
    /// Decoders, Flux and WAN: linear weights in F8_E4M3 with per-tensor F32 scales.
    Fp8,
    /// Flux: linear weights as ComfyUI's int8_tensorwise (I8, one F32 scale each).
    Int8,
    /// Flux: linear weights as ComfyUI's awq_w4a16 (4-bit, BF16 scale and zero per group of 64 inputs).
    Awq,
}

impl DTypeArg {
    pub(super) fn dtype(self) -> DType {
        match self {
            DTypeArg::F32 => DType::F32,
            DTypeArg::F16 => DType::F16,
            DTypeArg::Bf16 => DType::Bf16,
            DTypeArg::Fp8 => DType::F8E4M3,
            DTypeArg::Int8 => DType::I8,
            DTypeArg::Awq => DType::U4,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct DemoModelArgs {
    /// Folder to write the model into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// What to write.
    #[arg(long, value_enum, default_value = "linear-stack")]
    pub arch: Arch,
    /// `--arch bert`: the shapes (tiny: tests; base and large: BERT-base/large).
    #[arg(long, value_enum, default_value = "tiny")]
    pub preset: BertPreset,
    /// Decoders (`--arch llama|mixtral|qwen3|qwen3-moe|qwen2-moe`): the shapes (tiny,
    /// small; 1b = Llama-3.2-1B's, Qwen3-0.6B's for qwen3).
    #[arg(long, value_enum, default_value = "tiny")]
    pub decoder_preset: DecoderPreset,
    /// Storage dtype of the weights (bert, decoders, flux, wan); fp8 for decoders, flux and wan, int8 and awq for flux.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DTypeArg,
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
    /// Also write a LoRA adapter for this model here: PEFT-style for `run --lora FILE` (a PEFT folder for bert and roberta), kohya-named for flux's `sample --lora FILE`.
    #[arg(long, value_name = "FILE")]
    pub lora_out: Option<PathBuf>,
    /// Rank of the adapter written with --lora-out.
    #[arg(long, default_value_t = 8)]
    pub lora_rank: usize,
    /// Precision of the adapter's factors: the same seeded values, rounded to nearest.
    #[arg(long, value_enum, default_value_t = LoraDtype::F32)]
    pub lora_dtype: LoraDtype,
    #[command(flatten)]
    pub flux: super::demo_flux::FluxArgs,
    /// `--arch wan`: the shapes (tiny, small; a14b: one Wan 2.2 T2V-A14B expert, 26.6 GiB in BF16; i2v-a14b: the I2V expert, 36 channels in; ti2v5b: TI2V-5B; ti2v-tiny: tiny with TI2V's 48 channels).
    #[arg(long, value_enum, default_value = "tiny")]
    pub wan_preset: WanPreset,
    /// `--arch umt5`: the shapes (tiny; xxl: umT5-XXL's encoder, Wan 2.2's text encoder, 10.6 GiB in BF16).
    #[arg(long, value_enum, default_value = "tiny")]
    pub umt5_preset: Umt5Preset,
}

/// Seeds an adapter apart from its model's weights (same `--seed`, other values).
pub(super) const LORA_SEED_MIX: u64 = 0x4c6f_5241;

pub fn execute(args: DemoModelArgs) -> CommandResult {
    check_arguments(&args)?;
    match args.arch {
        Arch::Bert => return write_bert(&args, false),
        Arch::Roberta => return write_bert(&args, true),
        Arch::Llama => return write_decoder(&args, DecoderArch::Llama),
        Arch::Mixtral => return write_decoder(&args, DecoderArch::Mixtral),
        Arch::Qwen3 => return write_decoder(&args, DecoderArch::Qwen3),
        Arch::Qwen3Moe => return write_decoder(&args, DecoderArch::Qwen3Moe),
        Arch::Qwen2Moe => return write_decoder(&args, DecoderArch::Qwen2Moe),
        Arch::Flux => {
            let lora = args
                .lora_out
                .as_deref()
                .map(|path| super::demo_flux::FluxLoraOut {
                    path,
                    rank: args.lora_rank,
                    dtype: args.lora_dtype,
                });
            return super::demo_flux::write(
                &args.out,
                &args.flux,
                args.dtype.dtype(),
                args.seed,
                lora,
            );
        }
        Arch::Wan => return write_wan(&args),
        Arch::Umt5 => return write_umt5(&args),
        Arch::LinearStack => {}
    }
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
        Bytes(spec.total_bytes()),
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
            Bytes(bytes),
            path.display(),
            lora_path.display()
        );
    }
    Ok(())
}

/// What every arch refuses before writing anything: an `--out` that is not a folder,
/// an adapter flag the arch does not write, a rank of 0.
fn check_arguments(args: &DemoModelArgs) -> CommandResult {
    let refuse = |message: String| Err(Failure::bad_input(anyhow::anyhow!(message)));
    if args.out.exists() && !args.out.is_dir() {
        return refuse(format!(
            "--out {}: not a folder (it is a file); give the folder to write into (made if missing)",
            args.out.display()
        ));
    }
    let writes_adapters = matches!(
        args.arch,
        Arch::LinearStack | Arch::Bert | Arch::Roberta | Arch::Flux
    );
    if args.lora_out.is_some() && !writes_adapters {
        return refuse(format!(
            "--lora-out writes adapters for --arch linear-stack, bert, roberta and flux only; leave it out for --arch {}",
            clap::ValueEnum::to_possible_value(&args.arch)
                .map_or_else(String::new, |value| value.get_name().to_string())
        ));
    }
    if let Some(lora_out) = args.lora_out.as_ref().filter(|path| path.is_dir()) {
        if matches!(args.arch, Arch::LinearStack | Arch::Flux) {
            return refuse(format!(
                "--lora-out {}: a folder; give the adapter file's path, e.g. {}",
                lora_out.display(),
                lora_out.join("lora.safetensors").display()
            ));
        }
    }
    if args.lora_out.is_some() && args.lora_rank == 0 {
        return refuse("--lora-rank 0: an adapter needs a rank of at least 1".to_string());
    }
    if matches!(args.dtype, DTypeArg::Int8 | DTypeArg::Awq) && args.arch != Arch::Flux {
        return refuse(
            "--dtype int8 and awq write ComfyUI's integer formats for --arch flux only; use f32, f16, bf16 (or fp8 for decoders, flux and wan)"
                .to_string(),
        );
    }
    Ok(())
}

/// `--arch bert|roberta`: the encoder folder, and with `--lora-out DIR` a PEFT adapter
/// folder.
fn write_bert(args: &DemoModelArgs, roberta: bool) -> CommandResult {
    if args.dtype == DTypeArg::Fp8 {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--dtype fp8 is for decoders (--arch llama, mixtral, qwen3, qwen3-moe, qwen2-moe); use f32, f16 or bf16 for bert"
        )));
    }
    let demo = BertDemo {
        preset: args.preset,
        dtype: args.dtype.dtype(),
        seed: args.seed,
        roberta,
        ..BertDemo::default()
    };
    let started = Instant::now();
    let dir = write_bert_folder(&args.out, &demo)
        .map_err(|error| Failure::run_failed(anyhow::anyhow!("{}: {error}", args.out.display())))?;
    let shape = demo.shape();
    println!(
        "wrote {} ({} {:?}: {} layers of {}, {} heads, {} weights = {}, seed {}) in {:.2} s",
        dir.display(),
        if roberta { "RoBERTa" } else { "BERT" },
        args.preset,
        shape.layers,
        shape.hidden,
        shape.heads,
        demo.dtype,
        Bytes(demo.weight_bytes()),
        args.seed,
        started.elapsed().as_secs_f64()
    );
    if let Some(lora_dir) = &args.lora_out {
        if args.lora_rank == 0 || args.lora_rank > shape.hidden {
            return Err(Failure::bad_input(anyhow::anyhow!(
                "--lora-rank must be between 1 and the hidden size {}",
                shape.hidden
            )));
        }
        let path = write_bert_lora(lora_dir, &demo, args.lora_rank, args.seed ^ LORA_SEED_MIX)
            .map_err(|error| {
                Failure::run_failed(anyhow::anyhow!("{}: {error}", lora_dir.display()))
            })?;
        println!(
            "wrote {} (PEFT rank {} on query/value); try: stagehand embed --model {} --lora {} \"hello world\"",
            path.display(),
            args.lora_rank,
            dir.display(),
            path.display()
        );
    }
    Ok(())
}

/// `--arch llama|mixtral|qwen3|qwen3-moe|qwen2-moe`: a decoder folder.
fn write_decoder(args: &DemoModelArgs, arch: DecoderArch) -> CommandResult {
    let demo = DecoderDemo {
        arch,
        preset: args.decoder_preset,
        dtype: args.dtype.dtype(),
        seed: args.seed,
        shard_bytes: 1 << 30,
    };
    let shape = demo.shape().map_err(Failure::bad_input)?;
    let started = Instant::now();
    let dir = write_decoder_folder(&args.out, &demo)
        .map_err(|error| Failure::run_failed(anyhow::anyhow!("{}: {error}", args.out.display())))?;
    println!(
        "wrote {} ({arch:?} {:?}: {} layers of {}, {} query / {} KV heads of {}{}, {} weights = {}, seed {}) in {:.2} s",
        dir.display(),
        args.decoder_preset,
        shape.layers,
        shape.hidden,
        shape.heads,
        shape.kv_heads,
        shape.head_dim,
        shape
            .experts
            .map(|moe| format!(
                ", {} experts top-{}{}",
                moe.experts,
                moe.top_k,
                if moe.shared_intermediate.is_some() { " + a shared expert" } else { "" }
            ))
            .unwrap_or_default(),
        demo.dtype,
        Bytes(demo.weight_bytes()),
        args.seed,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `--arch wan`: a generated WAN transformer folder (`transformer/`), or with
/// `--dtype fp8` ComfyUI's scaled-FP8 file.
fn write_wan(args: &DemoModelArgs) -> CommandResult {
    let demo = WanDemo {
        preset: args.wan_preset,
        dtype: args.dtype.dtype(),
        seed: args.seed,
    };
    let started = Instant::now();
    let path = demo
        .write(&args.out)
        .map_err(|error| Failure::run_failed(anyhow::anyhow!("{}: {error}", args.out.display())))?;
    let config = args.wan_preset.config();
    println!(
        "wrote {} (WAN {:?}: {} blocks of {}, {} heads of {}, FFN {}, {} → {} latent channels, {} weights = {}, seed {}) in {:.2} s",
        path.display(),
        args.wan_preset,
        config.layers,
        config.dim(),
        config.heads,
        config.head_dim,
        config.ffn_dim,
        config.in_channels,
        config.out_channels,
        demo.dtype,
        Bytes(demo.weight_bytes()),
        args.seed,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `--arch umt5`: a umT5 encoder folder (`text_encoder/`).
fn write_umt5(args: &DemoModelArgs) -> CommandResult {
    if !matches!(args.dtype, DTypeArg::F32 | DTypeArg::F16 | DTypeArg::Bf16) {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--dtype {:?}: a umT5 demo is written in f32, f16 or bf16",
            args.dtype
        )));
    }
    let demo = Umt5Demo {
        preset: args.umt5_preset,
        dtype: args.dtype.dtype(),
        seed: args.seed,
    };
    let started = Instant::now();
    let path = demo
        .write(&args.out)
        .map_err(|error| Failure::run_failed(anyhow::anyhow!("{}: {error}", args.out.display())))?;
    let config = args.umt5_preset.config();
    println!(
        "wrote {} (umT5 {:?}: {} blocks of {}, {} heads of {}, FFN {}, {} tokens, {} weights = {}, seed {}) in {:.2} s",
        path.display(),
        args.umt5_preset,
        config.layers,
        config.model,
        config.heads,
        config.head_dim,
        config.feed_forward,
        config.vocab,
        demo.dtype,
        Bytes(demo.weight_bytes()),
        args.seed,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

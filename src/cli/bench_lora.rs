//! `stagehand bench lora`: what a streamed LoRA costs. In one process, on the demo model
//! with the deployment budgets, interleaved rounds of (a) stagehand without an adapter
//! and (b) stagehand with a generated rank-R adapter on every layer, whose factors ride
//! with their blocks (re-sent each step for streamed blocks, baked once into resident
//! ones). Prints both step times, the ratio (b)/(a), and the LoRA bytes re-sent per step
//! against the model bytes streamed per step: the two overheads should be about equal
//! to the adapter's share of the weights, `rank·(in + out) / (in·out)`.

use serde::Serialize;
use stagehand_actors::{Link, ResidencyPolicy};

use super::bench::{keep_faster, run_error, Bench};
use stagehand_actors::Bytes;

use super::{CommandResult, Failure};
use stagehand::lora::{write_demo_lora, DemoLora, LoraSpec};
use stagehand::model::demo::DemoSpec;
use stagehand::run::{
    default_cache_dir, ensure_demo_model, resolve_budgets, Budgets, Extras, Outcome,
};
use stagehand::settings::{self, SettingsArgs};

#[derive(Debug, clap::Args)]
pub struct BenchLoraArgs {
    /// Rank of the generated adapter (it patches every layer of the demo model).
    #[arg(long, default_value_t = 16)]
    pub rank: usize,
    /// Rows per step: the default is the balanced configuration of `stagehand bench`.
    #[arg(long, default_value_t = 24)]
    pub batch: usize,
    /// Steps per run (the first, cold, step is not counted).
    #[arg(long, default_value_t = 6)]
    pub steps: u64,
    /// Interleaved rounds; each figure is the fastest round's.
    #[arg(long, default_value_t = 2)]
    pub rounds: u32,
    /// Print the figures as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

#[derive(Debug, Serialize)]
struct LoraBench {
    rank: usize,
    batch: usize,
    plain_seconds: f64,
    lora_seconds: f64,
    lora_over_plain: f64,
    model_bytes_per_step: f64,
    lora_bytes_per_step: f64,
    lora_bytes: u64,
    lora_vram_bytes: u64,
    lora_pinned_bytes: u64,
    /// The adapter's factors over the weights they patch: rank × 2 × dim / dim² (a
    /// fraction, 0.031 = 3.1 %).
    adapter_share: f64,
    low_rank_steps: u64,
    verified_steps: u64,
}

pub fn execute(args: BenchLoraArgs) -> CommandResult {
    let loaded = settings::load(&args.settings).map_err(Failure::bad_input)?;
    let settings = loaded.settings;
    super::run::init_logging(&settings.log);
    super::logging::log_setting_notes(&loaded.provenance);
    // The LoRA bench runs the CPU backend: `sim` and `cuda` are refused, not ignored.
    let device = settings.device;
    if !matches!(
        device,
        settings::DeviceKind::Cpu | settings::DeviceKind::Auto
    ) {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "bench lora runs on the CPU backend only; --device {} is not implemented for it (use --device cpu{})",
            format!("{device:?}").to_ascii_lowercase(),
            if device == settings::DeviceKind::Sim {
                ", or `stagehand simulate` for virtual time"
            } else {
                ""
            }
        )));
    }
    if args.steps < 2 || args.rounds == 0 || args.rank == 0 || args.batch == 0 {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--steps must be at least 2 (the first step is cold), --rounds, --rank and --batch at least 1"
        )));
    }
    let spec = DemoSpec::default();
    let cache = default_cache_dir();
    let model = ensure_demo_model(&cache, &spec).map_err(run_error)?;
    let lora_path = cache.join(format!("lora-rank{}.safetensors", args.rank));
    let lora = DemoLora {
        rank: args.rank,
        ..DemoLora::default()
    };
    write_demo_lora(&lora_path, &spec, &lora).map_err(Failure::bad_input)?;
    let model_bytes = spec.total_bytes();
    let budgets = resolve_budgets(&settings, model_bytes, true);
    let bench = Bench {
        settings: &settings,
        steps: args.steps,
        model,
        model_bytes,
        activation_bytes: 0,
        rounds: args.rounds,
        family: super::bench::demo_family()?,
        use_cuda: false,
    };
    let with_lora = Extras {
        loras: vec![LoraSpec {
            path: lora_path,
            strength: 0.8,
        }],
        ..Extras::default()
    };
    let (plain, patched) = fastest_rounds(&bench, &args, budgets, &with_lora)?;
    let row = LoraBench::new(&args, &spec, &plain, &patched);
    if args.json {
        let text = serde_json::to_string_pretty(&row).map_err(Failure::run_failed)?;
        println!("{text}");
        return Ok(());
    }
    print_text(&row, model_bytes, budgets.vram_budget_bytes);
    Ok(())
}

/// Interleaved rounds without and with the adapter; the fastest run of each.
fn fastest_rounds(
    bench: &Bench,
    args: &BenchLoraArgs,
    budgets: Budgets,
    with_lora: &Extras,
) -> Result<(Outcome, Outcome), Failure> {
    let depth = bench.settings.prefetch_depth;
    let policy = ResidencyPolicy::Planned;
    let mut plain: Option<Outcome> = None;
    let mut patched: Option<Outcome> = None;
    for round in 0..args.rounds {
        eprintln!("bench lora: round {} of {}", round + 1, args.rounds);
        let outcome = bench.run_with(args.batch, budgets, depth, policy, &Extras::default())?;
        keep_faster(&mut plain, outcome);
        let outcome = bench.run_with(args.batch, budgets, depth, policy, with_lora)?;
        keep_faster(&mut patched, outcome);
    }
    let (Some(plain), Some(patched)) = (plain, patched) else {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--rounds must be at least 1"
        )));
    };
    Ok((plain, patched))
}

impl LoraBench {
    fn new(args: &BenchLoraArgs, spec: &DemoSpec, plain: &Outcome, patched: &Outcome) -> Self {
        let dim = spec.dim as f64;
        Self {
            rank: args.rank,
            batch: args.batch,
            plain_seconds: plain.report.steady_step_seconds(),
            lora_seconds: patched.report.steady_step_seconds(),
            lora_over_plain: patched.report.steady_step_seconds()
                / plain.report.steady_step_seconds(),
            model_bytes_per_step: patched.report.steady_bytes_per_step(Link::PinnedToVram),
            lora_bytes_per_step: patched.report.steady_lora_bytes_per_step(),
            lora_bytes: patched.report.lora.adapters.iter().map(|a| a.bytes).sum(),
            lora_vram_bytes: patched.report.lora.vram_bytes,
            lora_pinned_bytes: patched.report.lora.pinned_bytes,
            adapter_share: args.rank as f64 * 2.0 * dim / (dim * dim),
            low_rank_steps: patched.report.tolerance_steps,
            verified_steps: patched.report.verified_steps,
        }
    }
}

fn print_text(row: &LoraBench, model_bytes: u64, vram_budget_bytes: u64) {
    println!(
        "stagehand bench lora: demo model {}, rank {} adapter on every layer ({} of factors), batch {}, vram budget {}",
        Bytes(model_bytes),
        row.rank,
        Bytes(row.lora_bytes),
        row.batch,
        Bytes(vram_budget_bytes)
    );
    println!(
        "  step: {:.1} ms without, {:.1} ms with the adapter: {:.3}× (the factors are {:.1} % of the weights they patch)",
        row.plain_seconds * 1e3,
        row.lora_seconds * 1e3,
        row.lora_over_plain,
        row.adapter_share * 100.0
    );
    println!(
        "  per step: {} of model and {} of LoRA factors to vram ({:.1} % of the model bytes); LoRA holds {} of vram, {} pinned",
        Bytes(row.model_bytes_per_step.round() as u64),
        Bytes(row.lora_bytes_per_step.round() as u64),
        row.lora_bytes_per_step / row.model_bytes_per_step.max(1.0) * 100.0,
        Bytes(row.lora_vram_bytes),
        Bytes(row.lora_pinned_bytes)
    );
    println!(
        "  verified: {} steps ({} low-rank within tolerance, the rest bit-exact)",
        row.verified_steps, row.low_rank_steps
    );
}

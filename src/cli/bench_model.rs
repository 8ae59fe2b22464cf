//! `stagehand bench --model PATH`: a model folder of a supported family at 40 % of its
//! streamed bytes (raised to the plan's minimum), in one process: resident, naive and
//! stagehand per batch (encoders) or per decoded token (decoders), with the ratio to
//! the bound and the bytes per step on each link. For MoE decoders (Mixtral, Qwen2-MoE,
//! Qwen3-MoE), the expert cache's hit rate per policy without a hint, with the
//! next-layer hint and with an oracle that replays the true routing; for decoders
//! with `--kv-tokens N`, a long generation whose KV cache makes resident weights give
//! way, with the step time before and after and the plan's prediction of the new step.

use serde::Serialize;
use stagehand_actors::{Bytes, ExpertPolicy, ResidencyPolicy};

use super::bench::{run_error, Bench, BenchArgs, Configuration, JsonReport};
use super::machine_load::{CpuSample, MachineLoad};
use super::{CommandResult, Failure};
use stagehand::families::llama::{ExpertHint, Sampling};
use stagehand::families::StepUnit;
use stagehand::run::bound::StepBound;
use stagehand::run::report::median;
use stagehand::run::{
    prepare_with, resolve_budgets, BudgetAsk, Budgets, DecoderInput, Extras, MoeOptions, Outcome,
    PromptInput, WorkloadKind, BUILT_IN_PROMPT,
};
use stagehand::settings::Settings;

pub fn execute(
    args: &BenchArgs,
    settings: &Settings,
    model: &std::path::Path,
    use_cuda: bool,
) -> CommandResult {
    let probe = prepare_with(
        model,
        WorkloadKind::Auto,
        1,
        settings,
        false,
        &Extras::default(),
    )
    .map_err(run_error)?;
    let model_bytes = probe.streamed_model_bytes();
    let activation_bytes = probe.activation_bytes(args.steps);
    let budgets = stagehand::run::budgets_for(&probe, settings, BudgetAsk::steps(args.steps));
    let facts = probe.facts();
    let family = probe.family;
    if family.step == StepUnit::Check {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "bench --model measures computed models of a folder; {} is {}",
            model.display(),
            facts.describe()
        )));
    }
    let is_moe = family.step == StepUnit::Token && facts.experts().is_some();
    let has_kv = facts.kv_cache().is_some();
    drop(probe);
    check_asks(args, family.step, has_kv, model)?;
    let bench = Bench {
        settings,
        steps: args.steps,
        model: model.to_path_buf(),
        model_bytes,
        activation_bytes,
        rounds: args.rounds,
        family,
        use_cuda,
    };
    let before = CpuSample::now();
    let rows = configurations(&bench, args, budgets)?;
    let experts = if is_moe {
        expert_rows(&bench, budgets)?
    } else {
        Vec::new()
    };
    let kv = match args.kv_tokens {
        Some(tokens) => Some(kv_growth(&bench, settings, tokens)?),
        None => None,
    };
    let results = Results {
        rows,
        experts,
        kv,
        machine_load: before
            .zip(CpuSample::now())
            .map(|(before, after)| MachineLoad::between(before, after)),
    };
    if args.json {
        return print_json(&results);
    }
    print_text(&bench, budgets, &results);
    Ok(())
}

/// What is refused before the first measurement, not after it.
fn check_asks(
    args: &BenchArgs,
    step: StepUnit,
    has_kv: bool,
    model: &std::path::Path,
) -> CommandResult {
    let refuse = |message: String| Err(Failure::bad_input(anyhow::anyhow!(message)));
    if step == StepUnit::Batch && args.batches.contains(&0) {
        return refuse("--batches must be at least 1".to_string());
    }
    match args.kv_tokens {
        Some(_) if !has_kv => refuse(format!(
            "--kv-tokens is for decoders (it measures a KV cache's growth); {} keeps no KV cache",
            model.display()
        )),
        Some(tokens) if tokens < 8 => refuse(format!("--kv-tokens {tokens}: at least 8")),
        _ => Ok(()),
    }
}

/// What `bench --model` measured, for either output.
struct Results {
    rows: Vec<Configuration>,
    experts: Vec<ExpertRow>,
    kv: Option<KvGrowth>,
    machine_load: Option<MachineLoad>,
}

/// Resident, naive and stagehand at each batch (one row of a token for a decoder, of
/// a denoising step for a diffusion transformer).
fn configurations(
    bench: &Bench<'_>,
    args: &BenchArgs,
    budgets: Budgets,
) -> Result<Vec<Configuration>, Failure> {
    let batches: &[usize] = match bench.family.step {
        StepUnit::Batch => &args.batches,
        StepUnit::Token | StepUnit::Denoise | StepUnit::Check => &[1],
    };
    let mut rows = Vec::with_capacity(batches.len());
    for &batch in batches {
        rows.push(bench.configuration("model", batch, budgets)?);
    }
    Ok(rows)
}

fn print_json(results: &Results) -> CommandResult {
    #[derive(Serialize)]
    struct ModelReport<'a> {
        #[serde(flatten)]
        steps: JsonReport<'a>,
        experts: &'a [ExpertRow],
        kv_growth: Option<&'a KvGrowth>,
    }
    let report = ModelReport {
        steps: JsonReport {
            configurations: &results.rows,
            machine_load: results.machine_load,
        },
        experts: &results.experts,
        kv_growth: results.kv.as_ref(),
    };
    let text = serde_json::to_string_pretty(&report).map_err(Failure::run_failed)?;
    println!("{text}");
    Ok(())
}

fn print_text(bench: &Bench<'_>, budgets: Budgets, results: &Results) {
    println!(
        "stagehand bench: {} ({} streamed), vram budget {}, pin ceiling {}, prefetch depth {}",
        bench.model.display(),
        Bytes(bench.model_bytes),
        Bytes(budgets.vram_budget_bytes),
        Bytes(budgets.pin_ceiling_bytes),
        bench.settings.prefetch_depth
    );
    print_steps(&results.rows, bench.family.step);
    if !results.experts.is_empty() {
        print_experts(&results.experts);
    }
    if let Some(kv) = &results.kv {
        print_kv(kv);
    }
    match results.machine_load {
        Some(load) => println!("{}", load.verdict()),
        None => println!("machine load: unknown (/proc unreadable): judge the ratios with care"),
    }
}

fn print_steps(rows: &[Configuration], step: StepUnit) {
    let decoder = step == StepUnit::Token;
    let unit = if decoder { "token" } else { "step" };
    println!(
        "{:>5} {:>10} {:>14} {:>10} {:>10} {:>10} {:>16} {:>16} {:>14} {:>14}",
        step.row_name(),
        "bound ms",
        "limited by",
        "resident",
        "naive",
        "stagehand",
        "stagehand/bound",
        "naive/stagehand",
        format!("→vram/{unit}"),
        format!("disk/{unit}")
    );
    for row in rows {
        println!(
            "{:>5} {:>10.1} {:>14} {:>10.1} {:>10.1} {:>10.1} {:>16.3} {:>16.3} {:>14} {:>14}",
            row.batch,
            row.bound_seconds * 1e3,
            row.bound_limited_by,
            row.resident_seconds * 1e3,
            row.naive_seconds * 1e3,
            row.stagehand_seconds * 1e3,
            row.stagehand_over_bound,
            row.naive_over_stagehand,
            Bytes(row.measured_to_vram_bytes_per_step as u64).to_string(),
            Bytes(row.measured_from_disk_bytes_per_step as u64).to_string()
        );
        if decoder {
            println!(
                "      decode: resident {:.2} tokens/s, naive {:.2}, stagehand {:.2}",
                1.0 / row.resident_seconds,
                1.0 / row.naive_seconds,
                1.0 / row.stagehand_seconds
            );
        }
    }
}

/// One expert-cache configuration of an MoE decode.
#[derive(Debug, Serialize)]
struct ExpertRow {
    policy: &'static str,
    hint: &'static str,
    hit_rate: f64,
    /// Resident or already hinted when used (see `Summary::expert_foreseen_rate`).
    foreseen_rate: f64,
    hits: u64,
    misses: u64,
    decode_seconds: f64,
    /// Model bytes copied to VRAM per steady token (dense blocks and experts).
    to_vram_bytes_per_token: f64,
}

/// Every expert policy with no hint, the next-layer hint and the oracle (the routing
/// the no-hint run recorded, replayed as the hint: the same greedy tokens route the
/// same way).
fn expert_rows(bench: &Bench<'_>, budgets: Budgets) -> Result<Vec<ExpertRow>, Failure> {
    let depth = bench.settings.prefetch_depth;
    let mut rows = Vec::new();
    for (policy, name) in [
        (ExpertPolicy::Lru, "lru"),
        (ExpertPolicy::Lfu, "lfu"),
        (ExpertPolicy::default(), "lfu-aging"),
    ] {
        let run = |hint: ExpertHint| -> Result<Outcome, Failure> {
            let extras = Extras {
                moe: MoeOptions {
                    policy,
                    ..MoeOptions::default()
                },
                ..Extras::default()
            }
            .with(DecoderInput {
                prompt: PromptInput::Text(BUILT_IN_PROMPT.to_string()),
                sampling: Sampling::default(),
                hint,
            });
            bench.run_with(1, budgets, depth, ResidencyPolicy::Planned, &extras)
        };
        let plain = run(ExpertHint::None)?;
        let routes = plain.report.routes.clone();
        let hinted = run(ExpertHint::NextLayer)?;
        let oracle = run(ExpertHint::Oracle(routes))?;
        for (hint, outcome) in [("none", plain), ("next-layer", hinted), ("oracle", oracle)] {
            let report = &outcome.report;
            let steady_steps = report.steps.saturating_sub(1).max(1) as f64;
            let to_vram = report.stats.pinned_to_vram.model_bytes
                - report.after_first_step.pinned_to_vram.model_bytes;
            rows.push(ExpertRow {
                policy: name,
                hint,
                hit_rate: report.expert_share(report.expert_hits),
                foreseen_rate: report.expert_share(report.expert_hits + report.expert_late),
                hits: report.expert_hits,
                misses: report.expert_misses,
                decode_seconds: report.steady_step_seconds(),
                to_vram_bytes_per_token: to_vram as f64 / steady_steps,
            });
        }
    }
    Ok(rows)
}

fn print_experts(rows: &[ExpertRow]) {
    println!(
        "experts: {:<10} {:<11} {:>9} {:>9} {:>7} {:>7} {:>10} {:>14}",
        "policy", "hint", "hit rate", "foreseen", "hits", "misses", "ms/token", "→vram/token"
    );
    for row in rows {
        println!(
            "         {:<10} {:<11} {:>9.3} {:>9.3} {:>7} {:>7} {:>10.2} {:>14}",
            row.policy,
            row.hint,
            row.hit_rate,
            row.foreseen_rate,
            row.hits,
            row.misses,
            row.decode_seconds * 1e3,
            Bytes(row.to_vram_bytes_per_token as u64).to_string()
        );
    }
    println!(
        "         hint: none = experts load when the router asks; next-layer = the next layer's router applied one layer early; oracle = the true routing (recorded) hinted one layer early; foreseen = resident or already hinted when used (a hit, or a wait for a hinted load still under way)"
    );
}

/// A long generation whose KV cache grows into the weights' room.
#[derive(Debug, Serialize)]
struct KvGrowth {
    tokens: u64,
    vram_budget_bytes: u64,
    kv_bytes: u64,
    evicted_blocks: u64,
    /// The token at which the first and the last growth made weights give way.
    first_eviction_step: Option<u64>,
    last_eviction_step: Option<u64>,
    step_seconds_before: f64,
    step_seconds_after: f64,
    streamed_bytes_before: u64,
    streamed_bytes_after: u64,
    /// The plan's prediction of the step after: max(compute, streamed after / copy rate).
    predicted_seconds_after: f64,
}

/// Generates `tokens` tokens with every block resident beside a spare ring and room
/// for about one KV page, so the cache's growth makes resident blocks stream.
fn kv_growth(bench: &Bench<'_>, settings: &Settings, tokens: u64) -> Result<KvGrowth, Failure> {
    let prepared = prepare_with(
        &bench.model,
        bench.family.kind,
        1,
        settings,
        false,
        &Extras::default(),
    )
    .map_err(run_error)?;
    let depth = settings.prefetch_depth;
    let (minimum, total) = prepared.plan_minimum_bytes(depth, ResidencyPolicy::Planned);
    let page = prepared.activation_bytes(1);
    let budget = total + minimum + page + page / 2;
    drop(prepared);
    let budgets = Budgets {
        vram_budget_bytes: budget,
        pin_ceiling_bytes: resolve_budgets(settings, total, false).pin_ceiling_bytes,
    };
    let long = Bench {
        steps: tokens,
        settings: bench.settings,
        model: bench.model.clone(),
        model_bytes: bench.model_bytes,
        activation_bytes: 0,
        rounds: 1,
        family: bench.family,
        use_cuda: bench.use_cuda,
    };
    let outcome = long.run_with(
        1,
        budgets,
        depth,
        ResidencyPolicy::Planned,
        &Extras::default(),
    )?;
    let report = &outcome.report;
    let evictions: Vec<u64> = report
        .kv_growth
        .iter()
        .filter(|(_, _, blocks)| !blocks.is_empty())
        .map(|(step, _, _)| *step)
        .collect();
    let first = evictions.first().copied();
    let last = evictions.last().copied();
    let steps = &report.step_seconds;
    let before = first.map_or(steps.len(), |step| step as usize);
    let after = last.map_or(steps.len(), |step| step as usize + 1);
    let window = |range: std::ops::Range<usize>| median(steps.get(range).unwrap_or(&[]));
    let streamed_after = outcome.streamed_bytes_per_step_after_kv;
    let predicted = StepBound::new(
        report.steady_compute_seconds(),
        streamed_after as f64,
        report.plan.pins.disk_bytes_per_step as f64,
        outcome.rates,
    );
    Ok(KvGrowth {
        tokens,
        vram_budget_bytes: budget,
        kv_bytes: report.kv_bytes,
        evicted_blocks: report
            .kv_growth
            .iter()
            .map(|(_, _, blocks)| blocks.len() as u64)
            .sum(),
        first_eviction_step: first,
        last_eviction_step: last,
        step_seconds_before: window(1..before),
        step_seconds_after: window(after..steps.len()),
        streamed_bytes_before: report.plan.vram.streamed_bytes_per_step,
        streamed_bytes_after: streamed_after,
        predicted_seconds_after: predicted.seconds(),
    })
}

fn print_kv(kv: &KvGrowth) {
    println!(
        "kv growth: {} tokens under {}: KV cache {}, {} resident blocks gave way (first at token {}, last at token {})",
        kv.tokens,
        Bytes(kv.vram_budget_bytes),
        Bytes(kv.kv_bytes),
        kv.evicted_blocks,
        kv.first_eviction_step.map_or("-".into(), |step| step.to_string()),
        kv.last_eviction_step.map_or("-".into(), |step| step.to_string())
    );
    println!(
        "           step before {:.2} ms ({} streamed/token), after {:.2} ms ({} streamed/token); the plan predicted {:.2} ms after",
        kv.step_seconds_before * 1e3,
        Bytes(kv.streamed_bytes_before),
        kv.step_seconds_after * 1e3,
        Bytes(kv.streamed_bytes_after),
        kv.predicted_seconds_after * 1e3
    );
}

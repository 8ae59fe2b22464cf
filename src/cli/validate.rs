//! `stagehand validate`: a matrix of configurations, each simulated on a hardware
//! profile (`--hardware local` by default: this machine, calibrated) and really run,
//! printed as predicted vs measured with the error of each figure and a verdict per
//! row (`--json` for scripts). The matrix and how to read it: docs/simulator.md.

use std::io::Write;
use std::path::{Path, PathBuf};

use stagehand_actors::Bytes;

use super::{CommandResult, Failure};
use depth::{depth_checks, write_depth_checks, DepthCheck};
use speed::{write_speed, Speed};
use stagehand::calibrate::validate::{
    validate_case, Case, CaseModel, Figure, Row, Verdict, COLD_TOLERANCE, STEADY_TOLERANCE,
};
use stagehand::families::bert::{write_bert_folder, BertDemo};
use stagehand::families::llama::{write_decoder_folder, DecoderArch, DecoderDemo, DecoderPreset};
use stagehand::model::demo::DemoSpec;

/// Steps one validation run may take: the steady median needs a handful, and the
/// matrix runs every configuration.
pub(super) const MAX_STEPS: u64 = 1000;
/// Real runs per configuration at most.
pub(super) const MAX_REPEATS: u32 = 20;

/// The demo model of the matrix: 8 blocks × 2 layers × dim² f32 (64 MiB at the
/// default 1024), small enough that 36 real runs take about a minute, large enough
/// to stream.
fn demo_spec(dim: u32) -> DemoSpec {
    DemoSpec {
        blocks: 8,
        layers_per_block: 2,
        dim,
        seed: 0x5747_4e44,
    }
}

#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// The profile to predict with: `local` (calibrated now, or a fresh cached
    /// calibration), a profile TOML, or a shipped name.
    #[arg(long, default_value = "local", value_name = "PROFILE")]
    pub hardware: String,
    /// Really run on this device: cpu, or cuda (with a profile calibrated on that GPU).
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: ValidateDevice,
    /// Steps per run (the first is cold; steady is the median from the third on).
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub steps: u64,
    /// Real runs per configuration: its measured times are their median, and a
    /// time outside its tolerance while identical runs spread over more than twice
    /// it is judged "unrepeatable" (the machine's noise), not a model miss.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub repeats: u32,
    /// A small matrix (batch 8, one budget, depths 0 and 2, page cache only): seconds.
    #[arg(long)]
    pub quick: bool,
    /// Width of the demo model's layers (each weight dim × dim f32).
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub demo_dim: u32,
    /// Leave out the generated Llama decoder.
    #[arg(long)]
    pub no_decoder: bool,
    /// Leave out the BERT encoder.
    #[arg(long)]
    pub no_encoder: bool,
    /// The encoder's folder (e.g. all-MiniLM-L6-v2); default: a generated tiny BERT.
    #[arg(long, value_name = "DIR")]
    pub encoder: Option<PathBuf>,
    /// Where the generated models are written (default: the cache directory).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Print the rows as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write each row's simulated and real Chrome traces into DIR
    /// (`<row>.sim.json`, `<row>.run.json`, the last repeat): where a row misses, the
    /// two timelines show which lane differs.
    #[arg(long, value_name = "DIR")]
    pub traces: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ValidateDevice {
    Cpu,
    Cuda,
}

/// The real-model families of the matrix, each at half its bytes and depths 0 and 2.
#[derive(Debug, Clone, Default)]
pub struct Families {
    /// A Llama-family decoder folder (one token a step).
    pub decoder: Option<PathBuf>,
    /// A BERT encoder folder (each step the 8 built-in sentences).
    pub encoder: Option<PathBuf>,
}

/// Sentences per encoder step: the 8 built-in ones, so every step is the same batch.
const ENCODER_BATCH: usize = 8;

/// The configurations to run: the demo model at three batch sizes × three VRAM
/// budgets × prefetch depth 0 and 2 × `--fast-disk` off and on, then each family
/// given at depths 0 and 2 (`--quick`: batch 8, one budget, page cache).
pub fn matrix(
    demo: PathBuf,
    families: Families,
    quick: bool,
    steps: u64,
    repeats: u32,
) -> Vec<Case> {
    let (batches, shares, fast): (&[usize], &[f64], &[bool]) = if quick {
        (&[8], &[0.5], &[false])
    } else {
        (&[1, 8, 64], &[0.3, 0.6, 1.0], &[false, true])
    };
    let mut cases = Vec::new();
    for &fast_disk in fast {
        for &batch in batches {
            for &vram_share in shares {
                for prefetch_depth in [0, 2] {
                    cases.push(Case {
                        model: CaseModel::LinearStack { path: demo.clone() },
                        batch,
                        vram_share,
                        prefetch_depth,
                        fast_disk,
                        steps,
                        repeats,
                        cuda: false,
                    });
                }
            }
        }
    }
    let family_models = [
        families
            .decoder
            .map(|path| (CaseModel::Decoder { path }, 1)),
        families
            .encoder
            .map(|path| (CaseModel::Encoder { path }, ENCODER_BATCH)),
    ];
    for (model, batch) in family_models.into_iter().flatten() {
        for prefetch_depth in [0, 2] {
            cases.push(Case {
                model: model.clone(),
                batch,
                vram_share: 0.5,
                prefetch_depth,
                fast_disk: false,
                steps,
                repeats,
                cuda: false,
            });
        }
    }
    cases
}

/// Every case simulated and run, in order, with a progress line each.
fn validate_all(
    cases: &[Case],
    profile: &stagehand::sim::HardwareProfile,
    traces: Option<&Path>,
) -> Result<Vec<Row>, Failure> {
    let mut rows = Vec::with_capacity(cases.len());
    for (index, case) in cases.iter().enumerate() {
        eprintln!(
            "validate: {}/{} {}",
            index + 1,
            cases.len(),
            case.short_label()
        );
        rows.push(validate_case(case, profile, traces).map_err(Failure::run_failed)?);
    }
    Ok(rows)
}

pub fn execute(args: ValidateArgs) -> CommandResult {
    super::validate_checks::check_arguments(&args)?;
    let cache = args
        .cache_dir
        .clone()
        .unwrap_or_else(stagehand::run::default_cache_dir);
    let spec = demo_spec(args.demo_dim);
    spec.validate().map_err(Failure::bad_input)?;
    let demo_dir = cache.join(format!("validate-linear-stack-{}", args.demo_dim));
    let demo = stagehand::run::ensure_demo_model(&demo_dir, &spec)
        .map_err(|error| Failure::run_failed(anyhow::anyhow!(error)))?;
    let decoder =
        if args.no_decoder || args.quick {
            None
        } else {
            let demo = DecoderDemo {
                arch: DecoderArch::Llama,
                preset: DecoderPreset::Tiny,
                dtype: stagehand::compute::DType::F32,
                seed: 7,
                shard_bytes: 1 << 30,
            };
            let dir = cache.join("validate-llama-tiny");
            Some(write_decoder_folder(&dir, &demo).map_err(|error| {
                Failure::run_failed(anyhow::anyhow!("{}: {error}", dir.display()))
            })?)
        };
    let encoder = match (&args.encoder, args.no_encoder || args.quick) {
        (_, true) => None,
        (Some(path), false) => Some(path.clone()),
        (None, false) => {
            let dir = cache.join("validate-bert-tiny");
            Some(
                write_bert_folder(&dir, &BertDemo::default()).map_err(|error| {
                    Failure::run_failed(anyhow::anyhow!("{}: {error}", dir.display()))
                })?,
            )
        }
    };
    let profile = super::hardware_arg::load_hardware(&args.hardware, Some(&demo_dir))?;
    let families = Families { decoder, encoder };
    let mut cases = matrix(demo, families, args.quick, args.steps, args.repeats);
    for case in &mut cases {
        case.cuda = args.device == ValidateDevice::Cuda;
    }
    let load_before = stagehand::calibrate::load_average();
    let speed_before = speed::probe(&profile, args.device);
    let rows = validate_all(&cases, &profile, args.traces.as_deref())?;
    let load_after = stagehand::calibrate::load_average();
    let speed = speed_before.and_then(|before| {
        let after = speed::probe(&profile, args.device)?;
        Some(Speed { before, after })
    });
    let depth_checks = depth_checks(&rows);
    let caches = cache_effect(&profile);
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        let report = serde_json::json!({
            "hardware": profile.name,
            "cached_over_memory_product_rate": caches.map(|(cached, memory)| cached / memory),
            "load_average_before": load_before,
            "load_average_after": load_after,
            "speed_against_profile": speed,
            "rows": rows,
            "depth_checks": depth_checks,
        });
        serde_json::to_writer_pretty(&mut out, &report)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        write_table(&mut out, &rows, &depth_checks, load_before, load_after)
            .and_then(|()| speed.as_ref().map_or(Ok(()), |speed| write_speed(&mut out, speed)))
            .and_then(|()| {
            match caches {
                Some((cached, memory)) => writeln!(
                    out,
                    "this machine's caches: a one-row f32 1024² product runs at {cached:.1} GFLOP/s with its weight in the caches (a resident block's rate) and {memory:.1} from memory (a streamed block's), {:.2}×; reads from the page cache at {} the cold rate. How much of a model the CPU caches and the page cache hold is what differs most between two machines of one kind: `simulate` reads the page cache's state of the checkpoint, range by range, before it predicts",
                    cached / memory,
                    profile
                        .disk
                        .page_cache_gb_per_s
                        .map_or("(not measured)".to_string(), |page_cache| format!(
                            "{:.1}×",
                            page_cache / profile.disk.read_gb_per_s
                        ))
                ),
                None => Ok(()),
            }
        })
    };
    match written {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(Failure::run_failed),
    }
}

/// The profile's product rate at one row of an f32 1024² weight, with the weight in
/// the caches and from memory (`gflops` and `cold_gflops`); `None` without kernel costs.
fn cache_effect(profile: &stagehand::sim::HardwareProfile) -> Option<(f64, f64)> {
    let costs = profile.compute.as_ref()?;
    let rate = |costs: &stagehand::sim::KernelCosts| {
        costs.linear_gflops(1, 1024 * 1024, stagehand::compute::DType::F32)
    };
    Some((rate(costs), rate(&costs.cold())))
}

fn ms(seconds: f64) -> String {
    format!("{:.2}", seconds * 1e3)
}

fn error(figure: &Figure) -> String {
    if figure.error.is_finite() {
        format!("{:+.1}%", figure.error * 100.0)
    } else {
        "n/a".to_string()
    }
}

fn bytes_pair(figure: &Figure) -> String {
    let show = |value: f64| Bytes(value.round() as u64).to_string();
    if figure.error == 0.0 {
        format!("{} =", show(figure.measured))
    } else {
        format!("{}≠{}", show(figure.predicted), show(figure.measured))
    }
}

fn write_table(
    out: &mut impl Write,
    rows: &[Row],
    depth_checks: &[DepthCheck],
    load_before: Option<f64>,
    load_after: Option<f64>,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<28} {:>16} {:>8} {:>8} {:>7} {:>16} {:>8} {:>8} {:>18} {:>18} {:>14} {:>14} {:>12}",
        "configuration",
        "steady ms p/m",
        "err",
        "@run",
        "spread",
        "cold ms p/m",
        "err",
        "@run",
        "pinned→vram/step",
        "disk→*/step",
        "peak vram",
        "peak pinned",
        "verdict"
    )?;
    for row in rows {
        write_row(out, row)?;
    }
    write_tallies(out, rows)?;
    write_depth_checks(out, depth_checks)?;
    writeln!(
        out,
        "(p/m: predicted/median measured over the repeats; spread: (slowest − fastest) / median of the repeats' steady steps; bytes: mean per steady step, `=` when exact; load average 1 min before/after: {}/{})",
        load_before.map_or("?".to_string(), |load| format!("{load:.2}")),
        load_after.map_or("?".to_string(), |load| format!("{load:.2}"))
    )
}

/// One configuration: each figure predicted/measured with its error, and the verdict.
fn write_row(out: &mut impl Write, row: &Row) -> std::io::Result<()> {
    let disk = Figure::new(
        row.disk_to_pinned_bytes.predicted + row.disk_to_vram_bytes.predicted,
        row.disk_to_pinned_bytes.measured + row.disk_to_vram_bytes.measured,
    );
    writeln!(
        out,
        "{:<28} {:>16} {:>8} {:>8} {:>7} {:>16} {:>8} {:>8} {:>18} {:>18} {:>14} {:>14} {:>12}",
        row.case.short_label(),
        format!(
            "{}/{}",
            ms(row.steady_step_seconds.predicted),
            ms(row.steady_step_seconds.measured)
        ),
        error(&row.steady_step_seconds),
        error(&row.steady_at_run_rates),
        format!("{:.0}%", row.steady_repeats.spread * 100.0),
        format!(
            "{}/{}",
            ms(row.cold_step_seconds.predicted),
            ms(row.cold_step_seconds.measured)
        ),
        error(&row.cold_step_seconds),
        error(&row.cold_at_run_rates),
        bytes_pair(&row.pinned_to_vram_bytes),
        bytes_pair(&disk),
        bytes_pair(&row.peak_vram_bytes),
        bytes_pair(&row.peak_pinned_bytes),
        match row.verdict {
            Verdict::Pass => "pass",
            Verdict::TimeMiss => "time miss",
            Verdict::Unrepeatable => "unrepeatable",
            Verdict::PlanMiss => "plan miss",
        }
    )
}

/// How many rows each figure got within its tolerance, and the verdicts counted.
fn write_tallies(out: &mut impl Write, rows: &[Row]) -> std::io::Result<()> {
    let within = |figure: fn(&Row) -> &Figure, tolerance: f64| {
        rows.iter()
            .filter(|row| figure(row).error.abs() <= tolerance)
            .count()
    };
    let steady_ok = within(|row| &row.steady_step_seconds, STEADY_TOLERANCE);
    let cold_ok = within(|row| &row.cold_step_seconds, COLD_TOLERANCE);
    let steady_run = within(|row| &row.steady_at_run_rates, STEADY_TOLERANCE);
    let cold_run = within(|row| &row.cold_at_run_rates, COLD_TOLERANCE);
    let exact = rows
        .iter()
        .filter(|row| row.verdict != Verdict::PlanMiss)
        .count();
    let unverified = rows.iter().filter(|row| !row.verified).count();
    let verdicts = |verdict: Verdict| rows.iter().filter(|row| row.verdict == verdict).count();
    writeln!(
        out,
        "steady within ±{:.0} %: {steady_ok}/{n}; cold within ±{:.0} %: {cold_ok}/{n}; plan bytes and peaks exact: {exact}/{n}; runs not verified against their reference: {unverified}",
        STEADY_TOLERANCE * 100.0,
        COLD_TOLERANCE * 100.0,
        n = rows.len()
    )?;
    writeln!(
        out,
        "verdicts: {} pass, {} unrepeatable (identical runs spread over more than twice the tolerance, the prediction within their range), {} time miss, {} plan miss",
        verdicts(Verdict::Pass),
        verdicts(Verdict::Unrepeatable),
        verdicts(Verdict::TimeMiss),
        verdicts(Verdict::PlanMiss)
    )?;
    writeln!(
        out,
        "with each run's own link rates (@run: its copy and read rates, measured after its steps, in place of the profile's): steady {steady_run}/{n}, cold {cold_run}/{n}",
        n = rows.len()
    )?;
    Ok(())
}

mod depth;
mod speed;
#[cfg(test)]
mod tests;

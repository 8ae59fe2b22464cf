//! `stagehand bench --device cuda`: in one process, so the ratios are comparable,
//! (a) pinned H2D peak, (b) pageable H2D, (c) `cuMemHostRegister` cost per GiB, then
//! the linear-stack model (d) fully resident — compute only — and (e) streamed under a
//! VRAM budget of a third of its size, for a transfer-bound (small batch) and a
//! compute-bound (large batch) configuration: streamed / bound, bytes moved per step,
//! and the streamed H2D rate against (a).
//!
//! The model is a 1 GiB linear stack (16 blocks of 4 × 2048² f32 layers, 64 MiB
//! blocks) in its own cache folder, so blocks are large enough that a copy, not the
//! per-block message round trip, is what a streamed step waits on. Both runs go
//! through the one run path (`stagehand::run::execute_cuda_with`), whose driver checks
//! every step bit for bit against the fully-resident pass of the same model on the
//! same GPU.
//!
//! `--json` prints one JSON object on stdout and the Markdown tables on stderr after a
//! `<!-- bench-cuda-markdown -->` line, which `scripts/gpu-check.sh` copies into its
//! report; without `--json` the Markdown goes to stdout.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use stagehand_actors::{Link, ResidencyPolicy};

use super::run::run_error;
use super::{CommandResult, Failure};
use stagehand::device::cuda::bench::{link_figures, LinkFigures};
use stagehand::device::cuda::CudaDevice;
use stagehand::model::demo::DemoSpec;
use stagehand::run::bound::{LinkRates, StepBound};
use stagehand::run::{
    available_ram_bytes, default_cache_dir, ensure_demo_model, execute_cuda_with, no_observer,
    prepare, Budgets, CudaOutcome, CudaRunOptions, Prepared, RunPlan, WorkloadKind,
};
use stagehand::settings::Settings;

/// Bytes each link loop copies at once.
const LINK_BYTES: u64 = 1 << 30;
/// The bench model: 16 × 4 × 2048² f32 = 1 GiB, 64 MiB blocks.
const BENCH_SPEC: DemoSpec = DemoSpec {
    blocks: 16,
    layers_per_block: 4,
    dim: 2048,
    seed: 0x5747_4e44,
};
/// Rows per forward pass: small enough that copies dominate, large enough that the
/// GPU, not the launch rate, sets the compute time.
const TRANSFER_BATCH: usize = 16;
const COMPUTE_BATCH: usize = 4096;
/// Steps per run; the first (cold) one is left out of the steady figures.
const STEPS: u64 = 6;
/// Marker before the Markdown on stderr in `--json` mode.
pub const MARKDOWN_MARKER: &str = "<!-- bench-cuda-markdown -->";

#[derive(Debug, Serialize)]
pub struct ModelFigures {
    pub path: PathBuf,
    pub bytes: u64,
    pub blocks: u32,
    pub block_bytes: u64,
    pub dim: u32,
    pub layers_per_block: u32,
}

/// A row is named by what its measured bound says; a batch that aimed elsewhere says
/// so, so "transfer-bound" never sits beside "limited by compute".
fn row_label(row: &Configuration) -> String {
    let measured_compute = row.bound_limited_by == "compute";
    let aimed_compute = row.name == "compute-bound";
    if measured_compute == aimed_compute {
        row.name.to_string()
    } else if measured_compute {
        format!("compute-bound (batch aimed at {})", row.name)
    } else {
        format!("transfer-bound (batch aimed at {})", row.name)
    }
}

/// The resident and streamed runs for one batch size.
#[derive(Debug, Serialize)]
pub struct Configuration {
    pub name: &'static str,
    pub batch: usize,
    /// Steps of both runs whose output equalled the fully-resident pass on this GPU
    /// bit for bit (the run fails otherwise), out of `steps_run`.
    pub verified_steps: u64,
    pub steps_run: u64,
    /// (d) fully resident: steady step and its device compute time.
    pub resident_step_seconds: f64,
    pub resident_compute_seconds: f64,
    /// (e) streamed under the small budget.
    pub streamed_step_seconds: f64,
    pub streamed_compute_seconds: f64,
    pub vram_budget_bytes: u64,
    pub resident_bytes: u64,
    pub bound_seconds: f64,
    pub bound_limited_by: &'static str,
    pub streamed_over_bound: f64,
    pub streamed_bytes_per_step_planned: u64,
    /// Pinned → VRAM bytes per steady step, from the session's counters.
    pub pinned_to_vram_bytes_per_step: f64,
    pub disk_bytes_per_step: f64,
    /// Bytes moved per steady step over the streamed step's time, and that over (a).
    pub streamed_h2d_bytes_per_second: f64,
    pub streamed_h2d_over_pinned_peak: f64,
    /// The driver's used figure less the compute adapter's buffers, over its
    /// pre-run baseline, at its peak, against budget + vram_headroom.
    pub vram_peak_weights_bytes: u64,
    pub vram_budget_plus_headroom_bytes: u64,
    pub vram_within_budget_and_headroom: bool,
}

#[derive(Debug, Serialize)]
pub struct BenchCuda {
    pub device: String,
    pub link: LinkFigures,
    pub model: ModelFigures,
    pub prefetch_depth: u32,
    pub pin_ceiling_bytes: u64,
    pub configurations: Vec<Configuration>,
    pub seconds: f64,
}

struct Bench<'a> {
    settings: &'a Settings,
    device: Arc<CudaDevice>,
    link: LinkFigures,
    model: PathBuf,
    model_bytes: u64,
    pin_ceiling_bytes: u64,
}

impl Bench<'_> {
    fn run(&self, prepared: &Prepared, vram_budget_bytes: u64) -> Result<CudaOutcome, Failure> {
        execute_cuda_with(
            prepared,
            RunPlan {
                settings: self.settings,
                budgets: Budgets {
                    vram_budget_bytes,
                    pin_ceiling_bytes: self.pin_ceiling_bytes,
                },
                prefetch_depth: self.settings.prefetch_depth,
                policy: ResidencyPolicy::Planned,
                steps: STEPS,
                stop: stagehand::signals::stop_flag(),
                observer: no_observer(),
                on_step: Box::new(|_, _| {}),
                fail_after_reads: None,
                keep_outputs: false,
                on_token: None,
                measure_links: true,
                shared: None,
            },
            CudaRunOptions {
                device: Some(self.device.clone()),
                link: Some(self.link.clone()),
            },
        )
        .map_err(run_error)
    }

    /// (d) then (e) for `batch`.
    fn configuration(&self, name: &'static str, batch: usize) -> Result<Configuration, Failure> {
        eprintln!("bench cuda: {name} (batch {batch}): resident, then streamed");
        let prepared = prepare(
            &self.model,
            WorkloadKind::LinearStack,
            batch,
            self.settings,
            true,
        )
        .map_err(run_error)?;
        // Room for every block, with the arena's per-block alignment.
        let resident = self.run(&prepared, self.model_bytes + (64 << 20))?;
        let streamed = self.run(&prepared, self.model_bytes / 3)?;
        Ok(self.figures(name, batch, &resident, &streamed))
    }

    fn figures(
        &self,
        name: &'static str,
        batch: usize,
        resident: &CudaOutcome,
        streamed: &CudaOutcome,
    ) -> Configuration {
        let report = &streamed.outcome.report;
        let resident_step_seconds = resident.outcome.report.steady_step_seconds();
        let streamed_step_seconds = report.steady_step_seconds();
        let bound = StepBound::new(
            resident_step_seconds,
            report.plan.vram.streamed_bytes_per_step as f64,
            report.plan.pins.disk_bytes_per_step as f64,
            LinkRates {
                copy_bytes_per_second: self.link.pinned_h2d_bytes_per_second,
                read_bytes_per_second: streamed.outcome.rates.read_bytes_per_second,
            },
        );
        let moved = report.steady_bytes_per_step(Link::PinnedToVram);
        let streamed_h2d = moved / streamed_step_seconds.max(1e-12);
        let vram = &streamed.vram;
        Configuration {
            name,
            batch,
            verified_steps: resident.outcome.report.verified_steps + report.verified_steps,
            steps_run: resident.outcome.report.steps + report.steps,
            resident_step_seconds,
            resident_compute_seconds: resident.outcome.report.steady_compute_seconds(),
            streamed_step_seconds,
            streamed_compute_seconds: report.steady_compute_seconds(),
            vram_budget_bytes: streamed.outcome.budgets.vram_budget_bytes,
            resident_bytes: report.plan.vram.resident_bytes,
            bound_seconds: bound.seconds(),
            bound_limited_by: bound.limited_by(),
            streamed_over_bound: streamed_step_seconds / bound.seconds().max(1e-12),
            streamed_bytes_per_step_planned: report.plan.vram.streamed_bytes_per_step,
            pinned_to_vram_bytes_per_step: moved,
            disk_bytes_per_step: report.steady_bytes_per_step(Link::DiskToPinned)
                + report.steady_bytes_per_step(Link::DiskToVram),
            streamed_h2d_bytes_per_second: streamed_h2d,
            streamed_h2d_over_pinned_peak: streamed_h2d / self.link.pinned_h2d_bytes_per_second,
            vram_peak_weights_bytes: vram.peak_weights_bytes,
            vram_budget_plus_headroom_bytes: vram.budget.budget_bytes + vram.vram_headroom_bytes,
            vram_within_budget_and_headroom: vram.within_budget_and_headroom,
        }
    }
}

/// Pin room for the whole model plus the staging ring, within what the host can spare,
/// so the streamed configuration measures the PCIe link and not disk reads.
fn bench_pin_ceiling(settings: &Settings, model_bytes: u64, block_bytes: u64) -> u64 {
    if let Some(ceiling) = settings.pin_ceiling {
        return ceiling.as_u64();
    }
    let wanted = model_bytes + u64::from(settings.prefetch_depth + 2) * block_bytes;
    match available_ram_bytes() {
        Some(available) => wanted.min(available.saturating_sub(settings.ram_floor.as_u64())),
        None => wanted,
    }
}

pub fn execute(settings: &Settings, json: bool) -> CommandResult {
    let started = Instant::now();
    let device = Arc::new(CudaDevice::open(0).map_err(Failure::bad_input)?);
    eprintln!(
        "bench cuda: {} ({}): link figures",
        stagehand_actors::Device::name(device.as_ref()),
        device.device_name()
    );
    let link = link_figures(&device, LINK_BYTES).map_err(Failure::run_failed)?;
    let cache = default_cache_dir().join("bench-cuda");
    let model = ensure_demo_model(&cache, &BENCH_SPEC).map_err(run_error)?;
    let model_bytes = BENCH_SPEC.total_bytes();
    let pin_ceiling_bytes = bench_pin_ceiling(settings, model_bytes, BENCH_SPEC.block_bytes());
    let bench = Bench {
        settings,
        device: device.clone(),
        link: link.clone(),
        model: model.clone(),
        model_bytes,
        pin_ceiling_bytes,
    };
    let configurations = vec![
        bench.configuration("transfer-bound", TRANSFER_BATCH)?,
        bench.configuration("compute-bound", COMPUTE_BATCH)?,
    ];
    let result = BenchCuda {
        device: link.device.clone(),
        link,
        model: ModelFigures {
            path: model,
            bytes: model_bytes,
            blocks: BENCH_SPEC.blocks,
            block_bytes: BENCH_SPEC.block_bytes(),
            dim: BENCH_SPEC.dim,
            layers_per_block: BENCH_SPEC.layers_per_block,
        },
        prefetch_depth: settings.prefetch_depth,
        pin_ceiling_bytes,
        configurations,
        seconds: started.elapsed().as_secs_f64(),
    };
    if json {
        let text = serde_json::to_string_pretty(&result).map_err(Failure::run_failed)?;
        println!("{text}");
        eprintln!("{MARKDOWN_MARKER}");
        eprintln!("{}", to_markdown(&result));
    } else {
        println!("{}", to_markdown(&result));
    }
    Ok(())
}

/// The report's Markdown: the link table, then one row per configuration.
pub fn to_markdown(bench: &BenchCuda) -> String {
    let mib = |bytes: f64| bytes / (1u64 << 20) as f64;
    let ms = |seconds: f64| seconds * 1e3;
    let mut out = bench.link.to_markdown();
    out.push_str(&format!(
        "\nlinear stack: {} ({} blocks of {}, {} × {}² f32 layers each), prefetch depth {}, pin ceiling {}, {:.0} s in all\n\n",
        stagehand_actors::Bytes(bench.model.bytes),
        bench.model.blocks,
        stagehand_actors::Bytes(bench.model.block_bytes),
        bench.model.layers_per_block,
        bench.model.dim,
        bench.prefetch_depth,
        stagehand_actors::Bytes(bench.pin_ceiling_bytes),
        bench.seconds,
    ));
    out.push_str(
        "| configuration | batch | resident ms | streamed ms | bound ms (limited by) | streamed/bound | VRAM budget MiB | moved MiB/step | streamed H2D GB/s (share of the pinned peak) | VRAM weights MiB (≤ budget+headroom) | bit-exact steps |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in &bench.configurations {
        out.push_str(&format!(
            "| {} | {} | {:.2} | {:.2} | {:.2} ({}) | {:.3} | {:.0} | {:.0} | {:.2} ({:.0} %) | {:.0} ({}) | {}/{} |\n",
            row_label(row),
            row.batch,
            ms(row.resident_step_seconds),
            ms(row.streamed_step_seconds),
            ms(row.bound_seconds),
            row.bound_limited_by,
            row.streamed_over_bound,
            mib(row.vram_budget_bytes as f64),
            mib(row.pinned_to_vram_bytes_per_step),
            row.streamed_h2d_bytes_per_second / 1e9,
            row.streamed_h2d_over_pinned_peak * 100.0,
            mib(row.vram_peak_weights_bytes as f64),
            if row.vram_within_budget_and_headroom { "within" } else { "ABOVE" },
            row.verified_steps,
            row.steps_run,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_model_is_a_valid_gib_stack_with_large_blocks() {
        // Proves the bench model is the 1 GiB, 64 MiB-block stack the docs describe.
        BENCH_SPEC.validate().unwrap();
        assert_eq!(BENCH_SPEC.total_bytes(), 1 << 30);
        assert_eq!(BENCH_SPEC.block_bytes(), 64 << 20);
    }

    #[test]
    fn the_markdown_has_one_row_per_configuration_with_its_ratios() {
        // Proves the report carries (a)–(c) and, per configuration, (d), (e), the bound
        // ratio, bytes per step and the streamed rate against the peak.
        let link = LinkFigures {
            device: "cuda:0 (Test GPU)".to_string(),
            copy_bytes: 1 << 30,
            copies_per_loop: 4,
            pinned_h2d_bytes_per_second: 50e9,
            pageable_h2d_bytes_per_second: 20e9,
            pageable_over_pinned: 0.4,
            register_seconds_per_gib: 0.2,
            unregister_seconds_per_gib: 0.1,
        };
        let row = Configuration {
            name: "transfer-bound",
            batch: 16,
            verified_steps: 12,
            steps_run: 12,
            resident_step_seconds: 0.002,
            resident_compute_seconds: 0.0015,
            streamed_step_seconds: 0.0198,
            streamed_compute_seconds: 0.0015,
            vram_budget_bytes: 341 << 20,
            resident_bytes: 128 << 20,
            bound_seconds: 0.018,
            bound_limited_by: "copy to VRAM",
            streamed_over_bound: 1.1,
            streamed_bytes_per_step_planned: 896 << 20,
            pinned_to_vram_bytes_per_step: (896u64 << 20) as f64,
            disk_bytes_per_step: 0.0,
            streamed_h2d_bytes_per_second: 47.45e9,
            streamed_h2d_over_pinned_peak: 0.949,
            vram_peak_weights_bytes: 342 << 20,
            vram_budget_plus_headroom_bytes: 341 << 20,
            vram_within_budget_and_headroom: false,
        };
        let bench = BenchCuda {
            device: link.device.clone(),
            link,
            model: ModelFigures {
                path: PathBuf::from("m"),
                bytes: 1 << 30,
                blocks: 16,
                block_bytes: 64 << 20,
                dim: 2048,
                layers_per_block: 4,
            },
            prefetch_depth: 2,
            pin_ceiling_bytes: 1280 << 20,
            configurations: vec![row],
            seconds: 12.0,
        };
        let markdown = to_markdown(&bench);
        assert!(
            markdown.contains("| (a) pinned H2D | 50.00 GB/s |"),
            "{markdown}"
        );
        assert!(markdown.contains("| transfer-bound | 16 | 2.00 | 19.80 | 18.00 (copy to VRAM) | 1.100 | 341 | 896 | 47.45 (95 %) | 342 (ABOVE) | 12/12 |"), "{markdown}");
        let json = serde_json::to_value(&bench).unwrap();
        assert_eq!(json["configurations"][0]["streamed_over_bound"], 1.1);
        assert_eq!(json["link"]["pinned_h2d_bytes_per_second"], 50e9);
    }
}

//! The text report of `stagehand simulate`: the fit, the bound, each policy's row,
//! the comparison with the baselines and the advice on the prefetch depth.

use std::io::Write;
use std::path::Path;

use stagehand_actors::Bytes;

use stagehand::settings::Source;
use stagehand::simulate::{PolicyFigures, Simulation, AUTO_DEPTH_MAX, SEARCH_STEPS, TIE_RELATIVE};

fn seconds(value: f64) -> String {
    if value >= 1.0 {
        format!("{value:.3} s")
    } else {
        format!("{:.3} ms", value * 1e3)
    }
}

/// The bound in the model's unit; a tokens/s figure is an upper limit, a time a lower.
fn bound_in_unit(simulation: &Simulation) -> String {
    let rate = &simulation.bound_rate;
    if rate.unit == "tokens/s" {
        format!("at most {rate}")
    } else if rate.unit == "s/step" {
        "no [output] in the description: per step only".to_string()
    } else {
        format!("at least {rate}")
    }
}

fn per_step(bytes: f64) -> String {
    Bytes(bytes.round() as u64).to_string()
}

pub(super) fn write_text(
    out: &mut impl Write,
    simulation: &Simulation,
    depth_source: &Source,
    trace: Option<&Path>,
) -> std::io::Result<()> {
    write_setup(out, simulation)?;
    if !simulation.fits {
        writeln!(out, "fits: NO")?;
        for message in &simulation.failure_messages {
            writeln!(out, "  - {message}")?;
        }
        return Ok(());
    }
    write_bound(out, simulation)?;
    write_depth_search(out, simulation, depth_source)?;
    writeln!(out)?;
    write_policies(out, simulation)?;
    write_comparison(out, simulation)?;
    write_depth_advice(out, simulation)?;
    for warning in &simulation.warnings {
        writeln!(out, "warning: {warning}")?;
    }
    if let Some(path) = trace {
        writeln!(out, "trace (stagehand run): {}", path.display())?;
    }
    Ok(())
}

/// What was simulated on what, and the budgets it ran under.
fn write_setup(out: &mut impl Write, simulation: &Simulation) -> std::io::Result<()> {
    let fit = &simulation.fit;
    writeln!(
        out,
        "{} ({}) on {} ({}; {} RAM, {} disk, {} link), {} step{}, seed {}",
        simulation.model,
        Bytes(fit.model_bytes),
        simulation.hardware,
        simulation.gpu,
        Bytes(simulation.ram_bytes),
        simulation.disk,
        simulation.link,
        simulation.steps,
        if simulation.steps == 1 { "" } else { "s" },
        simulation.seed
    )?;
    writeln!(
        out,
        "budgets: vram {} (ring {}, resident {}), pin ceiling {} (staging {}, cache {})",
        Bytes(fit.vram_budget_bytes),
        Bytes(fit.ring_bytes),
        Bytes(fit.resident_bytes),
        Bytes(fit.pin_ceiling_bytes),
        Bytes(fit.staging_bytes),
        Bytes(fit.pinned_cache_bytes)
    )?;
    let basis = simulation
        .reserve_basis
        .as_deref()
        .unwrap_or("the description states none");
    match &simulation.activations {
        Some(activations) if !activations.peaks.is_empty() => writeln!(
            out,
            "activations: {} reserved beside the weights (every tensor of a step; {basis}); working set per block: {}",
            Bytes(activations.reserved_bytes),
            activations.describe_peaks()
        )?,
        Some(activations) => writeln!(
            out,
            "activations: {} reserved beside the weights ({basis})",
            Bytes(activations.reserved_bytes)
        )?,
        None if fit.activation_bytes > 0 => writeln!(
            out,
            "activations: the KV cache's first pages, {} at the start, growing a page at a time ({basis})",
            Bytes(fit.activation_bytes)
        )?,
        None => writeln!(
            out,
            "activations: none counted ({basis}); the fit below is the weights' alone"
        )?,
    }
    Ok(())
}

/// The verdict: what the plan takes of the budget, activations counted, and the margin.
fn verdict(simulation: &Simulation) -> String {
    let fit = &simulation.fit;
    let activations = match fit.activation_bytes {
        0 => "activations not counted".to_string(),
        bytes => format!("activations {} counted", Bytes(bytes)),
    };
    let used = format!(
        "{} of {} VRAM",
        Bytes(fit.vram_used_bytes),
        Bytes(fit.vram_budget_bytes)
    );
    if fit.ring_bytes == 0 {
        return format!(
            "fits: yes, {used} (weights {} resident, {activations}), margin {}",
            Bytes(fit.resident_bytes),
            Bytes(fit.vram_margin_bytes)
        );
    }
    format!(
        "fits: yes, streaming: {used} (weights {} resident, ring {}, {activations}); runs down to a budget of {}, margin {}",
        Bytes(fit.resident_bytes),
        Bytes(fit.ring_bytes),
        Bytes(fit.vram_least_bytes),
        Bytes(fit.vram_budget_bytes.saturating_sub(fit.vram_least_bytes))
    )
}

/// The bytes a step moves and the bound they set.
fn write_bound(out: &mut impl Write, simulation: &Simulation) -> std::io::Result<()> {
    let fit = &simulation.fit;
    writeln!(
        out,
        "{}; per step {} over PCIe, {} from disk",
        verdict(simulation),
        Bytes(fit.pcie_bytes_per_step),
        Bytes(fit.disk_bytes_per_step)
    )?;
    writeln!(
        out,
        "bound: {} per step ({}), {:?}-bound (compute {}, pcie {}, disk {}); cold first step ≥ {}",
        seconds(fit.bound_seconds),
        bound_in_unit(simulation),
        fit.bottleneck,
        seconds(fit.compute_seconds),
        seconds(fit.pcie_seconds),
        seconds(fit.disk_seconds),
        seconds(fit.cold_bound_seconds)
    )
}

/// One row per policy: stagehand, then each baseline (or why it could not run).
fn write_policies(out: &mut impl Write, simulation: &Simulation) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<13} {:>5} {:>11} {:>11} {:>11} {:>8} {:>7} {:>12} {:>12} {:>12} {:>21} {:>21}",
        "policy",
        "depth",
        "cold",
        "steady",
        "bound",
        "×bound",
        "×plan",
        "disk→pinned",
        "pinned→vram",
        "disk→vram",
        "peak vram / budget",
        "peak pinned / limit"
    )?;
    if let Some(stagehand) = &simulation.stagehand {
        write_row(out, "stagehand", stagehand)?;
    }
    for baseline in &simulation.baselines {
        match &baseline.figures {
            Some(figures) => write_row(out, baseline.policy.label(), figures)?,
            None => writeln!(
                out,
                "{:<13} could not run: {}",
                baseline.policy.label(),
                baseline.error.as_deref().unwrap_or("unknown")
            )?,
        }
    }
    writeln!(
        out,
        "(bound: the fit check's at each policy's prefetch depth; ×plan: steady step over the bound of the bytes its plan moves; bytes per steady step)"
    )
}

fn write_row(out: &mut impl Write, name: &str, figures: &PolicyFigures) -> std::io::Result<()> {
    let run = &figures.run;
    let bytes = &run.steady_bytes_per_step;
    writeln!(
        out,
        "{:<13} {:>5} {:>11} {:>11} {:>11} {:>7.3}× {:>6.3}× {:>12} {:>12} {:>12} {:>21} {:>21}",
        name,
        run.prefetch_depth,
        seconds(run.cold_step_seconds),
        seconds(run.steady_step_seconds),
        seconds(figures.bound_seconds),
        figures.steady_over_bound,
        figures.steady_over_plan_bound,
        per_step(bytes.disk_to_pinned),
        per_step(bytes.pinned_to_vram),
        per_step(bytes.disk_to_vram),
        format!(
            "{} / {}",
            Bytes(run.peak_vram_bytes),
            Bytes(run.vram_budget_bytes)
        ),
        format!(
            "{} / {}",
            Bytes(run.peak_pinned_bytes),
            Bytes(run.pinned_limit_bytes)
        ),
    )
}

/// Stagehand's steady step against the bound and against each baseline.
fn write_comparison(out: &mut impl Write, simulation: &Simulation) -> std::io::Result<()> {
    if let (Some(stagehand), Some(rate)) = (&simulation.stagehand, &simulation.stagehand_rate) {
        writeln!(
            out,
            "stagehand: {} per steady step = {rate}; {:.1} % of the bound",
            seconds(stagehand.run.steady_step_seconds),
            stagehand.efficiency * 100.0
        )?;
    }
    for baseline in &simulation.baselines {
        let Some(speedup) = baseline.stagehand_speedup else {
            continue;
        };
        if (speedup - 1.0).abs() < 0.005 {
            // At depth 0 stagehand is the naive baseline: "1.00× faster" would mislead.
            writeln!(
                out,
                "stagehand vs {} ({}): the same steady step",
                baseline.policy.label(),
                baseline.description
            )?;
        } else if speedup >= 1.0 {
            writeln!(
                out,
                "stagehand vs {} ({}): {speedup:.2}× faster per steady step",
                baseline.policy.label(),
                baseline.description
            )?;
        } else {
            writeln!(
                out,
                "stagehand vs {} ({}): {:.2}× slower per steady step",
                baseline.policy.label(),
                baseline.description,
                1.0 / speedup
            )?;
        }
    }
    Ok(())
}

/// Where the depth came from and, with auto, every candidate's figure.
fn write_depth_search(
    out: &mut impl Write,
    simulation: &Simulation,
    depth_source: &Source,
) -> std::io::Result<()> {
    let configured = simulation.prefetch_depth_configured;
    if !simulation.prefetch_depth_auto {
        return writeln!(
            out,
            "prefetch depth: {configured} (set by {depth_source}); --prefetch-depth auto lets the simulator choose"
        );
    }
    let tried: Vec<String> = simulation
        .depth_candidates
        .iter()
        .map(|candidate| match candidate.steady_step_seconds {
            Some(steady) => format!("{} → {}", candidate.depth, seconds(steady)),
            None => format!("{} → could not run", candidate.depth),
        })
        .collect();
    let chosen = match simulation.prefetch_depth_chosen {
        Some(depth) => format!("chose {depth}"),
        None => format!("no depth could run; checked the configured {configured}"),
    };
    writeln!(
        out,
        "prefetch depth: auto, steady step over {SEARCH_STEPS} steps at each of 0..={AUTO_DEPTH_MAX}: {}; {chosen}",
        tried.join(", ")
    )?;
    for candidate in &simulation.depth_candidates {
        if let Some(error) = &candidate.error {
            writeln!(out, "  depth {}: {error}", candidate.depth)?;
        }
    }
    Ok(())
}

/// The depth to put in the config for this model on this machine.
fn write_depth_advice(out: &mut impl Write, simulation: &Simulation) -> std::io::Result<()> {
    let Some(advice) = simulation.depth_advice() else {
        return Ok(());
    };
    let chosen = seconds(advice.steady_step_seconds);
    let configured = advice.configured_depth;
    if simulation.fit.ring_bytes == 0 {
        return writeln!(
            out,
            "the whole model stays resident in VRAM: prefetch_depth makes no difference here ({chosen}/step)"
        );
    }
    if advice.depth == configured {
        return writeln!(
            out,
            "the configured prefetch_depth = {configured} is the fastest for this model on this box: {chosen}/step"
        );
    }
    let versus = match advice.configured_steady_step_seconds {
        Some(steady) if steady <= advice.steady_step_seconds * (1.0 + TIE_RELATIVE) => {
            format!(
                "within {:.0} % of the configured {configured} ({}), with fewer buffers in VRAM and pinned RAM",
                TIE_RELATIVE * 100.0,
                seconds(steady)
            )
        }
        Some(steady) => format!("vs {} at the configured {configured}", seconds(steady)),
        None => format!("; the configured {configured} cannot run under these budgets"),
    };
    write!(
        out,
        "recommended prefetch_depth = {} for this model on this box: {chosen}/step {versus}",
        advice.depth
    )?;
    writeln!(out)
}

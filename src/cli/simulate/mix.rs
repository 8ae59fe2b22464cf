//! `stagehand simulate --model A --with B`: two models used in turn under one shared
//! budget (`serve`'s `[budget]`), predicted with the broker's own ledger
//! ([`stagehand::simulate::simulate_mix`]): the leases each holds in use and idle,
//! its steady step in turn against alone with the whole budget, and what a switch
//! moves. `--vram-budget` and `--pin-ceiling` are the shared budget.

use std::io::Write;

use stagehand::actors::{Bytes, Lease};
use stagehand::settings::Settings;
use stagehand::sim::HardwareProfile;
use stagehand::simulate::{
    simulate_mix, FitSettings, MixPrediction, ModelDescription, SimulateOptions,
};

use super::{Failure, SimulateArgs};
use crate::cli::CommandResult;

pub(super) fn execute(
    args: &SimulateArgs,
    models: [&ModelDescription; 2],
    hardware: &HardwareProfile,
    settings: &Settings,
) -> CommandResult {
    let fit = FitSettings::from_settings(settings);
    let card = hardware
        .vram_bytes()
        .saturating_sub(fit.reserve_vram_bytes)
        .saturating_sub(fit.vram_headroom_bytes);
    let shared = Lease {
        vram_bytes: settings.vram_budget.map_or(card, |budget| budget.as_u64()),
        pin_bytes: settings.pin_ceiling.map_or_else(
            || stagehand::run::memory::pinnable_bytes(hardware.ram_bytes, settings),
            |ceiling| ceiling.as_u64(),
        ),
    };
    let options = SimulateOptions {
        steps: args.steps,
        settings: fit,
        baselines: false,
        ..SimulateOptions::default()
    };
    let mix = simulate_mix(models, hardware, &options, shared).map_err(Failure::bad_input)?;
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        serde_json::to_writer_pretty(&mut out, &mix)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        write_text(&mut out, &mix, &hardware.name)
    };
    match written {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(Failure::run_failed),
    }
}

fn write_text(out: &mut impl Write, mix: &MixPrediction, hardware: &str) -> std::io::Result<()> {
    let names: Vec<&str> = mix.models.iter().map(|model| model.name.as_str()).collect();
    writeln!(
        out,
        "{} in turn on {hardware}, sharing {} of VRAM and {} of pinned RAM",
        names.join(" and "),
        Bytes(mix.shared.vram_bytes),
        Bytes(mix.shared.pin_bytes)
    )?;
    for model in &mix.models {
        writeln!(out, "  {}:", model.name)?;
        writeln!(
            out,
            "    floor {} VRAM / {} pinned, want {} / {}",
            Bytes(model.floor.vram_bytes),
            Bytes(model.floor.pin_bytes),
            Bytes(model.want.vram_bytes),
            Bytes(model.want.pin_bytes)
        )?;
        writeln!(
            out,
            "    holds {} of VRAM in use, {} while the other runs",
            Bytes(model.active.vram_bytes),
            Bytes(model.idle.vram_bytes)
        )?;
        writeln!(
            out,
            "    steady step {:.1} ms in turn, {:.1} ms alone with the whole budget ({:.2}x)",
            model.in_turn_step_seconds * 1e3,
            model.alone_step_seconds * 1e3,
            model.in_turn_step_seconds / model.alone_step_seconds.max(f64::MIN_POSITIVE)
        )?;
        writeln!(
            out,
            "    a switch to it plans {} resident again: +{:.1} ms on its first step",
            Bytes(model.switch_bytes),
            model.switch_seconds * 1e3
        )?;
    }
    Ok(())
}

//! `stagehand calibrate [--out FILE]`: measures this machine on the backend a run would
//! use and writes a hardware profile (the format of `config/hardware/*.toml`, every
//! figure with how it was measured) for `simulate --hardware FILE`. A measurement the
//! filesystem refuses is skipped with its reason (exit 0 with the rest); nothing
//! measured at all is exit 2.

use std::path::PathBuf;

use super::{CommandResult, Failure};
use stagehand::calibrate::{calibrate, profile_toml, CalibrateOptions, Calibration, Part};
use stagehand::settings::{self, SettingsArgs};
use stagehand::storage::StorageOptions;

#[derive(Debug, clap::Args)]
pub struct CalibrateArgs {
    /// Write the profile here (default: print it).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Measure reads on this directory's filesystem (a scratch file is written and
    /// removed): where the models live. Default: the cache directory.
    #[arg(long, value_name = "DIR", conflicts_with = "file")]
    pub dir: Option<PathBuf>,
    /// Measure reads of this existing file instead (nothing is written): a model file,
    /// or any large file on a read-only filesystem.
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Bytes the disk measurement reads per pass (the scratch file's size).
    #[arg(long, value_name = "SIZE", default_value = "256MiB")]
    pub disk_bytes: bytesize::ByteSize,
    /// Only these measurements (comma-separated): copy, disk, compute, shared.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "PART")]
    pub measure: Vec<Part>,
    /// Fewer shapes and samples (~5 s instead of ~15 s).
    #[arg(long)]
    pub quick: bool,
    /// Print every figure as JSON instead of the profile.
    #[arg(long)]
    pub json: bool,
    /// Measure only the roofline a run's bound comes from on the CPU backend (memory
    /// bandwidth, product peaks, copy rate; each the best of 5 rounds, ~6 s), replace
    /// the cached one and print it as JSON.
    #[arg(long, conflicts_with_all = ["out", "dir", "file", "measure", "quick"])]
    pub roofline: bool,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

pub fn execute(args: CalibrateArgs) -> CommandResult {
    let loaded = settings::load(&args.settings).map_err(Failure::bad_input)?;
    let settings = loaded.settings;
    check_arguments(&args, &settings)?;
    if args.roofline {
        return measure_roofline();
    }
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(stagehand::run::default_cache_dir);
    if args.file.is_none() && args.dir.is_none() {
        // The default scratch directory may not exist yet.
        let _ = std::fs::create_dir_all(&dir);
    }
    let mut options = if args.quick {
        CalibrateOptions::quick(dir)
    } else {
        CalibrateOptions::full(dir)
    };
    // `--device cuda` measures GPU 0 (copies over its link, its kernels); `auto` and
    // `cpu` measure the CPU backend, the one a run without a GPU uses.
    options.cuda = settings.device == stagehand::settings::DeviceKind::Cuda;
    options.disk.bytes = args.disk_bytes.as_u64();
    options.disk.file = args.file.clone();
    options.disk.storage = StorageOptions::from_settings(&settings);
    if !args.measure.is_empty() {
        options.parts = args.measure.clone();
    }
    if args.out.is_some() && !covers_a_profile(&options.parts) {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--out writes a whole profile: it needs --measure copy,disk,compute (shared is optional); drop --measure or --out"
        )));
    }
    let calibration = calibrate(&options, &mut |what| eprintln!("calibrate: {what}"))
        .map_err(Failure::bad_input)?;
    for skipped in &calibration.skipped {
        eprintln!(
            "calibrate: skipped {}: {}",
            skipped.measurement, skipped.reason
        );
    }
    if args.json {
        let text = serde_json::to_string_pretty(&calibration).map_err(Failure::run_failed)?;
        println!("{text}");
        return write_profile(&args, &calibration, false);
    }
    write_profile(&args, &calibration, true)
}

/// `--roofline`: a fresh measurement, cached for the next run and printed.
fn measure_roofline() -> CommandResult {
    use stagehand::run::roofline::{unix_now, Roofline};
    let cache_dir = stagehand::run::default_cache_dir();
    eprintln!("calibrate: measuring the roofline (memory bandwidth, product peaks, copy rate)");
    let roofline = Roofline::measure();
    // An unoptimised build measures its own slow loops: its figures are never cached.
    if cfg!(debug_assertions) {
        eprintln!(
            "calibrate: roofline {} (an unoptimised build: not cached)",
            roofline.provenance(unix_now())
        );
    } else {
        store_roofline(&roofline, &cache_dir);
    }
    let text = serde_json::to_string_pretty(&roofline).map_err(Failure::run_failed)?;
    println!("{text}");
    Ok(())
}

/// Caches `roofline` for the next run, saying where (or why not).
fn store_roofline(roofline: &stagehand::run::roofline::Roofline, cache_dir: &std::path::Path) {
    use stagehand::run::roofline::unix_now;
    match roofline.store(cache_dir) {
        Ok(()) => eprintln!(
            "calibrate: roofline {}; cached in {}",
            roofline.provenance(unix_now()),
            cache_dir.display()
        ),
        Err(error) => eprintln!(
            "calibrate: roofline not cached in {} ({error}); runs measure their own",
            cache_dir.display()
        ),
    }
}

/// What is refused before anything is measured (a calibration takes seconds to
/// minutes): the simulator as the device, no bytes to read, a --dir or --file that is
/// not one, an `--out` that cannot be
/// written.
fn check_arguments(
    args: &CalibrateArgs,
    settings: &stagehand::settings::Settings,
) -> CommandResult {
    let refuse = |message: String| Err(Failure::bad_input(anyhow::anyhow!(message)));
    if settings.device == stagehand::settings::DeviceKind::Sim {
        return refuse(
            "--device sim: calibrate measures a real machine (cpu or cuda); the simulator reads              the profile it writes (`stagehand simulate --hardware FILE`)"
                .to_string(),
        );
    }
    if args.disk_bytes.as_u64() == 0 {
        return refuse(
            "--disk-bytes 0: the disk measurement needs bytes to read, e.g. 256MiB".to_string(),
        );
    }
    if let Some(dir) = args.dir.as_ref().filter(|dir| !dir.is_dir()) {
        return refuse(format!(
            "--dir {}: not a folder; give the folder to write the scratch file in",
            dir.display()
        ));
    }
    if let Some(file) = args.file.as_ref().filter(|file| !file.is_file()) {
        return refuse(format!(
            "--file {}: not a regular file; give a file to read (it is read, never written)",
            file.display()
        ));
    }
    let Some(out) = &args.out else {
        return Ok(());
    };
    let folder = out.parent().filter(|parent| !parent.as_os_str().is_empty());
    if out.is_dir() {
        return refuse(format!(
            "--out {}: a folder; give the profile file's path, e.g. local.toml",
            out.display()
        ));
    }
    match folder {
        Some(folder) if !folder.is_dir() => refuse(format!(
            "--out {}: the folder {} does not exist",
            out.display(),
            folder.display()
        )),
        _ => Ok(()),
    }
}

/// Copies, reads and kernels are what a profile cannot do without.
fn covers_a_profile(parts: &[Part]) -> bool {
    [Part::Copy, Part::Disk, Part::Compute]
        .iter()
        .all(|part| parts.contains(part))
}

fn write_profile(args: &CalibrateArgs, calibration: &Calibration, print: bool) -> CommandResult {
    if !covers_a_profile(
        &[Part::Copy, Part::Disk, Part::Compute]
            .into_iter()
            .filter(|part| match part {
                Part::Copy => calibration.copies.is_some(),
                Part::Compute => calibration.kernels.is_some(),
                _ => true,
            })
            .collect::<Vec<_>>(),
    ) {
        if args.out.is_some() {
            return Err(Failure::bad_input(anyhow::anyhow!(
                "no profile written: copies and kernels must both be measured"
            )));
        }
        return Ok(());
    }
    let text = profile_toml(calibration, "local")
        .map_err(|error| Failure::run_failed(anyhow::anyhow!(error)))?;
    match &args.out {
        Some(path) => {
            std::fs::write(path, &text).map_err(|error| {
                Failure::bad_input(anyhow::anyhow!("--out {}: {error}", path.display()))
            })?;
            eprintln!(
                "calibrate: wrote {}; use it with: stagehand simulate --hardware {} --model ...",
                path.display(),
                path.display()
            );
        }
        None if print => print!("{text}"),
        None => {}
    }
    Ok(())
}

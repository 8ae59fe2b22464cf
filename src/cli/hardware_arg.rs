//! The `--hardware` argument of `simulate` and `validate`: a shipped profile, a
//! profile file, or `local` (this machine, calibrated).

use std::path::Path;

use super::Failure;
use stagehand::sim::HardwareProfile;

/// A shipped profile, a profile file, or `local` (calibrated now or reused from the
/// cache, saying which on stderr; reads are measured on `read_dir`'s filesystem).
pub fn load_hardware(name: &str, read_dir: Option<&Path>) -> Result<HardwareProfile, Failure> {
    if name != stagehand::calibrate::LOCAL {
        return HardwareProfile::load(name).map_err(Failure::bad_input);
    }
    let cache_dir = stagehand::run::default_cache_dir();
    let read_dir = read_dir.map_or_else(|| cache_dir.clone(), Path::to_path_buf);
    if std::fs::create_dir_all(&read_dir).is_err() {
        // The disk measurement says why it was skipped; the rest still runs.
        tracing::debug!("cannot create {}", read_dir.display());
    }
    let local = stagehand::calibrate::local_profile(&cache_dir, &read_dir, &mut |what| {
        eprintln!("calibrate: {what}")
    })
    .map_err(Failure::bad_input)?;
    eprintln!("{}", local.note);
    Ok(local.profile)
}

/// The profile `simulate` predicts with: reads measured on the model's filesystem
/// (`local`), at the O_DIRECT rate with `fast_disk` when the profile measured one.
pub fn for_model(name: &str, model: &str, fast_disk: bool) -> Result<HardwareProfile, Failure> {
    let read_dir = Path::new(model).parent().filter(|dir| dir.is_dir());
    let hardware = load_hardware(name, read_dir)?;
    Ok(if fast_disk {
        hardware.reading(stagehand::sim::ReadPath::Direct)
    } else {
        hardware
    })
}

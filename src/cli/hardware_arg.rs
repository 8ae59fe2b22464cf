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
/// (`local`); at the O_DIRECT rate with `fast_disk` when the profile measured one;
/// otherwise, for a checkpoint on this machine, at the rate of what the page cache
/// holds of it now (said on stderr), as the run will read it.
pub fn for_model(name: &str, model: &str, fast_disk: bool) -> Result<HardwareProfile, Failure> {
    let read_dir = Path::new(model).parent().filter(|dir| dir.is_dir());
    let hardware = load_hardware(name, read_dir)?;
    if fast_disk {
        return Ok(hardware.reading(stagehand::sim::ReadPath::Direct));
    }
    let Some(page_cache_rate) = hardware.disk.page_cache_gb_per_s else {
        return Ok(hardware);
    };
    let Some((cached, total)) = cached_share(Path::new(model)) else {
        return Ok(hardware);
    };
    let cold_rate = hardware.disk.read_gb_per_s;
    let hardware = hardware.reading_cached(cached as f64 / total as f64);
    eprintln!(
        "reads: the page cache holds {} of the checkpoint's {} now, read at {page_cache_rate:.2} GB/s, the rest at the cold {cold_rate:.2} GB/s: {:.2} GB/s predicted (--fast-disk reads past the page cache)",
        stagehand::actors::Bytes(cached),
        stagehand::actors::Bytes(total),
        hardware.disk.read_gb_per_s
    );
    Ok(hardware)
}

/// Bytes of a checkpoint's files in the page cache now, and their total; `None` for a
/// shipped model or a description, or where the files cannot be measured.
fn cached_share(model: &Path) -> Option<(u64, u64)> {
    if !model.exists()
        || model
            .extension()
            .is_some_and(|extension| extension == "toml")
    {
        return None;
    }
    let index = stagehand::ModelIndex::open(model, None).ok()?;
    let mut cached = 0;
    let mut total = 0;
    for file in &index.files {
        cached += stagehand::os::cached_bytes(&file.path).ok()?;
        total += std::fs::metadata(&file.path).ok()?.len();
    }
    (total > 0).then_some((cached, total))
}

//! The `--hardware` argument of `simulate` and `validate`: a shipped profile, a
//! profile file, or `local` (this machine, calibrated).

use std::path::Path;

use super::Failure;
use stagehand::sim::{HardwareProfile, UncachedRange};

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
/// otherwise, for a checkpoint on this machine, from the page cache as it holds the
/// checkpoint now (said on stderr): what it holds at the page-cache rate, the rest at
/// the cold rate the first time it is read, as the run will read them.
pub fn for_model(name: &str, model: &str, fast_disk: bool) -> Result<HardwareProfile, Failure> {
    let read_dir = Path::new(model).parent().filter(|dir| dir.is_dir());
    let hardware = load_hardware(name, read_dir)?;
    if fast_disk {
        return Ok(hardware.reading(stagehand::sim::ReadPath::Direct));
    }
    let Some(page_cache_rate) = hardware.disk.page_cache_gb_per_s else {
        return Ok(hardware);
    };
    let Some((uncached, total)) = uncached_ranges(Path::new(model)) else {
        return Ok(hardware);
    };
    let cold_rate = hardware.disk.read_gb_per_s;
    let uncached_bytes: u64 = uncached.iter().map(|&(_, start, end)| end - start).sum();
    eprintln!(
        "reads: the page cache holds {} of the checkpoint's {} now, read at {page_cache_rate:.2} GB/s; the rest at the cold {cold_rate:.2} GB/s the first time (--fast-disk reads past the page cache)",
        stagehand::actors::Bytes(total.saturating_sub(uncached_bytes)),
        stagehand::actors::Bytes(total),
    );
    Ok(hardware.reading_cached(uncached))
}

/// The byte ranges of a checkpoint's files the page cache does not hold now
/// (`(file, start, end)`, `file` the index in the model's files), and the files'
/// total bytes; `None` for a shipped model or a description, or where the files
/// cannot be measured.
fn uncached_ranges(model: &Path) -> Option<(Vec<UncachedRange>, u64)> {
    if !model.exists()
        || model
            .extension()
            .is_some_and(|extension| extension == "toml")
    {
        return None;
    }
    let index = stagehand::ModelIndex::open(model, None).ok()?;
    let mut uncached = Vec::new();
    let mut total = 0;
    for (file, shard) in (0u32..).zip(&index.files) {
        let ranges = stagehand::os::uncached_ranges(&shard.path).ok()?;
        uncached.extend(ranges.into_iter().map(|(start, end)| (file, start, end)));
        total += std::fs::metadata(&shard.path).ok()?.len();
    }
    (total > 0).then_some((uncached, total))
}

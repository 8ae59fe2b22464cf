//! `--hardware local`: the profile of this machine, from a recent calibration cached
//! in the cache directory, or measured now (the quick calibration, ~5–10 s) when the
//! cached one is missing, malformed, from another machine or stagehand, or stale.
//! Either way the caller is told which, in one line.

use std::path::{Path, PathBuf};

use super::{calibrate, profile_toml, CalibrateError, CalibrateOptions, HostIdentity};
use crate::sim::HardwareProfile;

/// The name `--hardware` takes for this machine.
pub const LOCAL: &str = "local";
/// The cached profile's file name inside the cache directory.
pub const CACHED_PROFILE_FILE: &str = "hardware-local.toml";
/// A cached profile older than this is measured again (a kernel, a BIOS setting or a
/// neighbour's load changes the figures; a week keeps a day's work on one profile).
pub const MAX_AGE_SECONDS: u64 = 7 * 24 * 3600;

/// The profile `--hardware local` uses, and what was done to get it.
#[derive(Debug)]
pub struct LocalProfile {
    pub profile: HardwareProfile,
    pub path: PathBuf,
    /// Reused from the cache (true) or measured now (false).
    pub reused: bool,
    /// One line for the user: which, and why.
    pub note: String,
}

/// The local profile: the cached one in `cache_dir` if it is fresh, else a quick
/// calibration reading on `read_dir`'s filesystem (written back to the cache).
pub fn local_profile(
    cache_dir: &Path,
    read_dir: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<LocalProfile, CalibrateError> {
    let path = cache_dir.join(CACHED_PROFILE_FILE);
    let mut measure = || {
        let calibration = calibrate(&CalibrateOptions::quick(read_dir.to_path_buf()), progress)?;
        profile_toml(&calibration, LOCAL).map_err(CalibrateError::Profile)
    };
    local_profile_with(&path, super::unix_now(), &mut measure)
}

/// As [`local_profile`], with the cache file, the time and the measurement given
/// (tests give a measurement that returns a known profile).
pub fn local_profile_with(
    path: &Path,
    now_unix: u64,
    measure: &mut dyn FnMut() -> Result<String, CalibrateError>,
) -> Result<LocalProfile, CalibrateError> {
    let shown = path.display();
    let why = match std::fs::read_to_string(path) {
        Ok(text) => match HardwareProfile::parse(LOCAL, &shown.to_string(), &text) {
            Ok(profile) => match staleness(&profile, now_unix) {
                None => {
                    let age = profile
                        .calibration
                        .as_ref()
                        .map_or(0, |stamp| now_unix.saturating_sub(stamp.at_unix));
                    let note = format!(
                        "--hardware local: using the profile cached in {shown}, calibrated {} ago (`stagehand calibrate --out {shown}` measures it again)",
                        age_words(age)
                    );
                    return Ok(LocalProfile {
                        profile,
                        path: path.to_path_buf(),
                        reused: true,
                        note,
                    });
                }
                Some(why) => why,
            },
            Err(error) => format!("is malformed ({})", one_line(&error.to_string())),
        },
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            "does not exist yet".to_string()
        }
        Err(error) => format!("cannot be read ({error})"),
    };
    let text = measure()?;
    let profile = HardwareProfile::parse(LOCAL, &shown.to_string(), &text)
        .map_err(|error| CalibrateError::Profile(error.to_string()))?;
    let saved = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(path, &text));
    let kept = match saved {
        Ok(()) => format!("saved to {shown}"),
        Err(error) => format!("not cached: cannot write {shown}: {error}"),
    };
    Ok(LocalProfile {
        profile,
        path: path.to_path_buf(),
        reused: false,
        note: format!("--hardware local: the cached profile {shown} {why}: calibrated this machine now ({kept})"),
    })
}

/// Why a cached profile cannot be reused, if it cannot.
fn staleness(profile: &HardwareProfile, now_unix: u64) -> Option<String> {
    let Some(stamp) = &profile.calibration else {
        return Some(
            "has no [calibration] stamp (it was not written by `stagehand calibrate`)".to_string(),
        );
    };
    let host = HostIdentity::current().fingerprint();
    if stamp.host != host {
        return Some(format!(
            "was measured on another machine ({}; this one is {host})",
            stamp.host
        ));
    }
    if stamp.stagehand != env!("CARGO_PKG_VERSION") {
        return Some(format!(
            "was measured by stagehand {} (this is {})",
            stamp.stagehand,
            env!("CARGO_PKG_VERSION")
        ));
    }
    if stamp.method != crate::sim::CALIBRATION_METHOD {
        return Some(format!(
            "was measured by an older calibration (method {}; this stagehand measures by method {})",
            stamp.method,
            crate::sim::CALIBRATION_METHOD
        ));
    }
    let age = now_unix.saturating_sub(stamp.at_unix);
    if age > MAX_AGE_SECONDS {
        return Some(format!(
            "is stale (calibrated {} ago; at most {} are reused)",
            age_words(age),
            age_words(MAX_AGE_SECONDS)
        ));
    }
    None
}

fn age_words(seconds: u64) -> String {
    match seconds {
        0..=119 => format!("{seconds} s"),
        120..=7199 => format!("{} min", seconds / 60),
        7200..=172_799 => format!("{} h", seconds / 3600),
        _ => format!("{} days", seconds / 86_400),
    }
}

/// A parse error's lines joined, so the note stays one line.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && line.chars().any(char::is_alphanumeric))
        .collect::<Vec<_>>()
        .join(" / ")
}

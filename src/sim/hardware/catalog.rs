//! The shipped links and disks (`config/hardware/links.toml`, `disks.toml`, embedded
//! in the binary) that a profile may name instead of describing its own.

use serde::Deserialize;

use super::{DiskSpec, LinkSpec, SimError};

const LINKS_FILE: &str = include_str!("../../../config/hardware/links.toml");
const DISKS_FILE: &str = include_str!("../../../config/hardware/disks.toml");

/// Every shipped disk, in file order.
pub(super) fn disks() -> Result<Vec<(String, DiskSpec)>, SimError> {
    catalog("disks.toml", DISKS_FILE)
}

pub(super) fn named_link(name: &str) -> Result<LinkSpec, SimError> {
    named("link", "links.toml", LINKS_FILE, name)
}

pub(super) fn named_disk(name: &str) -> Result<DiskSpec, SimError> {
    named("disk", "disks.toml", DISKS_FILE, name)
}

fn named<T: for<'de> Deserialize<'de> + NamedSpec>(
    kind: &'static str,
    file: &str,
    text: &str,
    name: &str,
) -> Result<T, SimError> {
    let entries = catalog::<T>(file, text)?;
    let known: Vec<&str> = entries.iter().map(|(name, _)| name.as_str()).collect();
    let known = known.join(", ");
    entries
        .into_iter()
        .find(|(entry, _)| entry == name)
        .map(|(_, spec)| spec)
        .ok_or_else(|| SimError::UnknownProfile {
            kind,
            name: name.to_string(),
            known,
        })
}

/// The tables of a catalog file, in file order, each with its name filled in.
fn catalog<T: for<'de> Deserialize<'de> + NamedSpec>(
    file: &str,
    text: &str,
) -> Result<Vec<(String, T)>, SimError> {
    let error = |message: String| SimError::Profile {
        file: format!("config/hardware/{file}"),
        message,
    };
    let table: toml::Table = toml::from_str(text).map_err(|e| error(e.to_string()))?;
    let mut entries = Vec::new();
    for (name, value) in table {
        let mut spec: T = value
            .try_into()
            .map_err(|e: toml::de::Error| error(format!("[{name}]: {e}")))?;
        spec.set_name(&name);
        entries.push((name, spec));
    }
    Ok(entries)
}

trait NamedSpec {
    fn set_name(&mut self, name: &str);
}

impl NamedSpec for LinkSpec {
    fn set_name(&mut self, name: &str) {
        self.name = name.to_string();
    }
}

impl NamedSpec for DiskSpec {
    fn set_name(&mut self, name: &str) {
        self.name = name.to_string();
    }
}

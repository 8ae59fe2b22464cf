//! Hardware profiles: a GPU, its host link, a disk and the host's RAM.
//!
//! The shipped profiles live in `config/hardware/*.toml` and are embedded in the
//! binary, so `--hardware rtx4090` works from any directory. A user's own profile is
//! a file of the same shape, given by path; it may name a shipped link or disk or
//! describe its own in a `[link]` / `[disk]` table.

mod catalog;

use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

use super::compute::ComputeRates;
use super::device::{LinkRates, SimDeviceSpec};
use super::kernel_costs::KernelCosts;
use super::shared::SharedSpec;
use super::storage::DiskRates;
use super::SimError;
use catalog::{named_disk, named_link};

/// The shipped machine profiles, by name.
const BUILTIN_PROFILES: &[(&str, &str)] = &[
    (
        "rtx3060-12gb",
        include_str!("../../config/hardware/rtx3060-12gb.toml"),
    ),
    (
        "rtx4090",
        include_str!("../../config/hardware/rtx4090.toml"),
    ),
    (
        "rtx5090",
        include_str!("../../config/hardware/rtx5090.toml"),
    ),
    (
        "rtx-pro-6000",
        include_str!("../../config/hardware/rtx-pro-6000.toml"),
    ),
    (
        "h100-80gb",
        include_str!("../../config/hardware/h100-80gb.toml"),
    ),
    ("h200", include_str!("../../config/hardware/h200.toml")),
];

/// A byte range of a model's file the page cache does not hold: `(file, start, end)`,
/// `file` the index in the model's files.
pub type UncachedRange = (u32, u64, u64);

/// A resolved machine: everything the simulator and the fit check need.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HardwareProfile {
    /// The name it was loaded by (built-in name or file stem).
    pub name: String,
    /// "built-in" or the file it came from.
    pub source: String,
    pub gpu: GpuSpec,
    pub link: LinkSpec,
    pub disk: DiskSpec,
    pub ram_bytes: u64,
    /// When and where a calibrated profile was measured (`stagehand calibrate`).
    pub calibration: Option<CalibrationStamp>,
    /// Copies, reads and compute share cores and one memory bus (the CPU backend)
    /// instead of running on independent engines.
    pub shared: Option<SharedSpec>,
    /// Measured kernel costs: a block's compute is the sum of its kernels' times
    /// instead of the roofline of `[gpu]`.
    pub compute: Option<KernelCosts>,
    /// `[host] first_touch_gb_per_s`: how fast the host faults in fresh memory on its
    /// first write (the CPU backend's arena and pinned buffers, see `first_touch`);
    /// `None`: memory is mapped when allocated (GPU profiles, older calibrations).
    pub first_touch_gb_per_s: Option<f64>,
    /// Reading from the page cache (`reading(ReadPath::PageCache)`): the rate of the
    /// bytes whose pages a run dropped once it had pinned them (`Storage::forget_cached`)
    /// and reads again later — the buffered cold rate. `None`: every read at the disk's
    /// one rate.
    pub uncached_read_gb_per_s: Option<f64>,
    /// The byte ranges of the model's files the page cache did not hold when the
    /// simulation began, `(file, start, end)` with `file` the index in the model's
    /// files ([`Self::reading_cached`]): read at the uncached rate the first time,
    /// cached from then on, as the run reads them. Not part of a profile file.
    #[serde(skip)]
    pub uncached_at_start: Vec<UncachedRange>,
}

/// The `[calibration]` stamp of a measured profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationStamp {
    /// Seconds since the Unix epoch when the calibration finished.
    pub at_unix: u64,
    /// The machine it measured (host name, CPU model, cores, RAM).
    pub host: String,
    /// The backend measured: `cpu` or `cuda`.
    pub backend: String,
    /// The stagehand version that measured it.
    pub stagehand: String,
    /// How it was measured ([`CALIBRATION_METHOD`] when written; absent: 0, before
    /// methods were numbered). `--hardware local` measures again when it differs.
    #[serde(default)]
    pub method: u32,
}

/// The calibration method `stagehand calibrate` writes into its stamp: raised whenever
/// a measurement changes what it reports, so a profile cached by an older one is
/// measured again rather than reused for a week. 1: attention per (query, head), the
/// first-touch rate the fastest of three fresh arenas (2026-12-06).
pub const CALIBRATION_METHOD: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    pub name: String,
    pub vram: ByteSize,
    pub pcie_generation: u32,
    /// Dense (no sparsity) bf16 tensor throughput, FP32 accumulate.
    pub bf16_dense_tflops: f64,
    /// Fraction of the dense peak a whole model step sustains.
    pub sustained_efficiency: f64,
    pub memory_gb_per_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    #[serde(default)]
    pub name: String,
    pub pinned_gb_per_s: f64,
    pub pageable_gb_per_s: f64,
    pub latency_us: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskSpec {
    #[serde(default)]
    pub name: String,
    pub read_gb_per_s: f64,
    pub request_latency_us: f64,
    /// Measured O_DIRECT rate (`--fast-disk`), when it differs from `read_gb_per_s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_read_gb_per_s: Option<f64>,
    /// Measured buffered rate with the file in the page cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_cache_gb_per_s: Option<f64>,
}

/// Where a run's reads come from, for a profile that measured each kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadPath {
    /// Buffered reads of a file not in the page cache (`read_gb_per_s`).
    BufferedCold,
    /// Buffered reads of a file the page cache holds (`page_cache_gb_per_s`).
    PageCache,
    /// O_DIRECT reads (`--fast-disk`, `direct_read_gb_per_s`).
    Direct,
}

/// The file format of a machine profile.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    gpu: GpuSpec,
    host: HostSection,
    /// A link of the user's own, instead of the one the PCIe generation names.
    link: Option<LinkSpec>,
    /// A disk of the user's own, instead of `host.disk`.
    disk: Option<DiskSpec>,
    calibration: Option<CalibrationStamp>,
    shared: Option<SharedSpec>,
    compute: Option<KernelCosts>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostSection {
    ram: ByteSize,
    /// Name of a shipped disk (hdd, sata, nvme3, nvme4, nvme5).
    disk: Option<String>,
    /// Measured by `stagehand calibrate` on the CPU backend; optional.
    first_touch_gb_per_s: Option<f64>,
}

impl HardwareProfile {
    /// Loads a shipped profile by name, or a user's profile file by path.
    pub fn load(name_or_path: &str) -> Result<Self, SimError> {
        let (name, source, text) =
            super::shipped_or_file("hardware", name_or_path, BUILTIN_PROFILES)?;
        Self::parse(&name, &source, &text)
    }

    /// Names `load` accepts without a path.
    pub fn builtin_names() -> Vec<&'static str> {
        BUILTIN_PROFILES.iter().map(|(name, _)| *name).collect()
    }

    /// Names `with_disk` accepts.
    pub fn disk_names() -> Result<Vec<String>, SimError> {
        Ok(catalog::disks()?
            .into_iter()
            .map(|(name, _)| name)
            .collect())
    }

    /// Parses a profile's text; `source` names it in errors.
    pub fn parse(name: &str, source: &str, text: &str) -> Result<Self, SimError> {
        let profile_error = |message: String| SimError::Profile {
            file: source.to_string(),
            message,
        };
        let file: ProfileFile =
            toml::from_str(text).map_err(|error| profile_error(error.to_string()))?;
        let link = match file.link {
            Some(link) => link,
            None => named_link(&format!("pcie{}", file.gpu.pcie_generation)).map_err(|_| {
                profile_error(format!(
                    "gpu.pcie_generation = {}: no shipped link `pcie{0}` (3, 4 or 5); describe it in a [link] table",
                    file.gpu.pcie_generation
                ))
            })?,
        };
        let disk = match (file.disk, file.host.disk) {
            (Some(_), Some(_)) => {
                return Err(profile_error(
                    "both host.disk and a [disk] table: keep one".to_string(),
                ))
            }
            (Some(disk), None) => disk,
            (None, Some(name)) => {
                named_disk(&name).map_err(|error| profile_error(format!("host.disk: {error}")))?
            }
            (None, None) => {
                return Err(profile_error(
                    "no disk: set host.disk to a shipped disk or add a [disk] table".to_string(),
                ))
            }
        };
        let profile = Self {
            name: name.to_string(),
            source: source.to_string(),
            gpu: file.gpu,
            link,
            disk,
            ram_bytes: file.host.ram.as_u64(),
            calibration: file.calibration,
            shared: file.shared,
            compute: file.compute,
            first_touch_gb_per_s: file.host.first_touch_gb_per_s,
            uncached_read_gb_per_s: None,
            uncached_at_start: Vec::new(),
        };
        profile.validate().map_err(profile_error)?;
        Ok(profile)
    }

    /// The same machine with another amount of RAM (`--ram`).
    pub fn with_ram(mut self, ram: ByteSize) -> Self {
        self.ram_bytes = ram.as_u64();
        self
    }

    /// The same machine with a shipped disk (`--disk nvme4`).
    pub fn with_disk(mut self, name: &str) -> Result<Self, SimError> {
        self.disk = named_disk(name)?;
        Ok(self)
    }

    /// The same machine reading along `path`: its measured rate for that kind of
    /// read becomes the disk's rate (a shipped disk has one rate for all).
    pub fn reading(mut self, path: ReadPath) -> Self {
        let rate = match path {
            ReadPath::BufferedCold => None,
            ReadPath::PageCache => self.disk.page_cache_gb_per_s,
            ReadPath::Direct => self.disk.direct_read_gb_per_s,
        };
        if let Some(rate) = rate {
            if path == ReadPath::PageCache && self.uncached_read_gb_per_s.is_none() {
                self.uncached_read_gb_per_s = Some(self.disk.read_gb_per_s);
            }
            self.disk.read_gb_per_s = rate;
        }
        self
    }

    /// The same machine reading buffered from files of which the page cache holds
    /// all but `uncached` now (`(file, start, end)` byte ranges): reads at the
    /// page-cache rate, and those ranges at the cold rate the first time they are
    /// read — page by page, as a run meets them: a run that pinned some blocks
    /// dropped their pages, and the next run reads those cold once, then from its
    /// pins, while the streamed blocks keep coming from the page cache. Unchanged
    /// where the profile measured no page-cache rate (a shipped profile).
    pub fn reading_cached(mut self, uncached: Vec<UncachedRange>) -> Self {
        let Some(page_cache) = self.disk.page_cache_gb_per_s else {
            return self;
        };
        if page_cache.is_nan() || page_cache <= 0.0 {
            return self;
        }
        if self.uncached_read_gb_per_s.is_none() {
            self.uncached_read_gb_per_s = Some(self.disk.read_gb_per_s);
        }
        self.disk.read_gb_per_s = page_cache;
        self.uncached_at_start = uncached;
        self
    }

    /// Read rate of bytes whose pages were dropped, when it differs from the disk's.
    pub fn uncached_rates(&self) -> Option<DiskRates> {
        self.uncached_read_gb_per_s.map(|gb_per_s| DiskRates {
            bytes_per_second: gigabytes(gb_per_s),
            ..self.disk_rates()
        })
    }

    fn validate(&self) -> Result<(), String> {
        if let Some(shared) = &self.shared {
            shared.validate()?;
        }
        if let Some(compute) = &self.compute {
            compute.validate()?;
        }
        for (key, value) in [
            ("disk.direct_read_gb_per_s", self.disk.direct_read_gb_per_s),
            ("disk.page_cache_gb_per_s", self.disk.page_cache_gb_per_s),
            ("host.first_touch_gb_per_s", self.first_touch_gb_per_s),
        ] {
            if let Some(value) = value {
                if !(value.is_finite() && value > 0.0) {
                    return Err(format!("{key} = {value}: must be a positive number"));
                }
            }
        }
        let positive = [
            ("gpu.bf16_dense_tflops", self.gpu.bf16_dense_tflops),
            ("gpu.memory_gb_per_s", self.gpu.memory_gb_per_s),
            ("link.pinned_gb_per_s", self.link.pinned_gb_per_s),
            ("link.pageable_gb_per_s", self.link.pageable_gb_per_s),
            ("disk.read_gb_per_s", self.disk.read_gb_per_s),
        ];
        for (key, value) in positive {
            if !(value.is_finite() && value > 0.0) {
                return Err(format!("{key} = {value}: must be a positive number"));
            }
        }
        let efficiency = self.gpu.sustained_efficiency;
        if !(efficiency > 0.0 && efficiency <= 1.0) {
            return Err(format!(
                "gpu.sustained_efficiency = {efficiency}: must be in (0, 1]"
            ));
        }
        for (key, value) in [
            ("link.latency_us", self.link.latency_us),
            ("disk.request_latency_us", self.disk.request_latency_us),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(format!("{key} = {value}: must be zero or positive"));
            }
        }
        if self.gpu.vram.as_u64() == 0 {
            return Err("gpu.vram: must be more than 0".to_string());
        }
        if self.ram_bytes == 0 {
            return Err("host.ram: must be more than 0".to_string());
        }
        Ok(())
    }

    pub fn vram_bytes(&self) -> u64 {
        self.gpu.vram.as_u64()
    }

    pub fn link_rates(&self) -> LinkRates {
        LinkRates {
            pinned_bytes_per_second: gigabytes(self.link.pinned_gb_per_s),
            pageable_bytes_per_second: gigabytes(self.link.pageable_gb_per_s),
            latency: microseconds(self.link.latency_us),
        }
    }

    pub fn disk_rates(&self) -> DiskRates {
        DiskRates {
            bytes_per_second: gigabytes(self.disk.read_gb_per_s),
            request_latency: microseconds(self.disk.request_latency_us),
        }
    }

    pub fn compute_rates(&self) -> ComputeRates {
        ComputeRates {
            sustained_flops_per_second: self.gpu.bf16_dense_tflops
                * 1e12
                * self.gpu.sustained_efficiency,
            memory_bytes_per_second: gigabytes(self.gpu.memory_gb_per_s),
        }
    }

    /// The simulated device; it may pin at most the host's RAM (the pin manager's
    /// ceiling is the tighter, deliberate limit).
    pub fn device_spec(&self) -> SimDeviceSpec {
        SimDeviceSpec {
            vram_bytes: self.vram_bytes(),
            pinnable_bytes: self.ram_bytes,
            link: self.link_rates(),
        }
    }
}

/// Decimal GB/s to bytes per second.
fn gigabytes(gb_per_second: f64) -> u64 {
    (gb_per_second * 1e9).round() as u64
}

fn microseconds(value: f64) -> Duration {
    Duration::from_nanos((value * 1e3).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_resolves_its_link_from_the_pcie_generation() {
        let profile = HardwareProfile::load("rtx4090").unwrap();
        assert_eq!(profile.link.name, "pcie4");
        assert_eq!(profile.link_rates().pinned_bytes_per_second, 25_000_000_000);
        assert_eq!(profile.vram_bytes(), 24 << 30);
    }

    #[test]
    fn errors_name_the_file_and_the_key() {
        let text = "[gpu]\nname = \"x\"\nvram = \"8 GiB\"\npcie_generation = 4\nbf16_dense_tflops = 10\nsustained_efficiency = 0.5\nmemory_gb_per_s = 100\nbogus = 1\n[host]\nram = \"8 GiB\"\ndisk = \"nvme4\"\n";
        let message = HardwareProfile::parse("x", "my-box.toml", text)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("my-box.toml") && message.contains("bogus"),
            "{message}"
        );

        let slow = text.replace("bogus = 1\n", "").replace("0.5", "1.5");
        let message = HardwareProfile::parse("x", "my-box.toml", &slow)
            .unwrap_err()
            .to_string();
        assert!(message.contains("gpu.sustained_efficiency"), "{message}");

        let floppy = text.replace("bogus = 1\n", "").replace("nvme4", "floppy");
        let message = HardwareProfile::parse("x", "my-box.toml", &floppy)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("floppy") && message.contains("nvme5"),
            "{message}"
        );
    }
}

//! Deployment settings, layered: built-in defaults (`config/default.toml`, compiled
//! in) < `config/default.toml` in the working directory <
//! `--config FILE` < `STAGEHAND_*` environment < command-line flags.
//!
//! This struct is the contract every subcommand reads; the loading, validation and
//! provenance live beside it.

mod args;
mod error;
mod keys;
mod layers;
mod load;
mod provenance;
mod validate;

pub use args::SettingsArgs;
pub use error::SettingsError;
pub use keys::{display_value, parse_metrics_addr, KEYS};
pub use layers::{CPU_PATH_ENV, NOT_SETTINGS_ENV};
pub use load::{
    find_default_file, load, load_layers, load_with, LoadOptions, Loaded, BUILT_IN_DEFAULTS_TOML,
    DEFAULT_FILE,
};
pub use provenance::{Origin, Provenance, Source};
pub use validate::{check_block_pattern, is_log_filter, IO_ALIGN_BYTES, MIN_RAM_FLOOR};

use std::net::SocketAddr;
use std::path::PathBuf;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

use crate::compute::ComputeDtype;

/// Which device adapter runs the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// CUDA when a device is present, else the CPU backend.
    Auto,
    Cpu,
    Sim,
    Cuda,
}

/// How a run checks that what it computed from streamed weights is right.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verify {
    /// Every step against the fully-resident pass, bit for bit (twice the compute).
    Full,
    /// The first step against the fully-resident pass, then `weights`.
    First,
    /// Every block's bytes against the file's checksum as they land in the device tier:
    /// streamed data cannot differ from the file. Costs a pass over the landed bytes.
    Weights,
    /// No check.
    Off,
}

impl Verify {
    pub const NAMES: &'static str = "full, first, weights, off";

    pub fn name(self) -> &'static str {
        match self {
            Verify::Full => "full",
            Verify::First => "first",
            Verify::Weights => "weights",
            Verify::Off => "off",
        }
    }

    /// Whether landed blocks are checked against the file.
    pub fn checks_weights(self) -> bool {
        matches!(self, Verify::First | Verify::Weights)
    }
}

/// Sizes in JSON (`stagehand config --json`) are integer bytes, which a script can
/// compare, not text such as "7.5 GiB". Reading still takes either.
mod size_json {
    use bytesize::ByteSize;
    use serde::Serializer;

    pub fn bytes<S: Serializer>(size: &ByteSize, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(size.as_u64())
    }

    pub fn optional<S: Serializer>(
        size: &Option<ByteSize>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match size {
            Some(size) => serializer.serialize_some(&size.as_u64()),
            None => serializer.serialize_none(),
        }
    }
}

/// The effective settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub device: DeviceKind,
    /// VRAM stagehand may use for weights; `None` = device total − reserve_vram − vram_headroom
    /// (the CPU backend then uses 40 % of the model, so the demo really streams).
    #[serde(serialize_with = "size_json::optional")]
    pub vram_budget: Option<ByteSize>,
    /// VRAM kept out of stagehand's own accounting.
    #[serde(serialize_with = "size_json::bytes")]
    pub reserve_vram: ByteSize,
    /// VRAM kept free even counting other processes.
    #[serde(serialize_with = "size_json::bytes")]
    pub vram_headroom: ByteSize,
    /// Most host memory stagehand pins; `None` = derived from free RAM − ram_floor.
    #[serde(serialize_with = "size_json::optional")]
    pub pin_ceiling: Option<ByteSize>,
    /// Free RAM kept for the rest of the machine; clamped to ≥ 2 GiB.
    #[serde(serialize_with = "size_json::bytes")]
    pub ram_floor: ByteSize,
    /// Stream from disk every step through a pinned staging ring (O_DIRECT).
    pub fast_disk: bool,
    /// Streamed blocks loaded ahead of the compute position.
    pub prefetch_depth: u32,
    /// Serve Prometheus `/metrics` here; `None` = off.
    pub metrics_addr: Option<SocketAddr>,
    /// Write a Chrome trace of the run here.
    pub trace: Option<PathBuf>,
    /// Log filter (tracing env-filter syntax).
    pub log: String,
    /// Regex whose first capture group is a tensor's block index; `None` = the built-in prefixes.
    pub block_pattern: Option<String>,
    /// Pinned staging buffers in the fast-disk ring.
    pub staging_buffers: u32,
    /// Size of each staging buffer.
    #[serde(serialize_with = "size_json::bytes")]
    pub staging_buffer_size: ByteSize,
    /// Size of one disk read request.
    #[serde(serialize_with = "size_json::bytes")]
    pub read_request_size: ByteSize,
    /// Disk reader worker threads.
    pub reader_threads: u32,
    /// Threads the CPU backend computes on; `None` = [`Settings::compute_threads_for`]'s
    /// choice (every core, one fewer when a streamed step has few rows).
    pub compute_threads: Option<u32>,
    /// How a run checks its results; `None`: the command's own default (`run` and
    /// `bench`: full, `embed` and `generate`: first).
    pub verify: Option<Verify>,
    /// The precision of the many-rows products (`f32` or `bf16`; see
    /// [`ComputeDtype`]).
    pub compute_dtype: ComputeDtype,
    /// No layer the user wrote set `prefetch_depth` (it is the shipped default), so a
    /// run may take a smaller depth that fits its VRAM budget (`run::fitting_depth`).
    /// Not a key: `settings::load` sets it from the layers (false once the user sets the depth);
    /// true by default, as the default depth is the shipped one.
    #[serde(skip)]
    pub choose_prefetch_depth: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            device: DeviceKind::Auto,
            vram_budget: None,
            reserve_vram: ByteSize::mib(256),
            vram_headroom: ByteSize::b(0),
            pin_ceiling: None,
            ram_floor: ByteSize::gib(2),
            fast_disk: false,
            prefetch_depth: 2,
            metrics_addr: None,
            trace: None,
            log: "info".to_string(),
            block_pattern: None,
            staging_buffers: 3,
            staging_buffer_size: ByteSize::mib(64),
            read_request_size: ByteSize::mib(4),
            reader_threads: 4,
            compute_threads: None,
            verify: None,
            compute_dtype: ComputeDtype::F32,
            choose_prefetch_depth: true,
        }
    }
}

/// What a run streams, as the CPU backend's thread choice sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streaming {
    /// Every block is resident.
    Nothing,
    /// Blocks stream, and each step pushes `rows` rows (tokens) through every block.
    Blocks { rows: u64 },
}

/// Rows per step from which a streamed block's copy is a small share of its compute:
/// each weight is copied once (one read, one write) and multiplied into every row
/// (two FLOPs a row), so at 64 rows the products cost ~100× the copy. Measured on the
/// generated full-depth Flux at 256² (320 rows, 40 % budget, 2 cores): 781 ms a step
/// on 2 compute threads against 1186 ms on 1, the resident step 754–871 ms.
pub const ROWS_HIDING_COPIES: u64 = 64;

impl Settings {
    /// The CPU backend's compute threads for a run: the setting when given, else every
    /// core when nothing streams (a resident model has nothing else to feed) or when
    /// each step pushes [`ROWS_HIDING_COPIES`] rows or more through every block (the
    /// copies are then a sliver of the step), and one core fewer, at least one, when
    /// fewer rows stream (decoding): the copy thread's `memcpy` and the disk readers
    /// then need a core of their own, or every streamed block waits behind a compute
    /// thread that spins for work. The kernels' results are the same bits for any
    /// count, so this choice never changes what a run computes.
    pub fn compute_threads_for(&self, streaming: Streaming) -> usize {
        let cores = machine_cores();
        match (self.compute_threads, streaming) {
            (Some(threads), _) => threads as usize,
            (None, Streaming::Blocks { rows }) if rows < ROWS_HIDING_COPIES => {
                threads_beside_streaming(cores)
            }
            (None, _) => cores,
        }
    }
}

/// The cores this process may run on (1 when the OS does not say).
pub fn machine_cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Compute threads that leave a core to the copy and read threads.
fn threads_beside_streaming(cores: usize) -> usize {
    cores.saturating_sub(1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_compute_threads_keep_a_core_only_for_few_row_streamed_steps() {
        // Proves every core computes when nothing streams or when a streamed step has
        // many rows per block (an encoder batch, a denoising step: its copies are a
        // sliver), one fewer for a streamed decode step, and a set count always wins.
        let cores = machine_cores();
        let settings = Settings::default();
        assert_eq!(settings.compute_threads_for(Streaming::Nothing), cores);
        let decode = Streaming::Blocks { rows: 1 };
        assert_eq!(
            settings.compute_threads_for(decode),
            cores.saturating_sub(1).max(1)
        );
        let batch = Streaming::Blocks {
            rows: ROWS_HIDING_COPIES,
        };
        assert_eq!(settings.compute_threads_for(batch), cores);
        let one = Settings {
            compute_threads: Some(1),
            ..Settings::default()
        };
        assert_eq!(one.compute_threads_for(Streaming::Blocks { rows: 4096 }), 1);
    }
}

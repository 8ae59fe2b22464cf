//! The deployment flags every subcommand shares (`#[command(flatten)]` them).
//!
//! Every flag is optional: an absent flag leaves the value of the lower layers alone.
//! A boolean setting is a pair of plain switches (`--fast-disk`, `--no-fast-disk`; the
//! last one given wins), never a flag with an optional value: such a flag would take the
//! next word (`--fast-disk "a text"`) as its value.
//! Values stay text here and are parsed with the same code as the file and environment
//! layers, so "2GiB" means the same everywhere and errors name the flag.

use std::path::PathBuf;

use config::Value;

use super::provenance::Source;

#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[cfg_attr(
    feature = "cli",
    command(next_help_heading = "Deployment settings (file < STAGEHAND_* env < flag)")
)]
pub struct SettingsArgs {
    /// TOML file layered over config/default.toml.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub config: Option<PathBuf>,
    /// Device backend: auto, cpu, sim or cuda.
    #[cfg_attr(feature = "cli", arg(long, value_name = "KIND"))]
    pub device: Option<String>,
    /// VRAM for weights, e.g. 8GiB ("" = device total - reserve - headroom).
    #[cfg_attr(feature = "cli", arg(long, value_name = "SIZE"))]
    pub vram_budget: Option<String>,
    /// VRAM left out of stagehand's accounting, e.g. 256MiB.
    #[cfg_attr(feature = "cli", arg(long, value_name = "SIZE"))]
    pub reserve_vram: Option<String>,
    /// VRAM kept free even counting other processes, e.g. 1GiB.
    #[cfg_attr(feature = "cli", arg(long, value_name = "SIZE"))]
    pub vram_headroom: Option<String>,
    /// Most host RAM stagehand pins ("" = free RAM - ram floor).
    #[cfg_attr(feature = "cli", arg(long, value_name = "SIZE"))]
    pub pin_ceiling: Option<String>,
    /// Free RAM always left to the machine (at least 2GiB).
    #[cfg_attr(feature = "cli", arg(long, value_name = "SIZE"))]
    pub ram_floor: Option<String>,
    /// Stream from disk every step through a pinned staging ring (O_DIRECT).
    #[cfg_attr(feature = "cli", arg(long, overrides_with = "no_fast_disk"))]
    pub fast_disk: bool,
    /// Cache streamed blocks in pinned RAM (the default); overrides `fast_disk = true`
    /// in a file or the environment.
    #[cfg_attr(feature = "cli", arg(long, overrides_with = "fast_disk"))]
    pub no_fast_disk: bool,
    /// Streamed blocks loaded ahead of compute (0..=64; 0 = load each when needed).
    /// `simulate` also takes `auto`: it tries 0..=4 and uses the fastest.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub prefetch_depth: Option<String>,
    /// Serve Prometheus /metrics at HOST:PORT, :PORT or PORT (127.0.0.1 unless a host is given).
    #[cfg_attr(feature = "cli", arg(long, value_name = "ADDR"))]
    pub metrics_addr: Option<String>,
    /// Write a Chrome trace (Perfetto) of the run to FILE.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub trace: Option<String>,
    /// Log filter, tracing env-filter syntax (info, stagehand=debug).
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILTER"))]
    pub log: Option<String>,
    /// Regex whose first capture group is a tensor's block key (overrides layers.N. etc.).
    #[cfg_attr(feature = "cli", arg(long, value_name = "REGEX"))]
    pub block_pattern: Option<String>,
    /// Pinned staging buffers in the fast-disk ring (2..=64).
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub staging_buffers: Option<String>,
    /// Size of each staging buffer, a multiple of 4KiB.
    #[cfg_attr(feature = "cli", arg(long, value_name = "SIZE"))]
    pub staging_buffer_size: Option<String>,
    /// Size of one disk read request, a multiple of 4KiB.
    #[cfg_attr(feature = "cli", arg(long, value_name = "SIZE"))]
    pub read_request_size: Option<String>,
    /// Disk reader worker threads (1..=64).
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub reader_threads: Option<String>,
    /// CPU backend compute threads (1..=cores; "" = every core, one fewer when a streamed step has under 64 rows).
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub compute_threads: Option<String>,
    /// How a run checks its results: full, first, weights or off (default: full for
    /// run and bench, first for embed and generate).
    #[cfg_attr(feature = "cli", arg(long, value_name = "MODE"))]
    pub verify: Option<String>,
    /// Precision of the many-rows products: f32 (default, exact widening) or bf16
    /// (PyTorch's bf16 arithmetic: bf16 operands, f32 sums; AMX tiles where present).
    #[cfg_attr(feature = "cli", arg(long, value_name = "DTYPE"))]
    pub compute_dtype: Option<String>,
}

impl SettingsArgs {
    /// The flags that were given, as (key, value, source) in field order.
    pub(crate) fn entries(&self) -> Vec<(String, Value, Source)> {
        let text = |value: &Option<String>| value.as_ref().map(|text| Value::from(text.as_str()));
        let candidates: [(&str, Option<Value>); 19] = [
            ("device", text(&self.device)),
            ("vram_budget", text(&self.vram_budget)),
            ("reserve_vram", text(&self.reserve_vram)),
            ("vram_headroom", text(&self.vram_headroom)),
            ("pin_ceiling", text(&self.pin_ceiling)),
            ("ram_floor", text(&self.ram_floor)),
            ("fast_disk", self.fast_disk_switch().map(Value::from)),
            ("prefetch_depth", text(&self.prefetch_depth)),
            ("metrics_addr", text(&self.metrics_addr)),
            ("trace", text(&self.trace)),
            ("log", text(&self.log)),
            ("block_pattern", text(&self.block_pattern)),
            ("staging_buffers", text(&self.staging_buffers)),
            ("staging_buffer_size", text(&self.staging_buffer_size)),
            ("read_request_size", text(&self.read_request_size)),
            ("reader_threads", text(&self.reader_threads)),
            ("compute_threads", text(&self.compute_threads)),
            ("verify", text(&self.verify)),
            ("compute_dtype", text(&self.compute_dtype)),
        ];
        candidates
            .into_iter()
            .filter_map(|(key, value)| {
                let value = value?;
                let source = Source::Flag(self.flag_of(key));
                Some((key.to_string(), value, source))
            })
            .collect()
    }

    /// The flag that set `key`: its kebab-case name, or `--no-fast-disk`.
    fn flag_of(&self, key: &str) -> String {
        if key == "fast_disk" && self.fast_disk_switch() == Some(false) {
            return "--no-fast-disk".to_string();
        }
        format!("--{}", key.replace('_', "-"))
    }

    /// `fast_disk` as the switches set it: `None` when neither was given, so the file
    /// and environment layers keep their value.
    pub fn fast_disk_switch(&self) -> Option<bool> {
        match (self.fast_disk, self.no_fast_disk) {
            (true, _) => Some(true),
            (false, true) => Some(false),
            (false, false) => None,
        }
    }

    /// Sets `fast_disk` as the switch `--fast-disk` (true) or `--no-fast-disk` (false)
    /// would: for callers that build the flags in code.
    pub fn set_fast_disk(&mut self, fast_disk: bool) {
        self.fast_disk = fast_disk;
        self.no_fast_disk = !fast_disk;
    }
}

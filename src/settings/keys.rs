//! The setting keys and how a value from any layer becomes a typed field.
//!
//! Every layer (TOML file, environment, flag) hands over a loosely typed
//! `config::Value`; parsing it here, one key at a time, is what lets an error name the
//! key, the value and the layer, and lets the same "2GiB" parse the same everywhere.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;

use bytesize::ByteSize;
use config::{Value, ValueKind};
use stagehand_actors::Bytes;

use super::{DeviceKind, Settings, Verify};
use crate::compute::ComputeDtype;

/// Every key, in the order of the `Settings` fields.
pub const KEYS: &[&str] = &[
    "device",
    "vram_budget",
    "reserve_vram",
    "vram_headroom",
    "pin_ceiling",
    "ram_floor",
    "fast_disk",
    "prefetch_depth",
    "metrics_addr",
    "trace",
    "log",
    "block_pattern",
    "staging_buffers",
    "staging_buffer_size",
    "read_request_size",
    "reader_threads",
    "compute_threads",
    "verify",
    "compute_dtype",
];

/// The canonical spelling of `key` if it is a known setting.
pub(crate) fn known_key(key: &str) -> Option<&'static str> {
    KEYS.iter().copied().find(|&known| known == key)
}

/// The text of a value as the user wrote it (strings without quotes).
pub(crate) fn value_text(value: &Value) -> String {
    match &value.kind {
        ValueKind::String(text) => text.clone(),
        _ => value.to_string(),
    }
}

/// Sets `key` (which must be in [`KEYS`]) from `value`; the error is the reason only.
pub(crate) fn apply(settings: &mut Settings, key: &str, value: Value) -> Result<(), String> {
    match key {
        "device" => settings.device = parse_device(&value)?,
        "vram_budget" => settings.vram_budget = optional(&value, parse_size)?,
        "reserve_vram" => settings.reserve_vram = parse_size(&value)?,
        "vram_headroom" => settings.vram_headroom = parse_size(&value)?,
        "pin_ceiling" => settings.pin_ceiling = optional(&value, parse_size)?,
        "ram_floor" => settings.ram_floor = parse_size(&value)?,
        "fast_disk" => settings.fast_disk = parse_bool(&value)?,
        "prefetch_depth" => settings.prefetch_depth = parse_count(&value)?,
        "metrics_addr" => settings.metrics_addr = optional(&value, parse_metrics_value)?,
        "trace" => settings.trace = optional(&value, |value| Ok(PathBuf::from(value_text(value))))?,
        "log" => settings.log = parse_string(&value)?,
        "block_pattern" => settings.block_pattern = optional(&value, parse_string)?,
        "staging_buffers" => settings.staging_buffers = parse_count(&value)?,
        "staging_buffer_size" => settings.staging_buffer_size = parse_size(&value)?,
        "read_request_size" => settings.read_request_size = parse_size(&value)?,
        "reader_threads" => settings.reader_threads = parse_count(&value)?,
        "verify" => settings.verify = optional(&value, parse_verify)?,
        "compute_threads" => settings.compute_threads = optional(&value, parse_count)?,
        "compute_dtype" => settings.compute_dtype = parse_compute_dtype(&value)?,
        other => return Err(format!("`{other}` is not a setting")),
    }
    Ok(())
}

/// A setting's effective value as `stagehand config` shows it; unset optional values
/// say what happens instead.
pub fn display_value(settings: &Settings, key: &str) -> String {
    let size = |size: ByteSize| Bytes(size.as_u64()).to_string();
    let size_or = |optional: Option<ByteSize>, otherwise: &str| {
        optional.map_or_else(|| otherwise.to_string(), size)
    };
    match key {
        "device" => format!("{:?}", settings.device).to_ascii_lowercase(),
        "vram_budget" => size_or(
            settings.vram_budget,
            "auto (CPU: 40 % of the model, raised to what its plan needs; CUDA: device total - reserve_vram - vram_headroom; `config --model M` computes it)",
        ),
        "reserve_vram" => size(settings.reserve_vram),
        "vram_headroom" => size(settings.vram_headroom),
        "pin_ceiling" => size_or(
            settings.pin_ceiling,
            "auto (free RAM - ram_floor; half a demo model; `config --model M` computes it)",
        ),
        "ram_floor" => size(settings.ram_floor),
        "fast_disk" => settings.fast_disk.to_string(),
        "prefetch_depth" => settings.prefetch_depth.to_string(),
        "metrics_addr" => settings
            .metrics_addr
            .map_or_else(|| "off".to_string(), |addr| addr.to_string()),
        "trace" => settings
            .trace
            .as_ref()
            .map_or_else(|| "off".to_string(), |path| path.display().to_string()),
        "log" => settings.log.clone(),
        "block_pattern" => settings
            .block_pattern
            .clone()
            .unwrap_or_else(|| "built-in prefixes".to_string()),
        "staging_buffers" => settings.staging_buffers.to_string(),
        "staging_buffer_size" => size(settings.staging_buffer_size),
        "read_request_size" => size(settings.read_request_size),
        "reader_threads" => settings.reader_threads.to_string(),
        "verify" => settings.verify.map_or_else(
            || "the command's default (run, bench: full; embed, generate: first)".to_string(),
            |verify| verify.name().to_string(),
        ),
        "compute_threads" => settings.compute_threads.map_or_else(
            || {
                let cores = super::machine_cores();
                format!(
                    "auto ({cores} when nothing streams, {} when blocks stream)",
                    super::threads_beside_streaming(cores)
                )
            },
            |threads| threads.to_string(),
        ),
        "compute_dtype" => settings.compute_dtype.name().to_string(),
        _ => String::new(),
    }
}

/// An empty string unsets an optional setting (back to "derive it" / "off").
fn optional<T>(
    value: &Value,
    parse: impl Fn(&Value) -> Result<T, String>,
) -> Result<Option<T>, String> {
    if matches!(&value.kind, ValueKind::String(text) if text.trim().is_empty()) {
        return Ok(None);
    }
    parse(value).map(Some)
}

fn parse_compute_dtype(value: &Value) -> Result<ComputeDtype, String> {
    ComputeDtype::parse(&value_text(value))
        .ok_or_else(|| format!("expected one of {}", ComputeDtype::NAMES))
}

fn parse_verify(value: &Value) -> Result<Verify, String> {
    match value_text(value).trim().to_ascii_lowercase().as_str() {
        "full" => Ok(Verify::Full),
        "first" => Ok(Verify::First),
        "weights" => Ok(Verify::Weights),
        "off" => Ok(Verify::Off),
        _ => Err(format!("expected one of {}", Verify::NAMES)),
    }
}

fn parse_device(value: &Value) -> Result<DeviceKind, String> {
    match value_text(value).trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(DeviceKind::Auto),
        "cpu" => Ok(DeviceKind::Cpu),
        "sim" => Ok(DeviceKind::Sim),
        "cuda" => Ok(DeviceKind::Cuda),
        _ => Err("expected one of auto, cpu, sim, cuda".to_string()),
    }
}

/// The keys whose values are sizes.
const SIZE_KEYS: &[&str] = &[
    "vram_budget",
    "reserve_vram",
    "vram_headroom",
    "pin_ceiling",
    "ram_floor",
    "staging_buffer_size",
    "read_request_size",
];

/// Sizes are strings with a unit ("2GiB", "512 MiB", "2GB"). A bare number is refused
/// rather than taken as bytes: `vram_budget = 2` meant 2 GiB, not 2 bytes.
pub(crate) fn parse_size(value: &Value) -> Result<ByteSize, String> {
    const HINT: &str = "expected a size such as \"2GiB\" or \"512 MiB\" (GB/MB are decimal)";
    let text = match &value.kind {
        ValueKind::String(text) => text.trim(),
        ValueKind::I64(number) if *number < 0 => return Err(HINT.to_string()),
        ValueKind::I64(_) | ValueKind::U64(_) | ValueKind::Float(_) => {
            return Err(needs_unit(&value_text(value)))
        }
        _ => return Err(HINT.to_string()),
    };
    let (number, unit) = split_size(text);
    if number.is_empty() {
        return Err(HINT.to_string());
    }
    if unit.is_empty() {
        return Err(needs_unit(number));
    }
    ByteSize::from_str(text).map_err(|_| HINT.to_string())
}

fn needs_unit(number: &str) -> String {
    format!("a size needs a unit, e.g. {number}GiB or {number}MiB ({number}B for bytes)")
}

/// A size's number and its unit, both trimmed: ("2", "GB") for "2 GB".
fn split_size(text: &str) -> (&str, &str) {
    let unit_start = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(unit_start);
    (number.trim(), unit.trim())
}

/// For a size written with a decimal unit (GB, MB, KB, G, M, K, TB, …), the value
/// converted to binary units ("2GB = 1.86 GiB"): budgets are shown in GiB, and a user
/// who wrote 2GB should see once what it became. `None` for other keys and units.
pub(crate) fn decimal_size_note(key: &str, value: &Value) -> Option<String> {
    if !SIZE_KEYS.contains(&key) {
        return None;
    }
    let ValueKind::String(text) = &value.kind else {
        return None;
    };
    let unit = split_size(text.trim()).1.to_ascii_lowercase();
    let binary = unit.is_empty() || unit == "b" || unit.ends_with("ib") || unit.ends_with('i');
    if binary {
        return None;
    }
    let size = parse_size(value).ok()?;
    Some(format!("{} = {}", text.trim(), Bytes(size.as_u64())))
}

fn parse_bool(value: &Value) -> Result<bool, String> {
    value
        .clone()
        .into_bool()
        .map_err(|_| "expected true or false".to_string())
}

fn parse_count(value: &Value) -> Result<u32, String> {
    const HINT: &str = "expected a whole number";
    let number: i64 = match &value.kind {
        ValueKind::String(text) => text.trim().parse().map_err(|_| HINT.to_string())?,
        ValueKind::I64(number) => *number,
        ValueKind::U64(number) => i64::try_from(*number).map_err(|_| HINT.to_string())?,
        _ => return Err(HINT.to_string()),
    };
    u32::try_from(number).map_err(|_| format!("{number} is out of range"))
}

fn parse_string(value: &Value) -> Result<String, String> {
    match &value.kind {
        ValueKind::String(text) => Ok(text.clone()),
        _ => Err("expected a string".to_string()),
    }
}

fn parse_metrics_value(value: &Value) -> Result<SocketAddr, String> {
    parse_metrics_addr(&value_text(value))
}

/// `HOST:PORT`, `:PORT` or a bare `PORT`; without a host the listener binds to
/// 127.0.0.1, so metrics are never exposed to the network unless asked for.
pub fn parse_metrics_addr(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let port_only = text.strip_prefix(':').unwrap_or(text);
    if let Ok(port) = port_only.parse::<u16>() {
        return Ok(SocketAddr::new(loopback, port));
    }
    if let Some(port) = text.strip_prefix("localhost:") {
        if let Ok(port) = port.parse::<u16>() {
            return Ok(SocketAddr::new(loopback, port));
        }
    }
    SocketAddr::from_str(text).map_err(|_| {
        "expected HOST:PORT, :PORT or PORT, with HOST an IP address (e.g. 0.0.0.0:9464)".to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_addr_defaults_to_loopback() {
        // Proves a bare port or `:PORT` binds to 127.0.0.1 and an explicit host is kept.
        assert_eq!(
            parse_metrics_addr("9464"),
            Ok("127.0.0.1:9464".parse().expect("literal"))
        );
        assert_eq!(
            parse_metrics_addr(":9464"),
            Ok("127.0.0.1:9464".parse().expect("literal"))
        );
        assert_eq!(
            parse_metrics_addr("0.0.0.0:80"),
            Ok("0.0.0.0:80".parse().expect("literal"))
        );
        assert!(parse_metrics_addr("example.com:80").is_err());
        assert!(parse_metrics_addr("70000").is_err());
    }

    #[test]
    fn sizes_need_a_unit() {
        // Proves "2GiB", "512 MiB", "4096B" and decimal "2GB" parse, and a bare number
        // (TOML integer or text) is refused asking for a unit, not taken as bytes.
        assert_eq!(parse_size(&Value::from("2GiB")), Ok(ByteSize::gib(2)));
        assert_eq!(parse_size(&Value::from("512 MiB")), Ok(ByteSize::mib(512)));
        assert_eq!(parse_size(&Value::from("4096B")), Ok(ByteSize::b(4096)));
        assert_eq!(
            parse_size(&Value::from("2GB")),
            Ok(ByteSize::b(2_000_000_000))
        );
        for bare in [Value::from(2i64), Value::from("2"), Value::from(" 2 ")] {
            let refused = parse_size(&bare).expect_err("a bare number is refused");
            assert!(
                refused.contains("a size needs a unit, e.g. 2GiB"),
                "{refused}"
            );
        }
        assert!(parse_size(&Value::from("lots")).is_err());
        assert!(parse_size(&Value::from(-1i64)).is_err());
    }

    #[test]
    fn decimal_sizes_are_shown_converted() {
        // Proves a decimal unit gets a note with its binary value, and a binary unit,
        // plain bytes or a key that is no size get none.
        assert_eq!(
            decimal_size_note("vram_budget", &Value::from("2GB")).as_deref(),
            Some("2GB = 1.86 GiB")
        );
        assert_eq!(
            decimal_size_note("pin_ceiling", &Value::from("500 M")).as_deref(),
            Some("500 M = 476.84 MiB")
        );
        assert_eq!(decimal_size_note("vram_budget", &Value::from("2GiB")), None);
        assert_eq!(
            decimal_size_note("vram_budget", &Value::from("4096B")),
            None
        );
        assert_eq!(decimal_size_note("log", &Value::from("2GB")), None);
    }
}

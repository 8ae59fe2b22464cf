//! The profile a calibration writes: the format of `config/hardware/*.toml` (loaded by
//! `sim::HardwareProfile`), with each measured figure's measurement in a comment and a
//! `[calibration]` stamp (when, on which machine) that `--hardware local` checks.

use std::fmt::Write as _;

use serde::Serialize;

use super::{Calibration, ContentionFigures, CopyFigures, KernelFigures, OverlapRun};
use crate::sim::SharedSpec;

/// Stand-in disk when the disk could not be measured: the shipped SATA SSD figures.
const STAND_IN_DISK: (&str, f64, f64) = ("sata", 0.5, 100.0);

/// The profile's TOML. Fails only when the kernels or the copies are missing (a
/// profile cannot do without them; the disk falls back to a stand-in, said loudly).
pub fn profile_toml(calibration: &Calibration, name: &str) -> Result<String, String> {
    let copies = calibration
        .copies
        .as_ref()
        .ok_or("the copies were not measured")?;
    let kernels = calibration
        .kernels
        .as_ref()
        .ok_or("the kernels were not measured")?;
    let mut text = String::new();
    write_header(&mut text, calibration, name);
    write_stamp(&mut text, calibration);
    write_gpu(&mut text, calibration, kernels);
    write_host(&mut text, calibration, copies);
    write_link(&mut text, copies);
    write_disk(&mut text, calibration);
    if let Some(contention) = &calibration.contention {
        write_shared(&mut text, contention)?;
    }
    write_compute(&mut text, kernels)?;
    Ok(text)
}

fn line(text: &mut String, value: String) {
    text.push_str(&value);
    text.push('\n');
}

/// The comments on top: which machine, how loaded, what was not measured.
fn write_header(text: &mut String, calibration: &Calibration, name: &str) {
    let host = &calibration.host;
    line(
        text,
        format!(
            "# {name}: this machine, measured by `stagehand calibrate` on the {} backend ({})\n# ({}, {} CPUs, {} RAM, host {}).",
            calibration.backend,
            calibration.device_name,
            host.cpu_model,
            host.cpus,
            stagehand_actors::Bytes(host.ram_bytes),
            host.hostname
        ),
    );
    line(
        text,
        format!(
            "# Load average (1 min) before / after: {} / {} — other processes skew every figure; calibrate on a quiet machine.",
            load(calibration.load_average_before),
            load(calibration.load_average_after)
        ),
    );
    if calibration.backend == "cpu" {
        line(
            text,
            "# On this backend the \"VRAM\" is host memory, a copy to it is a memcpy on the copy\n# thread, and copies, page-cache reads and compute share the cores and one memory bus\n# ([shared]).".to_string(),
        );
    }
    line(text, "# GB/s are decimal (10^9 bytes).".to_string());
    for skipped in &calibration.skipped {
        line(
            text,
            format!(
                "# NOT MEASURED: {} ({})",
                skipped.measurement, skipped.reason
            ),
        );
    }
}

/// `[calibration]`: when, on which machine and backend, by which version.
fn write_stamp(text: &mut String, calibration: &Calibration) {
    let host = &calibration.host;
    line(text, String::new());
    line(text, "[calibration]".to_string());
    line(
        text,
        format!("at_unix = {}", calibration.calibrated_at_unix),
    );
    line(text, format!("host = {}", quoted(&host.fingerprint())));
    line(text, format!("backend = {}", quoted(&calibration.backend)));
    line(
        text,
        format!("stagehand = {}", quoted(env!("CARGO_PKG_VERSION"))),
    );
    line(text, format!("method = {}", crate::sim::CALIBRATION_METHOD));
    line(text, String::new());
}

/// `[gpu]`: the device tier, and the roofline figures from the kernels.
fn write_gpu(text: &mut String, calibration: &Calibration, kernels: &KernelFigures) {
    // The roofline figures serve descriptions without kernels (shipped ones).
    let large = kernels
        .costs
        .linear_gflops(256, 1024 * 1024, crate::compute::DType::F32);
    let gemv = kernels
        .costs
        .linear_gflops(1, 1024 * 1024, crate::compute::DType::F32);
    // A one-row f32 GEMV moves 4 bytes of weight per 2 FLOPs.
    let gemv_bytes_per_second = gemv * 1e9 * 2.0;
    line(text, "[gpu]".to_string());
    if calibration.backend == "cpu" {
        line(
            text,
            "name = \"CPU backend (host memory as the device tier)\"".to_string(),
        );
        line(
            text,
            "# The device tier is host memory: the budget you give is the limit.".to_string(),
        );
    } else {
        line(text, format!("name = {}", quoted(&calibration.device_name)));
    }
    line(text, format!("vram = {}", calibration.device_bytes.max(1)));
    line(
        text,
        "pcie_generation = 0   # [link] below is measured, not named by generation".to_string(),
    );
    line(
        text,
        "# For descriptions without kernels (the roofline): the f32 GEMM rate at 256 rows of a\n# 1024×1024 weight, and the memory rate a one-row GEMV reaches (from [compute]).".to_string(),
    );
    line(text, format!("bf16_dense_tflops = {:.6}", large / 1e3));
    line(text, "sustained_efficiency = 1.0".to_string());
    line(
        text,
        format!("memory_gb_per_s = {:.3}", gemv_bytes_per_second / 1e9),
    );
    line(text, String::new());
}

/// `[host]`: the RAM, and the first-touch rate when fresh memory was measurably slower.
fn write_host(text: &mut String, calibration: &Calibration, copies: &CopyFigures) {
    let host = &calibration.host;
    line(text, "[host]".to_string());
    line(text, format!("ram = {}", host.ram_bytes.max(1)));
    match &copies.first_touch {
        Some(first_touch) => {
            line(
                text,
                format!(
                    "# {}. The simulator charges it to the first write of every arena,\n# pinned-buffer and cast-buffer byte (the cold step).",
                    first_touch.how
                ),
            );
            line(
                text,
                format!(
                    "first_touch_gb_per_s = {:.3}",
                    first_touch.per_second / 1e9
                ),
            );
        }
        None => line(
            text,
            "# first_touch_gb_per_s left out: a copy into fresh device-tier memory took no\n# measurably longer than into warm memory (mapped when allocated).".to_string(),
        ),
    }
    line(text, String::new());
}

/// `[link]`: the copy rates and latency.
fn write_link(text: &mut String, copies: &CopyFigures) {
    line(text, "[link]".to_string());
    line(text, "name = \"cpu-memcpy\"".to_string());
    line(
        text,
        format!(
            "# {}; slowest–fastest copy {:.2}–{:.2} GB/s.",
            copies.pinned.how,
            copies.pinned.slowest_per_second / 1e9,
            copies.pinned.fastest_per_second / 1e9
        ),
    );
    line(
        text,
        format!("pinned_gb_per_s = {:.3}", copies.pinned.per_second / 1e9),
    );
    line(
        text,
        format!(
            "# {}; slowest–fastest {:.2}–{:.2} GB/s (on this backend \"pinned\" is plain memory too).",
            copies.pageable.how,
            copies.pageable.slowest_per_second / 1e9,
            copies.pageable.fastest_per_second / 1e9
        ),
    );
    line(
        text,
        format!(
            "pageable_gb_per_s = {:.3}",
            copies.pageable.per_second / 1e9
        ),
    );
    line(text, format!("# {}.", copies.latency_how));
    line(
        text,
        format!("latency_us = {:.1}", copies.latency_seconds * 1e6),
    );
    line(text, String::new());
}

/// `[disk]`: the measured reads, or the shipped SATA figures standing in.
fn write_disk(text: &mut String, calibration: &Calibration) {
    let disk = calibration.disk.as_ref();
    let cold = disk.and_then(|disk| disk.buffered_cold.as_ref());
    text.push_str("[disk]\n");
    match cold {
        Some(cold) => {
            let _ = writeln!(text, "name = \"measured\"");
            let _ = writeln!(
                text,
                "# {}; slowest–fastest {:.2}–{:.2} GB/s.",
                cold.how,
                cold.slowest_per_second / 1e9,
                cold.fastest_per_second / 1e9
            );
            let _ = writeln!(text, "read_gb_per_s = {:.3}", cold.per_second / 1e9);
        }
        None => {
            let (name, rate, latency) = STAND_IN_DISK;
            let _ = writeln!(
                text,
                "# NOT MEASURED (see the skipped measurements above): the shipped `{name}` figures stand in.\nname = \"{name} (stand-in)\"\nread_gb_per_s = {rate}\nrequest_latency_us = {latency}\n"
            );
            return;
        }
    }
    let latency = disk.and_then(|disk| disk.request_latency_seconds);
    match latency {
        Some(seconds) => {
            let how = disk.map_or("", |disk| disk.request_latency_how.as_str());
            let _ = writeln!(text, "# {how}.");
            let _ = writeln!(text, "request_latency_us = {:.1}", seconds * 1e6);
        }
        None => {
            let _ = writeln!(
                text,
                "# request latency NOT MEASURED: {} µs (the shipped `sata` figure) stands in.\nrequest_latency_us = {}",
                STAND_IN_DISK.2, STAND_IN_DISK.2
            );
        }
    }
    if let Some(direct) = disk.and_then(|disk| disk.direct.as_ref()) {
        let _ = writeln!(
            text,
            "# {}; slowest–fastest {:.2}–{:.2} GB/s.",
            direct.how,
            direct.slowest_per_second / 1e9,
            direct.fastest_per_second / 1e9
        );
        let _ = writeln!(
            text,
            "direct_read_gb_per_s = {:.3}",
            direct.per_second / 1e9
        );
    }
    if let Some(warm) = disk.and_then(|disk| disk.page_cache.as_ref()) {
        let _ = writeln!(
            text,
            "# {}; slowest–fastest {:.2}–{:.2} GB/s.",
            warm.how,
            warm.slowest_per_second / 1e9,
            warm.fastest_per_second / 1e9
        );
        let _ = writeln!(text, "page_cache_gb_per_s = {:.3}", warm.per_second / 1e9);
    }
    for note in disk.map_or(&[][..], |disk| &disk.notes[..]) {
        let _ = writeln!(text, "# note: {note}");
    }
    text.push('\n');
}

/// `[shared]`: the bus model, with the overlaps it was fitted to in comments.
fn write_shared(text: &mut String, contention: &ContentionFigures) -> Result<(), String> {
    let shared = shared_spec(contention);
    line(text, format!("# [shared]: {}.", contention.how));
    for run in &contention.overlaps {
        line(
            text,
            format!(
                "# measured at once, GEMM of {} row(s): GEMM {:.3} ms alone, {:.3} ms with copies (× {:.2}); copies {:.2} GB/s alone, {:.2} GB/s with the GEMM (× {:.2} slower); {:.2} GB/s of memory traffic together.",
                run.rows,
                run.gemm_alone_seconds * 1e3,
                run.gemm_shared_seconds * 1e3,
                run.gemm_shared_seconds / run.gemm_alone_seconds.max(1e-12),
                run.copy_alone_bytes_per_second / 1e9,
                run.copy_shared_bytes_per_second / 1e9,
                run.copy_alone_bytes_per_second / run.copy_shared_bytes_per_second.max(1.0),
                run.shared_traffic() / 1e9
            ),
        );
    }
    line(
        text,
        format!(
            "# memcpy: {:.2} GB/s with one thread, {:.2} GB/s with {} at once.",
            contention.memcpy_one_thread_bytes_per_second / 1e9,
            contention.memcpy_all_cores_bytes_per_second / 1e9,
            contention.cores
        ),
    );
    line(
        text,
        "# memory_gb_per_s: the traffic of the one-row pair above (the bus a streamed batch-1\n# step shares), not memcpy's alone.".to_string(),
    );
    text.push_str(&table("shared", &shared)?);
    line(text, String::new());
    Ok(())
}

/// `[compute]`: the kernel costs, serialized by the type the loader reads.
fn write_compute(text: &mut String, kernels: &KernelFigures) -> Result<(), String> {
    line(text, format!("# [compute]: {}.", kernels.how));
    line(
        text,
        "# linear: GFLOP/s (2 per multiply-add) of y = x·Wᵀ by storage dtype, weight shape and rows;\n# elementwise_ns: nanoseconds per value (per byte for checksum); attention: ns per score·dim, plus ns per (query, head).".to_string(),
    );
    text.push_str(&table("compute", &kernels.costs)?);
    Ok(())
}

fn load(value: Option<f64>) -> String {
    value.map_or_else(|| "unknown".to_string(), |value| format!("{value:.2}"))
}

fn quoted(value: &str) -> String {
    toml::Value::String(value.to_string()).to_string()
}

/// `[key]` and its contents, serialized by the same types the loader reads.
fn table<T: Serialize>(key: &str, value: &T) -> Result<String, String> {
    #[derive(Serialize)]
    struct Wrapper<'a, T: Serialize> {
        #[serde(flatten)]
        inner: std::collections::BTreeMap<&'a str, &'a T>,
    }
    let wrapper = Wrapper {
        inner: std::collections::BTreeMap::from([(key, value)]),
    };
    toml::to_string(&wrapper).map_err(|error| error.to_string())
}

/// The shared-bus model's figures from a calibration: the cores, and the memory traffic
/// the bus carries when a one-row GEMM (a GEMV: weight reads) and the copy thread
/// (memcpy: a read and a write per byte) run at once — the pair a streamed batch-1
/// step is made of. That is what the overlap reached together, not what memcpy alone
/// reaches on every core: on this machine the two differ by up to × 1.4 either way (a
/// GEMV's streaming reads and a memcpy's read-write mix use the bus differently), and
/// fitting the bus to the measured pair makes the model reproduce the pair's slowdowns.
/// Without a one-row overlap (an older calibration), the all-core memcpy traffic.
pub fn shared_spec(contention: &ContentionFigures) -> SharedSpec {
    let memcpy = 2.0 * contention.memcpy_all_cores_bytes_per_second;
    let traffic = contention
        .overlaps
        .iter()
        .find(|run| run.rows == 1)
        .map_or(memcpy, OverlapRun::shared_traffic);
    SharedSpec {
        cores: contention.cores as f64,
        memory_gb_per_s: traffic / 1e9,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quoted_value_parses_back_to_itself() {
        // Host names and CPU models may hold quotes and backslashes.
        let value = "a \"b\" \\ c";
        let table: toml::Table = toml::from_str(&format!("x = {}", quoted(value))).unwrap();
        assert_eq!(table["x"].as_str(), Some(value));
    }
}

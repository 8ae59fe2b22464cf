//! What `bench disk` reports: one figure per mode (the median round), its ratio to
//! dd, and the table or JSON it prints.

use serde::Serialize;
use stagehand_actors::Bytes;

use super::BenchDiskArgs;

/// Target of issue 7: the O_DIRECT ring reads at ≥ 0.9× dd on the same file.
const TARGET_RATIO_TO_DD: f64 = 0.9;

#[derive(Debug, Serialize)]
pub(super) struct DiskBenchReport {
    file: String,
    bytes: u64,
    rounds: u32,
    request_bytes: u64,
    staging_buffers: u32,
    staging_buffer_bytes: u64,
    reader_threads: u32,
    modes: Vec<ModeResult>,
    /// O_DIRECT ring GB/s ÷ dd GB/s, when both ran.
    o_direct_ratio_to_dd: Option<f64>,
    target_ratio_to_dd: f64,
}

#[derive(Debug, Serialize)]
pub(super) struct ModeResult {
    pub(super) mode: &'static str,
    pub(super) bytes: u64,
    pub(super) seconds: f64,
    /// Decimal gigabytes (10^9 bytes) per second, as dd prints them.
    pub(super) gb_per_second: f64,
    pub(super) ratio_to_dd: Option<f64>,
    /// This mode's GB/s in every round, in order.
    pub(super) rounds_gb_per_second: Vec<f64>,
    /// Our VmRSS growth while the mode held its memory; `None` for dd (another process).
    pub(super) rss_growth_bytes: Option<i64>,
    /// Growth of the system page cache (`Cached`) across the mode.
    pub(super) page_cache_growth_bytes: i64,
    /// Anything that qualifies the figure (cache not dropped, O_DIRECT fallback, dd error).
    pub(super) notes: Vec<String>,
}

/// Per mode, the round with the median throughput; ratios are the median of the
/// per-round ratios, and every round's figure is kept for the record.
pub(super) fn median_per_mode(rounds: Vec<Vec<ModeResult>>) -> Vec<ModeResult> {
    let mode_count = rounds.first().map_or(0, Vec::len);
    let mut by_mode: Vec<Vec<ModeResult>> = (0..mode_count).map(|_| Vec::new()).collect();
    for round in rounds {
        for (index, mode) in round.into_iter().enumerate() {
            if let Some(samples) = by_mode.get_mut(index) {
                samples.push(mode);
            }
        }
    }
    by_mode
        .into_iter()
        .filter_map(|mut samples| {
            let every_round: Vec<f64> = samples.iter().map(|mode| mode.gb_per_second).collect();
            let mut ratios: Vec<f64> = samples.iter().filter_map(|mode| mode.ratio_to_dd).collect();
            ratios.sort_by(f64::total_cmp);
            let mut notes: Vec<String> =
                samples.iter().flat_map(|mode| mode.notes.clone()).collect();
            notes.dedup();
            samples.sort_by(|left, right| left.gb_per_second.total_cmp(&right.gb_per_second));
            let middle = samples.len() / 2;
            let mut median = samples.into_iter().nth(middle)?;
            median.ratio_to_dd = ratios.get(ratios.len() / 2).copied();
            median.rounds_gb_per_second = every_round;
            median.notes = notes;
            Some(median)
        })
        .collect()
}

pub(super) fn finish_report(
    args: &BenchDiskArgs,
    bytes: u64,
    modes: Vec<ModeResult>,
) -> DiskBenchReport {
    let o_direct_ratio_to_dd = modes
        .iter()
        .find(|mode| mode.mode == "o_direct_ring")
        .and_then(|mode| mode.ratio_to_dd);
    DiskBenchReport {
        file: args.file.display().to_string(),
        bytes,
        rounds: args.rounds,
        request_bytes: args.request_size.as_u64(),
        staging_buffers: args.staging_buffers,
        staging_buffer_bytes: args.staging_buffer_size.as_u64(),
        reader_threads: args.reader_threads,
        modes,
        o_direct_ratio_to_dd,
        target_ratio_to_dd: TARGET_RATIO_TO_DD,
    }
}

pub(super) fn print_table(report: &DiskBenchReport) {
    println!(
        "bench disk: {} — {} per mode, median of {} rounds, {} requests, ring {} × {}, {} reader threads",
        report.file,
        Bytes(report.bytes),
        report.rounds,
        Bytes(report.request_bytes),
        report.staging_buffers,
        Bytes(report.staging_buffer_bytes),
        report.reader_threads
    );
    println!(
        "{:<14} {:>8} {:>7} {:>12} {:>14}  {:<22} notes",
        "mode", "GB/s", "× dd", "RSS growth", "cache growth", "rounds GB/s"
    );
    for mode in &report.modes {
        let ratio = mode
            .ratio_to_dd
            .map_or("-".to_string(), |ratio| format!("{ratio:.2}"));
        let rss = mode.rss_growth_bytes.map_or("-".to_string(), signed_size);
        let every_round: Vec<String> = mode
            .rounds_gb_per_second
            .iter()
            .map(|speed| format!("{speed:.2}"))
            .collect();
        println!(
            "{:<14} {:>8.2} {:>7} {:>12} {:>14}  {:<22} {}",
            mode.mode,
            mode.gb_per_second,
            ratio,
            rss,
            signed_size(mode.page_cache_growth_bytes),
            every_round.join(" "),
            mode.notes.join("; ")
        );
    }
    match report.o_direct_ratio_to_dd {
        Some(ratio) => println!(
            "O_DIRECT ring / dd = {ratio:.2} (target ≥ {:.2}: {})",
            report.target_ratio_to_dd,
            if ratio >= report.target_ratio_to_dd {
                "met"
            } else {
                "missed"
            }
        ),
        None => println!("O_DIRECT ring / dd: no dd reference (see its note)"),
    }
}

fn signed_size(bytes: i64) -> String {
    let magnitude = Bytes(bytes.unsigned_abs()).to_string();
    if bytes < 0 {
        format!("-{magnitude}")
    } else {
        format!("+{magnitude}")
    }
}

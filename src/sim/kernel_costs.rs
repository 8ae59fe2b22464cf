//! What each kernel costs on a calibrated machine: the `[compute]` table of a profile
//! `stagehand calibrate` wrote. A block's compute is then the sum of its kernels'
//! times ([`KernelCosts::work_duration`]) instead of a roofline from datasheet peaks.
//!
//! `linear` rates are measured per storage dtype on square weights at several row
//! counts; a kernel between the measured points is interpolated in log(rows) and
//! log(weight elements), and held at the nearest point outside them (a GEMM's rate
//! saturates with rows; a GEMV's is the memory's).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::compute::work::{ElementOp, Kernel, Work};
use crate::compute::DType;

/// Measured kernel costs (the profile's `[compute]` table).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelCosts {
    /// Fixed cost of one call (dispatch, a launch on a GPU), microseconds.
    pub call_overhead_us: f64,
    /// Nanoseconds per score·dim of softmax attention (Σ heads × queries × keys ×
    /// head_dim).
    pub attention_ns_per_score_dim: f64,
    /// Nanoseconds per (query, head) of softmax attention, beside its scores: what
    /// short sequences pay most (absent in older profiles: 0, every cost per score·dim).
    #[serde(default)]
    pub attention_ns_per_query_head: f64,
    /// The same for a decoder's attention over its KV cache.
    pub cached_attention_ns_per_score_dim: f64,
    /// Nanoseconds per value of each element-wise kernel (per byte for `checksum`).
    pub elementwise_ns: BTreeMap<ElementOp, f64>,
    /// GEMM rates, one table per (dtype, weight shape).
    pub linear: Vec<LinearRates>,
    /// How the times scale with compute threads (the CPU backend); absent: the table's
    /// times hold for every run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<ThreadScaling>,
}

/// The CPU backend computes on every core when a step streams nothing or pushes many
/// rows, and on one core fewer when it streams few rows (`Settings::compute_threads_for`);
/// the table is timed on the latter. This says what the former gains.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThreadScaling {
    /// Compute threads the table was timed on.
    pub timed_on: u64,
    /// Every core of the calibrated machine.
    pub all_cores: u64,
    /// How much less time the kernels took on `all_cores` threads than on `timed_on`
    /// (the least over an f32 1024² product at 1, 8 and 64 rows).
    pub all_cores_speedup: f64,
}

impl ThreadScaling {
    /// The speedup on `threads` compute threads: 1 at `timed_on` or fewer,
    /// `all_cores_speedup` at `all_cores` or more, linear between.
    pub fn speedup_on(&self, threads: u64) -> f64 {
        if threads <= self.timed_on || self.all_cores <= self.timed_on {
            return 1.0;
        }
        let span = (self.all_cores - self.timed_on) as f64;
        let share = ((threads - self.timed_on) as f64 / span).min(1.0);
        1.0 + (self.all_cores_speedup - 1.0) * share
    }
}

/// GFLOP/s of `linear` on one weight shape and dtype, at each measured row count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinearRates {
    /// `f32`, `bf16`, `f16`, `f8_e4m3`, `f8_e5m2`.
    pub dtype: String,
    pub inner: u64,
    pub outer: u64,
    /// Row counts, ascending.
    pub rows: Vec<u64>,
    /// With the weight in the caches as far as they hold it (a resident block).
    pub gflops: Vec<f64>,
    /// With the weight flushed from the caches before each call: what a streamed
    /// block meets, copied in with non-temporal stores just before its compute.
    /// Absent in older profiles and where the adapter's caches hold little of a
    /// weight (a GPU): `gflops` then stands for both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_gflops: Option<Vec<f64>>,
}

impl KernelCosts {
    /// The same costs for weights read from memory, not the caches: each product's
    /// `cold_gflops` where it was measured.
    pub fn cold(&self) -> KernelCosts {
        let mut cold = self.clone();
        for table in &mut cold.linear {
            if let Some(rates) = table.cold_gflops.take() {
                table.gflops = rates;
            }
        }
        cold
    }

    /// Checks the table; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        for (key, value) in [
            ("compute.call_overhead_us", self.call_overhead_us),
            (
                "compute.attention_ns_per_score_dim",
                self.attention_ns_per_score_dim,
            ),
            (
                "compute.attention_ns_per_query_head",
                self.attention_ns_per_query_head,
            ),
            (
                "compute.cached_attention_ns_per_score_dim",
                self.cached_attention_ns_per_score_dim,
            ),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(format!("{key} = {value}: must be zero or positive"));
            }
        }
        for (op, value) in &self.elementwise_ns {
            if !(value.is_finite() && *value >= 0.0) {
                return Err(format!(
                    "compute.elementwise_ns.{} = {value}: must be zero or positive",
                    op.name()
                ));
            }
        }
        if let Some(threads) = &self.threads {
            if threads.timed_on == 0 || threads.all_cores < threads.timed_on {
                return Err(format!(
                    "compute.threads: timed_on = {}, all_cores = {}: at least 1, and all_cores at least timed_on",
                    threads.timed_on, threads.all_cores
                ));
            }
            if !(threads.all_cores_speedup.is_finite() && threads.all_cores_speedup > 0.0) {
                return Err(format!(
                    "compute.threads.all_cores_speedup = {}: must be a positive number",
                    threads.all_cores_speedup
                ));
            }
        }
        if self.linear.is_empty() {
            return Err("compute.linear: at least one table of rates is needed".to_string());
        }
        for (index, table) in self.linear.iter().enumerate() {
            let key = format!("compute.linear[{index}]");
            if dtype_of(&table.dtype).is_none() {
                return Err(format!(
                    "{key}.dtype = {:?}: one of f32, bf16, f16, f8_e4m3, f8_e5m2",
                    table.dtype
                ));
            }
            if table.inner == 0 || table.outer == 0 {
                return Err(format!("{key}: inner and outer must be at least 1"));
            }
            if table.rows.is_empty() || table.rows.len() != table.gflops.len() {
                return Err(format!(
                    "{key}: rows and gflops must be non-empty and of the same length"
                ));
            }
            if table.rows.windows(2).any(|pair| pair[0] >= pair[1]) || table.rows[0] == 0 {
                return Err(format!("{key}.rows: ascending, from at least 1"));
            }
            if let Some(bad) = table
                .gflops
                .iter()
                .find(|value| !(value.is_finite() && **value > 0.0))
            {
                return Err(format!("{key}.gflops: {bad} is not a positive number"));
            }
            if let Some(cold) = &table.cold_gflops {
                if cold.len() != table.rows.len() {
                    return Err(format!(
                        "{key}: cold_gflops must have one rate per row count"
                    ));
                }
                if let Some(bad) = cold
                    .iter()
                    .find(|value| !(value.is_finite() && **value > 0.0))
                {
                    return Err(format!("{key}.cold_gflops: {bad} is not a positive number"));
                }
            }
        }
        Ok(())
    }

    /// Time of one kernel.
    pub fn kernel_seconds(&self, kernel: &Kernel) -> f64 {
        let overhead = self.call_overhead_us * 1e-6;
        let element = |op: ElementOp, elements: u64| {
            self.elementwise_ns.get(&op).copied().unwrap_or(0.0) * 1e-9 * elements as f64
        };
        overhead
            + match *kernel {
                Kernel::Linear {
                    rows,
                    inner,
                    outer,
                    dtype,
                } => self.linear_seconds(rows, inner, outer, dtype),
                Kernel::LowRank {
                    rows,
                    inner,
                    rank,
                    outer,
                } => {
                    self.linear_seconds(rows, inner, rank, DType::F32)
                        + self.linear_seconds(rows, rank, outer, DType::F32)
                }
                Kernel::Elementwise { op, elements } => element(op, elements),
                Kernel::Attention {
                    score_dims,
                    queries,
                } => {
                    (self.attention_ns_per_score_dim * score_dims as f64
                        + self.attention_ns_per_query_head * queries as f64)
                        * 1e-9
                }
                Kernel::CachedAttention { score_dims } => {
                    self.cached_attention_ns_per_score_dim * 1e-9 * score_dims as f64
                }
                Kernel::Other { elements } => element(ElementOp::Move, elements),
            }
    }

    /// Time of a block's work: its kernels one after another.
    pub fn work_duration(&self, work: &Work) -> Duration {
        let seconds: f64 = work.kernels.iter().map(|k| self.kernel_seconds(k)).sum();
        Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX)
    }

    /// Seconds of `rows × inner → outer` in `dtype`, from the interpolated rate.
    pub fn linear_seconds(&self, rows: u64, inner: u64, outer: u64, dtype: DType) -> f64 {
        let flops = 2.0 * rows as f64 * inner as f64 * outer as f64;
        if flops <= 0.0 {
            return 0.0;
        }
        let gflops = self.linear_gflops(rows, inner * outer, dtype);
        flops / (gflops * 1e9)
    }

    /// The interpolated rate for `rows` rows of a weight of `elements` values.
    pub fn linear_gflops(&self, rows: u64, elements: u64, dtype: DType) -> f64 {
        let mut tables: Vec<&LinearRates> = self
            .linear
            .iter()
            .filter(|table| dtype_of(&table.dtype) == Some(dtype))
            .collect();
        if tables.is_empty() {
            // A dtype not measured: the widening ones cost like bf16, else f32.
            let stand_in = if dtype == DType::F32 {
                DType::F32
            } else {
                DType::Bf16
            };
            tables = self
                .linear
                .iter()
                .filter(|table| dtype_of(&table.dtype) == Some(stand_in))
                .collect();
        }
        if tables.is_empty() {
            tables = self.linear.iter().collect();
        }
        tables.sort_by_key(|table| table.inner * table.outer);
        let size = |table: &LinearRates| ((table.inner * table.outer) as f64).ln();
        let wanted = (elements.max(1) as f64).ln();
        let below = tables.iter().rev().find(|table| size(table) <= wanted);
        let above = tables.iter().find(|table| size(table) >= wanted);
        match (below, above) {
            (Some(below), Some(above)) if size(above) > size(below) => {
                let share = (wanted - size(below)) / (size(above) - size(below));
                let low = rate_at(below, rows).ln();
                let high = rate_at(above, rows).ln();
                (low + share * (high - low)).exp()
            }
            (Some(table), _) | (None, Some(table)) => rate_at(table, rows),
            (None, None) => 1.0,
        }
    }
}

/// A table's rate at `rows`, interpolated in log-log between its points.
fn rate_at(table: &LinearRates, rows: u64) -> f64 {
    let wanted = (rows.max(1) as f64).ln();
    let points: Vec<(f64, f64)> = table
        .rows
        .iter()
        .zip(&table.gflops)
        .map(|(&rows, &gflops)| ((rows as f64).ln(), gflops.ln()))
        .collect();
    let Some(&(first_x, first_y)) = points.first() else {
        return 1.0;
    };
    if wanted <= first_x {
        return first_y.exp();
    }
    for pair in points.windows(2) {
        let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
        if wanted <= x1 {
            let share = (wanted - x0) / (x1 - x0);
            return (y0 + share * (y1 - y0)).exp();
        }
    }
    points.last().map_or(1.0, |&(_, y)| y.exp())
}

/// The dtype a table names.
pub fn dtype_of(name: &str) -> Option<DType> {
    match name {
        "f32" => Some(DType::F32),
        "bf16" => Some(DType::Bf16),
        "f16" => Some(DType::F16),
        "f8_e4m3" => Some(DType::F8E4M3),
        "f8_e5m2" => Some(DType::F8E5M2),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs() -> KernelCosts {
        KernelCosts {
            call_overhead_us: 0.0,
            attention_ns_per_score_dim: 1.0,
            attention_ns_per_query_head: 100.0,
            cached_attention_ns_per_score_dim: 2.0,
            elementwise_ns: BTreeMap::from([(ElementOp::Add, 0.5)]),
            linear: vec![
                LinearRates {
                    dtype: "f32".into(),
                    inner: 256,
                    outer: 256,
                    rows: vec![1, 16],
                    gflops: vec![1.0, 16.0],
                    cold_gflops: Some(vec![0.5, 8.0]),
                },
                LinearRates {
                    dtype: "f32".into(),
                    inner: 1024,
                    outer: 1024,
                    rows: vec![1, 16],
                    gflops: vec![4.0, 64.0],
                    cold_gflops: None,
                },
            ],
            threads: None,
        }
    }

    #[test]
    fn every_core_speeds_a_step_up_by_the_measured_factor_and_no_further() {
        // Proves the thread scaling is 1 on the timed threads or fewer, the measured
        // speedup on every core or more, linear between, and that a bad table is
        // refused by name.
        let scaling = ThreadScaling {
            timed_on: 3,
            all_cores: 5,
            all_cores_speedup: 1.5,
        };
        assert_eq!(scaling.speedup_on(1), 1.0);
        assert_eq!(scaling.speedup_on(3), 1.0);
        assert!((scaling.speedup_on(4) - 1.25).abs() < 1e-12);
        assert_eq!(scaling.speedup_on(5), 1.5);
        assert_eq!(scaling.speedup_on(64), 1.5);
        for bad in [
            ThreadScaling {
                timed_on: 0,
                ..scaling
            },
            ThreadScaling {
                all_cores: 2,
                ..scaling
            },
            ThreadScaling {
                all_cores_speedup: f64::NAN,
                ..scaling
            },
        ] {
            let costs = KernelCosts {
                threads: Some(bad),
                ..costs()
            };
            let error = costs.validate().unwrap_err();
            assert!(error.contains("compute.threads"), "{error}");
        }
    }

    #[test]
    fn linear_rates_interpolate_in_log_rows_and_log_size_and_hold_outside() {
        // Proves the log-log interpolation: 4 rows is halfway (in log) between 1 and 16,
        // so the rate is the geometric mean; outside the table the nearest point holds.
        let costs = costs();
        let at = |rows, elements| costs.linear_gflops(rows, elements, DType::F32);
        assert!((at(4, 256 * 256) - 4.0).abs() < 1e-9);
        assert!((at(1, 512 * 512) - 2.0).abs() < 1e-9);
        assert!((at(64, 1024 * 1024) - 64.0).abs() < 1e-9);
        assert!((at(1, 64 * 64) - 1.0).abs() < 1e-9);
        // bf16 was not measured: f32 stands in (only f32 tables exist).
        assert!((costs.linear_gflops(16, 256 * 256, DType::Bf16) - 16.0).abs() < 1e-9);
    }

    #[test]
    fn cold_costs_use_the_flushed_rates_where_measured_and_refuse_bad_ones() {
        // Proves `cold()`: a table with `cold_gflops` takes them, one without keeps its
        // rates; a cold table of the wrong length or with a bad rate is refused by name.
        let cold = costs().cold();
        assert!((cold.linear_gflops(16, 256 * 256, DType::F32) - 8.0).abs() < 1e-9);
        assert!((cold.linear_gflops(16, 1024 * 1024, DType::F32) - 64.0).abs() < 1e-9);
        for bad in [vec![1.0], vec![1.0, f64::NAN]] {
            let mut costs = costs();
            costs.linear[0].cold_gflops = Some(bad);
            let error = costs.validate().unwrap_err();
            assert!(
                error.contains("compute.linear[0]") && error.contains("cold_gflops"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_blocks_work_is_the_sum_of_its_kernels() {
        // 2·16·256·256 FLOP at 16 GFLOP/s is 131.072 µs, plus 1000 adds at 0.5 ns.
        let work = Work {
            kernels: vec![
                Kernel::Linear {
                    rows: 16,
                    inner: 256,
                    outer: 256,
                    dtype: DType::F32,
                },
                Kernel::Elementwise {
                    op: ElementOp::Add,
                    elements: 1000,
                },
            ],
        };
        let seconds = costs().work_duration(&work).as_secs_f64();
        assert!((seconds - (131.072e-6 + 0.5e-6)).abs() < 1e-12, "{seconds}");
    }

    #[test]
    fn attention_costs_its_scores_and_its_query_heads() {
        // 8 sequences × 17 tokens × 12 heads × 32 dims (MiniLM at 8 short texts):
        // 887 808 score·dims at 1 ns and 1632 (query, head) pairs at 100 ns.
        let kernel = Kernel::Attention {
            score_dims: 8 * 12 * 17 * 17 * 32,
            queries: 8 * 12 * 17,
        };
        let seconds = costs().kernel_seconds(&kernel);
        assert!(
            (seconds - (887_808e-9 + 163_200e-9)).abs() < 1e-12,
            "{seconds}"
        );
        // An older profile without the per-query figure prices the scores alone.
        let text = r#"
            call_overhead_us = 0
            attention_ns_per_score_dim = 1
            cached_attention_ns_per_score_dim = 2
            elementwise_ns = {}
            linear = []
        "#;
        let older: KernelCosts = toml::from_str(text).unwrap();
        assert_eq!(older.attention_ns_per_query_head, 0.0);
        assert!((older.kernel_seconds(&kernel) - 887_808e-9).abs() < 1e-12);
        let mut bad = costs();
        bad.attention_ns_per_query_head = -1.0;
        let message = bad.validate().unwrap_err();
        assert!(
            message.contains("compute.attention_ns_per_query_head"),
            "{message}"
        );
    }

    #[test]
    fn validation_names_the_key() {
        let mut bad = costs();
        bad.linear[1].rows = vec![16, 1];
        let message = bad.validate().unwrap_err();
        assert!(message.contains("compute.linear[1].rows"), "{message}");
    }
}

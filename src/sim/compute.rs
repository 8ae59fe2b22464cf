//! The simulated compute stream: a block takes the time its arithmetic or its weight
//! reads need, whichever is longer (a roofline), and blocks run one after another.
//!
//! Large-batch work (diffusion: thousands of tokens per step) is bound by the tensor
//! cores' sustained rate; single-token decode is bound by reading the weights from
//! VRAM once per token. Both fall out of `max(flops / rate, bytes / memory bandwidth)`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::clock::{transfer_duration, SerialLane, SimClock};
use super::kernel_costs::KernelCosts;
use super::shared::{Demand, SharedBus};
use crate::compute::work::Work;
use crate::telemetry::trace::{Lane, TraceRecorder};

/// What the GPU sustains, not its peak.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ComputeRates {
    /// Dense bf16 tensor throughput × the sustained-efficiency factor.
    pub sustained_flops_per_second: f64,
    /// VRAM bandwidth (HBM/GDDR), for the weight reads of each block.
    pub memory_bytes_per_second: u64,
}

impl ComputeRates {
    /// Time for `flops` of arithmetic at the sustained rate.
    pub fn flops_duration(&self, flops: f64) -> Duration {
        if flops <= 0.0 {
            return Duration::ZERO;
        }
        if self.sustained_flops_per_second <= 0.0 {
            return Duration::MAX;
        }
        Duration::try_from_secs_f64(flops / self.sustained_flops_per_second)
            .unwrap_or(Duration::MAX)
    }

    /// Roofline time of one block: its arithmetic or reading its weights once.
    pub fn block_duration(&self, flops: f64, weight_bytes: u64) -> Duration {
        self.flops_duration(flops).max(transfer_duration(
            weight_bytes,
            self.memory_bytes_per_second,
        ))
    }
}

/// One compute stream on the simulator's timeline.
pub struct SimCompute {
    rates: ComputeRates,
    clock: Arc<SimClock>,
    stream: SerialLane,
    trace: Option<Arc<TraceRecorder>>,
    /// Measured kernel costs: a block with its kernels known costs their sum.
    costs: Option<KernelCosts>,
    /// The same, for weights read from memory (a streamed block's).
    cold_costs: Option<KernelCosts>,
    /// A shared-bus machine: compute runs on the bus beside copies and reads.
    bus: Option<Arc<SharedBus>>,
}

impl SimCompute {
    pub fn new(rates: ComputeRates, clock: Arc<SimClock>) -> Self {
        Self {
            rates,
            clock,
            stream: SerialLane::default(),
            trace: None,
            costs: None,
            cold_costs: None,
            bus: None,
        }
    }

    /// Blocks whose kernels are known cost what `costs` measured for them.
    pub fn with_costs(mut self, costs: KernelCosts) -> Self {
        self.cold_costs = Some(costs.cold());
        self.costs = Some(costs);
        self
    }

    /// Compute shares `bus` with copies and reads (one thread: the compute thread).
    pub fn with_bus(mut self, bus: Arc<SharedBus>) -> Self {
        self.bus = Some(bus);
        self
    }

    /// Time of one block: the sum of its kernels' measured costs when both are known,
    /// else the roofline.
    pub fn block_time(&self, flops: f64, weight_bytes: u64, work: Option<&Work>) -> Duration {
        match (&self.costs, work) {
            (Some(costs), Some(work)) => costs.work_duration(work),
            _ => self.block_duration(flops, weight_bytes),
        }
    }

    /// [`Self::block_time`] with the weights read from memory, not the caches: a
    /// streamed block's, copied in just before its compute.
    pub fn cold_block_time(&self, flops: f64, weight_bytes: u64, work: Option<&Work>) -> Duration {
        match (&self.cold_costs, work) {
            (Some(costs), Some(work)) => costs.work_duration(work),
            _ => self.block_duration(flops, weight_bytes),
        }
    }

    pub fn with_trace(mut self, trace: Arc<TraceRecorder>) -> Self {
        self.trace = Some(trace);
        self
    }

    pub fn rates(&self) -> ComputeRates {
        self.rates
    }

    /// Time for `flops` at the sustained rate.
    pub fn duration(&self, flops: f64) -> Duration {
        self.rates.flops_duration(flops)
    }

    /// Roofline time of one block (see [`ComputeRates::block_duration`]).
    pub fn block_duration(&self, flops: f64, weight_bytes: u64) -> Duration {
        self.rates.block_duration(flops, weight_bytes)
    }

    /// Runs `duration` of compute on the stream. Like a kernel launch, it is queued
    /// when called (behind earlier compute) and the future resolves when it is done.
    pub fn compute(
        &self,
        label: impl Into<String>,
        duration: Duration,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        self.compute_reading(label, duration, 0)
    }

    /// As [`Self::compute`], for work that reads `weight_bytes` of weights from memory
    /// once (what it asks of a shared bus).
    pub fn compute_reading(
        &self,
        label: impl Into<String>,
        duration: Duration,
        weight_bytes: u64,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        self.compute_on(label, duration, weight_bytes, 1)
    }

    /// As [`Self::compute_reading`], split over `threads` compute threads that all
    /// must finish (what it asks of a shared bus's cores).
    pub fn compute_on(
        &self,
        label: impl Into<String>,
        duration: Duration,
        weight_bytes: u64,
        threads: u64,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        if let Some(bus) = &self.bus {
            let seconds = duration.as_secs_f64().max(1e-12);
            let demand = Demand {
                threads: threads.max(1) as f64,
                memory_bytes_per_second: weight_bytes as f64 / seconds,
            };
            return Box::pin(bus.submit(Lane::Compute, duration, demand, label.into(), None));
        }
        let (start, end) = self.stream.book(self.clock.now(), duration);
        if let Some(trace) = &self.trace {
            trace.record(Lane::Compute, label, start, end, None);
        }
        let clock = Arc::clone(&self.clock);
        Box::pin(async move { clock.wait_until(end).await })
    }

    /// When the stream's last queued compute ends (exact virtual time).
    pub fn busy_until(&self) -> Duration {
        self.stream.busy_until()
    }
}

impl std::fmt::Debug for SimCompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCompute")
            .field("rates", &self.rates)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_roofline_takes_the_slower_of_arithmetic_and_weight_reads() {
        let rates = ComputeRates {
            sustained_flops_per_second: 100e12,
            memory_bytes_per_second: 1_000_000_000_000,
        };
        // 1 TFLOP on 100 TFLOP/s: 10 ms of arithmetic; 1 GB at 1 TB/s: 1 ms of reads.
        assert_eq!(
            rates.block_duration(1e12, 1_000_000_000),
            Duration::from_millis(10)
        );
        // One decode token: 2 GFLOP is 20 µs, the 1 GB of weights take 1 ms.
        assert_eq!(
            rates.block_duration(2e9, 1_000_000_000),
            Duration::from_millis(1)
        );
    }
}

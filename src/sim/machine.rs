//! A whole simulated machine built from a hardware profile: one clock, one device,
//! one disk, one compute stream, optionally one trace.

use std::sync::Arc;

use stagehand_actors::ModelLayout;

use super::clock::SimClock;
use super::compute::SimCompute;
use super::device::SimDevice;
use super::faults::FaultPlan;
use super::first_touch::FirstTouch;
use super::hardware::HardwareProfile;
use super::shared::SharedBus;
use super::storage::{ReadCost, SimStorage};
use super::SimError;
use crate::telemetry::trace::TraceRecorder;

/// The adapters of one simulated box, sharing one exact timeline.
#[derive(Debug)]
pub struct SimMachine {
    pub clock: Arc<SimClock>,
    pub device: Arc<SimDevice>,
    pub storage: Arc<SimStorage>,
    pub compute: Arc<SimCompute>,
    pub trace: Option<Arc<TraceRecorder>>,
}

impl SimMachine {
    /// Builds the machine; must be called inside [`super::virtual_time_runtime`].
    /// With the model's layout, reads are labelled by block in the trace and reads
    /// outside the model's files are errors.
    pub fn new(
        profile: &HardwareProfile,
        faults: &FaultPlan,
        layout: Option<&ModelLayout>,
        trace: Option<Arc<TraceRecorder>>,
    ) -> Result<Self, SimError> {
        Self::with_read_cost(profile, faults, layout, trace, ReadCost::BUFFERED)
    }

    /// As [`Self::new`], with what each read asks of a shared bus (buffered or
    /// O_DIRECT); a machine without one ignores it.
    pub fn with_read_cost(
        profile: &HardwareProfile,
        faults: &FaultPlan,
        layout: Option<&ModelLayout>,
        trace: Option<Arc<TraceRecorder>>,
        read_cost: ReadCost,
    ) -> Result<Self, SimError> {
        faults.validate()?;
        let clock = SimClock::new()?;
        let mut device = SimDevice::new(profile.device_spec(), Arc::clone(&clock), faults);
        let mut storage = SimStorage::new(profile.disk_rates(), Arc::clone(&clock), faults);
        if let Some(layout) = layout {
            storage = storage.with_layout(layout);
        }
        if let Some(rates) = profile.uncached_rates() {
            storage = storage
                .with_uncached(rates)
                .with_uncached_at_start(&profile.uncached_at_start);
        }
        let mut compute = SimCompute::new(profile.compute_rates(), Arc::clone(&clock));
        if let Some(costs) = &profile.compute {
            compute = compute.with_costs(costs.clone());
        }
        if let Some(gb_per_s) = profile.first_touch_gb_per_s {
            // One host: the device's fresh arena and pinned buffers, the disk's reads.
            let first_touch = Arc::new(FirstTouch::new(gb_per_s));
            device = device.with_first_touch(Arc::clone(&first_touch));
            storage = storage.with_first_touch(first_touch);
        }
        if let Some(spec) = &profile.shared {
            // One bus for the copy thread, the reader threads and the compute thread.
            let bus = SharedBus::new(spec.clone(), Arc::clone(&clock), trace.clone());
            device = device.with_bus(Arc::clone(&bus));
            storage = storage.with_bus(Arc::clone(&bus), read_cost);
            compute = compute.with_bus(bus);
        }
        if let Some(trace) = &trace {
            device = device.with_trace(Arc::clone(trace));
            storage = storage.with_trace(Arc::clone(trace));
            compute = compute.with_trace(Arc::clone(trace));
        }
        Ok(Self {
            clock,
            device: Arc::new(device),
            storage: Arc::new(storage),
            compute: Arc::new(compute),
            trace,
        })
    }
}

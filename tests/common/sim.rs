//! Shared helpers of the simulator adapter tests: a 24 GB card on PCIe 4 and an NVMe
//! disk, on a virtual clock.

use std::sync::Arc;
use std::time::Duration;

use stagehand::actors::{Extent, FileId};
use stagehand::sim::{
    DiskRates, FaultPlan, LinkRates, SimClock, SimDevice, SimDeviceSpec, SimStorage,
};

pub const GB: u64 = 1_000_000_000;

pub const COPY_LATENCY: Duration = Duration::from_micros(10);

pub const READ_LATENCY: Duration = Duration::from_micros(50);

pub fn pcie4() -> LinkRates {
    LinkRates {
        pinned_bytes_per_second: 25 * GB,
        pageable_bytes_per_second: 12 * GB,
        latency: COPY_LATENCY,
    }
}

pub fn device(clock: &Arc<SimClock>, faults: &FaultPlan) -> SimDevice {
    let spec = SimDeviceSpec {
        vram_bytes: 24 * GB,
        pinnable_bytes: 64 * GB,
        link: pcie4(),
    };
    SimDevice::new(spec, Arc::clone(clock), faults)
}

pub fn nvme(clock: &Arc<SimClock>, faults: &FaultPlan) -> SimStorage {
    let disk = DiskRates {
        bytes_per_second: 7 * GB,
        request_latency: READ_LATENCY,
    };
    SimStorage::new(disk, Arc::clone(clock), faults)
}

pub fn extent(offset: u64, length: u64) -> Extent {
    Extent {
        file: FileId(0),
        offset,
        length,
    }
}

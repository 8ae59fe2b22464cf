//! Shipped hardware profiles and model descriptions load, user files work, and bad
//! files are refused with the file and key named.

use std::time::Duration;

use bytesize::ByteSize;
use stagehand::sim::{virtual_time_runtime, FaultPlan, HardwareProfile, SimMachine, TraceRecorder};

const GIB: u64 = 1 << 30;

#[test]
fn every_shipped_hardware_profile_loads_with_sane_figures() {
    let names = HardwareProfile::builtin_names();
    assert_eq!(names.len(), 6);
    for name in names {
        let profile = HardwareProfile::load(name).unwrap();
        assert_eq!(profile.name, name);
        assert!(profile.vram_bytes() >= 12 * GIB, "{name}");
        let link = profile.link_rates();
        assert!(
            link.pageable_bytes_per_second < link.pinned_bytes_per_second,
            "{name}"
        );
        let compute = profile.compute_rates();
        assert!(compute.sustained_flops_per_second > 10e12, "{name}");
        assert!(
            profile.disk_rates().bytes_per_second >= 3_000_000_000,
            "{name}"
        );
    }
}

#[test]
fn shipped_figures_match_their_sources() {
    let rtx3060 = HardwareProfile::load("rtx3060-12gb").unwrap();
    assert_eq!(rtx3060.vram_bytes(), 12 * GIB);
    assert_eq!(rtx3060.link.name, "pcie4");
    assert_eq!(rtx3060.ram_bytes, 32 * GIB);
    let h200 = HardwareProfile::load("h200").unwrap();
    assert_eq!(h200.link_rates().pinned_bytes_per_second, 55_000_000_000);
    assert_eq!(
        h200.compute_rates().memory_bytes_per_second,
        4_800_000_000_000
    );
    assert_eq!(h200.vram_bytes(), 141 * GIB);
}

#[test]
fn ram_and_disk_overrides_replace_the_hosts_defaults() {
    let profile = HardwareProfile::load("rtx3060-12gb")
        .unwrap()
        .with_ram(ByteSize::gib(16))
        .with_disk("hdd")
        .unwrap();
    assert_eq!(profile.ram_bytes, 16 * GIB);
    assert_eq!(profile.disk.name, "hdd");
    let disk = profile.disk_rates();
    assert_eq!(disk.bytes_per_second, 200_000_000);
    assert_eq!(disk.request_latency, Duration::from_millis(8));
    for name in ["hdd", "sata", "nvme3", "nvme4", "nvme5"] {
        assert!(HardwareProfile::load("rtx4090")
            .unwrap()
            .with_disk(name)
            .is_ok());
    }
    let error = HardwareProfile::load("rtx4090")
        .unwrap()
        .with_disk("floppy")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("floppy") && error.contains("nvme4"),
        "{error}"
    );
}

#[test]
fn a_users_profile_file_can_describe_its_own_link_and_disk() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("my-box.toml");
    std::fs::write(
        &path,
        r#"
[gpu]
name = "Laptop GPU"
vram = "8 GiB"
pcie_generation = 4
bf16_dense_tflops = 40
sustained_efficiency = 0.5
memory_gb_per_s = 256

[host]
ram = "16 GiB"

[link]   # an x8 slot
pinned_gb_per_s = 12.5
pageable_gb_per_s = 6
latency_us = 10

[disk]
read_gb_per_s = 2.5
request_latency_us = 70
"#,
    )
    .unwrap();
    let profile = HardwareProfile::load(path.to_str().unwrap()).unwrap();
    assert_eq!(profile.name, "my-box");
    assert_eq!(profile.link_rates().pinned_bytes_per_second, 12_500_000_000);
    assert_eq!(profile.disk_rates().bytes_per_second, 2_500_000_000);
    assert_eq!(profile.ram_bytes, 16 * GIB);
}

#[test]
fn unknown_names_and_broken_files_say_what_to_do() {
    let error = HardwareProfile::load("gtx1080").unwrap_err().to_string();
    assert!(
        error.contains("gtx1080") && error.contains("rtx4090"),
        "{error}"
    );

    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("typo.toml");
    std::fs::write(
        &path,
        "[gpu]\nname = \"x\"\nvram = \"8 GiB\"\npcie_generation = 6\nbf16_dense_tflops = 1\nsustained_efficiency = 0.5\nmemory_gb_per_s = 1\n[host]\nram = \"8 GiB\"\ndisk = \"nvme4\"\n",
    )
    .unwrap();
    let error = HardwareProfile::load(path.to_str().unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("typo.toml") && error.contains("pcie_generation"),
        "{error}"
    );
}

#[test]
fn a_machine_built_from_a_profile_runs_at_the_profiles_rates() {
    let profile = HardwareProfile::load("rtx3060-12gb").unwrap();
    let runtime = virtual_time_runtime().unwrap();
    let trace = std::sync::Arc::new(TraceRecorder::new());
    let done_at = runtime.block_on(async {
        use stagehand::actors::Device;
        let machine =
            SimMachine::new(&profile, &FaultPlan::default(), None, Some(trace.clone())).unwrap();
        let arena = machine.device.allocate_arena(GIB).unwrap();
        let buffer = machine.device.allocate_pinned(GIB).unwrap();
        machine
            .device
            .copy_to_device(buffer, 0, 250_000_000, arena.base)
            .await
            .unwrap();
        machine.clock.now()
    });
    // 250 MB at PCIe 4.0's 25 GB/s plus the link's 10 µs.
    assert_eq!(done_at, Duration::from_micros(10_010));
    assert_eq!(trace.len(), 1);
}

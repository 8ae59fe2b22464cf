//! Shipped hardware profiles and model descriptions load, user files work, and bad
//! files are refused with the file and key named.

use std::time::Duration;

use bytesize::ByteSize;
use stagehand::model::ModelIndex;
use stagehand::sim::{virtual_time_runtime, FaultPlan, HardwareProfile, SimMachine};
use stagehand::simulate::{Bottleneck, FitCheck, FitSettings, ModelDescription};
use stagehand::telemetry::TraceRecorder;

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
fn a_checkpoint_partly_in_the_page_cache_reads_its_uncached_ranges_cold_once() {
    // Proves `reading_cached`: the page-cache rate for every read, the cold rate kept
    // for the ranges the page cache did not hold, which the storage model reads cold
    // the first time (tests/sim_disk.rs proves that part).
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("calibrated.toml");
    std::fs::write(
        &path,
        r#"
[gpu]
name = "CPU"
vram = "8 GiB"
pcie_generation = 4
bf16_dense_tflops = 1
sustained_efficiency = 0.5
memory_gb_per_s = 30

[host]
ram = "16 GiB"

[disk]
read_gb_per_s = 1.0
request_latency_us = 70
page_cache_gb_per_s = 4.0
"#,
    )
    .unwrap();
    let profile = HardwareProfile::load(path.to_str().unwrap()).unwrap();
    // What the page cache holds is read at 4 GB/s; the ranges it does not hold, at
    // the cold 1 GB/s the first time (the storage model's dropped ranges).
    let dropped = vec![(0, 4096, 1 << 20)];
    let partly = profile.clone().reading_cached(dropped.clone());
    assert_eq!(partly.disk_rates().bytes_per_second, 4_000_000_000);
    assert_eq!(
        partly.uncached_rates().unwrap().bytes_per_second,
        1_000_000_000
    );
    assert_eq!(partly.uncached_at_start, dropped);
    let all = profile.clone().reading_cached(Vec::new());
    assert_eq!(all.disk_rates().bytes_per_second, 4_000_000_000);
    assert!(all.uncached_at_start.is_empty());
    // A profile that never measured the page cache keeps its one rate.
    let shipped = HardwareProfile::load("rtx3060-12gb").unwrap();
    assert_eq!(shipped.clone().reading_cached(dropped), shipped);
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

#[test]
fn every_shipped_model_loads_with_its_published_size() {
    // (name, parameters from the published configs, blocks, tensors)
    let expected = [
        ("flux1-dev", 11_901_408_320_u64, 59, 780),
        ("wan2.2-14b", 14_288_491_584, 42, 1_095),
        ("sdxl-unet", 2_567_463_684, 9, 1_680),
        ("llama3-8b", 8_030_261_248, 34, 291),
        ("llama3-70b", 70_553_706_496, 82, 723),
        ("mixtral-8x7b", 46_702_792_704, 34, 995),
    ];
    assert_eq!(ModelDescription::builtin_names().len(), expected.len());
    for (name, parameters, blocks, tensors) in expected {
        let model = ModelDescription::load(name).unwrap();
        assert_eq!(model.name, name);
        assert_eq!(model.dtype, "bf16");
        assert_eq!(model.total_bytes(), 2 * parameters, "{name}");
        assert_eq!(model.blocks.len(), blocks, "{name}");
        assert_eq!(model.tensor_count(), tensors, "{name}");
        let layout = model.layout();
        assert_eq!(layout.total_bytes(), model.total_bytes(), "{name}");
        assert_eq!(layout.largest_block_bytes(), model.largest_block_bytes());
    }
}

#[test]
fn shipped_models_have_the_step_flops_their_arithmetic_says() {
    // Flux: 4608 tokens × 57 blocks × 283.1 MFLOP ≈ 74.4 TFLOP per step.
    let flux = ModelDescription::load("flux1-dev").unwrap();
    let flux_tflop = flux.step_flops() / 1e12;
    assert!((74.0..75.0).contains(&flux_tflop), "{flux_tflop}");
    // Mixtral: only 2 of 8 experts run per token.
    let mixtral = ModelDescription::load("mixtral-8x7b").unwrap();
    let experts = mixtral.experts.unwrap();
    assert_eq!((experts.per_layer, experts.top_k), (8, 2));
    assert_eq!(experts.bytes_each, 352_321_536);
    let layer = &mixtral.blocks[1];
    assert!(layer.flops_per_token < layer.bytes as f64 / 2.0 * 2.0 / 3.0);
}

#[test]
fn a_users_model_file_and_a_real_checkpoint_both_describe_a_model() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("tiny.toml");
    std::fs::write(
        &path,
        "dtype = \"f32\"\ntokens_per_step = 8\nblock_count = 4\nbytes_per_block = 4096\nflops_per_token_per_block = 2048.0\n",
    )
    .unwrap();
    let model = ModelDescription::load(path.to_str().unwrap()).unwrap();
    assert_eq!((model.name.as_str(), model.blocks.len()), ("tiny", 4));

    let checkpoint = directory.path().join("two_layers.safetensors");
    write_checkpoint(&checkpoint);
    let index = ModelIndex::open(&checkpoint, None).unwrap();
    let model = ModelDescription::from_model_index(&index, 16, None).unwrap();
    assert_eq!(model.total_bytes(), index.total_bytes());
    assert_eq!(model.tokens_per_step, 16);
    // Each layer holds one 8×4 f32 matrix and an 8-element bias: 2 × 32 FLOPs per token.
    let layer = model
        .blocks
        .iter()
        .find(|block| block.name.ends_with(".0"))
        .unwrap();
    assert_eq!(layer.flops_per_token, 64.0);
    assert_eq!(layer.bytes, (32 + 8) * 4);
}

#[test]
fn unknown_models_list_the_shipped_ones() {
    let error = ModelDescription::load("gpt-5").unwrap_err().to_string();
    assert!(
        error.contains("gpt-5") && error.contains("llama3-70b"),
        "{error}"
    );
}

/// A two-layer f32 safetensors file: `layers.N.weight` [8, 4] and `layers.N.bias` [8].
fn write_checkpoint(path: &std::path::Path) {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for layer in 0..2 {
        for (name, shape) in [("weight", vec![8, 4]), ("bias", vec![8])] {
            let bytes = shape.iter().product::<usize>() * 4;
            header.insert(
                format!("layers.{layer}.{name}"),
                serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + bytes]}),
            );
            offset += bytes;
        }
    }
    let mut json = serde_json::to_vec(&header).unwrap();
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let mut file = (json.len() as u64).to_le_bytes().to_vec();
    file.extend(json);
    file.extend(vec![0u8; offset]);
    std::fs::write(path, file).unwrap();
}

/// `actual` within a millionth of `expected`.
fn close(actual: f64, expected: f64) -> bool {
    (actual - expected).abs() <= expected.abs() * 1e-6
}

#[test]
fn worked_example_flux_on_an_rtx3060_is_compute_bound() {
    // FLUX.1-dev (23,802,816,640 bytes; largest block a double block of 679,662,592)
    // on the RTX 3060 12 GB box (PCIe 4.0, 32 GiB RAM, NVMe gen4), default settings:
    //   vram_budget = 12 GiB − 256 MiB reserve = 12,616,466,432, of which a 1024² step's
    //     activations take 1,541,857,284 (the Flux family's list): 11,074,609,148 plan
    //   ring = 679,662,592 × (depth 2 + 1) = 2,038,987,776
    //   resident = 11,074,609,148 − 2,038,987,776 = 9,035,621,372
    //   pcie bytes/step = 23,802,816,640 − 9,035,621,372 = 14,767,195,268
    //     → 14,767,195,268 / 25 GB/s = 0.591 s
    //   pin ceiling = 32 GiB − 2 GiB floor = 32,212,254,720; staging = 3 × 679,662,592;
    //     the remaining 30.2 GB cache every streamed byte: nothing from disk.
    //   compute: 25.5 TFLOPS × 0.55 = 14.025 TFLOP/s sustained; a double or single
    //     block is 283,115,520 × 4608 = 1.3046 TFLOP → 93.0 ms (its weight reads at
    //     360 GB/s take ≤ 1.9 ms); 57 blocks + head (1.04 ms) + tail (0.12 ms) = 5.303 s.
    //   bound = max(5.303, 0.591, 0) = 5.303 s: compute-bound, PCIe is 11 % of it.
    let model = ModelDescription::load("flux1-dev").unwrap();
    let hardware = HardwareProfile::load("rtx3060-12gb").unwrap();
    let check = FitCheck::new(&model, &hardware, &FitSettings::default());
    assert!(check.fits, "{:?}", check.failures);
    assert_eq!(check.vram_budget_bytes, 12_616_466_432);
    assert_eq!(check.ring_bytes, 2_038_987_776);
    assert_eq!(check.activation_bytes, 1_541_857_284);
    assert_eq!(check.resident_bytes, 9_035_621_372);
    assert_eq!(check.pcie_bytes_per_step, 14_767_195_268);
    assert_eq!(check.pin_ceiling_bytes, 32_212_254_720);
    assert_eq!(check.staging_bytes, 2_038_987_776);
    assert_eq!(check.disk_bytes_per_step, 0);
    assert!(
        close(check.pcie_seconds, 0.590_687_810_72),
        "{}",
        check.pcie_seconds
    );
    assert!(
        close(check.compute_seconds, 5.303_260_034),
        "{}",
        check.compute_seconds
    );
    assert_eq!(check.bottleneck, Bottleneck::Compute);
    assert!(close(check.bound_seconds, check.compute_seconds));
    // Cold: 23.8 GB from NVMe at 7 GB/s = 3.40 s, still under compute.
    assert!(close(check.cold_bound_seconds, check.compute_seconds));
}

#[test]
fn worked_example_llama70b_on_a_12gb_card_with_an_hdd_streams_from_disk() {
    // Llama-3-70B (141,107,412,992 bytes; largest block the lm_head tail, 2,101,362,688)
    // on the RTX 3060 box with 32 GiB RAM and an HDD, default settings:
    //   vram_budget = 12,616,466,432, of which the KV cache's first pages take
    //   4160 tokens × 640 KiB = 2,726,297,600 (4096-token context): 9,890,168,832 plan.
    //   The plan keeps the 2.1 GB embedding and lm_head resident (too large to
    //   stream) and sizes the ring for a layer:
    //   ring = 3 × 1,711,308,800 = 5,133,926,400
    //   resident = 9,890,168,832 − 5,133,926,400 = 4,756,242,432
    //   pcie bytes/step = 136,351,170,560 → 5.454 s at 25 GB/s
    //   pin ceiling 32,212,254,720 − staging 3 × 1,711,308,800 (whole-block buffers
    //   hold the largest streamed block) = 27,078,328,320 cached
    //   disk bytes/step = 136,351,170,560 − 27,078,328,320 = 109,272,842,240
    //     → 546.36 s at 0.2 GB/s
    //   compute (decode, 1 token): each layer reads 1.71 GB at 360 GB/s = 4.75 ms
    //     (its 1.85 GFLOP take 0.13 ms) → 0.392 s for the model
    //   bound = 546.4 s per token, disk-bound. Every budget holds, so it "fits":
    //   it runs, at ~9 minutes a token. Cold: 141 GB / 0.2 GB/s = 705.5 s.
    let model = ModelDescription::load("llama3-70b").unwrap();
    let hardware = HardwareProfile::load("rtx3060-12gb")
        .unwrap()
        .with_ram(ByteSize::gib(32))
        .with_disk("hdd")
        .unwrap();
    let check = FitCheck::new(&model, &hardware, &FitSettings::default());
    assert!(check.fits, "{:?}", check.failures);
    assert_eq!(check.ring_bytes, 5_133_926_400);
    assert_eq!(check.activation_bytes, 2_726_297_600);
    assert_eq!(check.resident_bytes, 4_756_242_432);
    assert_eq!(check.pcie_bytes_per_step, 136_351_170_560);
    assert_eq!(check.pinned_cache_bytes, 27_078_328_320);
    assert_eq!(check.disk_bytes_per_step, 109_272_842_240);
    assert!(close(check.pcie_seconds, 5.454_046_822_4));
    assert!(close(check.disk_seconds, 546.364_211_2));
    assert!(
        close(check.compute_seconds, 0.391_965_036),
        "{}",
        check.compute_seconds
    );
    assert_eq!(check.bottleneck, Bottleneck::Disk);
    assert!(close(check.bound_seconds, 546.364_211_2));
    assert!(close(check.cold_bound_seconds, 705.537_064_96));
}

#[test]
fn worked_example_llama70b_under_tight_budgets_does_not_fit_and_says_why() {
    // Same model, --vram-budget 5GiB --pin-ceiling 4GiB:
    //   ring 6,304,088,064 + the KV cache's first pages 2,726,297,600 > 5 GiB
    //   (5,368,709,120): 3,661,676,544 bytes short; depth 0 (one slot) fits
    //   staging 6,304,088,064 > 4 GiB (4,294,967,296): 2,009,120,768 bytes short
    let model = ModelDescription::load("llama3-70b").unwrap();
    let hardware = HardwareProfile::load("rtx3060-12gb").unwrap();
    let settings = FitSettings {
        vram_budget_bytes: Some(5 * GIB),
        pin_ceiling_bytes: Some(4 * GIB),
        ..FitSettings::default()
    };
    let check = FitCheck::new(&model, &hardware, &settings);
    assert!(!check.fits);
    let failures: Vec<_> = check
        .failures
        .iter()
        .map(|failure| (failure.budget(), failure.short_by_bytes()))
        .collect();
    assert_eq!(
        failures,
        [
            ("vram_budget", 3_661_676_544),
            ("pin_ceiling", 2_009_120_768)
        ]
    );
    assert_eq!(
        check.failures[0].to_string(),
        "vram_budget 5 GiB is 3.41 GiB short of the streaming ring: largest block 1.96 GiB × \
         (prefetch_depth 2 + 1) + activations 2.54 GiB = 8.41 GiB; set --vram-budget 8.42GiB or more, \
         or --prefetch-depth 0"
    );
}

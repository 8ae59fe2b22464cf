#![cfg(feature = "cuda")]
//! The CUDA adapters. Without a GPU: every entry point fails cleanly, with a message
//! that says what to do, and the operation scenario the GPU tests use runs on the CPU
//! adapter. With `STAGEHAND_GPU_TESTS=1` on a GPU machine: real pinned copies, cast
//! buffers, events, and every operation of `CudaCompute` against the compute port's
//! plain reference and `CpuCompute` (within a tolerance: a GPU sums in another order)
//! and against itself (bit for bit): the conformance suite of `compute_port/ops.rs`.

use std::sync::{Mutex, MutexGuard};

use stagehand::actors::{Device, DevicePtr, MemorySpace};
use stagehand::compute::{Compute, ComputeError, DType, TensorSlot};
use stagehand::device::cuda::{self, CudaCompute, CudaDevice};
use stagehand::device::CpuCompute;

#[path = "compute_port/ops.rs"]
mod ops;

/// Serialises the GPU tests: some compare the driver's free-memory figure before and
/// after their own allocations, which a concurrent test would disturb.
static GPU: Mutex<()> = Mutex::new(());

/// The device for a GPU test, with the lock that keeps GPU tests one at a time. GPU
/// tests are `#[ignore]`d, so a plain `cargo test` lists them as ignored; run without
/// STAGEHAND_GPU_TESTS=1 or without a device they fail: a GPU check that silently
/// skipped would report success without having run.
fn gpu_device() -> Option<(MutexGuard<'static, ()>, CudaDevice)> {
    if std::env::var("STAGEHAND_GPU_TESTS").as_deref() != Ok("1") {
        // GPU tests are #[ignore]d: reaching here means they were asked for
        // (--include-ignored) without saying there is a GPU. Passing would hide that.
        panic!(
            "GPU test run without STAGEHAND_GPU_TESTS=1: set it on a machine with a CUDA device"
        );
    }
    let guard = GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    match CudaDevice::open(0) {
        Ok(device) => Some((guard, device)),
        Err(error) => panic!("STAGEHAND_GPU_TESTS=1 but no usable CUDA device: {error}"),
    }
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
        .block_on(future)
}

#[test]
fn opening_without_a_usable_gpu_is_an_error_that_says_what_to_do() {
    // Proves `CudaDevice::open` never panics where CUDA is missing (cudarc would), on
    // the first call and on later ones, and that the message names the way out.
    let libraries = cuda::libraries();
    for attempt in 0..2 {
        match CudaDevice::open(0) {
            Ok(device) => {
                assert!(libraries.driver);
                println!(
                    "a CUDA device is present ({}): no-GPU path not exercised",
                    device.device_name()
                );
                return;
            }
            Err(error) => {
                let message = error.to_string();
                println!("attempt {attempt}: {message}");
                assert!(message.contains("--device cpu"), "{message}");
                if libraries.driver {
                    assert!(message.starts_with("no CUDA device"), "{message}");
                } else {
                    assert!(message.contains("libcuda not found"), "{message}");
                }
            }
        }
    }
}

#[test]
fn counting_devices_never_panics() {
    // Proves the device count is an answer (0 included) or a clean error, never a panic.
    match cuda::device_count() {
        Ok(count) => println!("{count} CUDA device(s)"),
        Err(error) => {
            assert!(!cuda::libraries().driver || error.to_string().contains("cuInit"));
            assert!(error.to_string().contains("--device cpu"), "{error}");
        }
    }
}

#[test]
fn asking_for_a_device_past_the_last_names_the_count() {
    // Proves an out-of-range ordinal is refused with the number of devices present (or,
    // without a driver, with the missing library), never a panic.
    let count = cuda::device_count().unwrap_or(0);
    let error = CudaDevice::open(count + 7).err().expect("no such device");
    let message = error.to_string();
    if !cuda::libraries().driver {
        assert!(message.contains("libcuda not found"), "{message}");
    } else if count > 0 {
        assert!(
            message.contains(&format!("device {}", count + 7)),
            "{message}"
        );
        assert!(message.contains(&format!("has {count}")), "{message}");
    } else {
        assert!(message.starts_with("no CUDA device"), "{message}");
    }
}

#[test]
#[ignore = "needs a CUDA device: run with STAGEHAND_GPU_TESTS=1 and --include-ignored (scripts/gpu-check.sh does)"]
fn gpu_pinned_copies_round_trip() {
    // Proves bytes copied from a registered buffer on the copy stream arrive intact,
    // that the buffer comes back still registered, and that bad copies are refused
    // with the buffer handed back.
    let Some((_gpu, device)) = gpu_device() else {
        return;
    };
    let bytes = 8 << 20;
    let mut source = device.allocate_pinned(bytes).expect("pinned buffer");
    assert!(source.is_registered());
    for (index, byte) in source.as_mut_slice().unwrap().iter_mut().enumerate() {
        *byte = (index * 31 % 251) as u8;
    }
    let expected = source.as_slice().unwrap().to_vec();
    let arena = device.allocate_arena(bytes).expect("arena");
    let half = bytes / 2;
    let source = block_on(device.copy_to_device(source, 0, half, arena.base)).expect("first half");
    let source = block_on(device.copy_to_device(source, half, half, arena.base.offset(half)))
        .expect("second half");
    assert!(source.is_registered());
    let mut back = vec![0u8; bytes as usize];
    device.copy_to_host(arena.base, &mut back).unwrap();
    assert!(back == expected, "device bytes differ from the source");

    let (error, source) = block_on(device.copy_to_device(source, half + 1, half, arena.base))
        .expect_err("copy past the end");
    assert!(error.to_string().contains("runs past"), "{error}");
    let (error, _source) =
        block_on(device.copy_to_device(source, 0, 1, DevicePtr(0))).expect_err("null destination");
    assert!(error.to_string().contains("null"), "{error}");
    device.free_arena(arena);

    let info = device.memory_info().unwrap();
    assert!(info.free_bytes <= info.total_bytes && info.total_bytes > 0);
}

#[test]
#[ignore = "needs a CUDA device: run with STAGEHAND_GPU_TESTS=1 and --include-ignored (scripts/gpu-check.sh does)"]
fn gpu_cast_buffer_grows_in_place_and_shrinks() {
    // Proves the cast buffer keeps its base address and its data while it grows, counts
    // mapped chunks against VRAM, refuses to pass its reservation, and gives memory back
    // when it shrinks.
    let Some((_gpu, device)) = gpu_device() else {
        return;
    };
    let mut buffer = device.cast_buffer(1 << 30, 16 << 20).expect("cast buffer");
    let base = buffer.base();
    let chunk = buffer.chunk_bytes();
    assert_eq!(buffer.mapped_bytes(), 0);
    buffer.grow_to(chunk + 1).unwrap();
    assert_eq!(buffer.mapped_bytes(), 2 * chunk);

    let mut pinned = device.allocate_pinned(chunk).unwrap();
    pinned.as_mut_slice().unwrap().fill(0xA5);
    let pinned = block_on(device.copy_to_device(pinned, 0, chunk, base)).unwrap();
    let free_before = device.memory_info().unwrap().free_bytes;
    buffer.grow_to(6 * chunk).unwrap();
    assert_eq!(buffer.base(), base, "growing moved the buffer");
    let free_after = device.memory_info().unwrap().free_bytes;
    assert!(
        free_before - free_after >= 4 * chunk,
        "new chunks were not backed by VRAM"
    );
    let mut back = vec![0u8; chunk as usize];
    device.copy_to_host(base, &mut back).unwrap();
    assert!(
        back.iter().all(|&byte| byte == 0xA5),
        "growing lost the data"
    );
    // The new chunks are usable too.
    let _pinned =
        block_on(device.copy_to_device(pinned, 0, chunk, base.offset(5 * chunk))).unwrap();

    assert!(buffer.grow_to(buffer.reservation_bytes() + 1).is_err());
    buffer.shrink_to(chunk).unwrap();
    assert_eq!(buffer.mapped_bytes(), chunk);
    let free_shrunk = device.memory_info().unwrap().free_bytes;
    assert!(
        free_shrunk >= free_after + 4 * chunk,
        "shrinking kept the VRAM"
    );
}

#[test]
#[ignore = "needs a CUDA device: run with STAGEHAND_GPU_TESTS=1 and --include-ignored (scripts/gpu-check.sh does)"]
fn gpu_link_figures_are_measured() {
    // Proves the link benchmark runs end to end and yields positive, finite figures
    // (no timing assertion: those belong to the benchmark report, not a test).
    let Some((_gpu, device)) = gpu_device() else {
        return;
    };
    assert!(
        cuda::bench::link_figures(&device, 4096).is_err(),
        "too small to measure"
    );
    let figures = cuda::bench::link_figures(&device, 64 << 20).expect("link figures");
    println!("{}", figures.to_markdown());
    for value in [
        figures.pinned_h2d_bytes_per_second,
        figures.pageable_h2d_bytes_per_second,
        figures.register_seconds_per_gib,
        figures.unregister_seconds_per_gib,
    ] {
        assert!(value.is_finite() && value > 0.0, "{figures:?}");
    }
}

#[test]
#[ignore = "needs a CUDA device: run with STAGEHAND_GPU_TESTS=1 and --include-ignored (scripts/gpu-check.sh does)"]
fn gpu_copy_and_compute_events_order_the_streams() {
    // Proves the stream-ordering calls the pipeline uses (compute-done events, copies
    // waiting on them, compute waiting on copies) are accepted by the driver and that
    // the compute-done future resolves.
    let Some((_gpu, device)) = gpu_device() else {
        return;
    };
    let compute_done = device.record_compute_done().expect("compute-done event");
    device
        .copies_wait_for(&compute_done)
        .expect("copy stream waits");
    let mut pinned = device.allocate_pinned(1 << 20).unwrap();
    pinned.as_mut_slice().unwrap().fill(7);
    let arena = device.allocate_arena(1 << 20).unwrap();
    let copy = device.copy_to_device(pinned, 0, 1 << 20, arena.base);
    device
        .compute_waits_for_copies()
        .expect("compute stream waits");
    block_on(device.compute_done()).expect("compute done resolves");
    let pinned = block_on(copy).expect("copy done");
    compute_done.synchronize().unwrap();
    drop(pinned);
    device.free_arena(arena);
}

fn device_read_back(device: &CudaDevice) -> impl Fn(u64, usize) -> Vec<u8> + '_ {
    move |address, length| {
        let mut bytes = vec![0u8; length];
        device
            .copy_to_host(DevicePtr(address), &mut bytes)
            .expect("device read-back");
        bytes
    }
}

#[test]
#[ignore = "needs a CUDA device: run with STAGEHAND_GPU_TESTS=1 and --include-ignored (scripts/gpu-check.sh does)"]
fn gpu_every_operation_matches_the_cpu_adapter() {
    // Proves each operation of CudaCompute (casts from f32/f16/bf16 at aligned and odd
    // offsets, GEMMs with bias, LoRA low-rank and merge, row operations, norms, GELU,
    // masked and grouped-query attention, checksums) computes what CpuCompute does,
    // within the stated tolerance per operation; merged half-precision weights within
    // one rounding of their dtype.
    let Some((_gpu, device)) = gpu_device() else {
        return;
    };
    let compute = CudaCompute::new(&device).expect("cuda compute");
    let gpu = ops::run_ops(&compute, &device_read_back(&device)).expect("scenario on the gpu");
    let cpu = ops::run_ops(&CpuCompute::new(), &ops::host_read_back).expect("scenario on the cpu");
    assert_eq!(gpu.values.len(), cpu.values.len());
    let misses = ops::reference_misses(&gpu);
    assert!(
        misses.is_empty(),
        "against the plain reference: {misses:#?}"
    );
    for (gpu_kept, cpu_kept) in gpu.values.iter().zip(&cpu.values) {
        let (what, tolerance) = (&gpu_kept.what, &gpu_kept.tolerance);
        let difference = ops::normalised_difference(&cpu_kept.values, &gpu_kept.values);
        println!("{what}: normalised error {difference:.3e} (tolerance {tolerance:.0e})");
        assert!(
            difference <= *tolerance,
            "{what}: {difference:e} over {tolerance:e}"
        );
    }
    for ((what, dtype, gpu_bytes, _), (_, _, cpu_bytes, _)) in gpu.merged.iter().zip(&cpu.merged) {
        let ulp = match dtype {
            DType::F32 => 1e-6,
            DType::F16 => 1.0 / 1024.0,
            DType::Bf16 => 1.0 / 128.0,
            DType::F8E4M3 => 1.0 / 8.0,
            DType::F8E5M2 => 1.0 / 4.0,
            DType::I8 => 1.0 / 127.0,
            DType::U4 => 0.0,
        };
        let difference =
            ops::normalised_difference(&dtype.decode(cpu_bytes), &dtype.decode(gpu_bytes));
        println!("{what}: normalised error {difference:.3e} (tolerance {ulp:.0e})");
        assert!(
            difference <= ulp,
            "{what}: {difference:e} over one rounding"
        );
    }
    assert_eq!(gpu.checksums, cpu.checksums);
}

#[test]
#[ignore = "needs a CUDA device: run with STAGEHAND_GPU_TESTS=1 and --include-ignored (scripts/gpu-check.sh does)"]
fn gpu_operations_repeat_bit_for_bit() {
    // Proves the GPU's reductions are deterministic: the scenario twice on one
    // adapter, and once on a second adapter of the same context, give the same bits.
    // This is what lets a streamed run equal the resident run on the GPU.
    let Some((_gpu, device)) = gpu_device() else {
        return;
    };
    let compute = CudaCompute::new(&device).expect("cuda compute");
    let read_back = device_read_back(&device);
    let first = ops::run_ops(&compute, &read_back).expect("first pass");
    let second = ops::run_ops(&compute, &read_back).expect("second pass");
    ops::assert_same_bits(&first, &second);
    let other = CudaCompute::new(&device).expect("a second cuda compute");
    let third = ops::run_ops(&other, &read_back).expect("third pass");
    ops::assert_same_bits(&first, &third);
}

#[test]
#[ignore = "needs a CUDA device: run with STAGEHAND_GPU_TESTS=1 and --include-ignored (scripts/gpu-check.sh does)"]
fn gpu_the_compute_shares_the_devices_memory_space_and_reuses_its_cast_buffer() {
    // Proves CudaCompute reads the session device's address space (the run refuses
    // otherwise), that the cast buffer grows once to a weight's f32 size and is then
    // reused, and that an impossible activation is an out-of-memory error.
    let Some((_gpu, device)) = gpu_device() else {
        return;
    };
    let compute = CudaCompute::new(&device).expect("cuda compute");
    assert_eq!(compute.memory_space(), device.memory_space());
    assert!(matches!(
        compute.memory_space(),
        MemorySpace::Accelerator { kind: "cuda", .. }
    ));
    let (inner, out) = (1024, 2048);
    let block = compute
        .load_block(&DType::F16.encode(&ops::seeded(out * inner, 5, 0.1)))
        .unwrap();
    let view = compute.block_view(&block);
    let weight = view
        .weight(&TensorSlot::new(0, DType::F16, out, inner))
        .unwrap();
    // A decode product (at most GEMV_ROWS rows) reads the f16 weight where it lies:
    // nothing is widened into the cast buffer.
    let before = compute.cast_buffer_bytes();
    let x = compute.tensor(4, inner).unwrap();
    let mut y = compute.tensor(4, out).unwrap();
    compute.linear(&x, &weight, None, &mut y).unwrap();
    assert_eq!(compute.cast_buffer_bytes(), before, "a gemv widens nothing");
    // More rows go through cuBLAS on the weight widened to f32 in the cast buffer.
    let rows = 16;
    let x = compute.tensor(rows, inner).unwrap();
    let mut y = compute.tensor(rows, out).unwrap();
    compute.linear(&x, &weight, None, &mut y).unwrap();
    let grown = compute.cast_buffer_bytes();
    assert!(grown >= (out * inner * 4) as u64, "{grown}");
    compute.linear(&x, &weight, None, &mut y).unwrap();
    assert_eq!(
        compute.cast_buffer_bytes(),
        grown,
        "the cast buffer is reused"
    );
    for (rows, cols) in [(usize::MAX / 2, 4), (1 << 20, 1 << 20)] {
        match compute.tensor(rows, cols) {
            Err(ComputeError::OutOfMemory(message)) => {
                assert!(message.contains("lower --batch"), "{message}")
            }
            Err(other) => panic!("expected out of memory, got {other}"),
            Ok(_) => panic!("a {rows} × {cols} activation was allocated"),
        }
    }
}

#[test]
fn the_kernels_compute_their_definitions_on_a_cpu_emulator() {
    // Proves, without a GPU, that kernels.cu as written (a std::thread per CUDA
    // thread, real barriers and warp shuffles) converts f16/bf16 exactly and rounds to
    // nearest even, widens and narrows at any byte offset, computes the norms, the
    // masked softmax, the row operations and GELU against plain loops, and sums the
    // checksum as crate::compute::checksum does. Needs g++ (C++20); says so if absent.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    if std::process::Command::new("g++")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("skipped: no g++ to build the kernel emulator");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("emulate_kernels");
    let built = std::process::Command::new("g++")
        .args(["-std=c++20", "-O1", "-pthread", "-I"])
        .arg(root.join("src/device/cuda"))
        .arg(root.join("tests/cuda/emulate_kernels.cpp"))
        .arg("-o")
        .arg(&binary)
        .output()
        .expect("g++ runs");
    assert!(
        built.status.success(),
        "the emulator does not build:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let run = std::process::Command::new(&binary).output().unwrap();
    let printed = String::from_utf8_lossy(&run.stdout);
    println!("{printed}");
    assert!(run.status.success(), "kernel checks failed:\n{printed}");
    let bytes: Vec<u8> = (0..(1u32 << 16) + 7)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut checked = 0;
    for line in printed.lines().filter(|line| line.starts_with("checksum ")) {
        let fields: Vec<u64> = line[9..]
            .split(' ')
            .map(|field| field.parse().unwrap())
            .collect();
        let (offset, length) = (fields[0] as usize, fields[1] as usize);
        let expected =
            stagehand::compute::checksum::partial_sum(&bytes[offset..offset + length], 0);
        assert_eq!(fields[2], expected, "checksum sum at {offset}+{length}");
        checked += 1;
    }
    assert_eq!(checked, 6, "every checksum case was printed");
    let mut narrowed = 0;
    for line in printed.lines().filter(|line| line.starts_with("narrow ")) {
        let fields: Vec<u32> = line[7..]
            .split(' ')
            .map(|field| field.parse().unwrap())
            .collect();
        let dtype = match fields[0] {
            1 => DType::F16,
            2 => DType::Bf16,
            3 => DType::F8E4M3,
            _ => DType::F8E5M2,
        };
        let value = f32::from_bits(fields[1]);
        let mut expected = dtype.encode(&[value]);
        expected.resize(2, 0);
        let expected = u32::from(u16::from_le_bytes([expected[0], expected[1]]));
        assert_eq!(fields[2], expected, "{dtype} narrowing of {value:e}");
        narrowed += 1;
    }
    assert!(
        narrowed > 1000,
        "the narrowing sweep was printed ({narrowed})"
    );
}

#[path = "compute_port/quantized.rs"]
mod quantized;

#[test]
#[ignore = "needs a CUDA device: run with STAGEHAND_GPU_TESTS=1 and --include-ignored (scripts/gpu-check.sh does)"]
fn gpu_int8_weights_match_the_reference_and_awq_is_refused_by_name() {
    // Proves the CUDA adapter's int8_tensorwise linears (code × scale, read in their
    // stored bytes) match the plain reference, and an awq_w4a16 weight, which it does
    // not compute, is refused with an error naming the format.
    let Some((_gpu, device)) = gpu_device() else {
        return;
    };
    let compute = CudaCompute::new(&device).expect("cuda compute");
    let misses = quantized::quantized_linear_misses(&compute, false).expect("int8 on the gpu");
    assert_eq!(misses.len(), 4);
    for (what, difference, _) in &misses {
        assert!(*difference <= quantized::TOLERANCE, "{what}: {difference}");
    }
    let refused = quantized::quantized_linear_misses(&compute, true).unwrap_err();
    assert!(refused.to_string().contains("awq_w4a16"), "{refused}");
    assert!(quantized::awq_tables_outside_the_block_are_refused(&compute).expect("a view"));
}

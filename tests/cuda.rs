#![cfg(feature = "cuda")]
//! The CUDA adapter. Without a GPU: every entry point fails cleanly, with a message that
//! says what to do. With `STAGEHAND_GPU_TESTS=1` on a GPU machine: real pinned copies,
//! cast buffers, cuBLAS and the checksum kernel, checked against the CPU.

use std::sync::{Mutex, MutexGuard};

use stagehand::actors::{Device, DevicePtr};
use stagehand::device::cuda::{self, CudaDevice};

/// Serialises the GPU tests: some compare the driver's free-memory figure before and
/// after their own allocations, which a concurrent test would disturb.
static GPU: Mutex<()> = Mutex::new(());

/// The device for a GPU test (with the lock that keeps GPU tests one at a time), or
/// `None` (printed) when GPU tests are not asked for. When they are asked for, a missing
/// device fails the test: a GPU check that silently skipped would report success
/// without having run.
fn gpu_device() -> Option<(MutexGuard<'static, ()>, CudaDevice)> {
    if std::env::var("STAGEHAND_GPU_TESTS").as_deref() != Ok("1") {
        println!("skipped: STAGEHAND_GPU_TESTS not set");
        return None;
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

/// Uploads `bytes` into a fresh arena through a pinned buffer.
fn upload(device: &CudaDevice, bytes: &[u8]) -> stagehand::actors::DeviceArena {
    let arena = device.allocate_arena(bytes.len() as u64).expect("arena");
    let mut pinned = device.allocate_pinned(bytes.len() as u64).expect("pinned");
    pinned.as_mut_slice().unwrap().copy_from_slice(bytes);
    block_on(device.copy_to_device(pinned, 0, bytes.len() as u64, arena.base)).expect("upload");
    arena
}

/// Deterministic values uniform in ±bound (a 64-bit LCG; no dependency needed).
fn uniform_values(count: usize, bound: f32, seed: u64) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let unit = (state >> 40) as f32 / (1u64 << 24) as f32;
            (unit * 2.0 - 1.0) * bound
        })
        .collect()
}

#[test]
fn gpu_cublas_forward_matches_the_cpu_reference() {
    // Proves the cuBLAS linear stack (sgemm for f32, GemmEx for f16/bf16) computes the
    // same y = x·Wᵀ as the CPU reference within the stated tolerance, on non-square
    // layers so a transposed operand would show.
    let Some((_gpu, device)) = gpu_device() else {
        return;
    };
    let blas = cuda::CublasLinear::new(&device).expect("cuBLAS");
    let widths = [384usize, 256, 512, 128, 320];
    let batch = 8;
    for dtype in [cuda::DType::F32, cuda::DType::F16, cuda::DType::Bf16] {
        let mut host_weights = Vec::new();
        let mut arenas = Vec::new();
        let mut layers = Vec::new();
        for (index, pair) in widths.windows(2).enumerate() {
            let shape = cuda::LayerShape {
                in_features: pair[0],
                out_features: pair[1],
            };
            let bound = 1.0 / (pair[0] as f32).sqrt();
            let weight: Vec<f32> = uniform_values(pair[0] * pair[1], bound, index as u64)
                .into_iter()
                .map(|value| dtype.round(value))
                .collect();
            let arena = upload(&device, &dtype.encode(&weight));
            layers.push(cuda::DeviceLayer {
                weight: arena.base,
                shape,
            });
            host_weights.push((weight, shape));
            arenas.push(arena);
        }
        let input: Vec<f32> = uniform_values(batch * widths[0], 1.0, 99)
            .into_iter()
            .map(|value| dtype.round(value))
            .collect();
        let widest = widths.iter().max().copied().unwrap() * batch * dtype.size_bytes();
        let mut input_bytes = dtype.encode(&input);
        input_bytes.resize(widest, 0);
        let ping = upload(&device, &input_bytes);
        let pong = device.allocate_arena(widest as u64).unwrap();
        let output = blas
            .forward(dtype, &layers, batch, [ping.base, pong.base])
            .unwrap();
        block_on(device.compute_done()).expect("compute done");
        let output_len = batch * widths[widths.len() - 1];
        let mut output_bytes = vec![0u8; output_len * dtype.size_bytes()];
        device.copy_to_host(output, &mut output_bytes).unwrap();
        let gpu = dtype.decode(&output_bytes);

        let weights: Vec<(&[f32], cuda::LayerShape)> = host_weights
            .iter()
            .map(|(weight, shape)| (weight.as_slice(), *shape))
            .collect();
        let cpu = cuda::reference_forward(&weights, dtype, batch, &input).unwrap();
        let error = cuda::normalised_error(&cpu, &gpu);
        println!(
            "{dtype:?}: normalised error {error:.3e} (tolerance {:.0e})",
            cuda::tolerance(dtype)
        );
        assert!(
            cpu.iter().any(|value| value.abs() > 1e-3),
            "degenerate reference"
        );
        assert!(
            error <= cuda::tolerance(dtype),
            "{dtype:?}: error {error} over tolerance"
        );
        for arena in arenas.into_iter().chain([ping, pong]) {
            device.free_arena(arena);
        }
    }
}

#[test]
fn gpu_checksum_kernel_matches_the_cpu() {
    // Proves the NVRTC checksum of device bytes equals the CPU checksum for aligned and
    // unaligned ranges and ragged lengths, and changes when one byte on the device does.
    let Some((_gpu, device)) = gpu_device() else {
        return;
    };
    let kernel = cuda::ChecksumKernel::new(&device).expect("NVRTC kernel");
    let bytes: Vec<u8> = (0..(3u32 << 20) + 3)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let arena = upload(&device, &bytes);
    for (offset, len) in [
        (0usize, bytes.len()),
        (1, 4097),
        (2, 6),
        (4, 1 << 20),
        (3, 0),
        (7, 1),
    ] {
        let gpu = kernel
            .checksum(arena.base.offset(offset as u64), len as u64)
            .unwrap();
        let cpu = cuda::checksum_cpu(&bytes[offset..offset + len]);
        assert_eq!(gpu, cpu, "offset {offset} length {len}");
    }
    let before = kernel.checksum(arena.base, bytes.len() as u64).unwrap();
    let mut flipped = device.allocate_pinned(1).unwrap();
    flipped.as_mut_slice().unwrap()[0] = bytes[123_457] ^ 1;
    let _ = block_on(device.copy_to_device(flipped, 0, 1, arena.base.offset(123_457))).unwrap();
    let after = kernel.checksum(arena.base, bytes.len() as u64).unwrap();
    assert_ne!(before, after, "a changed byte on the device went unnoticed");
    device.free_arena(arena);
}

#[test]
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

//! The CUDA adapter. Without a GPU: every entry point fails cleanly, with a message that
//! says what to do. With `STAGEHAND_GPU_TESTS=1` on a GPU machine: real pinned copies,
//! cast buffers, cuBLAS and the checksum kernel, checked against the CPU.

use stagehand::actors::{Device, DevicePtr};
use stagehand::device::cuda::{self, CudaDevice};

/// The device for a GPU test, or `None` (printed) when GPU tests are not asked for.
/// When they are asked for, a missing device fails the test: a GPU check that silently
/// skipped would report success without having run.
fn gpu_device() -> Option<CudaDevice> {
    if std::env::var("STAGEHAND_GPU_TESTS").as_deref() != Ok("1") {
        println!("skipped: STAGEHAND_GPU_TESTS not set");
        return None;
    }
    match CudaDevice::open(0) {
        Ok(device) => Some(device),
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
    // Proves an out-of-range ordinal is refused with the number of devices present.
    let Ok(count) = cuda::device_count() else {
        println!("skipped: no CUDA driver");
        return;
    };
    let error = CudaDevice::open(count + 7).err().expect("no such device");
    let message = error.to_string();
    assert!(message.contains("no CUDA device"), "{message}");
    if count > 0 {
        assert!(
            message.contains(&format!("device {}", count + 7)),
            "{message}"
        );
    }
}

#[test]
fn gpu_pinned_copies_round_trip() {
    // Proves bytes copied from a registered buffer on the copy stream arrive intact,
    // that the buffer comes back still registered, and that bad copies are refused
    // with the buffer handed back.
    let Some(device) = gpu_device() else { return };
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
    let Some(device) = gpu_device() else { return };
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

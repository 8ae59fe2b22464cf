//! The storage adapters against plain `std` reads: same bytes whatever the alignment,
//! clean errors for changed files and injected faults, and no thread left behind.

use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use stagehand::actors::{Extent, FileId, HostBuffer, Storage, StorageError};
use stagehand::storage::{
    cached_bytes, drop_page_cache, open_storage, stream_block, DirectStorage, PreadStorage,
    StagingRing, StorageFile, StorageOptions, StreamError,
};

/// Deterministic, position-dependent bytes so a misplaced range cannot compare equal.
fn pattern(seed: u64, bytes: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// A directory on the build disk (not tmpfs), so O_DIRECT really goes direct.
fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

fn write_file(dir: &Path, name: &str, contents: &[u8]) -> StorageFile {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write test file");
    StorageFile {
        path,
        expected_bytes: contents.len() as u64,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn small_requests() -> StorageOptions {
    StorageOptions {
        reader_threads: 3,
        read_request_bytes: 8192,
        ..StorageOptions::default()
    }
}

/// What the extents should read, by slicing the files' contents directly.
fn expected_bytes(contents: &[Vec<u8>], extents: &[Extent]) -> Vec<u8> {
    extents
        .iter()
        .flat_map(|extent| {
            let file = &contents[extent.file.0 as usize];
            file[extent.offset as usize..(extent.offset + extent.length) as usize].to_vec()
        })
        .collect()
}

fn read_all(
    runtime: &tokio::runtime::Runtime,
    storage: &dyn Storage,
    extents: &[Extent],
    into_offset: u64,
) -> Result<Vec<u8>, StorageError> {
    let total: u64 = extents.iter().map(|extent| extent.length).sum();
    let buffer = HostBuffer::allocate((into_offset + total).max(1) as usize).expect("buffer");
    match runtime.block_on(storage.read(extents.to_vec(), buffer, into_offset)) {
        Ok(buffer) => {
            let bytes = buffer.as_slice().expect("real buffer");
            Ok(bytes[into_offset as usize..(into_offset + total) as usize].to_vec())
        }
        Err((error, _buffer)) => Err(error),
    }
}

fn extent(file: u32, offset: u64, length: u64) -> Extent {
    Extent {
        file: FileId(file),
        offset,
        length,
    }
}

/// Extents at odd offsets and sizes, across two files, some adjacent, some far apart.
fn unaligned_extents() -> Vec<Extent> {
    vec![
        extent(0, 8 + 123, 4096 * 5 + 17),
        extent(0, 8 + 123 + 4096 * 5 + 17, 3),
        extent(1, 4096, 4096 * 3),
        extent(0, 70_001, 1),
        extent(1, 99_999, 100_001),
        extent(0, 0, 8),
    ]
}

fn two_files(dir: &Path) -> (Vec<StorageFile>, Vec<Vec<u8>>) {
    let contents = vec![pattern(1, 300_007), pattern(2, 200_000)];
    let files = vec![
        write_file(dir, "a.safetensors", &contents[0]),
        write_file(dir, "b.safetensors", &contents[1]),
    ];
    (files, contents)
}

fn live_threads_named(prefix: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| task.ok())
        .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
        .filter(|name| name.trim_end().starts_with(prefix))
        .count()
}

#[test]
fn pread_reads_extents_back_to_back_at_the_offset() {
    // Proves: buffered reads land every extent, in order, from `into_offset` on.
    let dir = disk_dir();
    let (files, contents) = two_files(dir.path());
    let storage = PreadStorage::open(&files, &small_requests()).expect("open");
    let runtime = runtime();
    let extents = unaligned_extents();
    let read = read_all(&runtime, &storage, &extents, 777).expect("read");
    assert_eq!(read, expected_bytes(&contents, &extents));
}

#[test]
fn o_direct_bytes_equal_pread_bytes_at_unaligned_offsets() {
    // Proves: O_DIRECT (bounce buffer for unaligned ranges) returns exactly the pread bytes.
    let dir = disk_dir();
    let (files, contents) = two_files(dir.path());
    let direct = DirectStorage::open(&files, &small_requests()).expect("open direct");
    assert!(direct.is_direct(), "the build disk should accept O_DIRECT");
    assert_eq!(direct.name(), "o_direct");
    let buffered = PreadStorage::open(&files, &small_requests()).expect("open pread");
    let runtime = runtime();
    let extents = unaligned_extents();
    for into_offset in [0, 1, 4096, 5000] {
        let direct_bytes = read_all(&runtime, &direct, &extents, into_offset).expect("direct");
        let buffered_bytes = read_all(&runtime, &buffered, &extents, into_offset).expect("pread");
        assert_eq!(direct_bytes, buffered_bytes, "into_offset {into_offset}");
        assert_eq!(direct_bytes, expected_bytes(&contents, &extents));
    }
    // An aligned whole-file read takes the straight-into-the-buffer path.
    let whole = [extent(1, 0, 200_000)];
    assert_eq!(
        read_all(&runtime, &direct, &whole, 0).expect("aligned"),
        contents[1]
    );
}

#[test]
fn tmpfs_file_reads_correctly_direct_or_through_the_fallback() {
    // Proves: a /dev/shm file opens with fast-disk and reads the right bytes (tmpfs refuses
    // O_DIRECT before Linux 6.6: then the adapter falls back instead of failing).
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipped: no /dev/shm on this machine");
        return;
    }
    let dir = tempfile::tempdir_in(shm).expect("tmpfs dir");
    let (files, contents) = two_files(dir.path());
    let storage = open_storage(&files, &small_requests(), true).expect("open on tmpfs");
    assert!(storage.name().starts_with("o_direct"), "{}", storage.name());
    let runtime = runtime();
    let extents = unaligned_extents();
    let read = read_all(&runtime, storage.as_ref(), &extents, 3).expect("read on tmpfs");
    assert_eq!(read, expected_bytes(&contents, &extents));
}

fn truncation_fails_the_next_read_and_threads_exit(fast_disk: bool) {
    let dir = disk_dir();
    let (files, _contents) = two_files(dir.path());
    let options = small_requests();
    let (storage, prefix): (Arc<dyn Storage>, String) = if fast_disk {
        let storage = DirectStorage::open(&files, &options).expect("open");
        let prefix = storage.thread_name_prefix().to_string();
        (Arc::new(storage), prefix)
    } else {
        let storage = PreadStorage::open(&files, &options).expect("open");
        let prefix = storage.thread_name_prefix().to_string();
        (Arc::new(storage), prefix)
    };
    // Threads name themselves once running: give them a moment (bounded) to do so.
    let mut named = 0;
    for _ in 0..200 {
        named = live_threads_named(&prefix);
        if named == options.reader_threads {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(named, options.reader_threads);
    let runtime = runtime();
    read_all(&runtime, storage.as_ref(), &[extent(0, 0, 1000)], 0).expect("read before");

    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&files[0].path)
        .expect("reopen for truncation");
    file.set_len(1000).expect("truncate");
    match read_all(&runtime, storage.as_ref(), &[extent(0, 500, 100_000)], 0) {
        Err(StorageError::FileChanged {
            expected_bytes,
            found_bytes,
            ..
        }) => {
            assert_eq!(expected_bytes, 300_007);
            assert_eq!(found_bytes, 1000);
        }
        other => panic!("expected FileChanged, got {other:?}"),
    }
    // The untouched file still reads.
    read_all(&runtime, storage.as_ref(), &[extent(1, 0, 10)], 0).expect("other file");
    drop(storage);
    assert_eq!(
        live_threads_named(&prefix),
        0,
        "reader threads left running"
    );
}

#[test]
fn truncated_file_fails_pread_with_file_changed_and_threads_exit_on_drop() {
    // Proves: a file truncated after open is FileChanged (no SIGBUS), and drop joins workers.
    truncation_fails_the_next_read_and_threads_exit(false);
}

#[test]
fn truncated_file_fails_o_direct_with_file_changed_and_threads_exit_on_drop() {
    // Proves: the same for the O_DIRECT adapter.
    truncation_fails_the_next_read_and_threads_exit(true);
}

#[test]
fn replaced_file_is_file_changed() {
    // Proves: a file replaced by rename (our descriptor still on the old inode) is detected.
    let dir = disk_dir();
    let (files, contents) = two_files(dir.path());
    let storage = PreadStorage::open(&files, &small_requests()).expect("open");
    let replacement = dir.path().join("new.safetensors");
    std::fs::write(&replacement, &contents[0]).expect("write replacement");
    std::fs::rename(&replacement, &files[0].path).expect("rename over");
    let runtime = runtime();
    let result = read_all(&runtime, &storage, &[extent(0, 0, 10)], 0);
    assert!(
        matches!(result, Err(StorageError::FileChanged { .. })),
        "{result:?}"
    );
}

#[test]
fn injected_fault_fails_reads_after_the_limit_and_returns_the_buffer() {
    // Proves: fail_after_reads lets N reads through, then fails with Injected and the buffer.
    let dir = disk_dir();
    let (files, _contents) = two_files(dir.path());
    let options = StorageOptions {
        fail_after_reads: Some(2),
        ..small_requests()
    };
    let storage = open_storage(&files, &options, false).expect("open");
    let runtime = runtime();
    for _ in 0..2 {
        read_all(&runtime, storage.as_ref(), &[extent(0, 0, 100)], 0).expect("allowed read");
    }
    let buffer = HostBuffer::allocate(100).expect("buffer");
    let failed = runtime.block_on(storage.read(vec![extent(0, 0, 100)], buffer, 0));
    match failed {
        Err((StorageError::Injected(_), buffer)) => assert_eq!(buffer.len(), 100),
        other => panic!("expected an injected fault, got {other:?}"),
    }
}

#[test]
fn bad_requests_fail_cleanly_and_hand_the_buffer_back() {
    // Proves: unknown files, ranges past the end and small buffers are errors, not panics.
    let dir = disk_dir();
    let (files, _contents) = two_files(dir.path());
    let storage = PreadStorage::open(&files, &small_requests()).expect("open");
    let runtime = runtime();
    let attempt = |extents: Vec<Extent>, buffer_bytes: usize| {
        let buffer = HostBuffer::allocate(buffer_bytes).expect("buffer");
        match runtime.block_on(storage.read(extents, buffer, 0)) {
            Ok(_) => panic!("expected an error"),
            Err((error, buffer)) => {
                assert_eq!(buffer.len(), buffer_bytes);
                error
            }
        }
    };
    assert!(matches!(
        attempt(vec![extent(7, 0, 1)], 10),
        StorageError::UnknownFile(FileId(7))
    ));
    assert!(matches!(
        attempt(vec![extent(0, 0, 100)], 10),
        StorageError::BufferTooSmall { .. }
    ));
    let past_end = attempt(vec![extent(1, 199_999, 2)], 10).to_string();
    assert!(past_end.contains("past the end"), "{past_end}");
}

#[test]
fn opening_a_missing_or_resized_file_names_it() {
    // Proves: open checks existence and the expected length up front, naming the path.
    let dir = disk_dir();
    let missing = StorageFile {
        path: dir.path().join("nope.safetensors"),
        expected_bytes: 1,
    };
    let error = PreadStorage::open(&[missing], &StorageOptions::default())
        .err()
        .expect("missing file");
    assert!(error.to_string().contains("nope.safetensors"), "{error}");

    let mut resized = write_file(dir.path(), "short.safetensors", &[1, 2, 3]);
    resized.expected_bytes = 4;
    let error = DirectStorage::open(&[resized], &StorageOptions::default())
        .err()
        .expect("wrong length");
    assert!(matches!(
        error,
        StorageError::FileChanged { found_bytes: 3, .. }
    ));
}

/// A file big enough that one read at 4 KiB requests needs more requests than the
/// worker queue holds (256), so the future queues the rest itself.
fn many_requests_file(dir: &Path) -> (StorageFile, Vec<u8>) {
    let contents = pattern(3, 3 << 20);
    (write_file(dir, "big.safetensors", &contents), contents)
}

fn tiny_requests() -> StorageOptions {
    StorageOptions {
        reader_threads: 2,
        read_request_bytes: 4096,
        ..StorageOptions::default()
    }
}

#[test]
fn reads_of_more_requests_than_the_queue_holds_return_the_right_bytes() {
    // Proves: requests that did not fit the bounded queue at `read` time are queued by the
    // future and still land in the right place, for both adapters.
    let dir = disk_dir();
    let (file, contents) = many_requests_file(dir.path());
    let runtime = runtime();
    for fast_disk in [false, true] {
        let storage =
            open_storage(std::slice::from_ref(&file), &tiny_requests(), fast_disk).expect("open");
        let extents = [extent(0, 5, (3 << 20) - 10)];
        let read = read_all(&runtime, storage.as_ref(), &extents, 1).expect("read");
        assert_eq!(read, &contents[5..(3 << 20) - 5], "fast_disk {fast_disk}");
    }
}

#[test]
fn dropping_the_storage_under_a_pending_read_completes_it_without_hanging() {
    // Proves: a read whose requests did not all fit the queue still resolves (with its
    // buffer) when the storage is dropped before it is polled.
    let dir = disk_dir();
    let (file, _contents) = many_requests_file(dir.path());
    let storage = PreadStorage::open(std::slice::from_ref(&file), &tiny_requests()).expect("open");
    let buffer = HostBuffer::allocate(3 << 20).expect("buffer");
    let pending = storage.read(vec![extent(0, 0, 3 << 20)], buffer, 0);
    drop(storage);
    let runtime = runtime();
    let outcome = runtime.block_on(async {
        tokio::time::timeout(std::time::Duration::from_secs(10), pending).await
    });
    match outcome.expect("read hung after the storage was dropped") {
        Ok(_) => panic!("a read cut short by closing the storage must not report success"),
        Err((_, buffer)) => assert_eq!(buffer.len(), 3 << 20),
    }
}

/// Writes the file and flushes it, so its cached pages are clean and can be dropped.
fn write_clean_file(dir: &Path, name: &str, contents: &[u8]) -> StorageFile {
    let file = write_file(dir, name, contents);
    std::fs::File::open(&file.path)
        .and_then(|handle| handle.sync_all())
        .expect("flush test file");
    file
}

#[test]
fn drop_page_cache_empties_the_cache_of_a_clean_file() {
    // Proves: drop_page_cache (fadvise DONTNEED) really evicts a file's clean pages.
    let dir = disk_dir();
    let contents = pattern(4, 1 << 20);
    let file = write_clean_file(dir.path(), "cached.bin", &contents);
    assert_eq!(std::fs::read(&file.path).expect("warm the cache"), contents);
    assert_eq!(cached_bytes(&file.path).expect("mincore"), 1 << 20);
    drop_page_cache(&file.path, 0, 0).expect("fadvise");
    assert_eq!(cached_bytes(&file.path).expect("mincore"), 0);
}

#[test]
fn drop_page_cache_option_leaves_read_ranges_uncached() {
    // Proves: with drop_page_cache set, a buffered read does not leave the file cached.
    let dir = disk_dir();
    let contents = pattern(5, 1 << 20);
    let file = write_clean_file(dir.path(), "dropped.bin", &contents);
    drop_page_cache(&file.path, 0, 0).expect("start cold");
    let options = StorageOptions {
        drop_page_cache: true,
        ..small_requests()
    };
    let storage = PreadStorage::open(std::slice::from_ref(&file), &options).expect("open");
    let runtime = runtime();
    let read = read_all(&runtime, &storage, &[extent(0, 0, 1 << 20)], 0).expect("read");
    assert_eq!(read, contents);
    assert_eq!(cached_bytes(&file.path).expect("mincore"), 0);
}

#[derive(Debug, thiserror::Error)]
#[error("copy engine on fire")]
struct CopyFailed;

fn ring(slots: usize, slot_bytes: usize) -> StagingRing {
    let buffers = (0..slots)
        .map(|_| HostBuffer::allocate(slot_bytes).expect("slot"))
        .collect();
    StagingRing::new(buffers).expect("ring")
}

#[test]
fn stream_block_hands_over_the_block_in_order_slot_by_slot() {
    // Proves: the ring delivers every byte of a block, in order, in slot-sized chunks,
    // and all slots are home afterwards — for both adapters.
    let dir = disk_dir();
    let (files, contents) = two_files(dir.path());
    let extents = unaligned_extents();
    let expected = expected_bytes(&contents, &extents);
    let runtime = runtime();
    for fast_disk in [false, true] {
        let storage = open_storage(&files, &small_requests(), fast_disk).expect("open");
        let mut staging = ring(3, 16_384);
        let mut streamed = Vec::new();
        let mut offsets = Vec::new();
        let result = runtime.block_on(stream_block(
            storage.as_ref(),
            extents.clone(),
            &mut staging,
            |slot: HostBuffer, offset: u64, bytes: u64| {
                offsets.push(offset);
                streamed.extend_from_slice(&slot.as_slice().expect("real")[..bytes as usize]);
                async move { Ok::<_, (CopyFailed, HostBuffer)>(slot) }
            },
        ));
        result.expect("stream");
        assert_eq!(streamed, expected, "fast_disk {fast_disk}");
        let chunk_count = expected.len().div_ceil(16_384);
        assert_eq!(
            offsets,
            (0..chunk_count as u64)
                .map(|i| i * 16_384)
                .collect::<Vec<_>>()
        );
        assert_eq!(staging.into_buffers().len(), 3);
    }
}

#[test]
fn stream_block_failures_name_their_side_and_bring_every_slot_home() {
    // Proves: a failed copy and a file truncated mid-stream both end the stream with the
    // right error and all K slots back in the ring.
    let dir = disk_dir();
    let (files, _contents) = two_files(dir.path());
    let storage = open_storage(&files, &small_requests(), true).expect("open");
    let runtime = runtime();

    let mut staging = ring(3, 8192);
    let mut copies = 0;
    let copy_fails = runtime.block_on(stream_block(
        storage.as_ref(),
        vec![extent(0, 0, 200_000)],
        &mut staging,
        |slot: HostBuffer, _offset: u64, _bytes: u64| {
            copies += 1;
            let fail = copies == 2;
            async move {
                if fail {
                    Err((CopyFailed, slot))
                } else {
                    Ok(slot)
                }
            }
        },
    ));
    assert!(matches!(copy_fails, Err(StreamError::Copy(CopyFailed))));
    assert_eq!(copies, 2);
    assert_eq!(staging.into_buffers().len(), 3);

    let mut staging = ring(3, 8192);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&files[0].path)
        .expect("reopen");
    let mut chunks_seen = 0;
    let read_fails = runtime.block_on(stream_block(
        storage.as_ref(),
        vec![extent(0, 0, 300_007)],
        &mut staging,
        |slot: HostBuffer, _offset: u64, _bytes: u64| {
            chunks_seen += 1;
            if chunks_seen == 1 {
                file.set_len(50_000).expect("truncate mid-stream");
            }
            async move { Ok::<_, (CopyFailed, HostBuffer)>(slot) }
        },
    ));
    assert!(
        matches!(
            read_fails,
            Err(StreamError::Read(StorageError::FileChanged { .. }))
        ),
        "{read_fails:?}"
    );
    assert_eq!(staging.into_buffers().len(), 3);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn random_extent_lists_read_like_std(
        ranges in prop::collection::vec((0u32..2, 0u64..200_000, 0u64..40_000), 0..12),
        into_offset in 0u64..5000,
    ) {
        // Proves: for any extent list, both adapters return exactly what std::fs reads.
        let dir = disk_dir();
        let (files, _contents) = two_files(dir.path());
        let extents: Vec<Extent> = ranges
            .iter()
            .map(|&(file, offset, length)| {
                let file_bytes = files[file as usize].expected_bytes;
                let offset = offset.min(file_bytes);
                extent(file, offset, length.min(file_bytes - offset))
            })
            .collect();
        let std_bytes: Vec<u8> = extents
            .iter()
            .flat_map(|extent| {
                let all = std::fs::read(&files[extent.file.0 as usize].path).expect("std read");
                all[extent.offset as usize..(extent.offset + extent.length) as usize].to_vec()
            })
            .collect();
        let runtime = runtime();
        let direct = DirectStorage::open(&files, &small_requests()).expect("open direct");
        let buffered = PreadStorage::open(&files, &small_requests()).expect("open pread");
        prop_assert_eq!(&read_all(&runtime, &direct, &extents, into_offset).expect("direct"), &std_bytes);
        prop_assert_eq!(&read_all(&runtime, &buffered, &extents, into_offset).expect("pread"), &std_bytes);
    }
}

//! The storage adapters when things go wrong: files changed under them, injected
//! faults, missing files and a storage dropped mid-read give clean errors with the
//! buffer handed back, and no reader thread is left behind.

mod common;

use std::sync::Arc;

use common::storage::{
    disk_dir, extent, many_requests_file, read_all, runtime, small_requests, tiny_requests,
    two_files, write_file,
};
use common::threads::{settled_threads, threads_named};
use stagehand::actors::{Extent, FileId, HostBuffer, Storage, StorageError};
use stagehand::storage::{open_storage, DirectStorage, PreadStorage, StorageFile, StorageOptions};

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
        named = threads_named(|name| name.starts_with(&prefix)).len();
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
        settled_threads(|name| name.starts_with(&prefix), 0),
        Vec::<String>::new(),
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

#[test]
fn dropping_the_storage_under_a_pending_read_completes_it_without_hanging() {
    // Proves: a read whose requests did not all fit the queue still resolves (with its
    // buffer) when the storage is dropped before it is polled — as a failure, never a
    // success: `read` queues at most a queue's worth (256 of these 768), the rest wait
    // for the future, which finds the storage gone.
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

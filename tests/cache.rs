//! The model cache: a corrupt cached model is rebuilt (never used and reported as
//! verified), temporary files of dead processes are cleaned and those of live ones
//! kept, and concurrent fills of one entry write it once, so no run sees its model
//! replaced under it.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Barrier};

use stagehand::model::cache::ensure_demo_model;
use stagehand::model::demo::{DemoSpec, LINEAR_STACK_FILE};
use stagehand::model::{verify_data_checksum, ChecksumError, FileStamp, ModelIndex};

const SPEC: DemoSpec = DemoSpec {
    blocks: 4,
    layers_per_block: 2,
    dim: 64,
    seed: 9,
};

fn stamp(path: &Path) -> FileStamp {
    FileStamp::of(&std::fs::metadata(path).expect("stat"))
}

/// Overwrites the whole data section with zeros, keeping the header (so the file
/// still indexes as the wanted model).
fn zero_the_weights(path: &Path) {
    let index = ModelIndex::open(path, None).expect("indexes");
    let shard = &index.files[0];
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("writable");
    let zeros = vec![0u8; (shard.bytes - shard.header_bytes) as usize];
    file.write_all_at(&zeros, shard.header_bytes)
        .expect("zeroed");
}

#[test]
fn a_corrupt_cached_model_is_rebuilt_not_trusted() {
    // Proves a cached model whose weights were zeroed behind a valid header fails its
    // checksum on next use and is written again with the right bytes, even when its
    // modification time is set back (the change time still moves).
    let cache = tempfile::tempdir().expect("temp dir");
    let path = ensure_demo_model(cache.path(), &SPEC).expect("first fill");
    let original = std::fs::read(&path).expect("readable");
    let index = ModelIndex::open(&path, None).expect("indexes");
    verify_data_checksum(&index).expect("a fresh model passes its check");

    let modified = std::fs::metadata(&path)
        .expect("stat")
        .modified()
        .expect("mtime");
    zero_the_weights(&path);
    let corrupt = ModelIndex::open(&path, None).expect("still indexes");
    assert!(matches!(
        verify_data_checksum(&corrupt),
        Err(ChecksumError::Mismatch { .. })
    ));
    // Hide the write from a modification-time check.
    std::fs::File::options()
        .write(true)
        .open(&path)
        .expect("open")
        .set_modified(modified)
        .expect("set mtime");

    let again = ensure_demo_model(cache.path(), &SPEC).expect("second fill");
    assert_eq!(again, path);
    assert_eq!(std::fs::read(&path).expect("readable"), original, "rebuilt");
}

#[test]
fn a_checked_model_is_reused_as_is() {
    // Proves a model that passed its check is neither rewritten nor replaced by the
    // next use (same inode, same times).
    let cache = tempfile::tempdir().expect("temp dir");
    let path = ensure_demo_model(cache.path(), &SPEC).expect("first fill");
    let before = stamp(&path);
    ensure_demo_model(cache.path(), &SPEC).expect("reuse");
    assert_eq!(stamp(&path), before);
}

#[test]
fn temporary_files_of_dead_processes_are_removed_and_live_ones_kept() {
    // Proves the cache removes `.<name>.<pid>.tmp` only when no process has that pid
    // (one above pid_max can never exist) and keeps a live process's (pid 1, init).
    let cache = tempfile::tempdir().expect("temp dir");
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("pid_max")
        .trim()
        .parse()
        .expect("a number");
    let dead = cache
        .path()
        .join(format!(".{LINEAR_STACK_FILE}.{}.tmp", pid_max + 1));
    let live = cache.path().join(format!(".{LINEAR_STACK_FILE}.1.tmp"));
    std::fs::write(&dead, vec![7u8; 4096]).expect("dead leftover");
    std::fs::write(&live, b"in progress").expect("live temp");
    ensure_demo_model(cache.path(), &SPEC).expect("fill");
    assert!(!dead.exists(), "a dead process's leftover is removed");
    assert!(live.exists(), "a live process's file is kept");
}

#[test]
fn concurrent_fills_of_one_entry_write_it_once() {
    // Proves eight fills started together on an empty cache all get the model, and
    // none replaces it after another got it: every caller sees the same file, still
    // in place once all are done (the "file changed while running" race).
    let cache = tempfile::tempdir().expect("temp dir");
    let fillers = 8;
    let barrier = Arc::new(Barrier::new(fillers));
    let handles: Vec<_> = (0..fillers)
        .map(|_| {
            let barrier = barrier.clone();
            let dir = cache.path().to_path_buf();
            std::thread::spawn(move || {
                barrier.wait();
                let path = ensure_demo_model(&dir, &SPEC).expect("fill");
                stamp(&path)
            })
        })
        .collect();
    let stamps: Vec<FileStamp> = handles
        .into_iter()
        .map(|handle| handle.join().expect("filler"))
        .collect();
    let last = stamp(&cache.path().join(LINEAR_STACK_FILE));
    assert!(
        stamps.iter().all(|seen| *seen == last),
        "{stamps:?} vs {last:?}"
    );
    let leftovers: Vec<String> = std::fs::read_dir(cache.path())
        .expect("listable")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

//! Shared helpers of the storage adapter tests: files with position-dependent bytes on
//! the build disk, extents at odd offsets, and a read through an adapter into a buffer.

use std::path::Path;

use stagehand::actors::{Extent, FileId, HostBuffer, Storage, StorageError};
use stagehand::storage::{StorageFile, StorageOptions};

/// Deterministic, position-dependent bytes so a misplaced range cannot compare equal.
pub fn pattern(seed: u64, bytes: usize) -> Vec<u8> {
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
pub fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

pub fn write_file(dir: &Path, name: &str, contents: &[u8]) -> StorageFile {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write test file");
    StorageFile {
        path,
        expected_bytes: contents.len() as u64,
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

pub fn small_requests() -> StorageOptions {
    StorageOptions {
        reader_threads: 3,
        read_request_bytes: 8192,
        ..StorageOptions::default()
    }
}

/// What the extents should read, by slicing the files' contents directly.
pub fn expected_bytes(contents: &[Vec<u8>], extents: &[Extent]) -> Vec<u8> {
    extents
        .iter()
        .flat_map(|extent| {
            let file = &contents[extent.file.0 as usize];
            file[extent.offset as usize..(extent.offset + extent.length) as usize].to_vec()
        })
        .collect()
}

pub fn read_all(
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

pub fn extent(file: u32, offset: u64, length: u64) -> Extent {
    Extent {
        file: FileId(file),
        offset,
        length,
    }
}

/// Extents at odd offsets and sizes, across two files, some adjacent, some far apart.
pub fn unaligned_extents() -> Vec<Extent> {
    vec![
        extent(0, 8 + 123, 4096 * 5 + 17),
        extent(0, 8 + 123 + 4096 * 5 + 17, 3),
        extent(1, 4096, 4096 * 3),
        extent(0, 70_001, 1),
        extent(1, 99_999, 100_001),
        extent(0, 0, 8),
    ]
}

pub fn two_files(dir: &Path) -> (Vec<StorageFile>, Vec<Vec<u8>>) {
    let contents = vec![pattern(1, 300_007), pattern(2, 200_000)];
    let files = vec![
        write_file(dir, "a.safetensors", &contents[0]),
        write_file(dir, "b.safetensors", &contents[1]),
    ];
    (files, contents)
}

/// A file big enough that one read at 4 KiB requests needs more requests than the
/// worker queue holds (256), so the future queues the rest itself.
pub fn many_requests_file(dir: &Path) -> (StorageFile, Vec<u8>) {
    let contents = pattern(3, 3 << 20);
    (write_file(dir, "big.safetensors", &contents), contents)
}

pub fn tiny_requests() -> StorageOptions {
    StorageOptions {
        reader_threads: 2,
        read_request_bytes: 4096,
        ..StorageOptions::default()
    }
}

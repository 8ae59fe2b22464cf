//! The storage adapters against plain `std` reads: the same bytes whatever the
//! alignment, whatever the queue holds, for any extent list; and what a read leaves in
//! the page cache.

mod common;

use std::path::Path;

use common::storage::{
    disk_dir, expected_bytes, extent, many_requests_file, pattern, read_all, runtime,
    small_requests, tiny_requests, two_files, unaligned_extents, write_file,
};
use proptest::prelude::*;
use stagehand::actors::{Extent, Storage};
use stagehand::storage::{
    cached_bytes, drop_page_cache, open_storage, DirectStorage, PreadStorage, StorageFile,
    StorageOptions,
};

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

proptest! {
    #![proptest_config(common::replay::replayable(32, 0x5707_a6e5))]

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

#[test]
fn a_one_off_read_leaves_the_page_cache_as_it_found_it() {
    // Proves `BlockReader::read_once` (references, checksums) drops the pages it brought
    // in and keeps those it found cached: a reference that dropped every page it read
    // sent a run's next reads of its streamed blocks, and the bound's read rate, to disk.
    let dir = disk_dir();
    let (path, data) = two_block_model(dir.path());
    let block_bytes = data[0].len();
    let index = stagehand::model::ModelIndex::open(&path, None).expect("indexed");
    let reader = stagehand::model::BlockReader::open(&index).expect("opened");
    let [cold, warm] = [&index.blocks[0], &index.blocks[1]];
    let cached_before = warm_only(&path, &reader, warm, block_bytes);
    let mut bytes = vec![0u8; block_bytes];
    for (block, expected) in [cold, warm].into_iter().zip(&data) {
        reader.read_once(&block.extents, &mut bytes).expect("read");
        assert_eq!(&bytes, expected, "{}", block.name);
    }
    assert_eq!(
        cached_bytes(&path).expect("mincore"),
        cached_before,
        "the cold block's pages dropped again, the warm block's kept"
    );
}

#[test]
fn a_cached_block_is_shared_from_the_files_pages_and_an_uncached_one_is_not() {
    // Proves `BlockReader::cached` hands the reference a block's bytes straight from the
    // file's cached pages (the same bytes, nothing read), and nothing for a block the
    // page cache does not hold — that one is read, and its pages dropped again.
    let dir = disk_dir();
    let (path, data) = two_block_model(dir.path());
    let index = stagehand::model::ModelIndex::open(&path, None).expect("indexed");
    let reader = stagehand::model::BlockReader::open(&index).expect("opened");
    let [cold, warm] = [&index.blocks[0], &index.blocks[1]];
    let cached_before = warm_only(&path, &reader, warm, data[1].len());
    let shared = reader
        .cached(&warm.extents)
        .expect("the warm block is cached");
    assert_eq!(shared.as_slice(), &data[1][..]);
    assert!(
        reader.cached(&cold.extents).is_none(),
        "the cold block is not"
    );
    let both = [warm.extents[0], cold.extents[0]];
    assert!(
        reader.cached(&both).is_none(),
        "two ranges are read, not shared"
    );
    assert_eq!(cached_bytes(&path).expect("mincore"), cached_before);
}

/// A safetensors file of two 1 MiB tensors in two blocks, flushed; its path and bytes.
fn two_block_model(dir: &Path) -> (std::path::PathBuf, Vec<Vec<u8>>) {
    let path = dir.join("model.safetensors");
    let block_bytes = 1usize << 20;
    let data: Vec<Vec<u8>> = (0..2).map(|seed| pattern(seed, block_bytes)).collect();
    let views: Vec<_> = ["layers.0.w", "layers.1.w"]
        .iter()
        .zip(&data)
        .map(|(name, bytes)| {
            let view = safetensors::tensor::TensorView::new(
                safetensors::Dtype::U8,
                vec![bytes.len()],
                bytes,
            );
            (*name, view.expect("tensor"))
        })
        .collect();
    safetensors::serialize_to_file(views, None, &path).expect("written");
    std::fs::File::open(&path)
        .and_then(|file| file.sync_all())
        .expect("flushed");
    (path, data)
}

/// Leaves `warm`'s pages in the page cache and none other of `path`'s; the bytes cached.
fn warm_only(
    path: &Path,
    reader: &stagehand::model::BlockReader<'_>,
    warm: &stagehand::model::BlockInfo,
    block_bytes: usize,
) -> u64 {
    drop_page_cache(path, 0, 0).expect("fadvise");
    let mut bytes = vec![0u8; block_bytes];
    reader
        .read_extents(&warm.extents, &mut bytes)
        .expect("warmed");
    let cached = cached_bytes(path).expect("mincore");
    assert!(
        cached >= block_bytes as u64 && cached < 2 * block_bytes as u64,
        "this test needs a filesystem with a page cache (target/ on tmpfs?): \
         {cached} bytes cached after warming one block of {block_bytes}"
    );
    cached
}

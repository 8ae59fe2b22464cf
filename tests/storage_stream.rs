//! `stream_block` through the staging ring: a block handed over in order, slot by slot,
//! and every slot home again after a failed copy or a file truncated mid-stream.

mod common;

use common::storage::{
    disk_dir, expected_bytes, extent, runtime, small_requests, two_files, unaligned_extents,
};
use stagehand::actors::{HostBuffer, StorageError};
use stagehand::storage::{open_storage, stream_block, StagingRing, StreamError};

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

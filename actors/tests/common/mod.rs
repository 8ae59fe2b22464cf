//! In-memory doubles of the device and storage ports, and a small model over them,
//! shared by the actor integration tests.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use stagehand_actors::{
    BlockLayout, Device, DeviceArena, DeviceError, DevicePtr, Extent, FileId, HostBuffer,
    MemoryInfo, ModelLayout, OpFuture, ResidencyPolicy, SessionConfig, Storage, StorageError,
};

/// VRAM is a Vec; copies are memcpy on the actor thread.
pub struct MemDevice {
    memory: Mutex<Vec<u8>>,
    pub pinned_bytes: AtomicU64,
}

impl MemDevice {
    pub fn new(bytes: usize) -> Self {
        Self {
            memory: Mutex::new(vec![0; bytes]),
            pinned_bytes: AtomicU64::new(0),
        }
    }

    pub fn read(&self, ptr: DevicePtr, bytes: u64) -> Vec<u8> {
        let memory = self.memory.lock().unwrap();
        memory[ptr.0 as usize..(ptr.0 + bytes) as usize].to_vec()
    }
}

impl Device for MemDevice {
    fn name(&self) -> String {
        "mem".into()
    }
    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        let total = self.memory.lock().unwrap().len() as u64;
        Ok(MemoryInfo {
            total_bytes: total,
            free_bytes: total,
        })
    }
    fn allocate_arena(&self, bytes: u64) -> Result<DeviceArena, DeviceError> {
        let total = self.memory.lock().unwrap().len() as u64;
        if bytes > total {
            return Err(DeviceError::OutOfMemory {
                requested_bytes: bytes,
                available_bytes: total,
            });
        }
        Ok(DeviceArena {
            base: DevicePtr(0),
            bytes,
        })
    }
    fn free_arena(&self, _arena: DeviceArena) {}
    fn allocate_pinned(&self, bytes: u64) -> Result<HostBuffer, DeviceError> {
        self.pinned_bytes.fetch_add(bytes, Ordering::Relaxed);
        HostBuffer::allocate(bytes as usize).map_err(|error| DeviceError::PinFailed {
            bytes,
            reason: error.to_string(),
        })
    }
    fn copy_to_device(
        &self,
        source: HostBuffer,
        source_offset: u64,
        bytes: u64,
        destination: DevicePtr,
    ) -> OpFuture<HostBuffer, (DeviceError, HostBuffer)> {
        {
            let mut memory = self.memory.lock().unwrap();
            let from = &source.as_slice().unwrap()
                [source_offset as usize..(source_offset + bytes) as usize];
            memory[destination.0 as usize..(destination.0 + bytes) as usize].copy_from_slice(from);
        }
        Box::pin(async move { Ok(source) })
    }
}

/// The "file" is a Vec; a read can be made to fail after N reads.
pub struct MemStorage {
    pub file: Vec<u8>,
    pub reads: AtomicU64,
    pub fail_after: Option<u64>,
}

impl Storage for MemStorage {
    fn name(&self) -> String {
        "mem".into()
    }
    fn read(
        &self,
        extents: Vec<Extent>,
        mut into: HostBuffer,
        into_offset: u64,
    ) -> OpFuture<HostBuffer, (StorageError, HostBuffer)> {
        let count = self.reads.fetch_add(1, Ordering::Relaxed);
        if self.fail_after.is_some_and(|limit| count >= limit) {
            return Box::pin(async move {
                Err((
                    StorageError::Injected("read failed on purpose".into()),
                    into,
                ))
            });
        }
        let mut at = into_offset as usize;
        let slice = into.as_mut_slice().unwrap();
        for extent in extents {
            let from = &self.file[extent.offset as usize..(extent.offset + extent.length) as usize];
            slice[at..at + from.len()].copy_from_slice(from);
            at += from.len();
        }
        Box::pin(async move { Ok(into) })
    }
}

pub const BLOCK: u64 = 4096;

pub fn model(blocks: u64) -> (ModelLayout, Vec<u8>) {
    let file: Vec<u8> = (0..blocks * BLOCK).map(|i| (i * 31 % 251) as u8).collect();
    let layout = ModelLayout {
        blocks: (0..blocks)
            .map(|index| {
                // Two extents per block, to check they are laid end to end.
                let half = BLOCK / 2;
                BlockLayout::new(
                    format!("blocks.{index}"),
                    vec![
                        Extent {
                            file: FileId(0),
                            offset: index * BLOCK,
                            length: half,
                        },
                        Extent {
                            file: FileId(0),
                            offset: index * BLOCK + half,
                            length: half,
                        },
                    ],
                )
            })
            .collect(),
    };
    (layout, file)
}

pub fn config(budget_blocks: u64, pin_blocks: u64, policy: ResidencyPolicy) -> SessionConfig {
    SessionConfig {
        vram_budget_bytes: budget_blocks * BLOCK,
        pin_ceiling_bytes: pin_blocks * BLOCK,
        prefetch_depth: 2,
        staging_buffers: 3,
        fast_disk_chunk_bytes: None,
        policy,
        max_reads_in_flight: 4,
        activation_reserve_bytes: 0,
    }
}

//! Failure paths of a session's start and waits: a staging ring that cannot be pinned
//! fails the start cleanly (before, every request waited forever for a buffer), and a
//! stop flag ends a compute thread's wait for a block that is not coming.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::{config, model, MemDevice, MemStorage, BLOCK};
use stagehand_actors::{
    BlockId, Device, DeviceArena, DeviceError, DevicePtr, Extent, HostBuffer, MemoryInfo,
    NoObserver, OpFuture, ResidencyPolicy, Session, SessionError, Storage, StorageError,
};

/// A device that pins nothing and counts its arenas.
struct NoPinDevice {
    inner: MemDevice,
    arenas: AtomicU64,
}

impl Device for NoPinDevice {
    fn name(&self) -> String {
        "no-pin".into()
    }
    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        self.inner.memory_info()
    }
    fn allocate_arena(&self, bytes: u64) -> Result<DeviceArena, DeviceError> {
        let arena = self.inner.allocate_arena(bytes)?;
        self.arenas.fetch_add(1, Ordering::SeqCst);
        Ok(arena)
    }
    fn free_arena(&self, arena: DeviceArena) {
        self.arenas.fetch_sub(1, Ordering::SeqCst);
        self.inner.free_arena(arena);
    }
    fn allocate_pinned(&self, bytes: u64) -> Result<HostBuffer, DeviceError> {
        Err(DeviceError::PinFailed {
            bytes,
            reason: "no pinned memory on this test device".into(),
        })
    }
    fn copy_to_device(
        &self,
        source: HostBuffer,
        source_offset: u64,
        bytes: u64,
        destination: DevicePtr,
    ) -> OpFuture<HostBuffer, (DeviceError, HostBuffer)> {
        self.inner
            .copy_to_device(source, source_offset, bytes, destination)
    }
}

#[test]
fn a_staging_ring_that_cannot_be_pinned_fails_the_start_and_frees_the_arena() {
    let (layout, file) = model(8);
    let device = Arc::new(NoPinDevice {
        inner: MemDevice::new((8 * BLOCK) as usize),
        arenas: AtomicU64::new(0),
    });
    let storage = Arc::new(MemStorage {
        file,
        reads: AtomicU64::new(0),
        fail_after: None,
    });
    let order: Vec<BlockId> = (0..8).map(BlockId).collect();
    let started = Session::start(
        config(4, 4, ResidencyPolicy::Planned),
        layout,
        order,
        device.clone(),
        storage,
        Arc::new(NoObserver),
    );
    let Err(error) = started else {
        panic!("the start must fail");
    };
    assert!(matches!(error, SessionError::PinFailed(_)), "{error}");
    assert!(error.to_string().contains("staging"), "{error}");
    assert_eq!(device.arenas.load(Ordering::SeqCst), 0, "arena freed");
}

/// Storage whose reads complete only once the test lets them.
struct GatedStorage {
    inner: MemStorage,
    open: Arc<AtomicBool>,
    waiting: Arc<Mutex<Vec<std::task::Waker>>>,
}

struct Gate {
    open: Arc<AtomicBool>,
    waiting: Arc<Mutex<Vec<std::task::Waker>>>,
}

impl std::future::Future for Gate {
    type Output = ();
    fn poll(
        self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.open.load(Ordering::SeqCst) {
            return std::task::Poll::Ready(());
        }
        self.waiting.lock().unwrap().push(context.waker().clone());
        if self.open.load(Ordering::SeqCst) {
            return std::task::Poll::Ready(());
        }
        std::task::Poll::Pending
    }
}

impl Storage for GatedStorage {
    fn name(&self) -> String {
        "gated".into()
    }
    fn read(
        &self,
        extents: Vec<Extent>,
        into: HostBuffer,
        into_offset: u64,
    ) -> OpFuture<HostBuffer, (StorageError, HostBuffer)> {
        let read = self.inner.read(extents, into, into_offset);
        let gate = Gate {
            open: self.open.clone(),
            waiting: self.waiting.clone(),
        };
        Box::pin(async move {
            gate.await;
            read.await
        })
    }
}

#[test]
fn a_stop_flag_ends_the_wait_for_a_block_and_the_session_still_drains() {
    let (layout, file) = model(8);
    let device = Arc::new(MemDevice::new((8 * BLOCK) as usize));
    let open = Arc::new(AtomicBool::new(false));
    let waiting = Arc::new(Mutex::new(Vec::new()));
    let storage = Arc::new(GatedStorage {
        inner: MemStorage {
            file,
            reads: AtomicU64::new(0),
            fail_after: None,
        },
        open: open.clone(),
        waiting: waiting.clone(),
    });
    let order: Vec<BlockId> = (0..8).map(BlockId).collect();
    let mut session = Session::start(
        config(4, 4, ResidencyPolicy::Planned),
        layout,
        order,
        device,
        storage,
        Arc::new(NoObserver),
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(true));
    session.stop_on(stop);
    // No read can complete: without the flag this would wait forever.
    let error = session.acquire(BlockId(0)).unwrap_err();
    assert_eq!(error, SessionError::Interrupted);
    // Let the reads in flight land, then drain: every budget comes back.
    open.store(true, Ordering::SeqCst);
    for waker in waiting.lock().unwrap().drain(..) {
        waker.wake();
    }
    let stats = session.finish();
    assert_eq!(stats.vram.used_bytes, 0);
    assert_eq!(stats.pinned.used_bytes, 0);
}

/// Four 3-unit blocks and one 4-unit block, one file.
fn uneven_model(unit: u64) -> (stagehand_actors::ModelLayout, Vec<u8>) {
    let sizes = [3, 3, 4, 3, 3];
    let mut offset = 0;
    let blocks = sizes
        .iter()
        .enumerate()
        .map(|(index, &units)| {
            let length = units * unit;
            let extent = Extent {
                file: stagehand_actors::FileId(0),
                offset,
                length,
            };
            offset += length;
            stagehand_actors::BlockLayout::new(format!("blocks.{index}"), vec![extent])
        })
        .collect();
    let file = (0..offset).map(|i| (i * 7 % 253) as u8).collect();
    (stagehand_actors::ModelLayout { blocks }, file)
}

#[test]
fn activations_reserved_at_the_start_fit_where_no_resident_block_could_give_way() {
    // Proves the plan leaves the start's activation reserve free. At 13 units the
    // planner would keep the 4-unit block resident (too large for 3-unit ring slots,
    // so it cannot give way) and fill the budget; with 1 unit reserved it plans 12
    // (4-unit slots, nothing stuck) and the reservation fits.
    let unit = 1024;
    let (layout, file) = uneven_model(unit);
    let start = |reserve: u64| {
        let mut settings = config(0, 16, ResidencyPolicy::Planned);
        settings.vram_budget_bytes = 13 * unit;
        settings.activation_reserve_bytes = reserve;
        Session::start(
            settings,
            layout.clone(),
            (0..5).map(BlockId).collect(),
            Arc::new(MemDevice::new((16 * unit) as usize)),
            Arc::new(MemStorage {
                file: file.clone(),
                reads: AtomicU64::new(0),
                fail_after: None,
            }),
            Arc::new(NoObserver),
        )
        .unwrap()
    };
    let mut unreserved = start(0);
    assert!(unreserved.reserve_activations(unit).is_err());
    let mut reserved = start(unit);
    assert_eq!(reserved.reserve_activations(unit).unwrap(), Vec::new());
    for block in 0..5 {
        let handle = reserved.acquire(BlockId(block)).unwrap();
        reserved.release(handle);
    }
}

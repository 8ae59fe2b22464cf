//! What a session decides before any actor starts, and how the actors are wired.

use std::sync::Arc;

use actix::prelude::*;
use tokio::time::Instant;

use crate::compute_stream::ComputeStream;
use crate::device::{Device, DeviceArena, MemorySpace};
use crate::disk_reader::DiskReader;
use crate::error::SessionError;
use crate::layout::{BlockId, Extent, ModelLayout};
use crate::lora_offloader::LoraOffloader;
use crate::lora_state::LoraState;
use crate::observer::{AcquireBatch, Observer, Tee};
use crate::pin_manager::PinManager;
use crate::pin_state::PinState;
use crate::plan::{PinPlan, Staging, StepOrder, VramPlan};
use crate::residency::ResidencyTable;
use crate::stats::Stats;
use crate::storage::Storage;
use crate::vram_allocator::{Peers, VramAllocator};
use crate::vram_state::VramState;

use super::core::Core;
use super::{ExpertConfig, SessionConfig, SessionPlan, Wiring};

/// Everything decided before any actor starts.
#[derive(Clone)]
pub(super) struct Prepared {
    table: Arc<ResidencyTable>,
    lora_table: Arc<ResidencyTable>,
    order: StepOrder,
    plan: SessionPlan,
    stats: Arc<Stats>,
    /// In a shared budget: the arena (the whole shared VRAM budget) and the budget
    /// the order is planned in before the lease is applied (one that keeps a ring).
    shared: Option<SharedPlan>,
}

/// How a session in a shared budget is planned (see `shared`).
#[derive(Clone, Copy)]
struct SharedPlan {
    capacity_bytes: u64,
    planned_bytes: u64,
}

impl Prepared {
    pub(super) fn new(
        config: &SessionConfig,
        experts: Option<ExpertConfig>,
        layout: &ModelLayout,
        order: Vec<BlockId>,
        capacity: Option<u64>,
    ) -> Result<Self, SessionError> {
        let order = StepOrder::new(order, layout.len())?;
        let mut planned_bytes = planned_budget(config, experts)?;
        let plan_in =
            |bytes| VramPlan::new(layout, &order, bytes, config.prefetch_depth, config.policy);
        let mut vram = plan_in(planned_bytes)?;
        if capacity.is_some() {
            // Planned one byte short of everything resident, whatever the lease: the
            // plan then streams the fewest bytes it can, through a ring of the
            // smallest slots that allows (blocks larger stay resident), which is the
            // ring a model that gives way down to its floor wants. A plan made in a
            // large lease would size the ring for the largest block (spare room), and
            // one made at the least budget may stream that block through a slot of
            // its size; either leaves the ring holding what residency should. The
            // lease's room is planned back after.
            let everything = plan_in(u64::MAX)?.resident_bytes;
            let near = everything.saturating_sub(1);
            if let Ok(streaming) = plan_in(near) {
                // Only when the lease holds what that plan cannot give way.
                if streaming.ring_slots > 0 && cannot_give_way(layout, &streaming) <= planned_bytes
                {
                    (planned_bytes, vram) = (near, streaming);
                }
            }
        }
        let shared = capacity.map(|capacity_bytes| SharedPlan {
            capacity_bytes: capacity_bytes.max(config.vram_budget_bytes),
            planned_bytes,
        });
        let staging = match config.fast_disk_chunk_bytes {
            Some(buffer_bytes) => Staging::Chunks {
                buffers: config.staging_buffers,
                buffer_bytes,
            },
            None => Staging::WholeBlocks {
                buffers: config.staging_buffers,
            },
        };
        let pins = PinPlan::new(layout, &order, &vram, config.pin_ceiling_bytes, staging)?;
        let table = Arc::new(ResidencyTable::new(
            layout.blocks.iter().map(|block| block.bytes),
        ));
        let lora_table = Arc::new(LoraState::new_table(layout.len()));
        Ok(Self {
            table,
            lora_table,
            order,
            plan: SessionPlan { vram, pins },
            stats: Arc::new(Stats::default()),
            shared,
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_actors(
        self,
        config: SessionConfig,
        experts: Option<ExpertConfig>,
        layout: ModelLayout,
        device: Arc<dyn Device>,
        storage: Arc<dyn Storage>,
        observer: Arc<dyn Observer>,
        owns_system: bool,
    ) -> Result<Wiring, SessionError> {
        let observer: Arc<dyn Observer> = Arc::new(Tee(self.stats.clone(), observer));
        let vram = self.vram_state(&config, experts, &layout)?;
        let mut pins = self.pin_state(&config, &layout);
        let arena_bytes = self
            .shared
            .map_or(config.vram_budget_bytes, |shared| shared.capacity_bytes);
        let arena = device
            .allocate_arena(arena_bytes)
            .map_err(|error| SessionError::Device(error.to_string()))?;
        // The staging ring is allocated here, before any actor starts: a ring that
        // cannot be pinned fails the start with a clear error, instead of leaving every
        // request waiting for a buffer that never comes.
        if let Err(error) = allocate_staging_ring(&mut pins, device.as_ref(), &observer) {
            device.free_arena(arena);
            return Err(error);
        }
        let bounds = MailboxBounds::new(layout.len(), config.staging_buffers);
        let extents = layout
            .blocks
            .into_iter()
            .map(|block| block.extents)
            .collect();
        let reader = DiskReader::new(
            storage,
            config.max_reads_in_flight,
            bounds.reads_outstanding,
        );
        let states = ActorStates {
            vram,
            pins,
            extents,
            reader: with_capacity(bounds.reader, reader),
            lora: LoraState::with_table(
                self.lora_table.clone(),
                self.plan.vram.ring_slots as usize,
            ),
            arena,
        };
        let (allocator, Peers { pins, lora }) =
            wire(states, self.table.clone(), device, &observer, &bounds)?;
        let stream = ComputeStream::new(allocator.clone(), pins, observer, owns_system);
        let stream = with_capacity(bounds.stream, stream);
        Ok(Wiring {
            stream,
            lora,
            allocator,
        })
    }

    /// The allocator's state: the planned budget, with read-ahead, the expert cache and
    /// the activations' room as the configuration asks.
    fn vram_state(
        &self,
        config: &SessionConfig,
        experts: Option<ExpertConfig>,
        layout: &ModelLayout,
    ) -> Result<VramState, SessionError> {
        let planned_bytes = match self.shared {
            Some(shared) => shared.planned_bytes,
            None => planned_budget(config, experts)?,
        };
        let mut state = VramState::new(
            layout,
            self.order.clone(),
            planned_bytes,
            config.prefetch_depth,
            config.policy,
            self.table.clone(),
        )?;
        // Disk read-ahead past the prefetch window, into idle staging buffers. Off at
        // depth 0 (naive: each block loaded when needed) and for the LRU baseline.
        if config.prefetch_depth > 0 && config.policy == crate::plan::ResidencyPolicy::Planned {
            state = state.with_read_ahead(READ_AHEAD_BLOCKS);
        }
        if let Some(experts) = experts {
            state = state.with_experts(experts.slots, experts.slot_bytes, experts.policy);
        }
        let state = state.with_activation_room(config.activation_reserve_bytes);
        let Some(shared) = self.shared else {
            return Ok(state);
        };
        // Planned below the lease to keep a ring: the lease's room is planned back.
        let mut state = state.with_capacity(shared.capacity_bytes);
        let resized = state.resize(config.vram_budget_bytes);
        if resized.budget_bytes > config.vram_budget_bytes {
            return Err(SessionError::Plan(
                crate::plan::PlanError::VramBudgetTooSmall {
                    budget: crate::plan::Bytes(config.vram_budget_bytes),
                    needed: crate::plan::Bytes(resized.budget_bytes),
                    largest: crate::plan::Bytes(self.plan.vram.slot_bytes),
                    depth: config.prefetch_depth,
                    fits_at_depth: None,
                },
            ));
        }
        Ok(state)
    }

    /// The pin manager's state: the pin plan, within the ceiling (and the chunk ring).
    fn pin_state(&self, config: &SessionConfig, layout: &ModelLayout) -> PinState {
        let block_bytes: Vec<u64> = layout.blocks.iter().map(|block| block.bytes).collect();
        let lookahead = 2 * (config.prefetch_depth as usize + 1);
        // With fast disk the chunk ring sits beside the ceiling: pinned ≤ ring + ceiling.
        let pinned_limit = if self.plan.pins.chunked {
            config.pin_ceiling_bytes + self.plan.pins.staging_bytes()
        } else {
            config.pin_ceiling_bytes
        };
        PinState::new(
            block_bytes,
            self.order.clone(),
            self.plan.pins.clone(),
            pinned_limit,
            lookahead,
        )
    }

    pub(super) fn into_core(self, wiring: Wiring, memory_space: MemorySpace) -> Core {
        Core {
            memory_space,
            table: self.table,
            lora_table: self.lora_table,
            lora_held: 0,
            stream: wiring.stream,
            lora: wiring.lora,
            allocator: wiring.allocator,
            order: self.order,
            position: 0,
            batch: AcquireBatch::default(),
            step_started: Instant::now(),
            stats: self.stats,
            plan: self.plan,
        }
    }
}

/// What the allocator, the pin manager and the LoRA offloader start with, made (and
/// the disk reader started) before any of them starts.
struct ActorStates {
    vram: VramState,
    pins: PinState,
    /// Each block's extents on disk, for the pin manager's reads.
    extents: Vec<Vec<Extent>>,
    reader: Addr<DiskReader>,
    lora: LoraState,
    arena: DeviceArena,
}

/// Starts the allocator with its peers. The allocator's context comes first (as
/// quickwit creates a mailbox before spawning its actor): the pin manager and the LoRA
/// offloader are made with its address, and it starts with theirs, so no actor is
/// ever unwired.
fn wire(
    states: ActorStates,
    table: Arc<ResidencyTable>,
    device: Arc<dyn Device>,
    observer: &Arc<dyn Observer>,
    bounds: &MailboxBounds,
) -> Result<(Addr<VramAllocator>, Peers), SessionError> {
    let mut peers = None;
    let allocator = VramAllocator::create(|ctx| {
        ctx.set_mailbox_capacity(bounds.allocator);
        let allocator = ctx.address();
        let pins = PinManager::new(
            states.pins,
            states.extents,
            device.clone(),
            states.reader,
            allocator.clone(),
            observer.clone(),
        );
        let pins = with_capacity(bounds.pins, pins);
        let lora = LoraOffloader::new(
            states.lora,
            device.clone(),
            allocator,
            pins.clone(),
            observer.clone(),
        );
        let lora = with_capacity(bounds.lora, lora);
        peers = Some(Peers {
            pins: pins.clone(),
            lora: lora.clone(),
        });
        VramAllocator::new(
            states.vram,
            table,
            device,
            states.arena,
            Peers { pins, lora },
            observer.clone(),
        )
    });
    let Some(peers) = peers else {
        return Err(SessionError::Device(
            "the allocator did not start its peers".to_string(),
        ));
    };
    Ok((allocator, peers))
}

/// Pins every buffer of the staging ring the plan asks for, or says why it could not.
fn allocate_staging_ring(
    pin_state: &mut PinState,
    device: &dyn Device,
    observer: &Arc<dyn Observer>,
) -> Result<(), SessionError> {
    let mut buffers = 0;
    while let Some(bytes) = pin_state.staging_wanted() {
        match device.allocate_pinned(bytes) {
            Ok(buffer) => pin_state.add_staging(buffer),
            Err(error) => {
                observer.error(crate::observer::ErrorKind::Pin);
                return Err(SessionError::PinFailed(format!(
                    "the staging ring could not be pinned after {buffers} buffers of \
                     {bytes} bytes ({error}); lower staging_buffers or staging_buffer_size"
                )));
            }
        }
        buffers += 1;
    }
    if buffers > 0 {
        observer.pin_consolidation(buffers);
    }
    Ok(())
}

/// Starts `actor` with a mailbox of `capacity` messages.
fn with_capacity<A>(capacity: usize, actor: A) -> Addr<A>
where
    A: Actor<Context = Context<A>>,
{
    A::create(move |ctx| {
        ctx.set_mailbox_capacity(capacity);
        actor
    })
}

/// Mailbox capacities from the protocol's bounds (see `messages`): the most messages
/// each actor can have queued at once, with room to spare. A send over one of these is
/// a broken protocol: it is not queued, and the actor system stops (`mailbox::post`).
///
/// Every disk read, copy and completion carries one pinned buffer, and there are at
/// most `blocks + staging_buffers` of those (a cache buffer per block, the ring); so
/// completions, reads and returned buffers each stay under that. The compute thread
/// has at most one miss and `ring` releases outstanding, and its other messages wait
/// for room in the compute stream's mailbox (back-pressure), so what the stream
/// forwards stays under the stream's own capacity.
struct MailboxBounds {
    stream: usize,
    allocator: usize,
    pins: usize,
    reader: usize,
    lora: usize,
    /// Reads the disk reader can be asked for at once (started or queued).
    reads_outstanding: usize,
}

impl MailboxBounds {
    fn new(blocks: usize, staging_buffers: u32) -> Self {
        let buffers = blocks + staging_buffers as usize;
        Self {
            stream: COMPUTE_MAILBOX,
            allocator: 2 * buffers + COMPUTE_MAILBOX + 2 * crate::MAX_ADAPTERS,
            pins: 3 * buffers + COMPUTE_MAILBOX + 2 * crate::MAX_ADAPTERS,
            reader: buffers + COMPUTE_MAILBOX,
            lora: buffers + COMPUTE_MAILBOX,
            reads_outstanding: buffers,
        }
    }
}

/// The compute stream's mailbox: the compute thread waits when it is full.
const COMPUTE_MAILBOX: usize = 256;
/// Streamed blocks past the prefetch window whose disk reads may start early: more than
/// the staging buffers (at most 3 by default) can hold is never used.
const READ_AHEAD_BLOCKS: usize = 4;

/// What `plan` keeps whatever its budget: the ring and the blocks too large for a slot.
fn cannot_give_way(layout: &ModelLayout, plan: &VramPlan) -> u64 {
    let oversized: u64 = (layout.blocks.iter())
        .map(|block| crate::arena::align_up(block.bytes))
        .filter(|&footprint| footprint > plan.slot_bytes)
        .sum();
    plan.ring_bytes() + oversized
}

/// The budget the step order is planned in: the VRAM budget less the expert cache.
fn planned_budget(
    config: &SessionConfig,
    experts: Option<ExpertConfig>,
) -> Result<u64, SessionError> {
    let area = experts.map_or(0, |experts| experts.area_bytes()) + config.activation_reserve_bytes;
    match config.vram_budget_bytes.checked_sub(area) {
        Some(left) if left > 0 || area == 0 => Ok(left),
        _ => Err(SessionError::Plan(
            crate::plan::PlanError::VramBudgetTooSmall {
                budget: crate::plan::Bytes(config.vram_budget_bytes),
                needed: crate::plan::Bytes(area),
                largest: crate::plan::Bytes(experts.map_or(0, |experts| experts.slot_bytes)),
                depth: 0,
                fits_at_depth: None,
            },
        )),
    }
}

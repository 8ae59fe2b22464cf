//! Where a forward pass gets its blocks: streamed through a session ([`Streamed`]),
//! or read straight from the files into memory the compute adapter owns
//! ([`FromFiles`], the fully-resident reference). A model family is written once
//! against [`Blocks`], so the reference and the streamed run execute the same
//! operations in the same order on the same device, and must agree bit for bit.
//!
//! LoRA lives here too, because how a block meets its adapters depends on where it
//! came from: a streamed block gets its factors' packs held beside it and applies them
//! low-rank; a resident block has `W + s·B·A` baked into its VRAM copy once per
//! generation; a block read for the reference is baked as it is loaded. Only F32
//! weights are baked ([`merges`]): a patch on a narrower weight is applied low-rank
//! wherever its block is, its packs held beside a resident block and loaded beside a
//! reference block.
//!
//! [`merges`]: super::lora_set::merges

use std::collections::VecDeque;
use std::ops::Range;
use std::time::Instant;

use stagehand_actors::{BlockHandle, BlockId, LoraHandle, LoraSlot, Session};

pub use super::from_files::FromFiles;
use super::landing::LandingCheck;
use super::lora_set::LoraSet;
use super::FamilyError;
use crate::compute::{BlockView, Compute, LowRank, TensorSlot};

/// A block a forward pass holds. Only a [`Blocks`] source makes one, which is what
/// makes its view sound.
pub struct Held<B>(pub(super) Inner<B>);

pub(super) enum Inner<B> {
    /// From a session: the block's handle and, for a streamed block with LoRA, the
    /// packs of the adapters that patch it (by adapter index in the set).
    Session {
        handle: BlockHandle,
        packs: Vec<(usize, LoraHandle)>,
        /// The block was ready when asked for (no wait).
        ready: bool,
    },
    /// Read from the files for the reference (LoRA baked into its F32 weights), with
    /// the packs (by adapter index) of the patches it applies low-rank.
    Loaded {
        block: BlockId,
        memory: B,
        packs: Vec<(usize, B)>,
    },
}

impl<B> Held<B> {
    /// A hold of `memory`, a block the compute adapter owns (loaded itself): its view
    /// is the adapter's own [`Compute::block_view`] of it, so any source may make one.
    pub fn of_loaded(block: BlockId, memory: B) -> Self {
        Held(Inner::Loaded {
            block,
            memory,
            packs: Vec::new(),
        })
    }

    /// The adapter's memory of a block made with [`Held::of_loaded`].
    pub fn into_loaded(self) -> Option<B> {
        match self.0 {
            Inner::Loaded { memory, .. } => Some(memory),
            Inner::Session { .. } => None,
        }
    }

    pub fn block(&self) -> BlockId {
        match &self.0 {
            Inner::Session { handle, .. } => handle.block,
            Inner::Loaded { block, .. } => *block,
        }
    }

    /// Whether the block was ready when asked for (a hit), or had to be waited for.
    pub fn was_ready(&self) -> bool {
        match &self.0 {
            Inner::Session { ready, .. } => *ready,
            Inner::Loaded { .. } => true,
        }
    }

    /// The block's bytes on the device, borrowed from this hold.
    pub fn view<'a, C: Compute<Block = B>>(&'a self, compute: &C) -> BlockView<'a> {
        match &self.0 {
            // SAFETY: `Streamed::new` checked that the session's device is in the
            // compute adapter's memory space, and the handle is held for as long as
            // this borrow lasts.
            Inner::Session { handle, .. } => unsafe { BlockView::new(handle.ptr, handle.bytes) },
            Inner::Loaded { memory, .. } => compute.block_view(memory),
        }
    }

    /// The LoRA factors to apply low-rank to the output rows `rows` of the weight at
    /// `slot` of this block (all of them, or a slice of a fused weight the pass
    /// computes apart, as Flux's q, k and v of one qkv), with their scales: each
    /// patch on those rows, its `B` cut to them. A streamed block applies every patch
    /// this way; a resident or reference block only those not baked into its weights.
    pub fn low_rank<'a, C: Compute<Block = B>>(
        &'a self,
        compute: &C,
        lora: Option<&LoraSet>,
        slot: &TensorSlot,
        rows: Range<usize>,
    ) -> Result<Vec<(LowRank<'a>, f32)>, FamilyError> {
        let Some(lora) = lora else {
            return Ok(Vec::new());
        };
        let (block, streamed, held_packs) = match &self.0 {
            Inner::Session { handle, packs, .. } => {
                (handle.block.index(), handle.streamed, packs.len())
            }
            Inner::Loaded { block, packs, .. } => (block.index(), false, packs.len()),
        };
        if held_packs == 0 {
            return Ok(Vec::new());
        }
        let mut factors = Vec::new();
        for patch in lora.patches_at(block, slot.offset) {
            if patch.merged && !streamed {
                continue;
            }
            let Some(local) = patch.local_row(&rows)? else {
                continue;
            };
            let view = self.pack_view(compute, lora, block, patch.adapter)?;
            let cut = patch.factors(&view)?.out_rows(local, rows.len())?;
            factors.push((cut, patch.scale));
        }
        Ok(factors)
    }

    /// Adapter `adapter`'s pack of `block`, held with this hold.
    fn pack_view<'a, C: Compute<Block = B>>(
        &'a self,
        compute: &C,
        lora: &LoraSet,
        block: usize,
        adapter: usize,
    ) -> Result<BlockView<'a>, FamilyError> {
        let missing = || {
            FamilyError::internal(format!(
                "block {block}: the pack of LoRA adapter {adapter} is not held"
            ))
        };
        match &self.0 {
            Inner::Session { packs, .. } => {
                let pack = packs
                    .iter()
                    .find(|(held, _)| *held == adapter)
                    .map(|(_, pack)| pack)
                    .ok_or_else(missing)?;
                // SAFETY: as for the block in `view`: the pack is held with this
                // hold, on the session's device, and the offloader copied exactly the
                // set's pack bytes there (a pack handle carries the address, not the
                // length).
                Ok(unsafe { BlockView::new(pack.ptr, lora.pack_bytes(adapter, block)) })
            }
            Inner::Loaded { packs, .. } => packs
                .iter()
                .find(|(held, _)| *held == adapter)
                .map(|(_, pack)| compute.block_view(pack))
                .ok_or_else(missing),
        }
    }
}

/// A source of blocks for a forward pass.
pub trait Blocks<C: Compute> {
    fn acquire(&mut self, compute: &C, block: BlockId) -> Result<Held<C::Block>, FamilyError>;
    /// Gives a block back once everything queued on it has run.
    fn release(&mut self, compute: &C, held: Held<C::Block>) -> Result<(), FamilyError>;
    /// Blocks outside the order likely needed soon (MoE experts). Only a hint.
    fn hint(&mut self, _blocks: &[BlockId]) {}
    /// The LoRA set attached now, whose low-rank patches a family applies.
    fn lora(&self) -> Option<&LoraSet>;
    /// Reserves device memory for activations (a growing KV cache): resident weights
    /// give way when the budget is full. Returns the blocks that gave way.
    fn reserve_activations(&mut self, _bytes: u64) -> Result<Vec<BlockId>, FamilyError> {
        Ok(Vec::new())
    }
    /// Runs `work` on block `id`, held (with the LoRA set attached now), and gives the
    /// block back whether or not the work failed.
    fn with_held<T>(
        &mut self,
        compute: &C,
        id: BlockId,
        work: impl FnOnce(&Held<C::Block>, Option<&LoraSet>) -> Result<T, FamilyError>,
    ) -> Result<T, FamilyError>
    where
        Self: Sized,
    {
        let held = self.acquire(compute, id)?;
        let outcome = work(&held, self.lora());
        self.release(compute, held)?;
        outcome
    }
}

/// Blocks streamed through a session, with the compute thread's bookkeeping: holds
/// kept until the compute stream has passed them, hit and compute-time counts, and
/// the LoRA state of the session.
pub struct Streamed<'s, C: Compute> {
    session: &'s mut Session,
    /// Released by the family, not yet by the compute stream: (hold, fence after it).
    pending: VecDeque<(Held<C::Block>, C::Fence)>,
    /// When the block the family holds now was handed out.
    acquired_at: Option<Instant>,
    pub compute_seconds: f64,
    /// Blocks found ready / waited for, this step.
    pub hits: u64,
    pub misses: u64,
    /// A block of this step took the low-rank LoRA path.
    pub low_rank_used: bool,
    lora: Option<AttachedLora<'s>>,
    /// Per block: the (generation, phase) whose LoRA is baked into its resident copy.
    baked: Vec<Option<(u32, usize)>>,
    trace: Option<&'s crate::telemetry::TraceObserver>,
    /// `verify = weights | first`: landed blocks checked against the file.
    pub landing: Option<LandingCheck<'s>>,
}

struct AttachedLora<'s> {
    set: &'s LoraSet,
    phase: usize,
    slots: Vec<LoraSlot>,
}

impl<'s, C: Compute> Streamed<'s, C> {
    /// Blocks of `session` for `compute`, which must read the session device's memory
    /// (the CPU device and `CpuCompute`; a CUDA device and the CUDA compute on the same
    /// context): a held block's `DevicePtr` is an address the adapter's kernels read.
    pub fn new(
        session: &'s mut Session,
        compute: &C,
        trace: Option<&'s crate::telemetry::TraceObserver>,
    ) -> Result<Self, FamilyError> {
        if session.memory_space() != compute.memory_space() {
            return Err(FamilyError::internal(format!(
                "the {} compute cannot read blocks of a device in {:?}",
                compute.name(),
                session.memory_space()
            )));
        }
        Ok(Self {
            session,
            pending: VecDeque::new(),
            acquired_at: None,
            compute_seconds: 0.0,
            hits: 0,
            misses: 0,
            low_rank_used: false,
            lora: None,
            baked: Vec::new(),
            trace,
            landing: None,
        })
    }

    pub fn session(&mut self) -> &mut Session {
        self.session
    }

    /// Starts a step's counts.
    pub fn begin_step(&mut self) {
        self.compute_seconds = 0.0;
        self.hits = 0;
        self.misses = 0;
        self.low_rank_used = false;
    }

    /// Switches the attached LoRA set (`phase` numbers it): detaches the old
    /// adapters, drops baked resident copies so they reload pristine, attaches the
    /// new ones.
    pub fn switch_lora(
        &mut self,
        compute: &C,
        set: Option<&'s LoraSet>,
        phase: usize,
    ) -> Result<(), FamilyError> {
        self.drain(compute)?;
        if let Some(old) = self.lora.take() {
            for adapter in old.set.adapters() {
                self.session.detach_lora(&adapter.name)?;
            }
        }
        let stale: Vec<BlockId> = (0..self.baked.len())
            .filter(|&block| self.baked[block].is_some())
            .map(|block| BlockId(block as u32))
            .collect();
        if !stale.is_empty() {
            self.session.invalidate(&stale)?;
        }
        self.baked.iter_mut().for_each(|baked| *baked = None);
        let Some(set) = set.filter(|set| !set.is_empty()) else {
            return Ok(());
        };
        let mut slots = Vec::with_capacity(set.adapters().len());
        for adapter in 0..set.adapters().len() {
            slots.push(self.session.attach_lora(set.attach_request(adapter))?);
        }
        self.lora = Some(AttachedLora { set, phase, slots });
        Ok(())
    }

    /// Releases every hold once the compute stream has passed it.
    pub fn drain(&mut self, compute: &C) -> Result<(), FamilyError> {
        while let Some((held, fence)) = self.pending.pop_front() {
            compute.wait(fence)?;
            self.give_back(held);
        }
        Ok(())
    }

    fn give_back(&mut self, held: Held<C::Block>) {
        if let Inner::Session { handle, packs, .. } = held.0 {
            for (_, pack) in packs {
                self.session.release_lora(pack);
            }
            self.session.release(handle);
        }
    }

    /// Holds `block`'s packs of every adapter that patches it.
    fn hold_packs(&mut self, block: usize) -> Result<Vec<(usize, LoraHandle)>, FamilyError> {
        let Some(lora) = &self.lora else {
            return Ok(Vec::new());
        };
        let adapters = lora.set.adapters_on(block);
        let mut packs = Vec::with_capacity(adapters.len());
        for adapter in adapters {
            let slot = lora.slots[adapter];
            match self.session.acquire_lora(slot, BlockId(block as u32)) {
                Ok(pack) => packs.push((adapter, pack)),
                Err(error) => {
                    for (_, pack) in packs {
                        self.session.release_lora(pack);
                    }
                    return Err(error.into());
                }
            }
        }
        Ok(packs)
    }

    /// Bakes the attached set into a resident block's VRAM copy, once per generation.
    fn bake(&mut self, compute: &C, handle: &BlockHandle) -> Result<(), FamilyError> {
        let Some((set, phase)) = self.lora.as_ref().map(|lora| (lora.set, lora.phase)) else {
            return Ok(());
        };
        let block = handle.block.index();
        if self.baked[block] == Some((handle.generation, phase)) || !set.merges_on(block) {
            return Ok(());
        }
        let packs = self.hold_packs(block)?;
        // SAFETY: see `Held::view`; the block is resident and held by this thread
        // alone, so writing into it is the port's merge contract.
        let view = unsafe { BlockView::new(handle.ptr, handle.bytes) };
        let outcome = set.bake(compute, block, &view, |adapter| {
            packs
                .iter()
                .find(|(held, _)| *held == adapter)
                // SAFETY: the pack is held until the releases below; the offloader
                // copied the set's pack bytes there.
                .map(|(_, pack)| unsafe {
                    BlockView::new(pack.ptr, set.pack_bytes(adapter, block))
                })
        });
        // The merge reads the packs: they go back only after the stream passed it.
        let fence = compute.fence()?;
        compute.wait(fence)?;
        for (_, pack) in packs {
            self.session.release_lora(pack);
        }
        outcome?;
        self.baked[block] = Some((handle.generation, phase));
        Ok(())
    }

    /// Gives back holds the compute stream has passed, keeping the device busy: it
    /// waits only for holds behind the newest one.
    fn retire_finished(&mut self, compute: &C) -> Result<(), FamilyError> {
        while let Some((_, fence)) = self.pending.front() {
            let behind_newest = self.pending.len() > 1;
            if !behind_newest && !compute.is_done(fence)? {
                break;
            }
            if let Some((held, fence)) = self.pending.pop_front() {
                compute.wait(fence)?;
                self.give_back(held);
            }
        }
        Ok(())
    }
}

impl<C: Compute> Blocks<C> for Streamed<'_, C> {
    fn acquire(&mut self, compute: &C, block: BlockId) -> Result<Held<C::Block>, FamilyError> {
        let (handle, ready) = match self.session.try_acquire(block) {
            Some(handle) => {
                self.hits += 1;
                (handle, true)
            }
            None => {
                // The block we wait for may need a slot one of our holds still takes.
                self.drain(compute)?;
                self.misses += 1;
                (self.session.acquire(block)?, false)
            }
        };
        if block.index() >= self.baked.len() {
            self.baked.resize(block.index() + 1, None);
        }
        let touched = self
            .lora
            .as_ref()
            .is_some_and(|lora| lora.set.touches(block.index()));
        // A block is checked as it lands, before an adapter is baked into it; once
        // baked (this generation) its bytes are no longer the file's.
        let baked = self.baked[block.index()]
            .is_some_and(|(generation, _)| generation == handle.generation);
        if let (Some(landing), false) = (self.landing.as_mut(), baked) {
            if let Err(error) = landing.check(compute, &handle) {
                self.session.release(handle);
                return Err(error);
            }
        }
        let mut packs = Vec::new();
        if let Some(set) = self.lora.as_ref().map(|lora| lora.set).filter(|_| touched) {
            let index = block.index();
            let prepared = if handle.streamed {
                self.hold_packs(index).map(|held| packs = held)
            } else {
                self.bake(compute, &handle).and_then(|()| {
                    if set.low_rank_on_resident(index) {
                        packs = self.hold_packs(index)?;
                    }
                    Ok(())
                })
            };
            if let Err(error) = prepared {
                self.session.release(handle);
                return Err(error);
            }
            // Only a baked patch computed low-rank sums in another order than the
            // reference; one low-rank in both is the same arithmetic.
            self.low_rank_used |= handle.streamed && set.merges_on(index);
        }
        self.acquired_at = Some(Instant::now());
        Ok(Held(Inner::Session {
            handle,
            packs,
            ready,
        }))
    }

    fn release(&mut self, compute: &C, held: Held<C::Block>) -> Result<(), FamilyError> {
        if let Some(started) = self.acquired_at.take() {
            let now = Instant::now();
            self.compute_seconds += now.duration_since(started).as_secs_f64();
            if let Some(trace) = self.trace {
                trace.compute(held.block(), started, now);
            }
        }
        let fence = compute.fence()?;
        self.pending.push_back((held, fence));
        self.retire_finished(compute)
    }

    fn hint(&mut self, blocks: &[BlockId]) {
        self.session.hint(blocks);
    }

    fn reserve_activations(&mut self, bytes: u64) -> Result<Vec<BlockId>, FamilyError> {
        Ok(self.session.reserve_activations(bytes)?)
    }

    fn lora(&self) -> Option<&LoraSet> {
        self.lora.as_ref().map(|lora| lora.set)
    }
}

//! A session inside a budget it shares with other models: started with the arena
//! of the whole shared budget (so it can grow without a new allocation) and a lease
//! of it as its budgets, and driven by the broker through a [`BudgetHandle`].

use std::sync::Arc;

use actix::prelude::*;

use super::{ExpertConfig, Session, SessionConfig};
use crate::device::Device;
use crate::error::SessionError;
use crate::layout::{BlockId, ModelLayout};
use crate::messages::Resize;
use crate::observer::Observer;
use crate::pool_state::Lease;
use crate::storage::Storage;
use crate::vram_allocator::VramAllocator;

/// Asks one session's allocator (from any thread) to make its budgets a new lease:
/// give way block by block, or take room. Cheap to clone; what the
/// [`crate::SharedBudget`] broker holds of each model.
#[derive(Clone)]
pub struct BudgetHandle {
    allocator: Addr<VramAllocator>,
}

impl BudgetHandle {
    /// Resizes both budgets and waits for the answer: the budgets now in force (a
    /// shrink may keep more than asked when held blocks cannot give way yet).
    pub fn resize(&self, lease: Lease) -> Result<Lease, SessionError> {
        let (reply, receiver) = flume::bounded(1);
        let message = Resize { lease, reply };
        let _ = crate::mailbox::send_blocking_when_room(&self.allocator, message, None);
        receiver.recv().map_err(|_| SessionError::Stopped)?
    }
}

impl Session {
    /// As [`Session::start_with_experts`], in a shared budget: `config`'s budgets are
    /// this model's lease, and the arena is `capacity_bytes` (the whole shared VRAM
    /// budget), which the lease may grow to at run time. The plan always keeps a
    /// streaming ring, so resident blocks can give way to another model later.
    #[allow(clippy::too_many_arguments)]
    pub fn start_shared(
        config: SessionConfig,
        experts: Option<ExpertConfig>,
        capacity_bytes: u64,
        layout: ModelLayout,
        order: Vec<BlockId>,
        device: Arc<dyn Device>,
        storage: Arc<dyn Storage>,
        observer: Arc<dyn Observer>,
    ) -> Result<Self, SessionError> {
        Self::start_inner(
            config,
            experts,
            Some(capacity_bytes),
            (layout, order),
            device,
            storage,
            observer,
        )
    }

    /// The handle a shared budget resizes this session through.
    pub fn budget_handle(&self) -> BudgetHandle {
        BudgetHandle {
            allocator: self.core.allocator.clone(),
        }
    }
}

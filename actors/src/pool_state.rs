//! The ledger of a budget several models share: who holds how much of the VRAM
//! budget and the pin ceiling, ranked by recency of use. A plain state machine; the
//! broker in [`crate::shared_budget`] turns its decisions into `Resize` messages to
//! each model's allocator and records what each actually gave.
//!
//! A model joins with a floor (the least its plan runs in: the ring, blocks too large
//! to stream, its activation reserve) and a want (what it would use alone: every
//! block resident beside its activations). When a model is used it is ranked first
//! and asks for its want; the room comes from the free part of the budget, then from
//! the other models in rank order — idle ones before busy ones, least recently used
//! first — each down to its floor at most. The sum of the leases never exceeds the
//! total: a model grows only into room another has already given back.

/// Both budgets of one model (or of the pool): VRAM and pinned RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Lease {
    /// VRAM budget, in bytes.
    pub vram_bytes: u64,
    /// Pin ceiling, in bytes.
    pub pin_bytes: u64,
}

impl Lease {
    /// Both figures added.
    pub fn plus(self, other: Lease) -> Lease {
        Lease {
            vram_bytes: self.vram_bytes.saturating_add(other.vram_bytes),
            pin_bytes: self.pin_bytes.saturating_add(other.pin_bytes),
        }
    }

    /// Both figures less `other`'s, down to 0.
    pub fn minus(self, other: Lease) -> Lease {
        Lease {
            vram_bytes: self.vram_bytes.saturating_sub(other.vram_bytes),
            pin_bytes: self.pin_bytes.saturating_sub(other.pin_bytes),
        }
    }

    /// The smaller of each figure.
    pub fn min(self, other: Lease) -> Lease {
        Lease {
            vram_bytes: self.vram_bytes.min(other.vram_bytes),
            pin_bytes: self.pin_bytes.min(other.pin_bytes),
        }
    }

    /// The larger of each figure.
    pub fn max(self, other: Lease) -> Lease {
        Lease {
            vram_bytes: self.vram_bytes.max(other.vram_bytes),
            pin_bytes: self.pin_bytes.max(other.pin_bytes),
        }
    }

    /// Whether both figures are within `other`'s.
    pub fn within(self, other: Lease) -> bool {
        self.vram_bytes <= other.vram_bytes && self.pin_bytes <= other.pin_bytes
    }

    fn is_zero(self) -> bool {
        self.vram_bytes == 0 && self.pin_bytes == 0
    }
}

/// What a model asks of a shared budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolAsk {
    /// The least it runs in; never taken from it.
    pub floor: Lease,
    /// What it would use alone; never given more.
    pub want: Lease,
}

/// Why the pool refused; each message names a fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// No model of that name is in the pool.
    #[error("no model \"{0}\" in the shared budget")]
    Unknown(String),
    /// A model of that name is in the pool already.
    #[error("the model \"{0}\" is in the shared budget already")]
    Taken(String),
    /// The floors of every model, this one's included, exceed the shared budget.
    #[error("the shared budget (vram {vram}, pin {pin}) cannot hold \"{name}\" beside the others: together their plans need at least vram {needed_vram} and pin {needed_pin}; raise the shared budget or serve fewer models", vram = crate::Bytes(total.vram_bytes), pin = crate::Bytes(total.pin_bytes), needed_vram = crate::Bytes(needed.vram_bytes), needed_pin = crate::Bytes(needed.pin_bytes))]
    DoesNotFit {
        /// The model that asked.
        name: String,
        /// The shared budget.
        total: Lease,
        /// The floors of every model, together.
        needed: Lease,
    },
    /// A model reported holding more than its lease allows (a broken protocol).
    #[error("the leases would exceed the shared budget: \"{name}\" reported {reported:?} with {free:?} free")]
    Exceeded {
        /// The model that reported.
        name: String,
        /// What it reported holding.
        reported: Lease,
        /// What was free beside its old lease.
        free: Lease,
    },
    /// The broker has stopped.
    #[error("the shared budget has stopped")]
    Stopped,
}

#[derive(Debug, Clone)]
struct Member {
    name: String,
    ask: PoolAsk,
    lease: Lease,
    last_use: u64,
    busy: bool,
    /// Its session runs and can be asked to give way.
    attached: bool,
}

/// One model's place in the ledger, for figures and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberSnapshot {
    /// The model's name.
    pub name: String,
    /// What it holds now.
    pub lease: Lease,
    /// Its floor and want.
    pub ask: PoolAsk,
    /// Rank by recency: 0 is the most recently used.
    pub rank: usize,
    /// Inside a job now.
    pub busy: bool,
}

/// The ledger.
#[derive(Debug, Clone)]
pub struct PoolState {
    total: Lease,
    members: Vec<Member>,
    clock: u64,
}

impl PoolState {
    /// An empty pool of `total`.
    pub fn new(total: Lease) -> Self {
        Self {
            total,
            members: Vec::new(),
            clock: 0,
        }
    }

    /// The shared budget.
    pub fn total(&self) -> Lease {
        self.total
    }

    /// What no model holds.
    pub fn free(&self) -> Lease {
        let held = self
            .members
            .iter()
            .fold(Lease::default(), |sum, member| sum.plus(member.lease));
        self.total.minus(held)
    }

    fn index(&self, name: &str) -> Result<usize, PoolError> {
        self.members
            .iter()
            .position(|member| member.name == name)
            .ok_or_else(|| PoolError::Unknown(name.to_string()))
    }

    /// Adds a model holding nothing yet (busy, not attached: nothing is asked of it
    /// until [`PoolState::attach`]); refused when every floor together would not fit.
    pub fn join(&mut self, name: &str, ask: PoolAsk) -> Result<(), PoolError> {
        if self.index(name).is_ok() {
            return Err(PoolError::Taken(name.to_string()));
        }
        let needed = self
            .members
            .iter()
            .fold(ask.floor, |sum, member| sum.plus(member.ask.floor));
        if !needed.within(self.total) {
            return Err(PoolError::DoesNotFit {
                name: name.to_string(),
                total: self.total,
                needed,
            });
        }
        self.clock += 1;
        self.members.push(Member {
            name: name.to_string(),
            ask: PoolAsk {
                floor: ask.floor,
                want: ask.want.max(ask.floor),
            },
            lease: Lease::default(),
            last_use: self.clock,
            busy: true,
            attached: false,
        });
        Ok(())
    }

    /// The model's session runs: it may be asked to give way from now on.
    pub fn attach(&mut self, name: &str) -> Result<(), PoolError> {
        let index = self.index(name)?;
        self.members[index].attached = true;
        Ok(())
    }

    /// Ranks `name` first and marks it busy. Returns the room it still wants and the
    /// models to take it from, in order (idle before busy, least recent first).
    pub fn begin_use(&mut self, name: &str) -> Result<(Lease, Vec<String>), PoolError> {
        let index = self.index(name)?;
        self.clock += 1;
        let member = &mut self.members[index];
        member.last_use = self.clock;
        member.busy = true;
        let wanted = member.ask.want.minus(member.lease);
        let mut others: Vec<&Member> = self
            .members
            .iter()
            .filter(|other| other.name != name && other.attached)
            .collect();
        others.sort_by_key(|other| (other.busy, other.last_use));
        let victims = others.iter().map(|other| other.name.clone()).collect();
        Ok((wanted, victims))
    }

    /// The lease to ask `victim` to shrink to so that `still_needed` more is free:
    /// each figure lowered by what is still needed, never below its floor. `None`
    /// when it has nothing to give.
    pub fn shrink_target(&self, victim: &str, still_needed: Lease) -> Option<Lease> {
        let member = &self.members[self.index(victim).ok()?];
        let target = member.lease.minus(still_needed).max(member.ask.floor);
        let target = target.min(member.lease);
        (target != member.lease).then_some(target)
    }

    /// What `name` wanted beyond its lease and is free now.
    pub fn grow_target(&self, name: &str) -> Option<Lease> {
        let member = &self.members[self.index(name).ok()?];
        let extra = member.ask.want.minus(member.lease).min(self.free());
        (!extra.is_zero()).then(|| member.lease.plus(extra))
    }

    /// Records what `name` holds now (what its session granted). Refused, leaving the
    /// ledger as it was, if that would exceed the total.
    pub fn record(&mut self, name: &str, granted: Lease) -> Result<(), PoolError> {
        let index = self.index(name)?;
        let free = self.free().plus(self.members[index].lease);
        if !granted.within(free) {
            return Err(PoolError::Exceeded {
                name: name.to_string(),
                reported: granted,
                free,
            });
        }
        self.members[index].lease = granted;
        Ok(())
    }

    /// The model left its job: it is idle, and gives way before busy ones.
    pub fn end_use(&mut self, name: &str) -> Result<(), PoolError> {
        let index = self.index(name)?;
        self.members[index].busy = false;
        Ok(())
    }

    /// Removes the model (its session has finished): its lease is free again.
    pub fn leave(&mut self, name: &str) -> Result<(), PoolError> {
        let index = self.index(name)?;
        self.members.remove(index);
        Ok(())
    }

    /// Every member, with its rank by recency.
    pub fn snapshot(&self) -> Vec<MemberSnapshot> {
        let mut by_recency: Vec<&Member> = self.members.iter().collect();
        by_recency.sort_by_key(|member| std::cmp::Reverse(member.last_use));
        by_recency
            .iter()
            .enumerate()
            .map(|(rank, member)| MemberSnapshot {
                name: member.name.clone(),
                lease: member.lease,
                ask: member.ask,
                rank,
                busy: member.busy,
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "pool_state_tests.rs"]
mod tests;

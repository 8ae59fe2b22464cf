//! Two models used in turn under one shared budget (docs/serving.md, "Several
//! models, one budget"): the steady state the shared budget's broker settles in,
//! predicted with the broker's own ledger ([`PoolState`]) and the simulator's run of
//! each model in the lease it holds while it is the one in use.
//!
//! Each model asks what a served model asks (`run::loaded::pool_ask`, for a dense
//! description): its floor is the least its plan runs in and its staging ring, its
//! want every block resident beside its ring and every block pinned. Using the two in
//! turn, each takes from the other down to that one's floor; two rounds reach the
//! steady state. A switch costs the bytes the model plans resident again (the plan in
//! its active lease less the plan in its idle one), copied over the link on the first
//! step after the switch.

use serde::Serialize;
use stagehand_actors::{
    arena_bytes, BlockId, Lease, PoolAsk, PoolError, PoolState, ResidencyPolicy, StepOrder,
    VramPlan,
};

use super::fit::whole_block_staging_buffers;
use super::model::ModelDescription;
use super::simulation::{simulate, SimulateOptions};
use crate::sim::HardwareProfile;

/// One model of a mix, as predicted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MixModel {
    /// The description's name.
    pub name: String,
    /// What it asks of the shared budget.
    pub floor: Lease,
    /// What it would use alone.
    pub want: Lease,
    /// Its lease while it is the one in use.
    pub active: Lease,
    /// Its lease while the other one is.
    pub idle: Lease,
    /// Its steady step alone with the whole shared budget.
    pub alone_step_seconds: f64,
    /// Its steady step in turn (in its active lease).
    pub in_turn_step_seconds: f64,
    /// Bytes planned resident again when it becomes the one in use.
    pub switch_bytes: u64,
    /// Those bytes over the link (pinned rate): what a switch adds to its first step.
    pub switch_seconds: f64,
}

/// The steady state of two models used in turn.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MixPrediction {
    /// The shared VRAM budget and pin ceiling.
    pub shared: Lease,
    /// The two models, in the order given.
    pub models: Vec<MixModel>,
}

/// Why a mix could not be predicted.
#[derive(Debug, thiserror::Error)]
pub enum MixError {
    /// The ledger refused (the floors do not fit the shared budget).
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// A model could not run in its lease.
    #[error("{name}: {reason}")]
    Run {
        /// The description's name.
        name: String,
        /// What the simulator said.
        reason: String,
    },
}

/// Predicts two models used in turn under `shared` on `hardware`.
pub fn simulate_mix(
    models: [&ModelDescription; 2],
    hardware: &HardwareProfile,
    options: &SimulateOptions,
    shared: Lease,
) -> Result<MixPrediction, MixError> {
    let depth = options.settings.prefetch_depth;
    let staging_buffers = whole_block_staging_buffers(options.settings.staging_buffers, depth);
    let orders = [order_of(models[0])?, order_of(models[1])?];
    let asks = [0, 1].map(|index| ask(models[index], &orders[index], depth, staging_buffers));
    let names = ["first", "second"];
    let mut pool = PoolState::new(shared);
    for (name, model_ask) in names.iter().zip(asks) {
        pool.join(name, model_ask)?;
        let lease = pool.free().min(model_ask.want);
        pool.record(name, lease)?;
        pool.attach(name)?;
        pool.end_use(name)?;
    }
    let (mut active, mut idle) = ([Lease::default(); 2], [Lease::default(); 2]);
    for _round in 0..2 {
        for index in 0..2 {
            use_in_turn(&mut pool, names[index])?;
            active[index] = lease_of(&pool, names[index]);
            idle[1 - index] = lease_of(&pool, names[1 - index]);
            pool.end_use(names[index])?;
        }
    }
    let mut predicted = Vec::new();
    for index in 0..2 {
        let model = models[index];
        let resident =
            |lease: Lease| resident_bytes(model, &orders[index], depth, lease.vram_bytes);
        let switch_bytes = resident(active[index]).saturating_sub(resident(idle[index]));
        predicted.push(MixModel {
            name: model.name.clone(),
            floor: asks[index].floor,
            want: asks[index].want,
            active: active[index],
            idle: idle[index],
            alone_step_seconds: steady_step(model, hardware, options, shared)?,
            in_turn_step_seconds: steady_step(model, hardware, options, active[index])?,
            switch_bytes,
            switch_seconds: switch_bytes as f64 / (hardware.link.pinned_gb_per_s * 1e9),
        });
    }
    Ok(MixPrediction {
        shared,
        models: predicted,
    })
}

/// The floor and want of a dense description at `depth`.
fn ask(model: &ModelDescription, order: &StepOrder, depth: u32, staging_buffers: u32) -> PoolAsk {
    let layout = model.layout();
    let minimum = VramPlan::minimum_capacity_bytes(&layout, order, depth, ResidencyPolicy::Planned);
    let slot = arena_bytes(model.largest_block_bytes());
    let everything: u64 = model
        .blocks
        .iter()
        .map(|block| arena_bytes(block.bytes))
        .sum();
    let staging = u64::from(staging_buffers.max(2)) * slot;
    PoolAsk {
        floor: Lease {
            vram_bytes: minimum,
            pin_bytes: staging,
        },
        want: Lease {
            vram_bytes: everything + slot * u64::from(depth + 1),
            pin_bytes: model.total_bytes() + staging,
        },
    }
}

/// Every block once, in forward order.
fn order_of(model: &ModelDescription) -> Result<StepOrder, MixError> {
    let blocks = model.blocks.len();
    let order = (0..blocks as u32).map(BlockId).collect();
    StepOrder::new(order, blocks).map_err(|error| MixError::Run {
        name: model.name.clone(),
        reason: error.to_string(),
    })
}

/// The broker's use of `name`: the other gives way down to its floor, then it grows.
fn use_in_turn(pool: &mut PoolState, name: &str) -> Result<(), PoolError> {
    let (wanted, victims) = pool.begin_use(name)?;
    for victim in &victims {
        let still_needed = wanted.minus(pool.free());
        if let Some(target) = pool.shrink_target(victim, still_needed) {
            pool.record(victim, target)?;
        }
    }
    if let Some(target) = pool.grow_target(name) {
        pool.record(name, target)?;
    }
    Ok(())
}

fn lease_of(pool: &PoolState, name: &str) -> Lease {
    pool.snapshot()
        .into_iter()
        .find(|member| member.name == name)
        .map_or(Lease::default(), |member| member.lease)
}

/// The bytes the plan keeps resident in `vram_bytes` (0 when it does not fit).
fn resident_bytes(model: &ModelDescription, order: &StepOrder, depth: u32, vram_bytes: u64) -> u64 {
    let plan = VramPlan::new(
        &model.layout(),
        order,
        vram_bytes,
        depth,
        ResidencyPolicy::Planned,
    );
    plan.map_or(0, |plan| plan.resident_bytes)
}

/// Stagehand's steady step of `model` under `lease`, simulated.
fn steady_step(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    options: &SimulateOptions,
    lease: Lease,
) -> Result<f64, MixError> {
    let mut options = options.clone();
    options.settings.vram_budget_bytes = Some(lease.vram_bytes);
    options.settings.pin_ceiling_bytes = Some(lease.pin_bytes);
    options.baselines = false;
    let failed = |reason: String| MixError::Run {
        name: model.name.clone(),
        reason,
    };
    let simulation =
        simulate(model, hardware, &options).map_err(|error| failed(error.to_string()))?;
    simulation
        .stagehand
        .map(|figures| figures.run.steady_step_seconds)
        .ok_or_else(|| failed(simulation.failure_messages.join("; ")))
}

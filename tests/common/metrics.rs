//! Shared helpers of the metrics tests: the repository's dashboard and its queries,
//! and a fixed set of observer events whose totals are easy to state.

use std::path::{Path, PathBuf};

use serde_json::Value;
use stagehand::actors::{AcquireBatch, ErrorKind, Link, Observer, Owner, Tier, TierUsage};

pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

pub fn read(relative: &str) -> String {
    let path = repo_path(relative);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("read {}: {error}", path.display()))
}

pub fn dashboard() -> Value {
    serde_json::from_str(&read("dashboards/stagehand.json")).expect("dashboard is valid JSON")
}

/// Every panel, including panels nested in collapsed rows.
pub fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut found = Vec::new();
    let mut pending: Vec<&Value> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    while let Some(panel) = pending.pop() {
        pending.extend(panel["panels"].as_array().into_iter().flatten());
        found.push(panel);
    }
    found
}

/// `(where, expression)` for every PromQL expression on the dashboard.
pub fn dashboard_expressions(dashboard: &Value) -> Vec<(String, String)> {
    let mut expressions = Vec::new();
    for panel in panels(dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expression) = target["expr"].as_str() {
                let place = format!("panel {:?} target {}", panel["title"], target["refId"]);
                expressions.push((place, expression.to_string()));
            }
        }
    }
    expressions
}

/// Feeds every kind of event, with figures whose totals are easy to state.
pub fn feed(observer: &dyn Observer) {
    for _ in 0..10 {
        observer.transfer(Link::DiskToPinned, Owner::Model, 4 << 20, 0.002);
        observer.transfer(Link::PinnedToVram, Owner::Model, 4 << 20, 0.0005);
    }
    observer.transfer(Link::DiskToVram, Owner::Lora, 65_536, 0.03);
    observer.transfer(Link::PinnedToVram, Owner::Lora, 65_536, 0.0001);
    let vram = TierUsage {
        model_bytes: 24 << 20,
        lora_bytes: 65_536,
        other_bytes: 8 << 20,
        budget_bytes: 40 << 20,
        blocks: 6,
    };
    observer.tier_usage(Tier::Vram, TierUsage { blocks: 1, ..vram });
    observer.tier_usage(Tier::Vram, vram);
    observer.tier_usage(
        Tier::Pinned,
        TierUsage {
            model_bytes: 40 << 20,
            budget_bytes: 64 << 20,
            blocks: 10,
            ..TierUsage::default()
        },
    );
    observer.eviction(Tier::Vram, 3);
    observer.eviction(Tier::Vram, 4);
    observer.eviction(Tier::Pinned, 1);
    observer.pin_consolidation(2);
    observer.speculative_declined();
    observer.speculative_declined();
    for step in 0..4u32 {
        observer.acquires(AcquireBatch {
            hits: 7,
            misses: 3,
            stall_seconds: 0.25 * f64::from(step),
        });
        observer.step(0.5);
        observer.prefetch_lead(u64::from(step) + 1);
    }
    observer.error(ErrorKind::Read);
    observer.error(ErrorKind::Read);
    observer.error(ErrorKind::Budget);
}

//! What a run on a model will use, and why: the budgets, the staging ring, the
//! prefetch depth and the verification, each with where it came from (a layer the
//! user wrote, or the policy that computed it). `stagehand config --model M` prints
//! it; the figures come from the same functions `run` calls, so they cannot drift.

use serde::Serialize;
use stagehand_actors::{Bytes, ResidencyPolicy};

use super::budget::{budgets_for, fitting_depth, BudgetAsk, DEFAULT_VRAM_FRACTION};
use super::Prepared;
use crate::settings::{Loaded, Provenance, Settings};

/// One figure of a run: its value as shown, its bytes where it is a size, and where
/// it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EffectiveValue {
    pub key: &'static str,
    pub value: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    pub from: String,
}

/// The figures of a run of `steps` steps on `prepared` under `loaded`'s settings, as
/// `run` computes them (planned residency, the default VRAM share).
pub fn effective_run(prepared: &Prepared, loaded: &Loaded, steps: u64) -> Vec<EffectiveValue> {
    let settings = &loaded.settings;
    let provenance = &loaded.provenance;
    let ask = BudgetAsk {
        policy: ResidencyPolicy::Planned,
        ..BudgetAsk::steps(steps)
    };
    let budgets = budgets_for(prepared, settings, ask);
    let depth = fitting_depth(prepared, settings, budgets, ask);
    let model_bytes = prepared.streamed_model_bytes();
    let size = |key, bytes: u64, from: String| EffectiveValue {
        key,
        value: Bytes(bytes).to_string(),
        bytes: Some(bytes),
        from,
    };
    vec![
        size(
            "model",
            model_bytes,
            format!("{} (the bytes it streams)", prepared.describe()),
        ),
        size(
            "vram_budget",
            budgets.vram_budget_bytes,
            vram_budget_from(provenance, model_bytes, budgets.vram_budget_bytes),
        ),
        size(
            "pin_ceiling",
            budgets.pin_ceiling_bytes,
            pin_ceiling_from(prepared, settings, provenance, budgets.pin_ceiling_bytes),
        ),
        staging_ring(prepared, settings, depth),
        EffectiveValue {
            key: "prefetch_depth",
            value: depth.to_string(),
            bytes: None,
            from: prefetch_depth_from(settings, provenance, depth),
        },
        EffectiveValue {
            key: "verify",
            value: settings
                .verify
                .map_or("full (run, bench); first (embed, generate)", |verify| {
                    verify.name()
                })
                .to_string(),
            bytes: None,
            from: source_of(provenance, "verify")
                .unwrap_or_else(|| "the command's default".to_string()),
        },
    ]
}

/// "set by …" when a layer the user wrote (or the shipped defaults file) set `key`;
/// `None` when it was left to the built-in default.
fn source_of(provenance: &Provenance, key: &str) -> Option<String> {
    let origin = provenance.get(key)?;
    match origin.source {
        crate::settings::Source::Default => None,
        ref source => Some(format!("set by {source}")),
    }
}

fn vram_budget_from(provenance: &Provenance, model_bytes: u64, budget_bytes: u64) -> String {
    if let Some(set) = source_of(provenance, "vram_budget") {
        return set;
    }
    let share_bytes = (model_bytes as f64 * DEFAULT_VRAM_FRACTION) as u64;
    let share = format!(
        "automatic: {:.0} % of the streamed model ({})",
        DEFAULT_VRAM_FRACTION * 100.0,
        Bytes(share_bytes)
    );
    if budget_bytes > share_bytes {
        format!("{share}, raised to what its plan and activations need")
    } else {
        share
    }
}

fn pin_ceiling_from(
    prepared: &Prepared,
    settings: &Settings,
    provenance: &Provenance,
    ceiling_bytes: u64,
) -> String {
    let wanted = match (source_of(provenance, "pin_ceiling"), settings.pin_ceiling) {
        (Some(set), Some(size)) if size.as_u64() == ceiling_bytes => return set,
        (Some(set), _) => set,
        (None, _) if prepared.is_demo => "automatic: half the demo model".to_string(),
        (None, _) => format!(
            "automatic: the free RAM above ram_floor ({})",
            Bytes(settings.ram_floor.as_u64())
        ),
    };
    match settings.pin_ceiling {
        Some(size) if size.as_u64() > ceiling_bytes => {
            format!("{wanted}, lowered so free RAM stays above ram_floor")
        }
        _ => wanted,
    }
}

/// The pinned staging buffers reads land in: with `fast_disk`, the configured ring
/// beside the pin ceiling; without, whole-block buffers inside it, as many as the
/// prefetch depth keeps busy.
fn staging_ring(prepared: &Prepared, settings: &Settings, depth: u32) -> EffectiveValue {
    if settings.fast_disk {
        let bytes = u64::from(settings.staging_buffers) * settings.staging_buffer_size.as_u64();
        return EffectiveValue {
            key: "staging_ring",
            value: Bytes(bytes).to_string(),
            bytes: Some(bytes),
            from: format!(
                "fast_disk: {} buffers of {} (O_DIRECT), pinned beside the pin ceiling",
                settings.staging_buffers,
                Bytes(settings.staging_buffer_size.as_u64())
            ),
        };
    }
    let largest = prepared.facts().layout().largest_block_bytes();
    let buffers = settings.staging_buffers.clamp(2, depth + 2);
    let bytes = u64::from(buffers) * largest;
    EffectiveValue {
        key: "staging_ring",
        value: Bytes(bytes).to_string(),
        bytes: Some(bytes),
        from: format!(
            "{buffers} buffers of the largest block ({}) inside the pin ceiling: staging_buffers within 2..=prefetch depth + 2",
            Bytes(largest)
        ),
    }
}

fn prefetch_depth_from(settings: &Settings, provenance: &Provenance, depth: u32) -> String {
    if !settings.choose_prefetch_depth {
        return source_of(provenance, "prefetch_depth")
            .unwrap_or_else(|| "the built-in default".to_string());
    }
    if depth < settings.prefetch_depth {
        format!(
            "chosen: the deepest up to {} that the vram budget fits",
            settings.prefetch_depth
        )
    } else {
        "the shipped default, which the vram budget fits".to_string()
    }
}

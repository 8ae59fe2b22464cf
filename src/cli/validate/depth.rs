//! Whether the simulation's recommended prefetch depth is the faster one measured.

use std::io::Write;

use stagehand::calibrate::validate::{Case, Row};

/// A recommended depth within this much of the fastest measured one counts as right.
const DEPTH_TOLERANCE: f64 = 0.05;

/// Per (model, batch, budget, disk): the depth the simulation finds faster (the
/// smaller on a tie within 5 %) and whether it is the fastest measured, within 5 %.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct DepthCheck {
    pub configuration: String,
    pub recommended_depth: u32,
    pub fastest_measured_depth: u32,
    pub ok: bool,
    /// Not within 5 %, but within the two rows' own spread (identical runs that far
    /// apart cannot tell the two depths apart: a resident model's, say).
    pub within_spread: bool,
}

pub(super) fn depth_checks(rows: &[Row]) -> Vec<DepthCheck> {
    let mut checks = Vec::new();
    for pair in rows.windows(2) {
        let (shallow, deep) = (&pair[0], &pair[1]);
        let same = Case {
            prefetch_depth: deep.case.prefetch_depth,
            ..shallow.case.clone()
        };
        if shallow.case.prefetch_depth != 0 || deep.case.prefetch_depth != 2 || same != deep.case {
            continue;
        }
        let figures = |row: &Row| DepthFigures {
            predicted: row.steady_step_seconds.predicted,
            measured: row.steady_step_seconds.measured,
            spread: row.steady_repeats.spread,
        };
        let judged = judge_depths(figures(shallow), figures(deep));
        let depth = |deep_one: bool| if deep_one { deep } else { shallow }.case.prefetch_depth;
        checks.push(DepthCheck {
            configuration: shallow.case.short_label().replace(" d0", ""),
            recommended_depth: depth(judged.recommends_deep),
            fastest_measured_depth: depth(judged.deep_measured_faster),
            ok: judged.ok,
            within_spread: judged.within_spread,
        });
    }
    checks
}

/// One depth's steady step: predicted and measured seconds, and the spread of its
/// repeats.
#[derive(Debug, Clone, Copy)]
pub(super) struct DepthFigures {
    pub(super) predicted: f64,
    pub(super) measured: f64,
    pub(super) spread: f64,
}

#[derive(Debug, PartialEq)]
pub(super) struct DepthVerdict {
    pub(super) recommends_deep: bool,
    pub(super) deep_measured_faster: bool,
    pub(super) ok: bool,
    pub(super) within_spread: bool,
}

/// The simulation recommends the deeper depth only where it predicts it faster by
/// more than [`DEPTH_TOLERANCE`]; the recommendation is right when it measured within
/// that tolerance of the faster one, and within the rows' spread when it measured
/// no further from it than the repeats of either row spread among themselves.
pub(super) fn judge_depths(shallow: DepthFigures, deep: DepthFigures) -> DepthVerdict {
    let recommends_deep = deep.predicted < shallow.predicted * (1.0 - DEPTH_TOLERANCE);
    let deep_measured_faster = deep.measured < shallow.measured;
    let pick = |deep_one: bool| if deep_one { deep } else { shallow }.measured;
    let (recommended, fastest) = (pick(recommends_deep), pick(deep_measured_faster));
    let ok = recommended <= fastest * (1.0 + DEPTH_TOLERANCE);
    let spread = shallow.spread.max(deep.spread);
    DepthVerdict {
        recommends_deep,
        deep_measured_faster,
        ok,
        within_spread: !ok && recommended <= fastest * (1.0 + spread),
    }
}

/// How often the recommended depth was the fastest measured, and where it was not.
pub(super) fn write_depth_checks(
    out: &mut impl Write,
    depth_checks: &[DepthCheck],
) -> std::io::Result<()> {
    let depth_ok = depth_checks.iter().filter(|check| check.ok).count();
    let within_spread = depth_checks
        .iter()
        .filter(|check| check.within_spread)
        .count();
    writeln!(
        out,
        "recommended depth (0 or 2) within 5 % of the fastest measured: {depth_ok}/{}; \
         of the others, {within_spread} within their runs' own spread",
        depth_checks.len()
    )?;
    for check in depth_checks.iter().filter(|check| !check.ok) {
        let noise = match check.within_spread {
            true => " (within the spread of identical runs)",
            false => "",
        };
        writeln!(
            out,
            "  {}: simulation recommends {}, depth {} measured faster{noise}",
            check.configuration, check.recommended_depth, check.fastest_measured_depth
        )?;
    }
    Ok(())
}

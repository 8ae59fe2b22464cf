//! The metric catalog checked against everything else that names metrics: the Grafana
//! dashboard, the Prometheus rules and `docs/metrics.md`. promtool's checks are in
//! `metrics_promtool.rs`, the observer's exposition in `metrics_exposition.rs`.

mod common;

use std::collections::BTreeSet;

use common::metrics::{dashboard, dashboard_expressions, panels, read, repo_path};
use stagehand::telemetry::{catalog, promql, CATALOG};

fn rules() -> serde_yaml::Value {
    serde_yaml::from_str(&read("dashboards/rules.yml")).expect("rules are valid YAML")
}

/// `(where, expression)` for every rule, and the names the recording rules define.
fn rule_expressions(rules: &serde_yaml::Value) -> (Vec<(String, String)>, BTreeSet<String>) {
    let mut expressions = Vec::new();
    let mut recorded = BTreeSet::new();
    let groups = rules["groups"].as_sequence().expect("rules have groups");
    for group in groups {
        for rule in group["rules"].as_sequence().expect("group has rules") {
            let name = rule["record"]
                .as_str()
                .or_else(|| rule["alert"].as_str())
                .expect("rule is a record or an alert");
            if rule["record"].is_string() {
                recorded.insert(name.to_string());
            }
            let expression = rule["expr"].as_str().expect("rule has expr");
            expressions.push((format!("rule {name}"), expression.to_string()));
        }
    }
    (expressions, recorded)
}

/// The base metric names an expression reads, or an error naming what is undeclared.
fn declared_bases(
    expression: &str,
    recorded: &BTreeSet<String>,
) -> Result<BTreeSet<&'static str>, String> {
    let names = promql::referenced_metrics(expression);
    if names.is_empty() {
        return Err("names no metric".to_string());
    }
    let mut bases = BTreeSet::new();
    for name in names {
        if recorded.contains(&name) {
            continue;
        }
        match catalog::find_series(&name) {
            Some(spec) => {
                bases.insert(spec.name);
            }
            None => return Err(format!("names undeclared metric {name}")),
        }
    }
    Ok(bases)
}

#[test]
fn every_declared_metric_is_on_the_dashboard() {
    // Proves no metric is exported that nobody can see on the dashboard.
    let dashboard = dashboard();
    let mut shown = BTreeSet::new();
    for (place, expression) in dashboard_expressions(&dashboard) {
        let bases = declared_bases(&expression, &BTreeSet::new())
            .unwrap_or_else(|error| panic!("{place} {error}: {expression}"));
        shown.extend(bases);
    }
    let missing: Vec<_> = CATALOG
        .iter()
        .map(|spec| spec.name)
        .filter(|name| !shown.contains(name))
        .collect();
    assert!(
        missing.is_empty(),
        "not on any dashboard panel: {missing:?}"
    );
}

#[test]
fn dashboard_and_rules_name_only_declared_metrics() {
    // Proves every query on the dashboard and in the rules reads metrics that exist.
    let (rule_expressions, recorded) = rule_expressions(&rules());
    let dashboard = dashboard();
    let mut checked = 0;
    for (place, expression) in dashboard_expressions(&dashboard)
        .into_iter()
        .chain(rule_expressions)
    {
        if let Err(error) = declared_bases(&expression, &recorded) {
            panic!("{place} {error}: {expression}");
        }
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} expressions found");
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        let Some(definition) = variable["definition"].as_str() else {
            continue;
        };
        let metric = definition
            .strip_prefix("label_values(")
            .and_then(|rest| rest.split(',').next())
            .unwrap_or(definition)
            .trim();
        assert!(
            catalog::find_series(metric).is_some(),
            "variable {} reads undeclared {metric}",
            variable["name"]
        );
    }
}

#[test]
fn dashboard_takes_its_datasource_from_a_variable_and_has_the_required_panels() {
    // Proves the dashboard imports into any Grafana and shows what operators ask for.
    let dashboard = dashboard();
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating");
    assert!(variables
        .iter()
        .any(|variable| variable["type"] == "datasource"
            && variable["name"] == "DS_PROMETHEUS"
            && variable["query"] == "prometheus"));
    for panel in panels(&dashboard) {
        let sources = std::iter::once(&panel["datasource"]).chain(
            panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|target| &target["datasource"]),
        );
        for source in sources {
            assert_eq!(
                source["uid"], "${DS_PROMETHEUS}",
                "panel {}",
                panel["title"]
            );
        }
    }
    let expressions = dashboard_expressions(&dashboard);
    let on_panel = |title: &str, needle: &str| {
        expressions
            .iter()
            .any(|(place, expression)| place.contains(title) && expression.contains(needle))
    };
    assert!(on_panel(
        "Link throughput",
        "rate(stagehand_link_transferred_bytes_total"
    ));
    assert!(on_panel("Budget use", "stagehand_tier_budget_bytes"));
    assert!(on_panel(
        "hit rate",
        "stagehand_compute_acquire_misses_total"
    ));
    assert!(on_panel(
        "stall fraction",
        "rate(stagehand_compute_stall_seconds_sum"
    ));
    assert!(on_panel("Step time", "histogram_quantile(0.5,"));
    assert!(on_panel("Step time", "histogram_quantile(0.99,"));
    assert!(on_panel("Evictions", "stagehand_tier_evicted_blocks_total"));
    assert!(on_panel("Errors", "stagehand_errors_total"));
    assert!(on_panel("Prefetch lead", "stagehand_prefetch_lead_blocks"));
    assert!(on_panel("LoRA", "owner=\"lora\""));
}

#[test]
fn docs_metrics_md_is_generated_from_the_catalog() {
    // Proves docs/metrics.md lists exactly the declared metrics; prints the fix when not.
    let expected = catalog::markdown_table();
    let actual = std::fs::read_to_string(repo_path("docs/metrics.md")).unwrap_or_default();
    if actual != expected {
        panic!(
            "docs/metrics.md is out of date; replace it with the text between the markers:\n\
             ----- 8< -----\n{expected}----- 8< -----"
        );
    }
}

//! The metric catalog checked against everything else that names metrics: the Grafana
//! dashboard, the Prometheus rules, `docs/metrics.md`, promtool, and the exposition the
//! observer actually renders.
//!
//! promtool comes from Debian's `prometheus` package (`scripts/install-prometheus.sh`);
//! when it is missing these tests fail and say so rather than pass silently.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;
use stagehand::actors::{
    AcquireBatch, ErrorKind, Link, Observer, Owner, Stats, Tee, Tier, TierUsage,
};
use stagehand::telemetry::{catalog, exposition, promql, MetricKind, PrometheusObserver, CATALOG};

fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn read(relative: &str) -> String {
    let path = repo_path(relative);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("read {}: {error}", path.display()))
}

fn dashboard() -> Value {
    serde_json::from_str(&read("dashboards/stagehand.json")).expect("dashboard is valid JSON")
}

fn rules() -> serde_yaml::Value {
    serde_yaml::from_str(&read("dashboards/rules.yml")).expect("rules are valid YAML")
}

/// Every panel, including panels nested in collapsed rows.
fn panels(dashboard: &Value) -> Vec<&Value> {
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
fn dashboard_expressions(dashboard: &Value) -> Vec<(String, String)> {
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

fn promtool(arguments: &[&str], stdin: Option<&str>) -> std::process::Output {
    let mut child = Command::new("promtool")
        .args(arguments)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| {
            panic!(
                "cannot run promtool ({error}): install Debian's prometheus with \
                 scripts/install-prometheus.sh"
            )
        });
    let mut input = child.stdin.take().expect("piped stdin");
    if let Some(text) = stdin {
        input
            .write_all(text.as_bytes())
            .expect("write promtool stdin");
    }
    drop(input);
    child.wait_with_output().expect("promtool finished")
}

fn describe(output: &std::process::Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
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
fn promtool_accepts_the_rules() {
    // Proves dashboards/rules.yml is a valid Prometheus rule file.
    let path = repo_path("dashboards/rules.yml");
    let output = promtool(&["check", "rules", &path.to_string_lossy()], None);
    assert!(output.status.success(), "{}", describe(&output));
}

#[test]
fn promtool_accepts_every_dashboard_expression() {
    // Proves each dashboard query is valid PromQL once Grafana's variables are filled in.
    let expressions = dashboard_expressions(&dashboard());
    let rules: Vec<_> = expressions
        .iter()
        .enumerate()
        .map(|(index, (_, expression))| {
            serde_json::json!({
                "record": format!("stagehand_dashboard:query_{index}"),
                "expr": promql::substitute_grafana_variables(expression, "1m"),
            })
        })
        .collect();
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let directory = tempfile::tempdir().expect("temp dir");
    let path = directory.path().join("dashboard_rules.yml");
    let text = serde_yaml::to_string(&file).expect("rules serialise");
    std::fs::write(&path, text).expect("write rules");
    let output = promtool(&["check", "rules", &path.to_string_lossy()], None);
    assert!(output.status.success(), "{}", describe(&output));
}

#[test]
fn alerts_fire_on_stalls_full_budgets_and_errors_only() {
    // Proves the three alerts fire on their conditions (per promtool's rule unit tests)
    // and stay quiet on a healthy instance.
    let rules_path = repo_path("dashboards/rules.yml");
    let test = format!(
        r#"rule_files: ["{rules}"]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # 18 s stalled per 60 s = 30 %; the healthy instance stalls 6 s = 10 %.
      - series: 'stagehand_compute_stall_seconds_sum{{job="s", instance="bad"}}'
        values: '0+18x20'
      - series: 'stagehand_compute_stall_seconds_sum{{job="s", instance="good"}}'
        values: '0+6x20'
      - series: 'stagehand_tier_used_bytes{{job="s", instance="bad", tier="vram", owner="model"}}'
        values: '985x20'
      - series: 'stagehand_tier_used_bytes{{job="s", instance="bad", tier="vram", owner="lora"}}'
        values: '1x20'
      - series: 'stagehand_tier_budget_bytes{{job="s", instance="bad", tier="vram"}}'
        values: '1000x20'
      - series: 'stagehand_tier_used_bytes{{job="s", instance="good", tier="vram", owner="model"}}'
        values: '970x20'
      - series: 'stagehand_tier_budget_bytes{{job="s", instance="good", tier="vram"}}'
        values: '1000x20'
      - series: 'stagehand_errors_total{{job="s", instance="bad", kind="read"}}'
        values: '0 0 0 1x17'
      - series: 'stagehand_errors_total{{job="s", instance="good", kind="read"}}'
        values: '0x20'
    alert_rule_test:
      - eval_time: 3m
        alertname: StagehandComputeStalled
        exp_alerts: []
      - eval_time: 12m
        alertname: StagehandComputeStalled
        exp_alerts:
          - exp_labels: {{job: s, instance: bad, severity: warning}}
            exp_annotations:
              summary: "stagehand on bad stalls compute 30% of the time"
              description: "{stalled}"
      - eval_time: 12m
        alertname: StagehandBudgetNearLimit
        exp_alerts:
          - exp_labels: {{job: s, instance: bad, tier: vram, severity: warning}}
            exp_annotations:
              summary: "stagehand vram budget on bad is 98.6% used"
              description: "{budget}"
      - eval_time: 5m
        alertname: StagehandErrors
        exp_alerts:
          - exp_labels: {{job: s, instance: bad, kind: read, severity: critical}}
            exp_annotations:
              summary: "stagehand on bad reported read errors"
              description: "{errors}"
      - eval_time: 15m
        alertname: StagehandErrors
        exp_alerts: []
"#,
        rules = rules_path.display(),
        stalled = "The compute thread has waited for blocks more than 20 % of the time for 5 \
                   minutes: the GPU is waiting on the bus or the disk. Check the link throughput \
                   panel; raise prefetch_depth or the VRAM budget, or use --fast-disk.",
        budget = "The vram tier has been within 2 % of its hard budget for 5 minutes; further \
                  loads must evict first. If stalls rise too, give the tier more memory.",
        errors =
            "stagehand counted 1 read errors in the last 5 minutes; see its log for the cause.",
    );
    let directory = tempfile::tempdir().expect("temp dir");
    let path = directory.path().join("alerts_test.yml");
    std::fs::write(&path, test).expect("write rule test");
    let output = promtool(&["test", "rules", &path.to_string_lossy()], None);
    assert!(output.status.success(), "{}", describe(&output));
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

/// Feeds every kind of event, with figures whose totals are easy to state.
fn feed(observer: &dyn Observer) {
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

#[test]
fn exposition_passes_promtool_lint() {
    // Proves what a scrape returns is valid and lint-clean for `promtool check metrics`.
    let observer = PrometheusObserver::in_process().expect("observer");
    feed(&observer);
    let text = observer.render();
    let output = promtool(&["check", "metrics"], Some(&text));
    let lint = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && lint.trim().is_empty(),
        "{}\nexposition:\n{text}",
        describe(&output)
    );
    for spec in CATALOG {
        let kind = spec.kind.as_str();
        assert!(
            text.contains(&format!("# TYPE {} {kind}\n", spec.name)),
            "{} missing or not a {kind}:\n{text}",
            spec.name
        );
        assert!(text.contains(&format!("# HELP {} ", spec.name)));
    }
}

#[test]
fn metrics_are_exported_at_zero_before_any_event() {
    // Proves every label combination exists from the first scrape, so rates and
    // `increase(...) > 0` see the first event rather than a series appearing from nowhere.
    let observer = PrometheusObserver::in_process().expect("observer");
    let samples = exposition::parse(&observer.render()).expect("parse exposition");
    for spec in CATALOG
        .iter()
        .filter(|spec| spec.kind == MetricKind::Counter)
    {
        let combinations: usize = spec.labels.iter().map(|label| label.values.len()).product();
        let found = samples
            .iter()
            .filter(|sample| sample.name == spec.name)
            .count();
        // Links are three of the four from/to pairs.
        let expected = if spec.name == catalog::LINK_TRANSFERRED_BYTES {
            3 * 2
        } else {
            combinations
        };
        assert_eq!(found, expected, "{}", spec.name);
    }
    assert_eq!(exposition::sum(&samples, catalog::ERRORS, &[]), 0.0);
}

#[test]
fn counters_equal_what_was_fed_in() {
    // Proves the exported figures are exactly the events' totals, which the run summary
    // also computes from the same Observer calls.
    let observer = PrometheusObserver::in_process().expect("observer");
    feed(&observer);
    let samples = exposition::parse(&observer.render()).expect("parse exposition");
    let value = |name: &str, labels: &[(&str, &str)]| exposition::sum(&samples, name, labels);
    let bytes = catalog::LINK_TRANSFERRED_BYTES;
    let disk_pinned = [("from", "disk"), ("to", "pinned"), ("owner", "model")];
    assert_eq!(value(bytes, &disk_pinned), 10.0 * f64::from(4 << 20));
    let pinned_vram = [("from", "pinned"), ("to", "vram")];
    assert_eq!(
        value(bytes, &pinned_vram),
        10.0 * f64::from(4 << 20) + 65_536.0
    );
    assert_eq!(value(bytes, &[("owner", "lora")]), 2.0 * 65_536.0);
    let latency_count = format!("{}_count", catalog::LINK_TRANSFER_DURATION);
    assert_eq!(
        value(&latency_count, &[("from", "disk"), ("to", "pinned")]),
        10.0
    );
    assert_eq!(value(&latency_count, &[]), 22.0);
    let latency_sum = format!("{}_sum", catalog::LINK_TRANSFER_DURATION);
    let disk_vram_seconds = value(&latency_sum, &[("from", "disk"), ("to", "vram")]);
    assert!((disk_vram_seconds - 0.03).abs() < 1e-12);

    let used = catalog::TIER_USED_BYTES;
    assert_eq!(
        value(used, &[("tier", "vram"), ("owner", "model")]),
        f64::from(24 << 20)
    );
    assert_eq!(
        value(used, &[("tier", "vram"), ("owner", "lora")]),
        65_536.0
    );
    assert_eq!(
        value(used, &[("tier", "vram"), ("owner", "other")]),
        f64::from(8 << 20)
    );
    assert_eq!(
        value(catalog::TIER_BUDGET_BYTES, &[("tier", "pinned")]),
        f64::from(64 << 20)
    );
    assert_eq!(
        value(catalog::TIER_RESIDENT_BLOCKS, &[("tier", "vram")]),
        6.0
    );
    assert_eq!(
        value(catalog::TIER_EVICTED_BLOCKS, &[("tier", "vram")]),
        7.0
    );
    assert_eq!(
        value(catalog::TIER_EVICTED_BLOCKS, &[("tier", "pinned")]),
        1.0
    );

    assert_eq!(value(catalog::COMPUTE_ACQUIRE_HITS, &[]), 28.0);
    assert_eq!(value(catalog::COMPUTE_ACQUIRE_MISSES, &[]), 12.0);
    let stall_sum = format!("{}_sum", catalog::COMPUTE_STALL);
    assert!((value(&stall_sum, &[]) - 1.5).abs() < 1e-12);
    let stall_zero_bucket = format!("{}_bucket", catalog::COMPUTE_STALL);
    assert_eq!(
        value(&stall_zero_bucket, &[("le", "0")]),
        1.0,
        "one batch never waited"
    );
    let steps = format!("{}_count", catalog::COMPUTE_STEP_DURATION);
    assert_eq!(value(&steps, &[]), 4.0);
    assert_eq!(value(catalog::PREFETCH_LEAD_BLOCKS, &[]), 4.0);
    assert_eq!(value(catalog::PREFETCH_SPECULATIVE_DECLINED, &[]), 2.0);
    assert_eq!(value(catalog::PIN_CONSOLIDATIONS, &[]), 1.0);
    assert_eq!(value(catalog::PIN_OPERATIONS, &[]), 2.0);
    assert_eq!(value(catalog::ERRORS, &[("kind", "read")]), 2.0);
    assert_eq!(value(catalog::ERRORS, &[("kind", "budget")]), 1.0);
    assert_eq!(value(catalog::ERRORS, &[]), 3.0);
}

#[test]
fn figures_match_the_run_summary_stats() {
    // Proves a scrape and the run summary agree: both are fed by the same Observer calls
    // (the summary by `Stats`), and every figure they share is equal.
    let observer = std::sync::Arc::new(PrometheusObserver::in_process().expect("observer"));
    let stats = std::sync::Arc::new(Stats::default());
    feed(&Tee(stats.clone(), observer.clone()));
    let summary = stats.snapshot();
    let samples = exposition::parse(&observer.render()).expect("parse exposition");
    let value = |name: &str, labels: &[(&str, &str)]| exposition::sum(&samples, name, labels);
    let close = |left: f64, right: f64| (left - right).abs() < 1e-6;

    let durations_sum = format!("{}_sum", catalog::LINK_TRANSFER_DURATION);
    let durations_count = format!("{}_count", catalog::LINK_TRANSFER_DURATION);
    for link in Link::ALL {
        let figures = summary.link(link);
        let on_link = [("from", link.from_label()), ("to", link.to_label())];
        let owned = |owner: &'static str| [on_link[0], on_link[1], ("owner", owner)];
        let bytes = catalog::LINK_TRANSFERRED_BYTES;
        assert_eq!(
            value(bytes, &owned("model")),
            figures.model_bytes as f64,
            "{link:?}"
        );
        assert_eq!(
            value(bytes, &owned("lora")),
            figures.lora_bytes as f64,
            "{link:?}"
        );
        assert_eq!(value(&durations_count, &on_link), figures.transfers as f64);
        assert!(
            close(value(&durations_sum, &on_link), figures.busy_seconds),
            "{link:?}"
        );
    }
    for (tier, figures) in [(Tier::Vram, summary.vram), (Tier::Pinned, summary.pinned)] {
        let on_tier = [("tier", tier.label())];
        assert_eq!(
            value(catalog::TIER_USED_BYTES, &on_tier),
            figures.used_bytes as f64
        );
        let model = [on_tier[0], ("owner", "model")];
        assert_eq!(
            value(catalog::TIER_USED_BYTES, &model),
            figures.model_bytes as f64
        );
        let lora = [on_tier[0], ("owner", "lora")];
        assert_eq!(
            value(catalog::TIER_USED_BYTES, &lora),
            figures.lora_bytes as f64
        );
        assert_eq!(
            value(catalog::TIER_BUDGET_BYTES, &on_tier),
            figures.budget_bytes as f64
        );
        assert_eq!(
            value(catalog::TIER_RESIDENT_BLOCKS, &on_tier),
            figures.blocks as f64
        );
        assert_eq!(
            value(catalog::TIER_EVICTED_BLOCKS, &on_tier),
            figures.evictions as f64
        );
    }
    assert_eq!(
        value(catalog::COMPUTE_ACQUIRE_HITS, &[]),
        summary.hits as f64
    );
    assert_eq!(
        value(catalog::COMPUTE_ACQUIRE_MISSES, &[]),
        summary.misses as f64
    );
    let stall_sum = format!("{}_sum", catalog::COMPUTE_STALL);
    assert!(close(value(&stall_sum, &[]), summary.stall_seconds));
    let steps_count = format!("{}_count", catalog::COMPUTE_STEP_DURATION);
    assert_eq!(value(&steps_count, &[]), summary.step_seconds.len() as f64);
    let steps_sum = format!("{}_sum", catalog::COMPUTE_STEP_DURATION);
    assert!(close(
        value(&steps_sum, &[]),
        summary.step_seconds.iter().sum()
    ));
    assert_eq!(
        value(catalog::PIN_CONSOLIDATIONS, &[]),
        summary.consolidations as f64
    );
    let operations = summary.consolidated_operations as f64;
    assert_eq!(value(catalog::PIN_OPERATIONS, &[]), operations);
    let declined = summary.speculative_declined as f64;
    assert_eq!(value(catalog::PREFETCH_SPECULATIVE_DECLINED, &[]), declined);
    assert_eq!(value(catalog::ERRORS, &[]), summary.errors as f64);
}

#[test]
fn served_metrics_match_the_in_process_rendering() {
    // Proves `install` really serves the observer's exposition over HTTP on loopback and
    // frees the port when the observer is dropped.
    let addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        probe.local_addr().expect("probe address")
    };
    let observer = stagehand::telemetry::install(addr).expect("install exporter");
    assert_eq!(observer.listen_addr(), Some(addr));
    observer.transfer(Link::DiskToPinned, Owner::Model, 12_345, 0.001);
    let body = http_get(addr, "/metrics");
    let samples = exposition::parse(&body).expect("parse served exposition");
    assert_eq!(
        exposition::sum(
            &samples,
            catalog::LINK_TRANSFERRED_BYTES,
            &[("to", "pinned")]
        ),
        12_345.0
    );
    let second = stagehand::telemetry::install(addr).expect_err("port already taken");
    assert!(second.to_string().contains("--metrics-addr"), "{second}");
    drop(observer);
    let again = stagehand::telemetry::install(addr).expect("port freed on drop");
    drop(again);
}

fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::Read;
    let timeout = Some(std::time::Duration::from_secs(5));
    let mut stream = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5))
        .expect("connect to exporter");
    stream.set_read_timeout(timeout).expect("read timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("send request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read response");
    let (head, body) = response.split_once("\r\n\r\n").expect("HTTP response");
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "{head}"
    );
    body.to_string()
}

//! promtool on what stagehand ships and serves: the rule file, every dashboard query,
//! the alerts' behaviour (promtool's rule unit tests), and a scrape's exposition.
//!
//! promtool comes from Debian's `prometheus` package (`scripts/install-prometheus.sh`);
//! when it is missing these tests fail and say so rather than pass silently.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::metrics::{dashboard, dashboard_expressions, feed, repo_path};
use stagehand::telemetry::{promql, PrometheusObserver, CATALOG};

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
    // The serve series exist only on a server's page (tests/serve_http.rs lints that).
    for spec in CATALOG
        .iter()
        .filter(|spec| !spec.name.starts_with("stagehand_serve_"))
    {
        let kind = spec.kind.as_str();
        assert!(
            text.contains(&format!("# TYPE {} {kind}\n", spec.name)),
            "{} missing or not a {kind}:\n{text}",
            spec.name
        );
        assert!(text.contains(&format!("# HELP {} ", spec.name)));
    }
}

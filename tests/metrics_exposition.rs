//! The exposition the observer renders: every series present from the first scrape,
//! counters equal to the events fed in and to the run summary's figures, and the same
//! text served over HTTP.

mod common;

use std::io::Write;

use common::metrics::feed;
use stagehand::actors::{Link, Observer, Owner, Stats, Tee, Tier};
use stagehand::telemetry::{catalog, exposition, MetricKind, PrometheusObserver, CATALOG};

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
        // Links are three of the four from/to pairs (the link bytes, and each
        // pipeline stage's).
        let per_link = spec.labels.iter().any(|label| label.name == "from");
        let expected = if per_link {
            combinations / 4 * 3
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

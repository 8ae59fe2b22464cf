use super::depth::{judge_depths, DepthFigures, DepthVerdict};
use super::*;

#[test]
fn the_cache_effect_is_the_profiles_cached_over_its_flushed_product_rate() {
    // Proves the caches line's figures come from the profile's `gflops` and
    // `cold_gflops` at one row of an f32 1024² weight, and that a profile without
    // kernel costs (a shipped GPU) has none.
    let text = r#"
[gpu]
name = "CPU"
vram = "8 GiB"
pcie_generation = 4
bf16_dense_tflops = 1
sustained_efficiency = 0.5
memory_gb_per_s = 30

[host]
ram = "16 GiB"

[disk]
read_gb_per_s = 1.0
request_latency_us = 70

[compute]
call_overhead_us = 0
attention_ns_per_score_dim = 1
cached_attention_ns_per_score_dim = 1

[compute.elementwise_ns]

[[compute.linear]]
dtype = "f32"
inner = 1024
outer = 1024
rows = [1, 8]
gflops = [12.0, 40.0]
cold_gflops = [6.0, 38.0]
"#;
    let profile = stagehand::sim::HardwareProfile::parse("box", "test", text).unwrap();
    assert_eq!(cache_effect(&profile), Some((12.0, 6.0)));
    let shipped = stagehand::sim::HardwareProfile::load("rtx4090").unwrap();
    assert_eq!(cache_effect(&shipped), None);
}

#[test]
fn a_depth_recommendation_is_judged_against_the_faster_depth_and_the_runs_spread() {
    // Proves the depth verdict: deep is recommended only when predicted faster by more
    // than 5 %; right when it measured within 5 % of the faster; a miss smaller than
    // the repeats' own spread is told apart from one larger.
    let figures = |predicted: f64, measured: f64, spread: f64| DepthFigures {
        predicted,
        measured,
        spread,
    };
    let resident = judge_depths(figures(3.0, 3.0, 0.16), figures(3.0, 2.6, 0.19));
    assert_eq!(
        resident,
        DepthVerdict {
            recommends_deep: false,
            deep_measured_faster: true,
            ok: false,
            within_spread: true,
        }
    );
    let clear_miss = judge_depths(figures(10.0, 10.0, 0.02), figures(12.0, 7.0, 0.03));
    assert!(!clear_miss.recommends_deep && !clear_miss.ok && !clear_miss.within_spread);
    let right = judge_depths(figures(10.0, 10.0, 0.02), figures(8.0, 7.0, 0.03));
    assert!(right.recommends_deep && right.ok && !right.within_spread);
    let tie = judge_depths(figures(10.0, 10.0, 0.02), figures(9.8, 10.3, 0.03));
    assert!(!tie.recommends_deep && tie.ok);
}

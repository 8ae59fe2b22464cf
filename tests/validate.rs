//! `stagehand validate --json` on a tiny matrix, and single rows of the real-model
//! families: every row's plan bytes and peak budgets predicted by the simulator equal
//! the real run's exactly (both sessions plan the same work and reserve the same
//! activations), the runs stream and verify, and bad input exits 2.

mod common;

use common::{assert_bad_input, stagehand};
use stagehand::calibrate::validate::{validate_case, Case, CaseModel, Row, Verdict};
use stagehand::compute::DType;
use stagehand::families::bert::{write_bert_folder, BertDemo};
use stagehand::families::llama::{write_decoder_folder, DecoderArch, DecoderDemo, DecoderPreset};
use stagehand::sim::HardwareProfile;

/// A calibrated-style profile with a shared bus and measured kernels (figures of
/// this order; the byte and peak figures checked here do not depend on them).
const PROFILE: &str = r#"
[calibration]
at_unix = 1
host = "test"
backend = "cpu"
stagehand = "0.1.0"

[gpu]
name = "CPU backend"
vram = "16 GiB"
pcie_generation = 0
bf16_dense_tflops = 0.05
sustained_efficiency = 1.0
memory_gb_per_s = 8

[host]
ram = "16 GiB"

[link]
pinned_gb_per_s = 10
pageable_gb_per_s = 10
latency_us = 5

[disk]
read_gb_per_s = 1.5
request_latency_us = 70
direct_read_gb_per_s = 1.1
page_cache_gb_per_s = 5.5

[shared]
cores = 2
memory_gb_per_s = 20

[compute]
call_overhead_us = 0.5
attention_ns_per_score_dim = 0.2
cached_attention_ns_per_score_dim = 1.2

[compute.elementwise_ns]
rms_norm = 0.9

[[compute.linear]]
dtype = "f32"
inner = 1024
outer = 1024
rows = [1, 8, 64]
gflops = [4.0, 17.0, 58.0]
"#;

#[test]
fn plan_bytes_and_peaks_are_predicted_exactly() {
    // Two rows (depth 0 and 2) of a 64-wide demo model: the simulator's plan bytes
    // per step and peak VRAM / pinned equal what the real session planned and used.
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("profile.toml");
    std::fs::write(&profile, PROFILE).unwrap();
    let output = stagehand()
        .args([
            "validate",
            "--quick",
            "--json",
            "--no-decoder",
            "--steps",
            "4",
        ])
        .args(["--demo-dim", "64", "--hardware"])
        .arg(&profile)
        .arg("--cache-dir")
        .arg(dir.path())
        .arg("--traces")
        .arg(dir.path().join("traces"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{report}");
    // Each row's two timelines, simulated and real, with the blocks' compute on them.
    for depth in [0, 2] {
        for side in ["sim", "run"] {
            let name = format!("linear-stack-b8-v50-d{depth}.{side}.json");
            let text = std::fs::read_to_string(dir.path().join("traces").join(&name))
                .unwrap_or_else(|error| panic!("{name}: {error}"));
            let trace: serde_json::Value = serde_json::from_str(&text).unwrap();
            let computed = trace["traceEvents"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|event| event["ph"] == "X" && event["name"] == "blocks.0")
                .count();
            assert!(computed >= 4, "{name}: {computed} spans of blocks.0");
        }
    }
    for row in rows {
        for key in [
            "plan_streamed_bytes",
            "plan_disk_bytes",
            "peak_vram_bytes",
            "peak_pinned_bytes",
        ] {
            let figure = &row[key];
            assert_eq!(figure["predicted"], figure["measured"], "{key}: {row}");
        }
        assert_eq!(row["verified"], true, "{row}");
        assert_ne!(row["verdict"], "plan_miss", "{row}");
        // The second prediction uses the run's own link rates, against the same
        // measured steps; the profile's rates are reported beside them.
        let rates = &row["link_rates"];
        assert_eq!(rates["profile_copy_gb_per_s"], 10.0, "{row}");
        assert_eq!(rates["profile_read_gb_per_s"], 5.5, "{row}");
        assert!(rates["run_copy_gb_per_s"].as_f64().unwrap() > 0.0, "{row}");
        for (at_run, profile) in [
            ("steady_at_run_rates", "steady_step_seconds"),
            ("cold_at_run_rates", "cold_step_seconds"),
        ] {
            assert_eq!(row[at_run]["measured"], row[profile]["measured"], "{row}");
            assert!(row[at_run]["predicted"].as_f64().unwrap() > 0.0, "{row}");
        }
        assert_ne!(row["verdict_at_run_rates"], "plan_miss", "{row}");
        // Three real runs (the default) each give a steady and a cold step; the
        // measured figure is their median.
        for (repeats, figure) in [
            ("steady_repeats", "steady_step_seconds"),
            ("cold_repeats", "cold_step_seconds"),
        ] {
            let mut seconds: Vec<f64> = row[repeats]["seconds"]
                .as_array()
                .unwrap()
                .iter()
                .map(|value| value.as_f64().unwrap())
                .collect();
            assert_eq!(seconds.len(), 3, "{row}");
            seconds.sort_by(f64::total_cmp);
            assert_eq!(
                row[figure]["measured"].as_f64().unwrap(),
                seconds[1],
                "{row}"
            );
            let spread = (seconds[2] - seconds[0]) / seconds[1];
            let reported = row[repeats]["spread"].as_f64().unwrap();
            assert!((reported - spread).abs() < 1e-9, "{row}");
        }
    }
    // The budget makes the demo stream: bytes cross every step.
    assert!(rows[1]["plan_streamed_bytes"]["measured"].as_f64().unwrap() > 0.0);
    // The machine's speed now against the profile: the same two products timed
    // before and after the matrix, each beside the figure the profile's table holds.
    for when in ["before", "after"] {
        let probes = report["speed_against_profile"][when].as_array().unwrap();
        assert_eq!(probes.len(), 2, "{report}");
        for (probe, (rows, table_gflops)) in probes.iter().zip([(1, 4.0), (64, 58.0)]) {
            assert_eq!(probe["rows"], rows, "{probe}");
            let profile_gflops = probe["profile_gflops"].as_f64().unwrap();
            assert!((profile_gflops - table_gflops).abs() < 1e-9, "{probe}");
            assert!(probe["gflops"].as_f64().unwrap() > 0.0, "{probe}");
        }
    }
}

/// Runs one case both ways on [`PROFILE`] and checks the exact figures of its row.
fn assert_exact_row(model: CaseModel, batch: usize, prefetch_depth: u32) -> Row {
    let profile = HardwareProfile::parse("test", "test", PROFILE).unwrap();
    let case = Case {
        model,
        batch,
        vram_share: 0.5,
        prefetch_depth,
        fast_disk: false,
        steps: 5,
        repeats: 1,
        cuda: false,
    };
    let row = validate_case(&case, &profile, None).unwrap();
    for (key, figure) in [
        ("plan_streamed_bytes", row.plan_streamed_bytes),
        ("plan_disk_bytes", row.plan_disk_bytes),
        ("peak_vram_bytes", row.peak_vram_bytes),
        ("peak_pinned_bytes", row.peak_pinned_bytes),
    ] {
        assert_eq!(figure.predicted, figure.measured, "{key}: {row:?}");
    }
    assert!(row.verified, "{row:?}");
    assert_ne!(row.verdict, Verdict::PlanMiss, "{row:?}");
    row
}

#[test]
fn a_decoder_rows_peaks_count_its_kv_cache_exactly() {
    // The tiny Llama at half its bytes: the description reserves the KV cache the run
    // reserves (pages of the prompt, then growth), so peak VRAM is exact at both depths.
    let dir = tempfile::tempdir().unwrap();
    let demo = DecoderDemo {
        arch: DecoderArch::Llama,
        preset: DecoderPreset::Tiny,
        dtype: DType::F32,
        seed: 7,
        shard_bytes: 1 << 30,
    };
    let path = write_decoder_folder(&dir.path().join("llama"), &demo).unwrap();
    for depth in [0, 2] {
        let row = assert_exact_row(CaseModel::Decoder { path: path.clone() }, 1, depth);
        assert!(row.plan_streamed_bytes.measured > 0.0, "{row:?}");
    }
}

#[test]
fn an_encoder_rows_bytes_and_peaks_are_exact() {
    // The tiny BERT embedding the 8 built-in sentences a step, at half its bytes.
    let dir = tempfile::tempdir().unwrap();
    let path = write_bert_folder(&dir.path().join("bert"), &BertDemo::default()).unwrap();
    for depth in [0, 2] {
        assert_exact_row(CaseModel::Encoder { path: path.clone() }, 8, depth);
    }
}

#[test]
fn no_repeats_is_bad_input() {
    let output = stagehand()
        .args(["validate", "--quick", "--repeats", "0"])
        .output()
        .unwrap();
    assert_bad_input(&output, &["--repeats 0", "between 1 and 20"]);
}

#[test]
fn too_few_steps_is_bad_input() {
    // A steady step needs a cold and a warm-up step before it.
    let output = stagehand()
        .args(["validate", "--steps", "2"])
        .output()
        .unwrap();
    assert_bad_input(&output, &["--steps 2", "at least 3"]);
}

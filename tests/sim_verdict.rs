//! `stagehand simulate`'s verdict, for scripts and for people: exit 0 when the model
//! fits and 3 when it does not (after the report), advice that is true for the case
//! (no smaller depth suggested when none fits), the step in the model's own unit, and
//! a warning when a model that fits is too slow to use.

mod common;

use common::stagehand;

fn simulate(args: &[&str]) -> (Option<i32>, String, String) {
    let output = stagehand()
        .current_dir(std::env::temp_dir())
        .arg("simulate")
        .args(args)
        .output()
        .expect("binary runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_model_that_does_not_fit_exits_3_with_the_value_that_would_work() {
    // Llama-3-70B's largest block (1.96 GiB) alone exceeds 1 GiB: no depth fits, so the
    // refusal names the least budget that works, the one at prefetch depth 0 (one slot
    // and the KV cache's first 2.54 GiB at its 4096-token context).
    let (code, stdout, stderr) = simulate(&[
        "--model",
        "llama3-70b",
        "--hardware",
        "rtx3060-12gb",
        "--vram-budget",
        "1GiB",
    ]);
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(stdout.contains("fits: NO"), "{stdout}");
    assert!(
        stdout.contains("set --vram-budget 4.50GiB or more with --prefetch-depth 0"),
        "{stdout}"
    );
    assert!(stdout.contains("8.41 GiB at prefetch_depth 2"), "{stdout}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("does not fit: llama3-70b on rtx3060-12gb"),
        "{stderr}"
    );
    // The same verdict in JSON, with the same exit status.
    let (code, stdout, _) = simulate(&[
        "--model",
        "llama3-70b",
        "--hardware",
        "rtx3060-12gb",
        "--vram-budget",
        "1GiB",
        "--json",
    ]);
    assert_eq!(code, Some(3));
    let verdict: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(verdict["fits"], false);
    assert_eq!(
        verdict["fit"]["failures"][0]["fits_at_depth"],
        serde_json::Value::Null
    );
}

#[test]
fn a_smaller_depth_is_suggested_only_when_it_fits() {
    let (code, stdout, _) = simulate(&[
        "--model",
        "llama3-70b",
        "--hardware",
        "rtx3060-12gb",
        "--vram-budget",
        "7GiB",
        "--prefetch-depth",
        "2",
    ]);
    assert_eq!(code, Some(3));
    // Depth 2 needs 3 slots of 1.96 GiB and the KV cache's 2.54 GiB; depth 1 fits in 7.
    assert!(
        stdout.contains("set --vram-budget 8.42GiB or more, or --prefetch-depth 1"),
        "{stdout}"
    );
}

#[test]
fn a_model_that_fits_exits_0_and_reports_its_unit() {
    let (code, stdout, _) = simulate(&["--model", "flux1-dev", "--hardware", "rtx4090"]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("s/image"), "{stdout}");
    assert!(!stdout.contains("warning:"), "{stdout}");
    let (code, stdout, _) = simulate(&["--model", "llama3-8b", "--hardware", "rtx4090", "--json"]);
    assert_eq!(code, Some(0));
    let verdict: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(verdict["stagehand_rate"]["unit"], "tokens/s");
    assert_eq!(verdict["output"]["unit"], "token");
    assert!(verdict["stagehand_rate"]["value"].as_f64().unwrap() > 1.0);
}

#[test]
fn a_model_that_fits_but_is_unusably_slow_says_so() {
    // Mixtral from an HDD: it fits, at hundreds of seconds per token.
    let (code, stdout, _) = simulate(&[
        "--model",
        "mixtral-8x7b",
        "--hardware",
        "rtx3060-12gb",
        "--disk",
        "hdd",
        "--no-baselines",
    ]);
    assert_eq!(code, Some(0), "fitting is not failing: {stdout}");
    assert!(stdout.contains("fits: yes"), "{stdout}");
    let warning = stdout
        .lines()
        .find(|line| line.starts_with("warning: impractically slow"))
        .unwrap_or_else(|| panic!("no warning: {stdout}"));
    assert!(warning.contains("below 1 token/s"), "{warning}");
    assert!(warning.contains("limited by the disk"), "{warning}");
}

#[test]
fn the_fit_of_flux_dev_on_a_4090_counts_its_activations_and_states_the_margin() {
    // Issue 40, friction 5: the shipped flux1-dev description carried no activations,
    // so an RTX 4090 read 22.17 of 23.75 GiB used while a 1024² step reserves 1.44 GiB
    // more. The verdict counts them and states the margin that is really left.
    let (code, stdout, _) = simulate(&["--model", "flux1-dev", "--hardware", "rtx4090"]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains(
            "fits: yes, 23.60 GiB of 23.75 GiB VRAM (weights 22.17 GiB resident, activations 1.44 GiB counted), margin 149.44 MiB"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("at 1024×1024 with 512 text tokens by the flux family's own code"),
        "{stdout}"
    );
    let (_, stdout, _) = simulate(&["--model", "flux1-dev", "--hardware", "rtx4090", "--json"]);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let fit = &report["fit"];
    let activation_bytes = fit["activation_bytes"].as_u64().unwrap();
    assert_eq!(
        Some(activation_bytes),
        report["activations"]["reserved_bytes"].as_u64()
    );
    assert_eq!(
        fit["vram_used_bytes"].as_u64().unwrap(),
        fit["model_bytes"].as_u64().unwrap() + activation_bytes
    );
    assert_eq!(
        fit["vram_margin_bytes"].as_u64().unwrap(),
        fit["vram_budget_bytes"].as_u64().unwrap() - fit["vram_used_bytes"].as_u64().unwrap()
    );
}

#[test]
fn a_description_without_activations_says_they_are_not_counted() {
    // A model description of one's own with no [activations]: the verdict says the fit
    // is the weights' alone rather than leaving them out in silence.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mine.toml");
    std::fs::write(
        &path,
        "dtype = \"bf16\"\ntokens_per_step = 1\nblock_count = 4\nbytes_per_block = 1048576\nflops_per_token_per_block = 1e6\n",
    )
    .unwrap();
    let (code, stdout, _) = simulate(&["--model", path.to_str().unwrap(), "--hardware", "rtx4090"]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("activations: none counted (the description states none)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("activations not counted), margin"),
        "{stdout}"
    );
}

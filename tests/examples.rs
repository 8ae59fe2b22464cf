//! The programs in `examples/` run and do what they say: an embedding program, a
//! generation program, and an engine driving its own forward pass through the
//! block-prefetch API. `cargo test` builds the examples before it runs the tests; each
//! is run here as a user runs it.

use std::path::PathBuf;
use std::process::Command;

/// The built example `name`, beside this test's binary (`target/<profile>/examples`).
fn example(name: &str) -> PathBuf {
    let test_binary = std::env::current_exe().expect("the test binary's path");
    let profile_dir = test_binary
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.is_file(),
        "{} is not built: run the tests with `cargo test` (which builds the examples), or `cargo build --examples` first",
        path.display()
    );
    path
}

/// Runs example `name` with `args`; its stdout, after checking it succeeded.
fn run(name: &str, args: &[&str]) -> String {
    let output = Command::new(example(name))
        .args(args)
        .env("TMPDIR", std::env::temp_dir())
        .output()
        .expect("the example starts");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{name} failed: {}\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn the_embedding_example_embeds_and_verifies_its_texts() {
    let stdout = run("embed", &[]);
    assert!(
        stdout.contains("3 texts embedded in 128 dimensions")
            && stdout.contains("1 step verified against the fully-resident pass"),
        "{stdout}"
    );
    // Three texts: three pairs, each a cosine in [-1, 1].
    let cosines: Vec<f32> = stdout
        .lines()
        .filter_map(|line| line.split(" = ").nth(1)?.parse().ok())
        .collect();
    assert_eq!(cosines.len(), 3, "{stdout}");
    assert!(cosines.iter().all(|c| (-1.0..=1.0).contains(c)), "{stdout}");
}

#[test]
fn the_generation_example_decodes_verified_tokens() {
    let stdout = run("generate", &[]);
    let tokens = stdout
        .lines()
        .find_map(|line| line.strip_prefix("tokens: "))
        .unwrap_or_else(|| panic!("no tokens line: {stdout}"));
    assert_eq!(tokens.matches(',').count() + 1, 9, "{stdout}");
    assert!(
        stdout.contains("9 steps verified against the fully-resident pass"),
        "{stdout}"
    );
}

#[test]
fn the_block_prefetch_engine_matches_its_resident_pass_and_releases_everything() {
    let stdout = run("block_prefetch", &["4"]);
    assert!(
        stdout.contains("4 steps over 8 blocks: 4 equal to the resident pass bit for bit")
            && stdout.contains("budgets back to 0 B VRAM and 0 B pinned"),
        "{stdout}"
    );
}

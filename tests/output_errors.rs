//! A closed or full stdout or stderr never makes `stagehand` panic (status 101): a
//! reader that went away (`| head -1`) is quiet and the command's own status stands;
//! a full device (`> /dev/full`) is reported on stderr with status 1.

mod common;

use std::fs::OpenOptions;
use std::process::Stdio;

use common::process::{shell_status, wait_or_kill, HANG};
use common::stagehand;

fn dev_full() -> std::fs::File {
    OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full exists on Linux")
}

#[test]
fn a_closed_stdout_is_quiet_and_keeps_the_status() {
    // Proves a run whose reader closed the pipe before the summary exits 0 without a
    // panic (`stagehand run | head -1`, with nothing read at all).
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let mut child = stagehand()
        .args([
            "run", "--device", "cpu", "--quiet", "--steps", "1", "--model",
        ])
        .arg(&model)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    drop(child.stdout.take());
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr readable");
    let status = wait_or_kill(&mut child, HANG);
    assert_eq!(shell_status(status), 0, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_full_stdout_is_reported_with_status_1() {
    // Proves output to a full device is one clean error line and status 1, for a run
    // and for inspect.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let commands: [Vec<String>; 2] = [
        vec![
            "run".into(),
            "--device".into(),
            "cpu".into(),
            "--log".into(),
            "warn".into(),
            "--quiet".into(),
            "--steps".into(),
            "1".into(),
            "--model".into(),
            model.to_string_lossy().into_owned(),
        ],
        vec!["inspect".into(), model.to_string_lossy().into_owned()],
    ];
    for args in commands {
        let output = stagehand()
            .args(&args)
            .stdout(dev_full())
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(stderr.contains("No space left"), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    }
}

#[test]
fn a_full_stderr_never_panics() {
    // Proves errors, logs and help written to a full device keep their status:
    // bad input still exits 2, help still exits 0.
    let output = stagehand()
        .args(["inspect", "/no/such/model.safetensors"])
        .stderr(dev_full())
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2));
    let output = stagehand()
        .arg("--help")
        .stdout(dev_full())
        .stderr(dev_full())
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0));
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let output = stagehand()
        .args(["run", "--device", "cpu", "--steps", "1", "--model"])
        .arg(&model)
        .stdout(Stdio::null())
        .stderr(dev_full())
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0), "logs lost, run fine");
}

//! A model writer killed with SIGKILL — no handler runs, no cleanup — leaves nothing in
//! its folder: the file is written unnamed (`O_TMPFILE`) and named only when complete.

mod common;

use std::time::{Duration, Instant};

use common::process::{send_signal, writes_unnamed_into};

#[test]
fn a_writer_killed_midway_leaves_no_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("model");
    std::fs::create_dir(&out).expect("folder");
    // 1 GiB: long enough to be killed in the middle of its write.
    let mut child = common::stagehand()
        .args([
            "demo-model",
            "--blocks",
            "64",
            "--layers-per-block",
            "4",
            "--dim",
            "1024",
        ])
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("stagehand starts");
    let started = Instant::now();
    while !writes_unnamed_into(child.id(), &out) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the writer never opened its unnamed file"
        );
        if child.try_wait().expect("status").is_some() {
            panic!("the writer finished before it could be killed");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    send_signal(&child, libc::SIGKILL);
    let status = child.wait().expect("reaped");
    assert_eq!(status.code(), None, "killed, not exited");
    let left: Vec<String> = std::fs::read_dir(&out)
        .expect("folder")
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "the killed writer left {left:?}");
}

//! Signals: a first SIGINT or SIGTERM stops `stagehand` at the next safe point of
//! whatever it is doing — streaming steps, writing a model, waiting for another
//! process's cache fill — releases every budget, leaves no partial file, and exits
//! 128 + the signal (130, 143); a second signal exits at once.

mod common;

use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::process::{
    send_signal, shell_status, wait_for_line, wait_or_kill, writes_unnamed_into, HANG,
};
use common::stagehand;

fn endless_run(model: &Path) -> Command {
    run_of(model, "0")
}

fn run_of(model: &Path, steps: &str) -> Command {
    let mut command = stagehand();
    command
        .args([
            "run", "--device", "cpu", "--quiet", "--steps", steps, "--model",
        ])
        .arg(model)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("listable")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

#[test]
fn sigint_stops_an_endless_run_with_every_budget_released_and_status_130() {
    // Proves `--steps 0` (run until stopped), once stepping, ends on SIGINT at a step
    // boundary, prints its summary with both budgets back at zero, and exits 130.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let mut child = endless_run(&model).spawn().expect("starts");
    let (_, rest) = wait_for_line(child.stderr.take().expect("stderr"), "step 1 ran");
    send_signal(&child, libc::SIGINT);
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut stdout)
        .expect("stdout readable");
    let status = wait_or_kill(&mut child, HANG);
    let stderr = rest.join().expect("stderr").join("\n");
    assert_eq!(shell_status(status), 130, "stderr: {stderr}");
    assert!(stderr.contains("stopped by SIGINT"), "{stderr}");
    assert!(stdout.contains("vram 0 B pinned 0 B held"), "{stdout}");
}

#[test]
fn sigterm_stops_a_long_counted_run_with_its_summary_and_status_143() {
    // Proves a run of a million steps stops on SIGTERM at a step boundary: its summary
    // counts the steps that ran (and verifies only those the reference pass reached
    // before the stop), both budgets are back at zero, status 143.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let mut child = run_of(&model, "1000000").spawn().expect("starts");
    let (_, rest) = wait_for_line(child.stderr.take().expect("stderr"), "step 1 ran");
    send_signal(&child, libc::SIGTERM);
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut stdout)
        .expect("stdout readable");
    let status = wait_or_kill(&mut child, HANG);
    let stderr = rest.join().expect("stderr").join("\n");
    assert_eq!(shell_status(status), 143, "stderr: {stderr}");
    assert!(stderr.contains("stopped by SIGTERM"), "{stderr}");
    assert!(stdout.contains("vram 0 B pinned 0 B held"), "{stdout}");
    assert!(!stdout.contains("1000000 steps"), "{stdout}");
}

#[test]
fn a_second_signal_exits_at_once() {
    // Proves the second of two signals ends the process without the graceful stop:
    // no summary, no "stopped by" line. The child is stopped while both are sent, so
    // both are pending together and handled back to back when it continues.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let mut child = endless_run(&model).spawn().expect("starts");
    let (_, rest) = wait_for_line(child.stderr.take().expect("stderr"), "step 1 ran");
    send_signal(&child, libc::SIGSTOP);
    send_signal(&child, libc::SIGINT);
    send_signal(&child, libc::SIGTERM);
    send_signal(&child, libc::SIGCONT);
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut stdout)
        .expect("stdout readable");
    let status = wait_or_kill(&mut child, HANG);
    let stderr = rest.join().expect("stderr").join("\n");
    let code = shell_status(status);
    assert!(
        code == 130 || code == 143,
        "status {code}; stderr: {stderr}"
    );
    assert!(status.code().is_some(), "exited through _exit, not killed");
    assert!(!stderr.contains("stopped by"), "{stderr}");
    assert!(stdout.is_empty(), "no summary: {stdout}");
}

#[test]
fn sigterm_while_writing_a_model_leaves_no_partial_file() {
    // Proves a model interrupted while being written leaves neither its temporary
    // file nor a model under the real name, and exits 143.
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("models");
    let mut child = stagehand()
        .args([
            "demo-model",
            "--blocks",
            "16",
            "--layers-per-block",
            "4",
            "--dim",
            "2048",
        ])
        .arg("--out")
        .arg(&out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    // The file exists, unnamed (or as a named `.tmp` where the filesystem has no
    // O_TMPFILE), as soon as the write has started.
    let started = std::time::Instant::now();
    let pid = child.id();
    let writing = |out: &Path| {
        out.is_dir()
            && (writes_unnamed_into(pid, out)
                || entries(out).iter().any(|name| name.ends_with(".tmp")))
    };
    while !writing(&out) {
        assert!(started.elapsed() < HANG, "the write never started");
        assert!(
            child.try_wait().expect("wait").is_none(),
            "ended before the test signalled"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    send_signal(&child, libc::SIGTERM);
    let status = wait_or_kill(&mut child, HANG);
    assert_eq!(shell_status(status), 143);
    assert_eq!(entries(&out), Vec::<String>::new(), "nothing left behind");
}

#[test]
fn a_signal_ends_the_wait_for_another_process_filling_the_cache() {
    // Proves a run waiting for the cache lock (another process writing the same
    // model) stops on SIGTERM instead of waiting on, and leaves nothing behind.
    let cache = tempfile::tempdir().expect("temp dir");
    let lock = std::fs::File::create(cache.path().join(".linear-stack.safetensors.lock"))
        .expect("lock file");
    // SAFETY: a valid descriptor; the lock is released when `lock` is dropped.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let mut child = stagehand()
        .args(["run", "--device", "cpu", "--quiet", "--cache-dir"])
        .arg(cache.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let (_, rest) = wait_for_line(
        child.stderr.take().expect("stderr"),
        "waiting for another stagehand process",
    );
    send_signal(&child, libc::SIGTERM);
    let status = wait_or_kill(&mut child, HANG);
    let stderr = rest.join().expect("stderr").join("\n");
    assert_eq!(shell_status(status), 143, "{stderr}");
    assert!(stderr.contains("stopped by SIGTERM"), "{stderr}");
    assert_eq!(
        entries(cache.path()),
        [".linear-stack.safetensors.lock"],
        "no model and no temporary file"
    );
}

//! Running the binary as a user would, with a watchdog: a command that used to hang
//! must fail its test rather than hang the suite. The watchdog's limit is generous (it
//! detects a hang, it does not time anything); no test asserts how long a run took.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStderr, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// Far longer than any of these commands takes on a loaded 2-core machine in a debug
/// build, far shorter than forever.
pub const HANG: Duration = Duration::from_secs(300);

/// Runs `command` to completion, killing it (and failing) if it is still running
/// after [`HANG`].
pub fn output_within_deadline(command: &mut Command) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = wait_or_kill(&mut child, HANG);
    Output {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}

/// Waits for `child`; kills it and panics if it outlives `limit`.
pub fn wait_or_kill(child: &mut Child, limit: Duration) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the command hung (still running after {limit:?}): killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads `stderr` line by line until one contains `needle`; returns the lines read.
/// Panics if the stream ends first. Keeps draining in the background afterwards so
/// the child never blocks on a full pipe.
pub fn wait_for_line(
    stderr: ChildStderr,
    needle: &str,
) -> (Vec<String>, std::thread::JoinHandle<Vec<String>>) {
    let mut reader = BufReader::new(stderr);
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        let read = reader.read_line(&mut line).expect("stderr readable");
        assert!(read > 0, "stderr ended before {needle:?}: {lines:?}");
        let found = line.contains(needle);
        lines.push(line);
        if found {
            break;
        }
    }
    let rest = std::thread::spawn(move || {
        reader
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    (lines, rest)
}

/// Sends `signal` to `child`.
pub fn send_signal(child: &Child, signal: i32) {
    // SAFETY: kill(2) on a pid we spawned and have not reaped yet.
    let sent = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    assert_eq!(sent, 0, "signal {signal} delivered");
}

/// The exit status as a shell reports it: the code, or 128 + the signal.
pub fn shell_status(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Whether process `pid` holds an open file in `dir` that has no name yet.
pub fn writes_unnamed_into(pid: u32, dir: &std::path::Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            target.starts_with(dir) && target.to_string_lossy().ends_with("(deleted)")
        })
    })
}

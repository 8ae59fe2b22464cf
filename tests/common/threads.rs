//! This process's threads, by name, for the tests that check none outlives its owner.
//!
//! A joined thread can still be listed for a moment: `pthread_join` returns when the
//! kernel clears the thread's id, which it does early in the thread's exit, before
//! the task is released from `/proc/self/task`. A count taken right after a drop that
//! joined its workers can therefore include one that has already ended (a storage
//! test saw it once in 26 suite runs). [`settled_threads`] waits for such exits to
//! finish; a thread that really outlives its owner never leaves and still fails the
//! test.

use std::time::{Duration, Instant};

/// Names of this process's threads for which `wanted` holds.
pub fn threads_named(wanted: impl Fn(&str) -> bool) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim_end().to_string())
        .filter(|name| wanted(name))
        .collect()
}

/// How long a joined thread may take to leave `/proc/self/task`.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// [`threads_named`] once at most `expected` are left, or after [`EXIT_GRACE`]: the
/// threads still listed then.
pub fn settled_threads(wanted: impl Fn(&str) -> bool, expected: usize) -> Vec<String> {
    let started = Instant::now();
    loop {
        let names = threads_named(&wanted);
        if names.len() <= expected || started.elapsed() >= EXIT_GRACE {
            return names;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The threads stagehand starts: its own (`stagehand-…`) and the storage readers'
/// (`sh-rd…`).
pub fn is_ours(name: &str) -> bool {
    name.starts_with("stagehand") || name.starts_with("sh-")
}

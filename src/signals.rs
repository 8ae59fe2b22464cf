//! SIGINT and SIGTERM. The first one asks the process to stop at its next safe point —
//! whatever phase it is in: reading or checking a model, writing one, waiting for a
//! lock, streaming steps, calibrating — and every budget is released on the way out.
//! A second one exits at once. Either way the exit status is 128 + the signal number
//! (130 for SIGINT, 143 for SIGTERM), the shell's convention for "ended by a signal".
//!
//! The handler (installed with `sigaction`) does only async-signal-safe work: on the
//! first signal it records the signal number and sets the process-wide stop flag; on
//! the second it calls `_exit`. Long phases poll [`check`] between units of work
//! (a block, a chunk, a step), and the session's waits poll the same flag, so no phase
//! can outlast a stop request by more than one unit of work.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};

/// The signal that asked the process to stop (0: none yet).
static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Set by the first signal; shared with every session and driver of this process.
static STOP: OnceLock<Arc<AtomicBool>> = OnceLock::new();
/// Set by a server once it serves: the first signal asks for a drain and leaves
/// [`STOP`] down (see [`drain_on_first_signal`]).
static DRAINS: AtomicBool = AtomicBool::new(false);

/// A phase gave up because a stop was requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("interrupted by {}", signal_name(*.signal))]
pub struct Interrupted {
    pub signal: i32,
}

fn stop() -> &'static Arc<AtomicBool> {
    STOP.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

extern "C" fn on_signal(signal: libc::c_int) {
    if SIGNAL
        .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        // SAFETY: `_exit` is async-signal-safe; the second signal ends the process
        // without running destructors, which is what "at once" means.
        unsafe { libc::_exit(128 + signal) };
    }
    stop_work_unless_draining();
}

/// The first signal's effect on the work: the stop flag is raised, unless a server
/// drains (then the work in flight must finish, and nothing it polls may see a stop).
fn stop_work_unless_draining() {
    if DRAINS.load(Ordering::SeqCst) {
        return;
    }
    // `install` initialised the flag before the handler existed, so `get` is a plain
    // atomic load here: no allocation, no lock.
    if let Some(flag) = STOP.get() {
        flag.store(true, Ordering::SeqCst);
    }
}

/// For a server, once it serves: from now on the first SIGINT or SIGTERM only asks
/// for a drain ([`received`] names it) and leaves the stop flag down, so the requests
/// in flight — a block read checking its checksum, an image's session waiting for a
/// copy — are never interrupted by it; the server refuses new work, waits for those
/// in flight and stops its models itself. A second signal still exits at once.
/// (Lowering the flag after it was raised, as [`take_stop_request`] does, leaves a
/// window in which the work in flight sees it: an image job failed with a 500 so.)
pub fn drain_on_first_signal() {
    DRAINS.store(true, Ordering::SeqCst);
}

/// Installs the handler for SIGINT and SIGTERM. Call once, first thing in `main`.
pub fn install() {
    stop();
    // SAFETY: `action` is fully initialised (zeroed, then the fields we set), the
    // handler only touches atomics and `_exit`, and we pass valid pointers.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SA_RESTART: a read or write the signal lands in is resumed, not failed with
        // EINTR; the phase then sees the flag at its next check.
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        for signal in [libc::SIGINT, libc::SIGTERM] {
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// The process-wide stop flag, for sessions and drivers that take one.
pub fn stop_flag() -> Arc<AtomicBool> {
    Arc::clone(stop())
}

/// The signal that asked the process to stop, if one did.
pub fn received() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

/// `Err` once a stop was requested: call between units of work.
pub fn check() -> Result<(), Interrupted> {
    if stop().load(Ordering::Relaxed) {
        return Err(Interrupted {
            signal: received().unwrap_or(libc::SIGINT),
        });
    }
    Ok(())
}

/// For a server that drains on the first signal: whether a stop was requested, and if
/// so, lowers the flag again so the work it still finishes is not interrupted by it.
/// [`received`] still names the signal, and a second signal still exits at once.
pub fn take_stop_request() -> bool {
    stop().swap(false, Ordering::SeqCst)
}

/// Asks the process to stop as `signal` would (the first-signal half of the handler).
/// For tests, which cannot send themselves a signal without stopping their runner.
pub fn request_stop(signal: i32) {
    let _ = SIGNAL.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
    stop();
    stop_work_unless_draining();
}

/// The exit status for a process stopped by `signal`: 128 + its number.
pub fn exit_status(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(u8::MAX)
}

/// "SIGINT", "SIGTERM", or the number.
pub fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".to_string(),
        libc::SIGTERM => "SIGTERM".to_string(),
        other => format!("signal {other}"),
    }
}

//! A server's first signal asks for a drain and never interrupts the work in flight:
//! once `drain_on_first_signal` is set, the stop that work polls stays down while the
//! signal is still named. (Before, the flag was raised and lowered again by the
//! server's drain loop: an image job that polled it in between failed with a 500.)
//!
//! One test in its own binary: the flag and the mode are process-wide.

use stagehand::signals;

#[test]
fn serving_the_first_signal_is_named_but_interrupts_no_work() {
    signals::drain_on_first_signal();
    signals::request_stop(libc::SIGTERM);
    assert_eq!(signals::received(), Some(libc::SIGTERM));
    assert_eq!(signals::check(), Ok(()), "work in flight saw the stop");
    assert!(!signals::stop_flag().load(std::sync::atomic::Ordering::SeqCst));
    assert!(!signals::take_stop_request(), "nothing to lower");
}

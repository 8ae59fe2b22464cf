//! "Still working" for anything that may take more than a second or two.
//!
//! A [`Status`] says nothing if the work ends quickly. Once it has run for
//! [`SHOW_AFTER`], it shows: a spinner with the elapsed time and the latest message
//! when stderr is a terminal, else one plain line on stderr (a CI log gets a line, not
//! a stream of redraws). Messages set later go to the spinner, or, without a terminal,
//! each on its own line.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::logging::stderr_is_terminal;

/// Work shorter than this shows nothing.
pub const SHOW_AFTER: Duration = Duration::from_millis(1500);

struct Shared {
    message: String,
    /// Shown (a spinner drawn, or the plain line printed).
    shown: bool,
}

pub struct Status {
    label: String,
    bar: ProgressBar,
    terminal: bool,
    shared: Arc<Mutex<Shared>>,
    stop: Option<flume::Sender<()>>,
    timer: Option<std::thread::JoinHandle<()>>,
}

impl Status {
    /// Starts timing `label` ("writing the demo model"); shows after [`SHOW_AFTER`].
    pub fn start(label: impl Into<String>) -> Self {
        let label = label.into();
        let terminal = stderr_is_terminal();
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {prefix} ({elapsed}) {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_prefix(label.clone());
        let shared = Arc::new(Mutex::new(Shared {
            message: String::new(),
            shown: false,
        }));
        let (stop, stopped) = flume::bounded::<()>(1);
        let timer = {
            let bar = bar.clone();
            let shared = Arc::clone(&shared);
            let label = label.clone();
            std::thread::Builder::new()
                .name("stagehand-status".into())
                .spawn(move || {
                    // The status dropped before the delay: the work ended quickly.
                    if !matches!(
                        stopped.recv_timeout(SHOW_AFTER),
                        Err(flume::RecvTimeoutError::Timeout)
                    ) {
                        return;
                    }
                    let Ok(mut shared) = shared.lock() else {
                        return;
                    };
                    shared.shown = true;
                    if terminal {
                        bar.set_draw_target(ProgressDrawTarget::stderr());
                        bar.enable_steady_tick(Duration::from_millis(120));
                    } else if shared.message.is_empty() {
                        eprintln!("{label} …");
                    } else {
                        eprintln!("{label}: {}", shared.message);
                    }
                })
                .ok()
        };
        Self {
            label,
            bar,
            terminal,
            shared,
            stop: Some(stop),
            timer,
        }
    }

    /// The latest step of the work ("round 2 of 3: O_DIRECT").
    pub fn set_message(&self, message: impl Into<String>) {
        let message = message.into();
        let Ok(mut shared) = self.shared.lock() else {
            return;
        };
        if shared.shown && !self.terminal {
            eprintln!("{}: {message}", self.label);
        }
        shared.message.clone_from(&message);
        self.bar.set_message(message);
    }
}

impl Drop for Status {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(timer) = self.timer.take() {
            let _ = timer.join();
        }
        self.bar.finish_and_clear();
    }
}

//! Sends that respect mailbox bounds, in release builds as in debug ones.
//!
//! Every actor sets a mailbox capacity (the figures and the protocol that keeps each
//! mailbox under it are in [`crate::messages`]). actix's `do_send` ignores that
//! capacity, so no send in this crate uses it; each goes through
//! [`Mailbox::try_post`], which queues a message only where there is room and
//! otherwise hands it back, typed ([`Refused`]). On top of it:
//!
//! - [`post`] / [`post_to`], between actors: the protocol guarantees room. A full
//!   mailbox means the protocol is broken. The message is not queued (the mailbox
//!   never grows past its bound), the break is logged, and the actor system stops, so
//!   each wait of the session ends (`SessionError::Stopped`) instead of stalling for
//!   good on the message that could not be delivered.
//! - [`offer`], for speculative messages (hints): dropped when the mailbox is full —
//!   a hint that cannot be queued is a hint not worth acting on.
//! - [`send_when_room`] (from a task: the simulator's compute task) and
//!   [`send_blocking_when_room`] (from a thread: the session's compute thread) wait
//!   for room, so a compute side faster than the actors cannot grow a queue.
//!
//! The bound a mailbox of capacity `C` holds is `C + senders`: actix's channel, like
//! futures' `mpsc`, gives every sender (each clone of an address) one guaranteed slot
//! past the shared `C`, then refuses that sender until the actor has taken a message.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix::dev::ToEnvelope;
use actix::prelude::*;

/// Why a message was not queued; the message comes back with it.
#[derive(thiserror::Error)]
pub(crate) enum Refused<M> {
    /// The mailbox holds its bound: the sender must wait, drop the message, or treat
    /// it as a broken protocol.
    #[error("the mailbox for {} is full", std::any::type_name::<M>())]
    Full(M),
    /// The actor has stopped: nothing will take the message.
    #[error("the mailbox for {} is closed: its actor has stopped", std::any::type_name::<M>())]
    Closed(M),
}

impl<M> std::fmt::Debug for Refused<M> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Refused::Full(_) => "Full",
            Refused::Closed(_) => "Closed",
        };
        write!(formatter, "{kind}({})", std::any::type_name::<M>())
    }
}

impl<M> From<SendError<M>> for Refused<M> {
    fn from(error: SendError<M>) -> Self {
        match error {
            SendError::Full(message) => Refused::Full(message),
            SendError::Closed(message) => Refused::Closed(message),
        }
    }
}

/// A mailbox that can be sent `M`: an actor's address or a recipient.
pub(crate) trait Mailbox<M> {
    /// Queues `message` if there is room (never past the bound), else hands it back.
    fn try_post(&self, message: M) -> Result<(), Refused<M>>;
}

impl<A, M> Mailbox<M> for Addr<A>
where
    A: Actor + Handler<M>,
    A::Context: ToEnvelope<A, M>,
    M: Message + Send + 'static,
    M::Result: Send,
{
    fn try_post(&self, message: M) -> Result<(), Refused<M>> {
        self.try_send(message).map_err(Refused::from)
    }
}

impl<M> Mailbox<M> for Recipient<M>
where
    M: Message + Send + 'static,
    M::Result: Send,
{
    fn try_post(&self, message: M) -> Result<(), Refused<M>> {
        self.try_send(message).map_err(Refused::from)
    }
}

/// Delivers `message` between actors. A closed mailbox drops it (the session is
/// stopping); a full one is a broken protocol, which stops the actor system.
pub(crate) fn post<M>(to: &impl Mailbox<M>, message: M) {
    match to.try_post(message) {
        Ok(()) | Err(Refused::Closed(_)) => {}
        Err(refused @ Refused::Full(_)) => protocol_broken(&refused.to_string()),
    }
}

/// As [`post`], through a recipient (the disk reader answers whoever asked).
pub(crate) fn post_to<M>(to: &Recipient<M>, message: M)
where
    M: Message + Send + 'static,
    M::Result: Send,
{
    post(to, message);
}

/// Delivers `message` if there is room; returns whether it was queued.
pub(crate) fn offer<M>(to: &impl Mailbox<M>, message: M) -> bool {
    to.try_post(message).is_ok()
}

/// How long a sender waiting for room sleeps between tries. actix wakes no sender
/// when room appears (its `send` future registers no waker once the sender is
/// refused), so a wait for room polls; a full mailbox is rare, so this costs nothing
/// on the usual path.
pub(crate) const ROOM_POLL: Duration = Duration::from_micros(500);

/// Sends `message`, waiting (asynchronously, on the current tokio runtime) until the
/// mailbox has room; the mailbox never holds more than its bound meanwhile. A closed
/// mailbox hands the message back: its actor has stopped.
pub(crate) async fn send_when_room<M>(to: &impl Mailbox<M>, mut message: M) -> Result<(), M> {
    loop {
        match to.try_post(message) {
            Ok(()) => return Ok(()),
            Err(Refused::Closed(back)) => return Err(back),
            Err(Refused::Full(back)) => {
                message = back;
                tokio::time::sleep(ROOM_POLL).await;
            }
        }
    }
}

/// Sends `message`, blocking this (non-runtime) thread until the mailbox has room; the
/// mailbox never holds more than its bound meanwhile. A closed mailbox drops the
/// message (its actor stopped: the wait for an answer reports it). `Err` when `stop`
/// was set first.
pub(crate) fn send_blocking_when_room<M>(
    to: &impl Mailbox<M>,
    mut message: M,
    stop: Option<&AtomicBool>,
) -> Result<(), Interrupted> {
    loop {
        match to.try_post(message) {
            Ok(()) | Err(Refused::Closed(_)) => return Ok(()),
            Err(Refused::Full(back)) => message = back,
        }
        if stop.is_some_and(|flag| flag.load(Ordering::Relaxed)) {
            return Err(Interrupted);
        }
        std::thread::park_timeout(ROOM_POLL);
    }
}

/// A blocking send was given up: the owner's stop flag was set while it waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("interrupted while waiting for room in a mailbox")]
pub(crate) struct Interrupted;

/// A send between actors found a full mailbox: the protocol that bounds the queues is
/// broken. Growing the queue would hide it (and grow without end in a release build);
/// dropping the message would leave a waiter stalled for good. So the actor system
/// stops: every mailbox closes and every wait of the session ends with an error.
fn protocol_broken(what: &str) {
    tracing::error!(
        "{what}: the message protocol that bounds every queue is broken; stopping the actors"
    );
    if let Some(system) = System::try_current() {
        system.stop();
    }
}

/// The disk reader's own queue went past its bound (a buffer lent twice): the same
/// broken protocol as a full mailbox.
pub(crate) fn queue_over_bound(what: &str) {
    protocol_broken(what);
}

/// `addr.post(message)`: [`post`] as a method, for addresses and recipients alike.
pub(crate) trait Post<M> {
    fn post(&self, message: M);
}

impl<A, M> Post<M> for Addr<A>
where
    A: Actor + Handler<M>,
    A::Context: ToEnvelope<A, M>,
    M: Message + Send + 'static,
    M::Result: Send,
{
    fn post(&self, message: M) {
        post(self, message);
    }
}

impl<M> Post<M> for Recipient<M>
where
    M: Message + Send + 'static,
    M::Result: Send,
{
    fn post(&self, message: M) {
        post_to(self, message);
    }
}

#[cfg(test)]
#[path = "mailbox_tests.rs"]
mod tests;

//! Sends that respect mailbox bounds.
//!
//! Every actor sets a mailbox capacity (the figures and the protocol that keeps each
//! mailbox under it are in [`crate::messages`]). actix's `do_send` ignores that
//! capacity, so no send in this crate uses it directly; each goes through one of these:
//!
//! - [`post`] / [`post_to`], between actors: the protocol guarantees room. A full
//!   mailbox means the protocol is broken, which a debug assertion catches in every
//!   test and simulation run; a release build logs it and still delivers, because
//!   dropping a completion or a release would stall the pipeline for good.
//! - [`offer`], for speculative messages (hints): dropped when the mailbox is full —
//!   a hint that cannot be queued is a hint not worth acting on.
//! - From the compute thread, the session applies back-pressure: it waits for room
//!   (see `session`), so a compute thread faster than the actors cannot grow a queue.

use actix::dev::ToEnvelope;
use actix::prelude::*;

/// Delivers `message`; a full mailbox is a protocol violation (asserted in debug).
pub(crate) fn post<A, M>(to: &Addr<A>, message: M)
where
    A: Actor + Handler<M>,
    A::Context: ToEnvelope<A, M>,
    M: Message + Send + 'static,
    M::Result: Send,
{
    match to.try_send(message) {
        Ok(()) | Err(SendError::Closed(_)) => {}
        Err(SendError::Full(message)) => {
            over_bound(std::any::type_name::<M>());
            to.do_send(message);
        }
    }
}

/// As [`post`], through a recipient (the disk reader answers whoever asked).
pub(crate) fn post_to<M>(to: &Recipient<M>, message: M)
where
    M: Message + Send + 'static,
    M::Result: Send,
{
    match to.try_send(message) {
        Ok(()) | Err(SendError::Closed(_)) => {}
        Err(SendError::Full(message)) => {
            over_bound(std::any::type_name::<M>());
            to.do_send(message);
        }
    }
}

/// Delivers `message` if there is room; returns whether it was queued.
pub(crate) fn offer<A, M>(to: &Addr<A>, message: M) -> bool
where
    A: Actor + Handler<M>,
    A::Context: ToEnvelope<A, M>,
    M: Message + Send + 'static,
    M::Result: Send,
{
    to.try_send(message).is_ok()
}

fn over_bound(message: &str) {
    tracing::error!(
        "a mailbox is over its bound while sending {message}: the message protocol is broken"
    );
    debug_assert!(false, "mailbox over its bound while sending {message}");
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

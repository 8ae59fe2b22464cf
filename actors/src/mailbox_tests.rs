//! Floods of one mailbox: its bound holds in every build (plain asserts, so
//! `cargo test --release` checks the release behaviour too).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use super::{post, send_when_room, Mailbox, Refused};

/// The mailbox capacity of the flooded actor.
const CAPACITY: usize = 4;
/// One sender may queue one message past the capacity (actix's guaranteed slot).
const BOUND: usize = CAPACITY + 1;
/// Messages each flood sends: many times the bound.
const FLOOD: usize = 50 * CAPACITY;

#[derive(Message)]
#[rtype(result = "()")]
struct Ping;

/// Counts what it handles.
struct Counter {
    handled: Arc<AtomicUsize>,
}

impl Actor for Counter {
    type Context = Context<Self>;
}

impl Handler<Ping> for Counter {
    type Result = ();

    fn handle(&mut self, _ping: Ping, _ctx: &mut Self::Context) {
        self.handled.fetch_add(1, Ordering::SeqCst);
    }
}

fn counter(handled: &Arc<AtomicUsize>) -> Addr<Counter> {
    let handled = Arc::clone(handled);
    Counter::create(move |ctx| {
        ctx.set_mailbox_capacity(CAPACITY);
        Counter { handled }
    })
}

/// Lets the actors run until `handled` reaches `count` (or a generous deadline).
async fn until_handled(handled: &AtomicUsize, count: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while handled.load(Ordering::SeqCst) < count && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[test]
fn try_post_refuses_a_full_mailbox_with_a_typed_error_and_never_grows() {
    // Proves a flood without yielding (the actor cannot take anything meanwhile)
    // queues at most the bound, refuses the rest as `Full` with the message handed
    // back, and that the actor then gets exactly what was queued.
    System::new().block_on(async {
        let handled = Arc::new(AtomicUsize::new(0));
        let addr = counter(&handled);
        let (mut queued, mut refused) = (0, 0);
        for _ in 0..FLOOD {
            match addr.try_post(Ping) {
                Ok(()) => queued += 1,
                Err(Refused::Full(Ping)) => refused += 1,
                Err(error @ Refused::Closed(_)) => panic!("unexpected {error:?}"),
            }
        }
        assert!(
            (CAPACITY..=BOUND).contains(&queued),
            "{queued} queued into a mailbox of capacity {CAPACITY}"
        );
        assert_eq!(queued + refused, FLOOD, "every refused message came back");
        let error = addr.try_post(Ping).expect_err("still full");
        assert!(error.to_string().contains("is full"), "{error}");
        until_handled(&handled, queued).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(
            handled.load(Ordering::SeqCst),
            queued,
            "only what was queued"
        );
    });
}

#[test]
fn send_when_room_waits_for_the_actor_and_delivers_everything_within_the_bound() {
    // Proves back-pressure: a sender far faster than the actor waits for room, the
    // mailbox never holds more than its bound, and no message is lost.
    System::new().block_on(async {
        let handled = Arc::new(AtomicUsize::new(0));
        let addr = counter(&handled);
        let mut most_queued = 0;
        for sent in 1..=FLOOD {
            let delivered = send_when_room(&addr, Ping).await;
            assert!(delivered.is_ok(), "the actor is running");
            let queued = sent - handled.load(Ordering::SeqCst);
            most_queued = most_queued.max(queued);
        }
        assert!(most_queued <= BOUND, "{most_queued} queued at once");
        assert!(most_queued >= CAPACITY, "the flood did fill the mailbox");
        until_handled(&handled, FLOOD).await;
        assert_eq!(
            handled.load(Ordering::SeqCst),
            FLOOD,
            "every message delivered"
        );
    });
}

#[test]
fn send_when_room_hands_the_message_back_when_the_actor_has_stopped() {
    // Proves a wait for room ends when nothing will ever take the message.
    System::new().block_on(async {
        let stopped = Counter::create(|ctx: &mut Context<Counter>| {
            ctx.stop();
            Counter {
                handled: Arc::new(AtomicUsize::new(0)),
            }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let answer = tokio::time::timeout(Duration::from_secs(10), send_when_room(&stopped, Ping));
        assert!(matches!(answer.await, Ok(Err(Ping))), "handed back");
    });
}

#[test]
fn a_full_mailbox_between_actors_stops_the_system_instead_of_growing() {
    // Proves `post`'s answer to a broken protocol in every build: the messages past
    // the bound are not queued, and the actor system stops (its `run` returns), so no
    // wait on the session can stall on a message that was not delivered.
    let handled = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&handled);
    let (ended, ended_seen) = flume::bounded(1);
    let thread = std::thread::spawn(move || {
        let system = System::new();
        system.block_on(async move {
            let addr = counter(&counted);
            for _ in 0..FLOOD {
                post(&addr, Ping);
            }
        });
        let run = system.run();
        let _ = ended.send(run.is_ok());
    });
    let ended = ended_seen.recv_timeout(Duration::from_secs(20));
    assert_eq!(ended, Ok(true), "the actor system stopped");
    let _ = thread.join();
    let handled = handled.load(Ordering::SeqCst);
    assert!(
        handled <= BOUND,
        "{handled} delivered past a bound of {BOUND}"
    );
}

#[test]
fn a_blocked_thread_waits_for_room_and_delivers_everything_within_the_bound() {
    // Proves the compute thread's back-pressure: a plain thread flooding a mailbox
    // whose actor runs on another thread waits for room (it is woken by no one, so
    // this also proves the wait polls), never overfills it, and loses nothing.
    let handled = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&handled);
    let (addresses, address) = flume::bounded(1);
    let (stop, stopped) = flume::bounded::<()>(1);
    let actors = std::thread::spawn(move || {
        System::new().block_on(async move {
            let _ = addresses.send(counter(&counted));
            let _ = stopped.recv_async().await;
        });
    });
    let addr = address
        .recv_timeout(Duration::from_secs(10))
        .expect("actor started");
    let mut most_queued = 0;
    for sent in 1..=FLOOD {
        let delivered = super::send_blocking_when_room(&addr, Ping, None);
        assert_eq!(delivered, Ok(()));
        let queued = sent - handled.load(Ordering::SeqCst);
        most_queued = most_queued.max(queued);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while handled.load(Ordering::SeqCst) < FLOOD && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = stop.send(());
    let _ = actors.join();
    // The actor takes a message (making room) a moment before it counts it, so the
    // count seen here may lag by the one message in its handler.
    assert!(most_queued <= BOUND + 1, "{most_queued} queued at once");
    assert_eq!(
        handled.load(Ordering::SeqCst),
        FLOOD,
        "every message delivered"
    );
}

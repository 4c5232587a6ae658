//! Processes SIGKILLed while holding or waiting: what they leave behind ends by itself, within
//! the lease (holder) or the waiter TTL (waiter), and the others go on in FIFO order.

use std::time::{Duration, Instant};

use fairlock::LockClient;
use fairlock_faults::contender::{assert_exclusive, Contender, Spec};
use fairlock_faults::store_view::{lease_floor, observer, wait_for_waiters};
use fairlock_testsupport::RedisServer;

const CONTENDER: &str = env!("CARGO_BIN_EXE_contender");
/// Slack the issue allows on top of a lease or TTL before the next process must hold.
const SLACK: Duration = Duration::from_secs(1);
/// Rounding between the store's millisecond clock and this process's clock.
const ROUNDING: Duration = Duration::from_millis(5);
/// Short waiter TTL, so a dead waiter is noticed quickly.
const TTL: Duration = Duration::from_secs(2);

/// A holder with a 2 s watchdog lease is SIGKILLed: its watchdog dies with it, and the
/// waiting process holds within the lease + 1 s, but not before the lease ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_is_replaced_after_its_lease() {
    const LEASE: Duration = Duration::from_secs(2);
    let server = RedisServer::start().expect("redis-server");
    let name = "crash-holder";
    let store = observer(&server.url()).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut holder = Contender::spawn(
        CONTENDER,
        "holder",
        &Spec {
            watchdog_lease: Some(LEASE),
            ..Spec::on(server.url(), name)
        },
    );
    holder.acquired(0, deadline).await;
    let mut waiter = Contender::spawn(
        CONTENDER,
        "waiter",
        &Spec {
            hold: Some(Duration::from_millis(10)),
            ..Spec::on(server.url(), name)
        },
    );
    let owner = waiter.ready(deadline).await;
    wait_for_waiters(&store, name, &[&owner], deadline).await;
    // Let at least one renewal happen, so the lease being waited out is a renewed one.
    tokio::time::sleep(LEASE / 2).await;

    let (earliest_expiry, _) = lease_floor(&store, name).await;
    let killed = holder.kill();
    let acquired = waiter.acquired(0, killed + LEASE + SLACK).await.at;
    let handover = acquired - killed;
    println!(
        "hand-over {handover:?} after SIGKILL; the lease had at least {:?} left",
        earliest_expiry.saturating_duration_since(killed)
    );
    assert!(
        acquired + ROUNDING >= earliest_expiry,
        "the waiter held {:?} before the dead holder's lease ran out",
        earliest_expiry - acquired
    );
    waiter.done(deadline).await;
    let mut holds = holder.holds();
    holds.extend(waiter.holds());
    assert_exclusive(holds);
}

/// The head waiter is SIGKILLed and the lock released at once: the store hands it to the dead
/// process (it cannot know yet), and that pending grant lasts only the waiter TTL; then the
/// next waiters hold, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_head_waiter_delays_the_queue_by_at_most_its_ttl() {
    let server = RedisServer::start().expect("redis-server");
    let name = "crash-head";
    let store = observer(&server.url()).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut holder, mut waiters, owners) = holder_and_queue(&server, &store, name, deadline).await;

    let killed = waiters[0].kill();
    holder.release();
    holder.done(deadline).await;
    // The precondition that makes this test mean something: the dead waiter was still in
    // line when the lock was freed, so it got a grant it will never confirm.
    let state = store.state(name).await.expect("inspect");
    let pending = state.holder.as_ref().expect("held after release");
    assert!(
        pending.owner == owners[0] && !pending.confirmed,
        "expected a pending grant to the killed waiter: {state:?}"
    );

    let second = waiters[1].acquired(0, killed + TTL + SLACK).await.at;
    println!("next waiter holds {:?} after SIGKILL", second - killed);
    finish_in_order(holder, waiters, &["holder", "w1", "w2"], deadline).await;
}

/// A waiter in the middle of the queue is SIGKILLed while the lock is held: it drops out of
/// the queue within its TTL, and the others are then served in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_middle_waiter_leaves_the_queue_within_its_ttl() {
    let server = RedisServer::start().expect("redis-server");
    let name = "crash-middle";
    let store = observer(&server.url()).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut holder, mut waiters, owners) = holder_and_queue(&server, &store, name, deadline).await;

    let killed = waiters[1].kill();
    wait_for_waiters(
        &store,
        name,
        &[&owners[0], &owners[2]],
        killed + TTL + SLACK,
    )
    .await;
    let evicted = killed.elapsed();
    holder.release();
    let last = waiters[2].acquired(0, killed + TTL + SLACK).await.at;
    println!(
        "dropped from the queue {evicted:?} after SIGKILL; the last waiter holds {:?} after it",
        last - killed
    );
    finish_in_order(holder, waiters, &["holder", "w0", "w2"], deadline).await;
}

/// A holder (released on demand) and three waiters w0, w1, w2 with a 2 s TTL, queued in
/// that order; returns them and the waiters' owner ids.
async fn holder_and_queue(
    server: &RedisServer,
    store: &LockClient,
    name: &str,
    deadline: Instant,
) -> (Contender, Vec<Contender>, Vec<String>) {
    let mut holder = Contender::spawn(CONTENDER, "holder", &Spec::on(server.url(), name));
    holder.acquired(0, deadline).await;
    let spec = Spec {
        waiter_ttl: Some(TTL),
        hold: Some(Duration::from_millis(20)),
        ..Spec::on(server.url(), name)
    };
    let mut waiters = Vec::new();
    let mut owners = Vec::new();
    for i in 0..3 {
        let mut waiter = Contender::spawn(CONTENDER, format!("w{i}"), &spec);
        owners.push(waiter.ready(deadline).await);
        let expected: Vec<&str> = owners.iter().map(String::as_str).collect();
        wait_for_waiters(store, name, &expected, deadline).await;
        waiters.push(waiter);
    }
    (holder, waiters, owners)
}

/// Waits for the survivors to finish and checks that the holds did not overlap and came in
/// the `expected` order.
async fn finish_in_order(
    mut holder: Contender,
    waiters: Vec<Contender>,
    expected: &[&str],
    deadline: Instant,
) {
    let mut holds = holder.holds();
    for mut waiter in waiters {
        if expected.contains(&waiter.label()) {
            waiter.done(deadline).await;
        }
        holds.extend(waiter.holds());
    }
    let order: Vec<String> = assert_exclusive(holds)
        .into_iter()
        .map(|hold| hold.who)
        .collect();
    assert_eq!(order, expected, "acquisition order");
}

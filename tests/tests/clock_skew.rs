//! Contenders whose wall clocks are an hour ahead or behind (under `faketime`): the store
//! measures every lease and deadline on its own clock, so FIFO order and leases are unaffected.
//!
//! `faketime` must be installed; without it these tests fail (a skipped test counts as a
//! failure).

use std::time::{Duration, Instant};

use fairlock_faults::contender::{
    assert_exclusive, faketime_files, require_faketime, Contender, Spec,
};
use fairlock_faults::protocol::{epoch_ns, Event};
use fairlock_faults::store_view::{lease_floor, observer, wait_for_waiters};
use fairlock_testsupport::RedisServer;

const CONTENDER: &str = env!("CARGO_BIN_EXE_contender");
const HOUR: i64 = 3600;
/// Slack the issue allows on top of a lease before the next process must hold.
const SLACK: Duration = Duration::from_secs(1);
/// Rounding between the store's millisecond clock and this process's clock.
const ROUNDING: Duration = Duration::from_millis(5);

/// Waits for `READY` and checks that the contender's clock really is off by `offset_secs`
/// (so the test cannot pass because `faketime` silently did nothing). Returns its owner.
async fn ready_with_offset(
    contender: &mut Contender,
    offset_secs: i64,
    deadline: Instant,
) -> String {
    let line = contender
        .wait_for("READY", deadline, |e| matches!(e, Event::Ready { .. }))
        .await;
    let Event::Ready {
        owner,
        epoch_ns: theirs,
    } = line.event
    else {
        unreachable!("wait_for returned another event");
    };
    let ours = epoch_ns();
    let measured =
        (i128::try_from(theirs).unwrap() - i128::try_from(ours).unwrap()) / 1_000_000_000;
    let expected = i128::from(offset_secs);
    assert!(
        (measured - expected).abs() <= 60,
        "{}: its clock is off by {measured} s, expected {expected} s: is faketime working?",
        contender.label()
    );
    owner
}

/// Killing a skewed contender (the `faketime` wrapper and the contender, with SIGKILL) leaves
/// no shared-memory files behind: a stale pair made a later `faketime` with the same process id
/// fail to start, and a clock-skew test fail in CI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_skewed_contender_leaves_no_files() {
    require_faketime();
    let server = RedisServer::start().expect("redis-server");
    let deadline = Instant::now() + Duration::from_secs(30);
    let spec = Spec {
        clock_offset_secs: Some(HOUR),
        ..Spec::on(server.url(), "skew-kill")
    };
    let mut contender = Contender::spawn(CONTENDER, "ahead", &spec);
    ready_with_offset(&mut contender, HOUR, deadline).await;
    let files = faketime_files(contender.pid());
    assert!(
        files.iter().all(|file| file.exists()),
        "the wrapper made its files: {files:?}"
    );
    contender.kill();
    let left: Vec<_> = files.iter().filter(|file| file.exists()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A holder with a normal clock; then waiters an hour ahead, an hour behind and normal
/// queue in that order; on release they are served in exactly that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_waiters_are_served_in_queue_order() {
    require_faketime();
    let server = RedisServer::start().expect("redis-server");
    let name = "skew-fifo";
    let store = observer(&server.url()).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut holder = Contender::spawn(CONTENDER, "holder", &Spec::on(server.url(), name));
    holder.acquired(0, deadline).await;

    let mut waiters = Vec::new();
    let mut owners = Vec::new();
    for (label, offset) in [("ahead", HOUR), ("behind", -HOUR), ("normal", 0)] {
        let spec = Spec {
            hold: Some(Duration::from_millis(20)),
            clock_offset_secs: (offset != 0).then_some(offset),
            ..Spec::on(server.url(), name)
        };
        let mut waiter = Contender::spawn(CONTENDER, label, &spec);
        owners.push(ready_with_offset(&mut waiter, offset, deadline).await);
        let expected: Vec<&str> = owners.iter().map(String::as_str).collect();
        wait_for_waiters(&store, name, &expected, deadline).await;
        waiters.push(waiter);
    }
    holder.release();
    let mut holds = Vec::new();
    holder.done(deadline).await;
    holds.extend(holder.holds());
    for waiter in &mut waiters {
        waiter.done(deadline).await;
        holds.extend(waiter.holds());
    }
    // `holds` converts each process's times back to the real clock, so they compare.
    let order: Vec<String> = assert_exclusive(holds)
        .into_iter()
        .map(|hold| hold.who)
        .collect();
    assert_eq!(
        order,
        ["holder", "ahead", "behind", "normal"],
        "acquisition order"
    );
}

/// A holder an hour ahead with a fixed 1.5 s lease never releases; a waiter an hour behind
/// gets the lock when the lease ends by the server's clock: not at once, not an hour later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_lease_of_a_clock_ahead_ends_on_time() {
    fixed_lease_ends_on_time("skew-lease-ahead", HOUR, -HOUR).await;
}

/// As above with the clocks the other way round: holder behind, waiter ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_lease_of_a_clock_behind_ends_on_time() {
    fixed_lease_ends_on_time("skew-lease-behind", -HOUR, HOUR).await;
}

async fn fixed_lease_ends_on_time(name: &str, holder_offset: i64, waiter_offset: i64) {
    const LEASE: Duration = Duration::from_millis(1500);
    require_faketime();
    let server = RedisServer::start().expect("redis-server");
    let store = observer(&server.url()).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut holder = Contender::spawn(
        CONTENDER,
        "holder",
        &Spec {
            lease: Some(LEASE),
            clock_offset_secs: Some(holder_offset),
            ..Spec::on(server.url(), name)
        },
    );
    ready_with_offset(&mut holder, holder_offset, deadline).await;
    let granted = holder.acquired(0, deadline).await.at;
    let (earliest_expiry, state) = lease_floor(&store, name).await;
    let lease = state.holder.as_ref().expect("held").lease_remaining;
    assert!(
        lease <= LEASE,
        "the store gave a {lease:?} lease for {LEASE:?}"
    );

    let mut waiter = Contender::spawn(
        CONTENDER,
        "waiter",
        &Spec {
            hold: Some(Duration::from_millis(20)),
            clock_offset_secs: Some(waiter_offset),
            ..Spec::on(server.url(), name)
        },
    );
    ready_with_offset(&mut waiter, waiter_offset, deadline).await;
    // The grant was made before `granted`, so the lease ends before `granted + LEASE`.
    let acquired = waiter.acquired(0, granted + LEASE + SLACK).await.at;
    println!(
        "waiter ({waiter_offset:+} s) held {:?} after the holder ({holder_offset:+} s) did; \
         the lease had at least {lease:?} left when first looked at",
        acquired - granted
    );
    assert!(
        acquired + ROUNDING >= earliest_expiry,
        "the waiter held {:?} before the holder's lease ran out",
        earliest_expiry - acquired
    );
    waiter.done(deadline).await;

    // The holder was never told to release; its own lost-lease signal fired after about its
    // lease by its monotonic clock, which the skewed wall clock did not disturb.
    let lost = holder
        .wait_for("LOST", deadline, |e| matches!(e, Event::Lost { .. }))
        .await
        .at;
    let signalled = lost - granted;
    println!("the holder's lost-lease signal fired {signalled:?} after its grant");
    assert!(
        signalled + Duration::from_millis(100) >= LEASE && signalled <= LEASE + SLACK,
        "lost-lease signal {signalled:?} after the grant, for a {LEASE:?} lease"
    );
    let token = |contender: &mut Contender| contender.holds()[0].token;
    assert!(
        token(&mut waiter) > token(&mut holder),
        "fencing tokens must grow"
    );
}

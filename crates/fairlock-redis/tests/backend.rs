//! The Redis backend against a real `redis-server`, at the level of the `LockBackend` trait.

mod common;

use std::time::Duration;

use common::{granted, name, owner, request, Server};
use fairlock::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, Grant, LockBackend, ReleaseOutcome, Wake, Watch,
    RESEND_HORIZON,
};
use fairlock::{Error, LockName, Owner};
use fairlock_redis::RedisBackend;

async fn queued(backend: &RedisBackend, request: &AcquireRequest) -> Option<Duration> {
    match backend.acquire(request).await.unwrap() {
        AcquireOutcome::Queued { retry_after, .. } => retry_after,
        other => panic!("{} expected to queue, got {other:?}", request.owner),
    }
}

async fn busy(backend: &RedisBackend, request: &AcquireRequest) {
    let outcome = backend.acquire(request).await.unwrap();
    assert_eq!(outcome, AcquireOutcome::Busy, "{}", request.owner);
}

/// Releases the level of `request`'s attempt from the hold with `token`.
async fn release(backend: &RedisBackend, request: &AcquireRequest, token: u64) -> ReleaseOutcome {
    backend
        .release(&request.name, &request.owner, token, request.attempt)
        .await
        .unwrap()
}

async fn abandon(backend: &RedisBackend, request: &AcquireRequest) {
    backend
        .abandon(&request.name, &request.owner, request.attempt)
        .await
        .unwrap();
}

async fn next_wake(watch: &mut Watch) -> Wake {
    tokio::time::timeout(Duration::from_secs(5), watch.recv())
        .await
        .expect("a wake-up within 5 s")
        .expect("the watch is open")
}

/// The next wake-up, which must be a hand-over to `request`'s attempt.
async fn handed_over(watch: &mut Watch, request: &AcquireRequest) -> Grant {
    match next_wake(watch).await {
        Wake::Granted { attempt, grant } => {
            assert_eq!(attempt, request.attempt, "handed to another attempt");
            assert_eq!(grant.hold_count, 1);
            grant
        }
        other => panic!("{} expected a hand-over, got {other:?}", request.owner),
    }
}

fn with_ttl(mut request: AcquireRequest, ttl_ms: u64) -> AcquireRequest {
    request.waiter_ttl = Duration::from_millis(ttl_ms);
    request
}

fn with_lease(mut request: AcquireRequest, lease_ms: u64) -> AcquireRequest {
    request.lease = Duration::from_millis(lease_ms);
    request
}

/// The key of lock `name` with this suffix (`h`, `q`, ...), under the default prefix.
fn key(name: &LockName, suffix: &str) -> String {
    format!("fairlock:{{{}}}:{suffix}", name.as_str())
}

/// The lines `redis-cli` prints for `args`, sorted.
fn sorted_lines(server: &Server, args: &[&str]) -> Vec<String> {
    let mut lines: Vec<String> = server.cli(args).lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

/// Keys left under this lock's tag, found with `redis-cli --scan`.
fn keys_of(server: &Server, name: &LockName) -> Vec<String> {
    let pattern = format!("fairlock:{{{}}}*", name.as_str());
    sorted_lines(server, &["--scan", "--pattern", &pattern])
}

/// What an idle lock keeps once attempts have ended on it: the fence, and the ended-attempt
/// records, which expire by themselves.
fn idle_keys(name: &LockName) -> Vec<String> {
    vec![key(name, "f"), key(name, "x")]
}

async fn hold_count(backend: &RedisBackend, lock: &LockName) -> Option<u32> {
    let state = backend.inspect(lock).await.unwrap();
    state.holder.map(|holder| holder.hold_count)
}

async fn lease_left(backend: &RedisBackend, lock: &LockName) -> Duration {
    let state = backend.inspect(lock).await.unwrap();
    state.holder.expect("held").lease_remaining
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_in_fifo_order_through_hand_over() {
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    let (a, b, c, d) = (owner("a"), owner("b"), owner("c"), owner("d"));
    let first_request = request(&lock, &a, true);
    let first = granted(&backend, &first_request).await;
    assert_eq!(first.hold_count, 1);

    let mut waiters = Vec::new();
    for waiter in [&b, &c, &d] {
        let watch = backend.watch(&lock, waiter).await.unwrap();
        let waiting = request(&lock, waiter, true);
        queued(&backend, &waiting).await;
        waiters.push((waiting, watch));
    }
    let state = backend.inspect(&lock).await.unwrap();
    let order: Vec<&str> = state.waiters.iter().map(|w| w.owner.as_str()).collect();
    assert_eq!(order, ["b", "c", "d"]);
    let attempts: Vec<AttemptId> = state.waiters.iter().map(|w| w.attempt).collect();
    let expected: Vec<AttemptId> = waiters.iter().map(|(r, _)| r.attempt).collect();
    assert_eq!(attempts, expected, "inspect names each entry's attempt");

    let mut holder = (first_request, first.token);
    for (waiting, mut watch) in waiters {
        let released = release(&backend, &holder.0, holder.1).await;
        assert_eq!(released, ReleaseOutcome::Released { remaining: 0 });
        let grant = handed_over(&mut watch, &waiting).await;
        assert!(grant.token > holder.1, "tokens grow");
        let pending = backend.inspect(&lock).await.unwrap().holder.unwrap();
        assert_eq!(
            (
                pending.owner.as_str(),
                pending.hold_count,
                pending.confirmed
            ),
            (waiting.owner.as_str(), 1, false)
        );
        // Confirming by acquire keeps the count at 1 and the token.
        let confirmed = granted(&backend, &waiting).await;
        assert_eq!(confirmed, grant);
        let holder_state = backend.inspect(&lock).await.unwrap().holder.unwrap();
        assert!(holder_state.confirmed);
        assert_eq!(holder_state.hold_count, 1);
        holder = (waiting, grant.token);
    }
    release(&backend, &holder.0, holder.1).await;
    assert_eq!(keys_of(&server, &lock), idle_keys(&lock));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrant_acquire_keeps_the_token_and_counts_levels() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a) = (name(), owner("a"));
    let outer = request(&lock, &a, false);
    let inner = request(&lock, &a, false);
    let first = granted(&backend, &outer).await;
    let second = granted(&backend, &inner).await;
    assert_eq!(
        second,
        Grant {
            token: first.token,
            hold_count: 2
        }
    );
    // An attempt is one level, however often it asks.
    assert_eq!(granted(&backend, &inner).await, second);
    assert_eq!(granted(&backend, &outer).await, second);

    // Releases that name no level of this hold change nothing (fresh attempts each time: a
    // release ends the attempt it names).
    let stranger = request(&lock, &a, false);
    assert_eq!(
        release(&backend, &stranger, first.token + 1).await,
        ReleaseOutcome::NotHeld
    );
    let stranger = request(&lock, &a, false);
    assert_eq!(
        release(&backend, &stranger, first.token).await,
        ReleaseOutcome::NotHeld,
        "an attempt that holds no level"
    );
    let other_owner = AcquireRequest {
        attempt: outer.attempt,
        ..request(&lock, &owner("b"), false)
    };
    assert_eq!(
        release(&backend, &other_owner, first.token).await,
        ReleaseOutcome::NotHeld
    );
    assert_eq!(hold_count(&backend, &lock).await, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_remove_the_level_they_name_once() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a) = (name(), owner("a"));
    let outer = request(&lock, &a, false);
    let inner = request(&lock, &a, false);
    let grant = granted(&backend, &outer).await;
    granted(&backend, &inner).await;

    // Out of order: the outer level first.
    let one = release(&backend, &outer, grant.token).await;
    assert_eq!(one, ReleaseOutcome::Released { remaining: 1 });
    // Re-sent: the attempt is gone, so nothing more is removed.
    let again = release(&backend, &outer, grant.token).await;
    assert_eq!(again, ReleaseOutcome::Released { remaining: 1 });
    assert_eq!(hold_count(&backend, &lock).await, Some(1));
    let zero = release(&backend, &inner, grant.token).await;
    assert_eq!(zero, ReleaseOutcome::Released { remaining: 0 });
    // The hold is gone, freed by this very release: sent again, it answers as it did.
    let again = release(&backend, &inner, grant.token).await;
    assert_eq!(again, ReleaseOutcome::Released { remaining: 0 });
    assert_eq!(hold_count(&backend, &lock).await, None);
    assert!(!backend
        .extend(&lock, &a, grant.token, Duration::from_secs(1))
        .await
        .unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_release_never_drops_a_newer_level() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a) = (name(), owner("a"));
    let (x, w, y) = (
        request(&lock, &a, false),
        request(&lock, &a, false),
        request(&lock, &a, false),
    );
    let grant = granted(&backend, &x).await;
    granted(&backend, &w).await;
    // Release x: 2 -> 1. Re-entry by y: 1 -> 2. Then x's release arrives again (a re-send):
    // with counts alone it would take y's level; with attempts it finds x gone.
    assert_eq!(
        release(&backend, &x, grant.token).await,
        ReleaseOutcome::Released { remaining: 1 }
    );
    assert_eq!(granted(&backend, &y).await.hold_count, 2);
    assert_eq!(
        release(&backend, &x, grant.token).await,
        ReleaseOutcome::Released { remaining: 2 }
    );
    assert_eq!(hold_count(&backend, &lock).await, Some(2));
    assert_eq!(
        release(&backend, &y, grant.token).await,
        ReleaseOutcome::Released { remaining: 1 }
    );
    assert_eq!(
        release(&backend, &w, grant.token).await,
        ReleaseOutcome::Released { remaining: 0 }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_acquire_of_an_ended_attempt_changes_nothing() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    let first = request(&lock, &a, true);
    let grant = granted(&backend, &first).await;
    assert_eq!(
        release(&backend, &first, grant.token).await,
        ReleaseOutcome::Released { remaining: 0 }
    );
    // The acquire arrives again after its release: the lock stays free.
    busy(&backend, &first).await;
    assert_eq!(backend.inspect(&lock).await.unwrap().holder, None);
    assert!(!keys_of(&server, &lock).contains(&key(&lock, "h")));

    // Also when someone else holds it: not queued either.
    let other = request(&lock, &b, true);
    granted(&backend, &other).await;
    busy(&backend, &first).await;
    assert!(backend.inspect(&lock).await.unwrap().waiters.is_empty());

    // An abandoned waiter's heartbeat that arrives late does not queue it again.
    let waiting = request(&lock, &a, true);
    queued(&backend, &waiting).await;
    abandon(&backend, &waiting).await;
    busy(&backend, &waiting).await;
    assert!(backend.inspect(&lock).await.unwrap().waiters.is_empty());

    // And an abandoned re-entry (its reply was lost) is not granted again.
    let reentry = request(&lock, &b, true);
    assert_eq!(granted(&backend, &reentry).await.hold_count, 2);
    abandon(&backend, &reentry).await;
    assert_eq!(hold_count(&backend, &lock).await, Some(1));
    busy(&backend, &reentry).await;
    assert_eq!(hold_count(&backend, &lock).await, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_force_release_frees_nothing_later() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    let first = granted(&backend, &request(&lock, &a, true)).await;
    assert!(backend.force_release(&lock, first.token).await.unwrap());
    let second = granted(&backend, &request(&lock, &b, true)).await;
    assert!(second.token > first.token);
    // The same force release again: it names the old hold, which is gone, and answers as its
    // first copy did.
    assert!(backend.force_release(&lock, first.token).await.unwrap());
    let holder = backend.inspect(&lock).await.unwrap().holder.unwrap();
    assert_eq!((holder.owner.as_str(), holder.token), ("b", second.token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandon_touches_only_its_own_attempt() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    // Two queued attempts of one owner: two entries.
    let holding = request(&lock, &b, true);
    let grant = granted(&backend, &holding).await;
    let (first, second) = (request(&lock, &a, true), request(&lock, &a, true));
    queued(&backend, &first).await;
    queued(&backend, &second).await;
    assert_eq!(backend.inspect(&lock).await.unwrap().waiters.len(), 2);
    abandon(&backend, &first).await;
    let waiters = backend.inspect(&lock).await.unwrap().waiters;
    assert_eq!(waiters.len(), 1);
    assert_eq!(waiters[0].attempt, second.attempt);

    // Two levels of one owner: abandoning one leaves the other.
    let mut watch = backend.watch(&lock, &a).await.unwrap();
    release(&backend, &holding, grant.token).await;
    let to_second = handed_over(&mut watch, &second).await;
    let third = request(&lock, &a, true);
    assert_eq!(granted(&backend, &third).await.hold_count, 2);
    abandon(&backend, &second).await;
    let holder = backend.inspect(&lock).await.unwrap().holder.unwrap();
    assert_eq!(
        (holder.hold_count, holder.token, holder.confirmed),
        (1, to_second.token, true),
        "the pending level went, the re-entry stays"
    );
    // A stranger's abandon of the same attempt id changes nothing of a's hold.
    let stranger = AcquireRequest {
        attempt: third.attempt,
        ..request(&lock, &b, true)
    };
    abandon(&backend, &stranger).await;
    assert_eq!(hold_count(&backend, &lock).await, Some(1));
    assert_eq!(
        release(&backend, &third, to_second.token).await,
        ReleaseOutcome::Released { remaining: 0 }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoning_a_level_whose_grant_was_lost_hands_over() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    let lost = request(&lock, &a, true);
    let grant = granted(&backend, &lost).await;
    let waiting = request(&lock, &b, true);
    queued(&backend, &waiting).await;
    let mut watch = backend.watch(&lock, &b).await.unwrap();
    // The caller never saw its grant: it abandons the attempt, which frees the lock.
    abandon(&backend, &lost).await;
    let to_b = handed_over(&mut watch, &waiting).await;
    assert!(to_b.token > grant.token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_never_shortened() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a) = (name(), owner("a"));
    let outer = request(&lock, &a, true);
    let grant = granted(&backend, &outer).await;
    let long = Duration::from_secs(29);
    // A re-entry with a short lease keeps the long one.
    granted(&backend, &with_lease(request(&lock, &a, true), 100)).await;
    assert!(lease_left(&backend, &lock).await > long);
    // So does an extend with a short lease.
    assert!(backend
        .extend(&lock, &a, grant.token, Duration::from_millis(100))
        .await
        .unwrap());
    assert!(lease_left(&backend, &lock).await > long);
    // A longer one lengthens it, by extend and by re-entry.
    assert!(backend
        .extend(&lock, &a, grant.token, Duration::from_secs(60))
        .await
        .unwrap());
    assert!(lease_left(&backend, &lock).await > Duration::from_secs(59));
    granted(&backend, &with_lease(request(&lock, &a, true), 120_000)).await;
    assert!(lease_left(&backend, &lock).await > Duration::from_secs(119));
    // A re-sent acquire of a level it already has changes nothing, not even the lease.
    assert_eq!(granted(&backend, &outer).await.hold_count, 3);
    assert!(lease_left(&backend, &lock).await > Duration::from_secs(119));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_barges_past_waiters() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b, c) = (name(), owner("a"), owner("b"), owner("c"));
    granted(&backend, &with_lease(request(&lock, &a, false), 300)).await;
    busy(&backend, &request(&lock, &b, false)).await;
    assert!(
        backend.inspect(&lock).await.unwrap().waiters.is_empty(),
        "Busy never queues"
    );

    let waiting = request(&lock, &b, true);
    queued(&backend, &waiting).await;
    // The holder's lease runs out: the lock is free, but b is first in line.
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(backend.inspect(&lock).await.unwrap().holder, None);
    busy(&backend, &request(&lock, &c, false)).await;
    queued(&backend, &request(&lock, &c, true)).await;
    granted(&backend, &waiting).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_attempt_keeps_its_place_and_is_queued_once() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b, c) = (name(), owner("a"), owner("b"), owner("c"));
    granted(&backend, &request(&lock, &a, true)).await;
    let b_first = request(&lock, &b, true);
    queued(&backend, &b_first).await;
    queued(&backend, &request(&lock, &c, true)).await;
    queued(&backend, &b_first).await;
    let state = backend.inspect(&lock).await.unwrap();
    let order: Vec<&str> = state.waiters.iter().map(|w| w.owner.as_str()).collect();
    assert_eq!(order, ["b", "c"]);
    // Another attempt of the same owner is another entry, at the tail.
    queued(&backend, &request(&lock, &b, true)).await;
    let state = backend.inspect(&lock).await.unwrap();
    let order: Vec<&str> = state.waiters.iter().map(|w| w.owner.as_str()).collect();
    assert_eq!(order, ["b", "c", "b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_holder_leaves_the_lock_to_the_head_waiter() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    granted(&backend, &with_lease(request(&lock, &a, true), 300)).await;
    let waiting = request(&lock, &b, true);
    let retry_after = queued(&backend, &waiting).await.expect("b is head");
    assert!(retry_after <= Duration::from_millis(300), "{retry_after:?}");
    tokio::time::sleep(retry_after + Duration::from_millis(20)).await;
    let grant = granted(&backend, &waiting).await;
    assert_eq!(grant.hold_count, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_grant_lasts_only_the_waiter_ttl() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    let holding = request(&lock, &a, true);
    let grant = granted(&backend, &holding).await;
    queued(&backend, &with_ttl(request(&lock, &b, true), 200)).await;
    release(&backend, &holding, grant.token).await;
    let pending = backend
        .inspect(&lock)
        .await
        .unwrap()
        .holder
        .expect("handed to b");
    assert_eq!(pending.owner, "b");
    assert!(!pending.confirmed);
    assert!(pending.lease_remaining <= Duration::from_millis(200));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(backend.inspect(&lock).await.unwrap().holder, None);
    assert_eq!(keys_of(&server, &lock), idle_keys(&lock));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_level_lapses_alone_when_its_owner_re_entered() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    let holding = request(&lock, &a, true);
    let grant = granted(&backend, &holding).await;
    let waiting = with_ttl(request(&lock, &b, true), 300);
    queued(&backend, &waiting).await;
    let mut watch = backend.watch(&lock, &b).await.unwrap();
    release(&backend, &holding, grant.token).await;
    let to_b = handed_over(&mut watch, &waiting).await;
    // Another attempt of b re-enters the pending hold: two levels, one still pending.
    let reentry = request(&lock, &b, true);
    assert_eq!(
        granted(&backend, &reentry).await,
        Grant {
            token: to_b.token,
            hold_count: 2
        }
    );
    let holder = backend.inspect(&lock).await.unwrap().holder.unwrap();
    assert_eq!((holder.hold_count, holder.confirmed), (2, false));
    // The pending level is never confirmed: it lapses, the re-entry keeps the hold.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let holder = backend.inspect(&lock).await.unwrap().holder.unwrap();
    assert_eq!(
        (holder.owner.as_str(), holder.hold_count, holder.confirmed),
        ("b", 1, true)
    );
    assert!(!backend
        .extend(&lock, &a, grant.token, Duration::from_secs(1))
        .await
        .unwrap());
    assert!(backend
        .extend(&lock, &b, to_b.token, Duration::from_secs(1))
        .await
        .unwrap());
    assert_eq!(hold_count(&backend, &lock).await, Some(1));
    assert_eq!(
        release(&backend, &reentry, to_b.token).await,
        ReleaseOutcome::Released { remaining: 0 }
    );
    assert_eq!(keys_of(&server, &lock), idle_keys(&lock));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_level_can_be_released() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b, c) = (name(), owner("a"), owner("b"), owner("c"));
    let holding = request(&lock, &a, true);
    let grant = granted(&backend, &holding).await;
    let to_b_request = request(&lock, &b, true);
    queued(&backend, &to_b_request).await;
    let to_c_request = request(&lock, &c, true);
    queued(&backend, &to_c_request).await;
    let mut watch_b = backend.watch(&lock, &b).await.unwrap();
    let mut watch_c = backend.watch(&lock, &c).await.unwrap();
    release(&backend, &holding, grant.token).await;
    let to_b = handed_over(&mut watch_b, &to_b_request).await;
    assert_eq!(
        release(&backend, &to_b_request, to_b.token).await,
        ReleaseOutcome::Released { remaining: 0 }
    );
    let to_c = handed_over(&mut watch_c, &to_c_request).await;
    assert!(to_c.token > to_b.token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_waiters_never_block_wherever_they_stand() {
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    let (a, dead_head, b, dead_middle, c) = (
        owner("a"),
        owner("dead-head"),
        owner("b"),
        owner("dead-middle"),
        owner("c"),
    );
    let holding = request(&lock, &a, true);
    let grant = granted(&backend, &holding).await;
    let dead_head_request = with_ttl(request(&lock, &dead_head, true), 150);
    queued(&backend, &dead_head_request).await;
    let b_request = request(&lock, &b, true);
    queued(&backend, &b_request).await;
    queued(&backend, &with_ttl(request(&lock, &dead_middle, true), 150)).await;
    let c_request = request(&lock, &c, true);
    queued(&backend, &c_request).await;
    tokio::time::sleep(Duration::from_millis(250)).await;

    let state = backend.inspect(&lock).await.unwrap();
    let order: Vec<&str> = state.waiters.iter().map(|w| w.owner.as_str()).collect();
    assert_eq!(order, ["b", "c"], "expired waiters are not counted");

    let mut watch_b = backend.watch(&lock, &b).await.unwrap();
    release(&backend, &holding, grant.token).await;
    let to_b = handed_over(&mut watch_b, &b_request).await;
    let mut watch_c = backend.watch(&lock, &c).await.unwrap();
    release(&backend, &b_request, to_b.token).await;
    let to_c = handed_over(&mut watch_c, &c_request).await;
    assert!(to_c.token > to_b.token);
    // A dead waiter that comes back has lost its place: it queues at the end.
    queued(&backend, &dead_head_request).await;
    let state = backend.inspect(&lock).await.unwrap();
    assert_eq!(state.holder.unwrap().owner, "c");
    assert_eq!(state.waiters.len(), 1);
    assert_eq!(state.waiters[0].attempt, dead_head_request.attempt);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoning_gives_back_a_pending_grant() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b, c) = (name(), owner("a"), owner("b"), owner("c"));
    let holding = request(&lock, &a, true);
    let grant = granted(&backend, &holding).await;
    let b_request = request(&lock, &b, true);
    queued(&backend, &b_request).await;
    let c_request = request(&lock, &c, true);
    queued(&backend, &c_request).await;
    let mut watch_c = backend.watch(&lock, &c).await.unwrap();
    release(&backend, &holding, grant.token).await;
    assert_eq!(
        backend.inspect(&lock).await.unwrap().holder.unwrap().owner,
        "b"
    );
    abandon(&backend, &b_request).await;
    let to_c = handed_over(&mut watch_c, &c_request).await;
    // Only the grantee's own acquire confirms a hand-over; extend just lengthens the lease.
    assert!(backend
        .extend(&lock, &c, to_c.token, Duration::from_secs(5))
        .await
        .unwrap());
    assert!(
        !backend
            .inspect(&lock)
            .await
            .unwrap()
            .holder
            .unwrap()
            .confirmed
    );
    assert_eq!(granted(&backend, &c_request).await.token, to_c.token);
    let holder = backend.inspect(&lock).await.unwrap().holder.unwrap();
    assert_eq!(
        (holder.owner.as_str(), holder.hold_count, holder.confirmed),
        ("c", 1, true)
    );
    // Abandoning again, or an attempt that has nothing, is fine and changes nothing.
    abandon(&backend, &b_request).await;
    abandon(&backend, &request(&lock, &b, true)).await;
    let holder = backend.inspect(&lock).await.unwrap().holder.unwrap();
    assert_eq!((holder.owner.as_str(), holder.hold_count), ("c", 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_waiter_leaving_a_free_lock_wakes_the_next() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b, c) = (name(), owner("a"), owner("b"), owner("c"));
    granted(&backend, &with_lease(request(&lock, &a, true), 200)).await;
    let b_request = request(&lock, &b, true);
    queued(&backend, &b_request).await;
    queued(&backend, &request(&lock, &c, true)).await;
    let mut watch_c = backend.watch(&lock, &c).await.unwrap();
    // The lease runs out unannounced; then the head gives up: c may take the lock now.
    tokio::time::sleep(Duration::from_millis(250)).await;
    abandon(&backend, &b_request).await;
    assert_eq!(next_wake(&mut watch_c).await, Wake::Recheck);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_frees_and_hands_over() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    assert!(!backend.force_release(&lock, 1).await.unwrap());
    let outer = request(&lock, &a, true);
    let first = granted(&backend, &outer).await;
    granted(&backend, &request(&lock, &a, true)).await;
    let b_request = request(&lock, &b, true);
    queued(&backend, &b_request).await;
    let mut watch_b = backend.watch(&lock, &b).await.unwrap();
    assert!(!backend.force_release(&lock, first.token + 1).await.unwrap());
    assert_eq!(hold_count(&backend, &lock).await, Some(2));
    assert!(backend.force_release(&lock, first.token).await.unwrap());
    let to_b = handed_over(&mut watch_b, &b_request).await;
    assert!(to_b.token > first.token);
    assert_eq!(
        release(&backend, &outer, first.token).await,
        ReleaseOutcome::NotHeld
    );
    // A pending hold can be forced too.
    assert!(backend.force_release(&lock, to_b.token).await.unwrap());
    // Sent again, it answers as it did; a token never freed is still refused.
    assert!(backend.force_release(&lock, to_b.token).await.unwrap());
    assert!(!backend.force_release(&lock, to_b.token + 1).await.unwrap());
    assert_eq!(keys_of(&server, &lock), idle_keys(&lock));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_locks_leave_only_the_fence_and_expiring_records() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    let holding = request(&lock, &a, true);
    let grant = granted(&backend, &holding).await;
    // A grant of a free lock is recorded spent in the fence hash, not in the records.
    assert_eq!(keys_of(&server, &lock), [key(&lock, "f"), key(&lock, "h")]);
    assert_eq!(
        server.cli(&["HGET", &key(&lock, "f"), "g"]),
        holding.attempt.to_string()
    );
    let waiting = request(&lock, &b, true);
    queued(&backend, &waiting).await;
    assert!(keys_of(&server, &lock).len() > 2);
    abandon(&backend, &waiting).await;
    release(&backend, &holding, grant.token).await;
    assert_eq!(keys_of(&server, &lock), idle_keys(&lock));
    // The ended-attempt records vanish by themselves after the horizon.
    let horizon = u64::try_from(RESEND_HORIZON.as_millis()).unwrap();
    let ttl: u64 = server.cli(&["PTTL", &key(&lock, "x")]).parse().unwrap();
    assert!(ttl > 0 && ttl <= horizon, "{ttl} ms");
    assert_eq!(server.cli(&["ZCARD", &key(&lock, "x")]), "2");
    // Waiters that die leave nothing either, once their deadline passes.
    let other = name();
    let holding = request(&other, &a, true);
    let grant = granted(&backend, &holding).await;
    queued(&backend, &with_ttl(request(&other, &b, true), 100)).await;
    release(&backend, &holding, grant.token).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(keys_of(&server, &other), idle_keys(&other));
}

/// The queue keys live until the latest waiter deadline, and the fence past it, whichever
/// waiter has it and whatever order they call in: a short-lived waiter's join or heartbeat
/// does not cut the keys short of a long-lived one's deadline, nor does a hand-over to it
/// cut the fence short. (Calls on a short queue take the latest deadline from the front of
/// the queue they read, not from a read of their own.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_keys_and_fence_outlive_the_latest_waiter() {
    let server = Server::start();
    let backend = RedisBackend::builder(server.url())
        .fence_margin(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    // Short enough to tell apart, long enough that no waiter dies on a slow machine.
    const SHORT: u64 = 10_000;
    const LONG: u64 = 600_000;
    // `key` has at least this much under `LONG` left.
    let outlives_long = |key: &str, what: &str| {
        let ttl: i64 = server.cli(&["PTTL", key]).parse().unwrap();
        assert!(ttl > 590_000, "{what}: {key} expires in {ttl} ms");
    };
    let queue_outlives_long = |lock: &LockName, what: &str| {
        for suffix in ["q", "z", "w"] {
            outlives_long(&key(lock, suffix), what);
        }
    };
    let waiter =
        |lock: &LockName, who: &str, ttl: u64| with_ttl(request(lock, &owner(who), true), ttl);

    // The long-lived waiter first, then a short-lived one joins and heartbeats behind it.
    let lock = name();
    granted(&backend, &request(&lock, &owner("holder"), true)).await;
    queued(&backend, &waiter(&lock, "long", LONG)).await;
    let short = waiter(&lock, "short", SHORT);
    queued(&backend, &short).await;
    queue_outlives_long(&lock, "a short join behind a long waiter");
    queued(&backend, &short).await;
    queue_outlives_long(&lock, "a short heartbeat behind a long waiter");

    // The short-lived waiter first: its heartbeat as the head, then the hand-over to it.
    let lock = name();
    let holding = request(&lock, &owner("holder"), true);
    let grant = granted(&backend, &holding).await;
    let short = waiter(&lock, "short", SHORT);
    queued(&backend, &short).await;
    queued(&backend, &waiter(&lock, "long", LONG)).await;
    queued(&backend, &short).await;
    queue_outlives_long(&lock, "the short head's heartbeat");
    release(&backend, &holding, grant.token).await;
    assert_eq!(
        backend.inspect(&lock).await.unwrap().holder.unwrap().owner,
        "short"
    );
    outlives_long(&key(&lock, "f"), "a hand-over to the short waiter");

    // A queue longer than the front a call reads first: the long-lived waiter stands behind
    // it, out of sight of the head's heartbeat.
    let lock = name();
    granted(&backend, &request(&lock, &owner("holder"), true)).await;
    let head = waiter(&lock, "head", SHORT);
    queued(&backend, &head).await;
    for i in 0..8 {
        queued(&backend, &waiter(&lock, &format!("short{i}"), SHORT)).await;
    }
    queued(&backend, &waiter(&lock, "long", LONG)).await;
    queued(&backend, &head).await;
    queue_outlives_long(&lock, "the head's heartbeat in a long queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_script_flush() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a) = (name(), owner("a"));
    let outer = request(&lock, &a, true);
    let grant = granted(&backend, &outer).await;
    for flush in [["SCRIPT", "FLUSH"], ["FUNCTION", "FLUSH"]] {
        assert_eq!(server.cli(&flush), "OK");
    }
    let again = granted(&backend, &request(&lock, &a, true)).await;
    assert_eq!(again.hold_count, 2);
    assert_eq!(server.cli(&["FUNCTION", "FLUSH"]), "OK");
    release(&backend, &outer, grant.token).await;
    assert_eq!(hold_count(&backend, &lock).await, Some(1));
    assert!(
        server.cli(&["FUNCTION", "LIST"]).contains("fairlock_"),
        "the library was loaded again"
    );
}

/// `lock` held by a unique owner's attempt, and another unique owner's attempt queued behind
/// it with a watch: (the holder's request, its grant, the waiter's request, its watch).
async fn held_with_a_waiter(
    backend: &RedisBackend,
    lock: &LockName,
) -> (AcquireRequest, Grant, AcquireRequest, Watch) {
    let holding = request(lock, &Owner::unique(), true);
    let grant = granted(backend, &holding).await;
    let waiting = request(lock, &Owner::unique(), true);
    queued(backend, &waiting).await;
    let watch = backend.watch(lock, &waiting.owner).await.unwrap();
    (holding, grant, waiting, watch)
}

/// A server out of memory (`maxmemory` with `noeviction`) still releases and hands over, and
/// refuses new holds and waiters before writing anything, as when the scripts ran by `EVAL`
/// (refused at their first write that needs memory, unless they wrote before): the library's
/// release is `allow-oom` (without it, Redis refuses a function that may write as soon as
/// memory is full, and a held lock would stay held until its lease ran out), its acquire is
/// not (with it, new holds and waiters would grow memory past the limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_out_of_memory_still_releases_and_hands_over() {
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    let (holding, grant, waiting, mut watch) = held_with_a_waiter(&backend, &lock).await;
    server.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    server.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    assert!(
        server.cli(&["SET", "probe", "1"]).contains("OOM"),
        "the server is out of memory"
    );
    let newcomer = request(&lock, &Owner::unique(), true);
    let refused = backend.acquire(&newcomer).await;
    assert!(
        matches!(&refused, Err(error) if error.to_string().contains("OOM")),
        "{refused:?}"
    );
    assert_eq!(
        release(&backend, &holding, grant.token).await,
        ReleaseOutcome::Released { remaining: 0 }
    );
    let to_b = handed_over(&mut watch, &waiting).await;
    assert_eq!(hold_count(&backend, &lock).await, Some(1));
    server.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    release(&backend, &waiting, to_b.token).await;
}

/// A user that may not call functions (an ACL without `FCALL`) still locks: the refusal comes
/// before anything ran, and the backend runs the scripts by SHA from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_fcall_runs_the_scripts_by_sha() {
    let server = Server::start();
    assert_eq!(
        server.cli(&[
            "ACL",
            "SETUSER",
            "noscripts",
            "on",
            ">secret",
            "~*",
            "&*",
            "+@all",
            "-fcall",
            "-function",
        ]),
        "OK"
    );
    let url = format!("redis://noscripts:secret@127.0.0.1:{}", server.0.port());
    let backend = RedisBackend::connect(&url).await.unwrap();
    let (lock, a) = (name(), Owner::unique());
    for _ in 0..3 {
        let holding = request(&lock, &a, true);
        let grant = granted(&backend, &holding).await;
        release(&backend, &holding, grant.token).await;
    }
    let stats = server.cli(&["INFO", "commandstats"]);
    assert_eq!(server.command_calls("evalsha"), 6, "every call by SHA");
    assert!(
        stats.contains("cmdstat_fcall:calls=0") || !stats.contains("cmdstat_fcall:"),
        "FCALL was refused, never run: {stats}"
    );
}

/// The library's functions do what the scripts do: each call starts afresh (the prelude's
/// state of one call never leaks into the next, though a library keeps its locals between
/// calls). A release that handed over, then a grant on another lock right after, must each
/// see only their own call's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_calls_start_afresh() {
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    let (holding, grant, waiting, mut watch) = held_with_a_waiter(&backend, &lock).await;
    release(&backend, &holding, grant.token).await;
    let to_b = handed_over(&mut watch, &waiting).await;
    // A call right after, on another lock: none of the hand-over's state (the queue it
    // touched, the hold's TTL, the attempts it spent) may carry into it.
    let other = name();
    let fresh = request(&other, &holding.owner, true);
    let fresh_grant = granted(&backend, &fresh).await;
    assert_eq!(fresh_grant.hold_count, 1);
    // Its attempt is recorded spent in the fence hash; no record of the hand-over's attempts
    // is written here.
    assert_eq!(
        keys_of(&server, &other),
        [key(&other, "f"), key(&other, "h")],
        "only its own keys"
    );
    assert_eq!(
        server.cli(&["HGET", &key(&other, "f"), "g"]),
        fresh.attempt.to_string(),
        "only its own attempt is recorded spent"
    );
    release(&backend, &waiting, to_b.token).await;
    release(&backend, &fresh, fresh_grant.token).await;
    assert_eq!(keys_of(&server, &lock), idle_keys(&lock));
    assert_eq!(keys_of(&server, &other), idle_keys(&other));
    assert!(
        server
            .cli(&["INFO", "commandstats"])
            .contains("cmdstat_fcall:"),
        "the calls ran as functions"
    );
}

/// The text of a mutating script exactly as the backend builds it for Redis 7 (sharded
/// pub/sub; see `src/scripts.rs`).
fn script(operation: &str) -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../lua/");
    let read = |file: &str| std::fs::read_to_string(format!("{dir}{file}")).unwrap();
    format!(
        "local PUBLISH = 'SPUBLISH'\nlocal INPUT = ARGV\n{}\nlocal function operation()\n{}\nend\nbegin(INPUT)\nreturn finish(operation())\n",
        read("prelude.lua"),
        read(&format!("{operation}.lua"))
    )
}

/// Runs a script of lock `tag` with `redis-cli EVAL`, as the backend would.
/// Runs `operation`'s script with `args`, then the trailer every mutating script takes: the
/// wake-up channel and a 10-minute fence margin.
fn eval(server: &Server, tag: &str, operation: &str, args: &[&str]) -> String {
    let keys: Vec<String> = ["h", "q", "z", "w", "f", "x"]
        .iter()
        .map(|suffix| format!("fairlock:{{{tag}}}:{suffix}"))
        .collect();
    let channel = format!("fairlock:{{{tag}}}:c");
    let body = script(operation);
    // The keys lead ARGV (see `lua/prelude.lua`).
    let mut command = vec!["EVAL", body.as_str(), "0"];
    command.extend(keys.iter().map(String::as_str));
    command.extend_from_slice(args);
    command.extend([channel.as_str(), "600000"]);
    server.cli(&command)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_script_is_applied_once() {
    let server = Server::start();
    let lock = name();
    let tag = lock.as_str();
    let (x, y) = (
        AttemptId::random().to_string(),
        AttemptId::random().to_string(),
    );
    let horizon = RESEND_HORIZON.as_millis().to_string();
    let acquire = |attempt: &str| {
        eval(
            &server,
            tag,
            "acquire",
            &["a", attempt, "30000", "5000", "1", tag, &horizon, ""],
        )
    };
    let first = acquire(&x);
    assert!(first.starts_with("G ") && first.ends_with(" 1"), "{first}");
    // fred re-sends the same command after a reconnect: same reply, no second level.
    assert_eq!(acquire(&x), first);
    let token = first.split(' ').nth(1).unwrap().to_owned();
    let second = acquire(&y);
    assert!(second.ends_with(" 2"), "{second}");
    let release = |attempt: &str| eval(&server, tag, "release", &["a", &token, attempt, &horizon]);
    assert_eq!(release(&x), "R 1");
    assert_eq!(release(&x), "R 1");
    assert_eq!(server.cli(&["HGET", &key(&lock, "h"), "c"]), "1");
    // x's acquire arrives once more after its release: nothing happens.
    assert_eq!(acquire(&x), "B");
    assert_eq!(server.cli(&["HGET", &key(&lock, "h"), "c"]), "1");
    assert_eq!(release(&y), "R 0");
    // The hold is gone, freed by this release: sent again, it answers as it did.
    assert_eq!(release(&y), "R 0");
    // A release of that hold by an attempt that never had a level finds nothing.
    assert_eq!(release(&AttemptId::random().to_string()), "N");
    assert_eq!(server.cli(&["EXISTS", &key(&lock, "h")]), "0");
    // A spent attempt is never granted again, even on a free lock.
    assert_eq!(acquire(&y), "B");
    assert_eq!(server.cli(&["EXISTS", &key(&lock, "h")]), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_attempt_records_are_forgotten_a_few_at_a_time() {
    let server = Server::start();
    let lock = name();
    let tag = lock.as_str();
    let records = key(&lock, "x");
    // One record kept for a minute, so the key stays; then releases of attempts that hold
    // nothing, remembered for 2 s only.
    let kept = AttemptId::random().to_string();
    eval(&server, tag, "abandon", &["a", &kept, "60000"]);
    for _ in 0..20 {
        let attempt = AttemptId::random().to_string();
        assert_eq!(
            eval(&server, tag, "release", &["a", "1", &attempt, "2000"]),
            "N"
        );
    }
    assert_eq!(server.cli(&["ZCARD", &records]), "21");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    // Each new record removes at most 8 expired ones: bounded work per call.
    let attempt = AttemptId::random().to_string();
    eval(&server, tag, "abandon", &["a", &attempt, "60000"]);
    assert_eq!(server.cli(&["ZCARD", &records]), "14");
    eval(&server, tag, "release", &["a", "1", &attempt, "60000"]);
    eval(&server, tag, "release", &["a", "1", &attempt, "60000"]);
    assert_eq!(
        server.cli(&["ZCARD", &records]),
        "2",
        "the kept one and the last"
    );
    let ttl: u64 = server.cli(&["PTTL", &records]).parse().unwrap();
    assert!(
        ttl > 50_000 && ttl <= 60_000,
        "expires with its latest record: {ttl}"
    );
    // Short-lived records alone: the key goes with the last of them.
    let other = name();
    let attempt = AttemptId::random().to_string();
    eval(&server, other.as_str(), "abandon", &["a", &attempt, "500"]);
    assert_eq!(server.cli(&["EXISTS", &key(&other, "x")]), "1");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(server.cli(&["EXISTS", &key(&other, "x")]), "0");
}

/// The ended-attempt records expire with the latest of them also where Redis 7's cheaper
/// `PEXPIREAT … GT` would leave them forever: when their key lost its expiry (`PERSIST`), and
/// when the Redis 7 variant of the scripts runs on a 6.2 node (a Cluster being upgraded),
/// which has no `GT`. A script that failed there would fail after its writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_attempt_records_keep_their_expiry() {
    let current = Server::start();
    let old = Server(
        fairlock_testsupport::RedisServer::start_binary(
            fairlock_testsupport::redis62_server(),
            &[],
        )
        .expect("redis-server 6.2 starts"),
    );
    for (server, persist) in [(&current, true), (&old, false)] {
        let lock = name();
        let records = key(&lock, "x");
        let abandon = || {
            let attempt = AttemptId::random().to_string();
            eval(server, lock.as_str(), "abandon", &["a", &attempt, "60000"])
        };
        assert_eq!(abandon(), "OK");
        if persist {
            assert_eq!(server.cli(&["PERSIST", &records]), "1");
        }
        assert_eq!(abandon(), "OK", "persisted: {persist}");
        let ttl: i64 = server.cli(&["PTTL", &records]).parse().unwrap();
        assert!(
            ttl > 50_000 && ttl <= 60_000,
            "expires with its latest record (persisted: {persist}): {ttl}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_data_is_a_conflict() {
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    server.cli(&["SET", &key(&lock, "h"), "not a lock"]);
    let err = backend
        .acquire(&request(&lock, &owner("a"), true))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Conflict { name, .. } if name == lock.as_str()),
        "{err}"
    );
    let err = backend.inspect(&lock).await.unwrap_err();
    assert!(matches!(err, Error::Conflict { .. }), "{err}");

    // A hash without fairlock's fields at the holder key is not read as a free lock.
    let lock = name();
    server.cli(&["HSET", &key(&lock, "h"), "unrelated", "field"]);
    let err = backend
        .acquire(&request(&lock, &owner("a"), true))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Conflict { .. }), "{err}");
    assert_eq!(
        server.cli(&["HGETALL", &key(&lock, "h")]),
        "unrelated\nfield"
    );

    // A hold whose level count leaves out one of its levels: releasing that level would count
    // below zero and free a hold that still has its pending level.
    let lock = name();
    let (a, b) = (
        request(&lock, &owner("a"), true),
        request(&lock, &owner("a"), true),
    );
    let (level, pending) = (a.attempt.to_string(), b.attempt.to_string());
    server.cli(&[
        "HSET",
        &key(&lock, "h"),
        "o",
        "a",
        "t",
        "7",
        "c",
        "0",
        &format!("l:{level}"),
        "1",
        "p",
        &pending,
        "pd",
        "99999999999999",
    ]);
    let err = backend
        .release(&lock, &a.owner, 7, a.attempt)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Conflict { .. }), "{err}");
    assert_eq!(server.cli(&["HGET", &key(&lock, "h"), "p"]), pending);

    // An acquire on a lock whose only key, `suffix`, holds foreign data: refused, and nothing
    // written.
    let refused_alone = |lock: LockName, suffix: &'static str| {
        let (backend, server) = (&backend, &server);
        async move {
            let err = backend
                .acquire(&request(&lock, &owner("a"), true))
                .await
                .unwrap_err();
            assert!(matches!(err, Error::Conflict { .. }), "{err}");
            assert_eq!(
                keys_of(server, &lock),
                [key(&lock, suffix)],
                "nothing written"
            );
        }
    };

    // Ended-attempt records of the wrong type.
    let lock = name();
    server.cli(&["SET", &key(&lock, "x"), "not a zset"]);
    refused_alone(lock, "x").await;

    // A key at the slot probe's name (`h~`, which fairlock never writes) is not read as the
    // hold being absent: a held lock stays held.
    let lock = name();
    let holding = request(&lock, &owner("a"), true);
    granted(&backend, &holding).await;
    server.cli(&["SET", &format!("{}~", key(&lock, "h")), "someone else's"]);
    busy(&backend, &request(&lock, &owner("b"), false)).await;
    queued(&backend, &request(&lock, &owner("b"), true)).await;
    let holder = backend.inspect(&lock).await.unwrap().holder.unwrap();
    assert_eq!(holder.owner, holding.owner.as_str());

    // A queue key alone, of the wrong type (the slot probe counts it with the others).
    for suffix in ["q", "z", "w"] {
        let lock = name();
        server.cli(&["SET", &key(&lock, suffix), "not fairlock's"]);
        refused_alone(lock, suffix).await;
    }

    // A fence hash whose grant record (the attempt the lock was last granted to, kept as
    // spent) is not one fairlock wrote: neither granted over nor read as no record.
    let lock = name();
    let fence = key(&lock, "f");
    server.cli(&["HSET", &fence, "t", "5", "g", "not an attempt", "gu", "1"]);
    refused_alone(lock, "f").await;
    assert_eq!(
        server.cli(&["HMGET", &fence, "t", "g"]),
        "5\nnot an attempt"
    );

    // A ticket counter `HINCRBY` would refuse (a leading zero): refused when read, not by
    // the join's `HINCRBY` after the call's first writes.
    let lock = name();
    let fence = key(&lock, "f");
    server.cli(&["HSET", &fence, "t", "5", "s", "007"]);
    refused_alone(lock, "f").await;
}

/// A waiter record whose TTL or attempt fairlock did not write (foreign data) is dropped like
/// a dead waiter's, not handed the lock: a TTL of `nan` made a hold that expired at once and
/// a fence hash expiry that deleted it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_waiter_record_is_dropped_not_handed_the_lock() {
    let server = Server::start();
    let backend = server.backend().await;
    // TTLs fairlock never writes, and (last) an attempt that is not one.
    let cases = [
        ("nan", None),
        ("inf", None),
        ("-5", None),
        ("0x10", None),
        ("0", None),
        (" 5", None),
        ("5000", Some("not-an-attempt")),
    ];
    for (ttl, attempt) in cases {
        let (lock, a, b) = (name(), owner("a"), owner("b"));
        let holding = request(&lock, &a, true);
        let grant = granted(&backend, &holding).await;
        let waiting = request(&lock, &b, true);
        queued(&backend, &waiting).await;
        let waiters = key(&lock, "w");
        let field = server
            .cli(&["HKEYS", &waiters])
            .lines()
            .find(|field| field.starts_with('#'))
            .expect("the waiter's record")
            .to_owned();
        let attempt = attempt.map_or_else(|| waiting.attempt.to_string(), str::to_owned);
        let record = format!("{ttl}:{attempt}:{}", b.as_str());
        server.cli(&["HSET", &waiters, &field, &record]);
        backend
            .release(&lock, &a, grant.token, holding.attempt)
            .await
            .unwrap();
        let state = backend.inspect(&lock).await.unwrap();
        assert_eq!(state.holder, None, "record {record:?}");
        let fence_ttl: i64 = server.cli(&["PTTL", &key(&lock, "f")]).parse().unwrap();
        assert!(
            fence_ttl > 0,
            "record {record:?}: the fence hash's PTTL is {fence_ttl}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_script_has_written_nothing() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    let holding = request(&lock, &a, true);
    let grant = granted(&backend, &holding).await;
    queued(&backend, &request(&lock, &b, true)).await;
    // The waiter records become foreign: a release that would hand over is refused before it
    // changes anything (Redis would not roll back a half-done script).
    // The holder's attempt is kept as spent in the fence hash (its grant record).
    let fence = key(&lock, "f");
    let spent = server.cli(&["HMGET", &fence, "g", "gu"]);
    assert!(spent.starts_with(&holding.attempt.to_string()), "{spent}");
    let waiters = key(&lock, "w");
    server.cli(&["DEL", &waiters]);
    server.cli(&["SET", &waiters, "foreign"]);
    let err = backend
        .release(&lock, &a, grant.token, holding.attempt)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Conflict { .. }), "{err}");
    let holder = key(&lock, "h");
    assert_eq!(server.cli(&["HGET", &holder, "c"]), "1");
    let level = format!("l:{}", holding.attempt);
    assert_eq!(server.cli(&["HEXISTS", &holder, &level]), "1");
    assert_eq!(server.cli(&["HMGET", &fence, "g", "gu"]), spent);
    assert_eq!(server.cli(&["EXISTS", &key(&lock, "x")]), "0");
    // The hold itself is untouched: it can still be extended.
    assert!(backend
        .extend(&lock, &a, grant.token, Duration::from_secs(30))
        .await
        .unwrap());
}

/// Every key of `lock` with its type and contents, to compare before and after a refused call.
fn snapshot(server: &Server, lock: &LockName) -> Vec<String> {
    keys_of(server, lock)
        .into_iter()
        .map(|key| {
            let kind = server.cli(&["TYPE", &key]);
            let contents = match kind.as_str() {
                "hash" => server.cli(&["HGETALL", &key]),
                "zset" => server.cli(&["ZRANGE", &key, "0", "-1", "WITHSCORES"]),
                "string" => server.cli(&["GET", &key]),
                other => panic!("{key} is a {other}"),
            };
            format!("{key} {kind} {contents}")
        })
        .collect()
}

/// The queue keys are type-checked by the reads of the queue's front that calls make before
/// their first write (no `TYPE` of each): a queue key holding foreign data gets a join, a
/// release that would hand over and an abandon refused with nothing written, whichever key
/// it is; also when the first waiters in line are dead, so that those reads do not reach W.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_queue_key_is_refused_before_any_write() {
    let server = Server::start();
    let backend = server.backend().await;
    for (suffix, dead_in_front) in [("q", 0), ("z", 0), ("w", 0), ("w", 4)] {
        let (lock, a) = (name(), owner("a"));
        let holding = request(&lock, &a, true);
        let grant = granted(&backend, &holding).await;
        for i in 0..dead_in_front {
            queued(
                &backend,
                &with_ttl(request(&lock, &owner(&format!("d{i}")), true), 100),
            )
            .await;
        }
        // A live waiter keeps the queue keys (they expire with the last deadline).
        let waiting = request(&lock, &owner("b"), true);
        queued(&backend, &waiting).await;
        if dead_in_front > 0 {
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let foreign = key(&lock, suffix);
        server.cli(&["DEL", &foreign]);
        server.cli(&["SET", &foreign, "foreign"]);
        let before = snapshot(&server, &lock);
        let what = format!("{suffix} foreign, {dead_in_front} dead in front");
        let refused = |result: Result<(), Error>, call: &str| match result {
            Err(Error::Conflict { .. }) => {}
            other => panic!("{what}: {call} answered {other:?}"),
        };
        let join = request(&lock, &owner("c"), true);
        refused(backend.acquire(&join).await.map(drop), "a join");
        refused(
            backend
                .release(&lock, &a, grant.token, holding.attempt)
                .await
                .map(drop),
            "a release",
        );
        refused(
            backend
                .abandon(&lock, &waiting.owner, waiting.attempt)
                .await,
            "an abandon",
        );
        assert_eq!(snapshot(&server, &lock), before, "{what}: nothing written");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unavailable_and_named() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let started = std::time::Instant::now();
    let err = RedisBackend::builder(format!("redis://user:secret@127.0.0.1:{port}"))
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "bounded");
    let endpoint = format!("127.0.0.1:{port}");
    assert!(
        matches!(&err, Error::Unavailable { backend: "redis", endpoint: e, .. } if *e == endpoint),
        "{err}"
    );
    assert!(!err.to_string().contains("secret"), "{err}");
}

/// The clients connected to `server`, not counting the `redis-cli` that asks.
fn clients_of(server: &Server) -> usize {
    server.cli(&["CLIENT", "LIST"]).lines().count() - 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_connect_leaves_no_connection_behind() {
    let server = Server::start();
    // A stopped server accepts TCP connections (the kernel does) but never answers, so
    // `connect` hangs halfway, with fred's connection tasks already running.
    server.0.pause_process().unwrap();
    let connect = RedisBackend::builder(server.url())
        .connect_timeout(Duration::from_secs(30))
        .connect();
    assert!(tokio::time::timeout(Duration::from_millis(300), connect)
        .await
        .is_err());
    server.0.resume_process().unwrap();
    // Before the fix the abandoned clients reconnected and stayed; now they quit.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let clients = clients_of(&server);
        if clients == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{clients} connections left: {}",
            server.cli(&["CLIENT", "LIST"])
        );
    }
    // Stays at zero: nothing reconnects later.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(clients_of(&server), 0);
}

/// The same for a `connect` future dropped on a thread outside any runtime, after it started
/// connecting on one: before, its clean-up looked for the current runtime and found none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_dropped_outside_a_runtime_leaves_no_connection_behind() {
    let server = Server::start();
    server.0.pause_process().unwrap();
    let mut connect = Box::pin(
        RedisBackend::builder(server.url())
            .connect_timeout(Duration::from_secs(30))
            .connect(),
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut connect)
            .await
            .is_err()
    );
    std::thread::spawn(move || drop(connect)).join().unwrap();
    server.0.resume_process().unwrap();
    until_no_clients(&server).await;
    // Stays at zero: nothing reconnects later.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(clients_of(&server), 0);
}

/// A backend dropped on a thread outside any runtime (its last clone sent there) closes its
/// connections all the same. Before, its drop looked for the current runtime to quit them on,
/// found none, and left them (and their subscriptions) for the life of the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_dropped_outside_a_runtime_closes_its_connections() {
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    let _watch = backend.watch(&lock, &owner("a")).await.unwrap();
    assert!(clients_of(&server) > 0);
    std::thread::spawn(move || drop(backend)).join().unwrap();
    until_no_clients(&server).await;
}

/// Waits until no client is connected to `server`; fails after 5 s.
async fn until_no_clients(server: &Server) {
    let started = std::time::Instant::now();
    while clients_of(server) > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "5 s after the drop: {}",
            server.cli(&["CLIENT", "LIST"])
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_growing_after_the_server_loses_its_data() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a) = (name(), owner("a"));
    let before = granted(&backend, &request(&lock, &a, true)).await;
    // This server is private to the test: wiping it is what a restart without persistence does.
    assert_eq!(server.cli(&["FLUSHALL"]), "OK");
    let after = granted(&backend, &request(&lock, &owner("b"), true)).await;
    assert!(after.token > before.token, "{after:?} after {before:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_work_and_list_finds_them() {
    let server = Server::start();
    let backend = server.backend().await;
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let names: Vec<LockName> = ["{braced}", "a}", "#hash", "spaced name:x", "größe\nline"]
        .iter()
        .map(|n| LockName::new(format!("odd-{suffix}-{n}")).unwrap())
        .collect();
    let a = owner("a");
    for (i, lock) in names.iter().enumerate() {
        granted(&backend, &request(lock, &a, true)).await;
        if i % 2 == 0 {
            queued(&backend, &request(lock, &owner("b"), true)).await;
        }
    }
    let mut listed = backend.list(&format!("odd-{suffix}-")).await.unwrap();
    listed.sort_by(|x, y| x.name.cmp(&y.name));
    let mut expected: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    expected.sort();
    assert_eq!(
        listed.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
        expected
    );
    for summary in &listed {
        assert_eq!(summary.holder.as_deref(), Some("a"));
    }
    assert!(backend.list("nothing-like-this-").await.unwrap().is_empty());
}

/// How many `SSUBSCRIBE` commands the server has run.
fn ssubscribe_calls(server: &Server) -> u64 {
    server.command_calls("ssubscribe")
}

/// Watches share the lock's subscriptions (its channel, and the backend's own channel of the
/// lock), which linger a little after the last watch and then go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_share_one_subscription_per_lock_and_drop_it() {
    let server = Server::start();
    let backend = lingering_backend(&server, Duration::from_millis(300)).await;
    let lock = name();
    let channel = key(&lock, "c");
    let subscribers = || server.cli(&["PUBSUB", "SHARDNUMSUB", &channel]);
    let first = backend.watch(&lock, &owner("a")).await.unwrap();
    let second = backend.watch(&lock, &owner("b")).await.unwrap();
    assert_eq!(subscribers(), format!("{channel}\n1"));
    let channels = subscribed_channels(&server, &lock);
    assert_eq!(channels.len(), 2, "{channels:?}");
    assert_eq!(
        ssubscribe_calls(&server),
        2,
        "one subscription of the lock's two channels for both watches"
    );
    drop(first);
    drop(second);
    // Within the linger, watching again reuses the subscription.
    let third = backend.watch(&lock, &owner("c")).await.unwrap();
    assert_eq!(ssubscribe_calls(&server), 2, "the subscription lingered");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        subscribed_channels(&server, &lock),
        channels,
        "c still watches"
    );
    drop(third);
    until_unsubscribed(&server, std::slice::from_ref(&lock)).await;
}

/// A dropped watch spawns no task of its own: the linger is kept by one timer task per
/// backend, which exits once nothing lingers (a hand-over's grantee drops its watch as its
/// `lock()` ends, so a spawn there delayed every hand-over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_watches_linger_without_a_task_each() {
    let server = Server::start();
    let backend = lingering_backend(&server, Duration::from_millis(300)).await;
    let alive = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let locks: Vec<LockName> = (0..3).map(|_| name()).collect();
    // Subscribed once, so the loop below only registers and drops.
    drop(backend.watch(&locks[0], &owner("a")).await.unwrap());
    let before = alive();
    for round in 0..60 {
        let watch = backend.watch(&locks[round % 3], &owner("a")).await.unwrap();
        drop(watch);
    }
    let during = alive();
    assert!(
        during <= before + 3,
        "60 dropped watches left {} more tasks",
        during.saturating_sub(before)
    );
    // The three channels were subscribed, so the wait below for their going means something.
    assert!(
        server.command_calls("ssubscribe") >= 3,
        "the watches subscribed nothing"
    );
    // Every channel still goes after the linger of its last watch, and the timer task
    // with them.
    until_unsubscribed(&server, &locks).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(alive() <= before, "{} tasks left", alive() - before);
}

/// A watch dropped on a thread with no runtime (a `lock()` future dropped there) still ends
/// its subscription after the linger: the unsubscribe runs on the dispatcher's runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_dropped_outside_a_runtime_still_unsubscribes() {
    let server = Server::start();
    let backend = lingering_backend(&server, Duration::from_millis(100)).await;
    let lock = name();
    let watch = backend.watch(&lock, &owner("a")).await.unwrap();
    assert!(!subscribed_channels(&server, &lock).is_empty());
    std::thread::spawn(move || drop(watch)).join().unwrap();
    until_unsubscribed(&server, std::slice::from_ref(&lock)).await;
}

/// A backend whose subscriptions linger `linger` after their last watch.
async fn lingering_backend(server: &Server, linger: Duration) -> RedisBackend {
    RedisBackend::builder(server.url())
        .subscription_linger(linger)
        .connect()
        .await
        .unwrap()
}

/// Waits until none of `locks` has a subscribed channel; fails after 5 s.
async fn until_unsubscribed(server: &Server, locks: &[LockName]) {
    let started = std::time::Instant::now();
    while locks
        .iter()
        .any(|lock| !subscribed_channels(server, lock).is_empty())
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never unsubscribed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The shard channels of `lock` this server has subscribers for, sorted.
fn subscribed_channels(server: &Server, lock: &LockName) -> Vec<String> {
    let pattern = format!("{}*", key(lock, "c"));
    sorted_lines(server, &["PUBSUB", "SHARDCHANNELS", &pattern])
}

/// Everything published on `channels` while `act` runs, read by a subscriber of the test's
/// own: (channel, message) in order. A marker the test publishes on the first channel after
/// `act` ends the reading.
async fn published_during<F: std::future::Future<Output = ()>>(
    server: &Server,
    channels: &[String],
    act: F,
) -> Vec<(String, String)> {
    use fairlock_redis::fred::clients::SubscriberClient;
    use fairlock_redis::fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
    use fairlock_redis::fred::types::config::Config;
    let listener =
        SubscriberClient::new(Config::from_url(&server.url()).unwrap(), None, None, None);
    listener.init().await.unwrap();
    let mut messages = listener.message_rx();
    for channel in channels {
        listener.ssubscribe(channel.as_str()).await.unwrap();
    }
    act.await;
    server.cli(&["SPUBLISH", &channels[0], "end"]);
    let mut seen = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(5), messages.recv())
            .await
            .expect("the marker arrives within 5 s")
            .unwrap();
        let payload: String = message.value.convert().unwrap();
        if payload == "end" {
            break;
        }
        seen.push((message.channel.to_string(), payload));
    }
    listener.quit().await.unwrap();
    seen
}

/// A hand-over to an owner that acts through one backend (`Owner::unique`, as every handle of
/// `LockClient::fair_lock` has) is published on the channel of the grantee's process alone
/// (issue 13: with one channel per lock, every hand-over woke every process waiting for the
/// lock). Each backend watching a lock subscribes the lock's channel (for messages to every
/// waiter) and one of its own under the lock's tag, which its waiters' records name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_is_published_to_the_grantees_process_alone() {
    let server = Server::start();
    let (holder, second, third) = (
        server.backend().await,
        server.backend().await,
        server.backend().await,
    );
    let (lock, a, b, c) = (name(), Owner::unique(), Owner::unique(), Owner::unique());
    let lock_channel = key(&lock, "c");
    let mut b_watch = second.watch(&lock, &b).await.unwrap();
    let seconds = subscribed_channels(&server, &lock);
    let mut c_watch = third.watch(&lock, &c).await.unwrap();
    let all = subscribed_channels(&server, &lock);
    assert_eq!(
        all.len(),
        3,
        "the lock's channel and one per backend: {all:?}"
    );
    assert!(all.contains(&lock_channel), "{all:?}");
    let second_channel = seconds
        .into_iter()
        .find(|channel| *channel != lock_channel)
        .expect("the second backend has a channel of its own");

    let holding = request(&lock, &a, true);
    let grant = granted(&holder, &holding).await;
    let (b_request, c_request) = (request(&lock, &b, true), request(&lock, &c, true));
    queued(&second, &b_request).await;
    queued(&third, &c_request).await;
    let mut listened = vec![lock_channel.clone()];
    listened.extend(
        all.iter()
            .filter(|channel| **channel != lock_channel)
            .cloned(),
    );
    let seen = published_during(&server, &listened, async {
        release(&holder, &holding, grant.token).await;
    })
    .await;
    assert_eq!(seen.len(), 1, "one message for the hand-over: {seen:?}");
    assert_eq!(
        seen[0].0, second_channel,
        "on b's backend's channel: {seen:?}"
    );
    assert!(
        seen[0].1.starts_with("G ") && seen[0].1.ends_with(&format!(" {b}")),
        "{seen:?}"
    );
    handed_over(&mut b_watch, &b_request).await;
    let heard = tokio::time::timeout(Duration::from_millis(200), c_watch.recv()).await;
    assert!(heard.is_err(), "c's backend heard {heard:?}");
}

/// A heartbeat stores what it asks, also when it comes from the head of the queue (whose
/// record the call has read already): a new liveness TTL, which the hand-over's pending grant
/// lasts, and a new process to tell (here the same attempt, sent again through another
/// backend).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_of_the_head_updates_its_record() {
    let server = Server::start();
    let (holder, first, second) = (
        server.backend().await,
        server.backend().await,
        server.backend().await,
    );
    // Each change alone, on a lock of its own: a new process to tell, then a new TTL.
    for new_ttl in [false, true] {
        let (lock, a, b) = (name(), Owner::unique(), Owner::unique());
        let holding = request(&lock, &a, true);
        let grant = granted(&holder, &holding).await;
        let mut watch = second.watch(&lock, &b).await.unwrap();
        let waiting = with_ttl(request(&lock, &b, true), 600_000);
        queued(if new_ttl { &second } else { &first }, &waiting).await;
        let waiting = if new_ttl {
            with_ttl(waiting, 2_000)
        } else {
            waiting
        };
        queued(&second, &waiting).await;
        release(&holder, &holding, grant.token).await;
        handed_over(&mut watch, &waiting).await;
        let left = lease_left(&holder, &lock).await;
        assert!(
            left <= waiting.waiter_ttl,
            "the pending grant lasts the waiter's TTL: {left:?}"
        );
    }
}

/// A waiter whose record names no channel of its process (queued by a version before
/// per-process channels, during a rolling upgrade) is woken on the lock's channel, which every
/// watching backend keeps subscribed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_record_names_no_channel_is_woken_on_the_locks_channel() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), Owner::unique(), Owner::unique());
    let mut watch = backend.watch(&lock, &b).await.unwrap();
    let holding = request(&lock, &a, true);
    let grant = granted(&backend, &holding).await;
    let waiting = request(&lock, &b, true);
    queued(&backend, &waiting).await;
    let waiters = key(&lock, "w");
    let ticket = server.cli(&["HGET", &waiters, &format!("@{}", waiting.attempt)]);
    assert_eq!(
        server.cli(&["HDEL", &waiters, &format!("${ticket}")]),
        "1",
        "the record named the backend's channel"
    );
    let seen = published_during(&server, &[key(&lock, "c")], async {
        release(&backend, &holding, grant.token).await;
    })
    .await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    handed_over(&mut watch, &waiting).await;
}

/// An owner of the caller's choosing may wait in several processes at once: a hand-over to one
/// of its attempts reaches its watches in every process (on the lock's channel), so an attempt
/// elsewhere re-enters at once rather than at its next heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_waiting_in_two_processes_hears_of_its_grant_in_both() {
    let server = Server::start();
    let (holder, here, there) = (
        server.backend().await,
        server.backend().await,
        server.backend().await,
    );
    let (lock, a, job) = (name(), Owner::unique(), owner("job-7"));
    let holding = request(&lock, &a, true);
    let grant = granted(&holder, &holding).await;
    let _here_watch = here.watch(&lock, &job).await.unwrap();
    let mut there_watch = there.watch(&lock, &job).await.unwrap();
    let (first, second) = (request(&lock, &job, true), request(&lock, &job, true));
    queued(&here, &first).await;
    queued(&there, &second).await;
    release(&holder, &holding, grant.token).await;
    match next_wake(&mut there_watch).await {
        Wake::Granted { attempt, .. } => assert_eq!(attempt, first.attempt),
        other => panic!("expected the hand-over to the first attempt, got {other:?}"),
    }
    // Which lets the second attempt re-enter now.
    assert_eq!(granted(&there, &second).await.hold_count, 2);
}

/// A waiter without a waker is told on the lock's channel even when its ticket number had a
/// waker before: older versions' scripts leave a ticket's "$" field behind, and ticket numbers
/// start again after the fence hash is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_without_a_waker_ignores_a_stale_one() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, job) = (name(), Owner::unique(), owner("job-7"));
    let holding = request(&lock, &a, true);
    let grant = granted(&backend, &holding).await;
    let waiters = key(&lock, "w");
    // The first ticket will be 1.
    server.cli(&["HSET", &waiters, "$1", "00ff"]);
    let _watch = backend.watch(&lock, &job).await.unwrap();
    let waiting = request(&lock, &job, true);
    queued(&backend, &waiting).await;
    assert_eq!(
        server.cli(&["HGET", &waiters, &format!("@{}", waiting.attempt)]),
        "1"
    );
    let lock_channel = key(&lock, "c");
    let stale = format!("{lock_channel}:00ff");
    let seen = published_during(&server, &[lock_channel.clone(), stale], async {
        release(&backend, &holding, grant.token).await;
    })
    .await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, lock_channel, "{seen:?}");
}

/// A waiter's record goes whole when it leaves the queue, however it leaves: abandoned,
/// handed the lock, or evicted dead (by the next join or heartbeat: a hand-over clears only
/// the dead in front of the head).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_leaves_no_field_behind() {
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    let [a, b, c, d, e] = std::array::from_fn(|_| Owner::unique());
    let holding = request(&lock, &a, true);
    let grant = granted(&backend, &holding).await;
    let handed = request(&lock, &b, true);
    let abandoned = request(&lock, &c, true);
    let dead = with_ttl(request(&lock, &d, true), 100);
    let staying = request(&lock, &e, true);
    for waiter in [&handed, &abandoned, &dead, &staying] {
        queued(&backend, waiter).await;
    }
    let fields = || sorted_lines(&server, &["HKEYS", &key(&lock, "w")]);
    assert_eq!(
        fields().len(),
        12,
        "three fields per waiter: {:?}",
        fields()
    );
    abandon(&backend, &abandoned).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    release(&backend, &holding, grant.token).await;
    queued(&backend, &staying).await;
    let ticket = server.cli(&["HGET", &key(&lock, "w"), &format!("@{}", staying.attempt)]);
    let mut expected = vec![
        format!("#{ticket}"),
        format!("${ticket}"),
        format!("@{}", staying.attempt),
    ];
    expected.sort();
    assert_eq!(fields(), expected, "only the staying waiter's record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_told_to_recheck_after_the_subscriber_reconnects() {
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    let mut watch = backend.watch(&lock, &owner("a")).await.unwrap();
    // Kill every client connection but this redis-cli's; fred reconnects.
    server.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert_eq!(next_wake(&mut watch).await, Wake::Recheck);
    // And the subscription is back: a hand-over still reaches the waiter.
    let (a, b) = (owner("a"), owner("b"));
    let holding = request(&lock, &b, true);
    let grant = granted(&backend, &holding).await;
    let waiting = request(&lock, &a, true);
    queued(&backend, &waiting).await;
    let started = std::time::Instant::now();
    let channel = format!("fairlock:{{{lock}}}:c");
    while server.cli(&["PUBSUB", "SHARDNUMSUB", &channel]) != format!("{channel}\n1") {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never resubscribed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    release(&backend, &holding, grant.token).await;
    loop {
        match next_wake(&mut watch).await {
            Wake::Recheck => continue,
            Wake::Granted {
                attempt,
                grant: to_a,
            } => {
                assert_eq!(attempt, waiting.attempt);
                assert!(to_a.token > grant.token);
                break;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_loses_holds_but_tokens_keep_growing() {
    let mut server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    let holding = request(&lock, &a, true);
    let before = granted(&backend, &holding).await;
    let mut watch = backend.watch(&lock, &b).await.unwrap();
    // No persistence: data and cached scripts are gone after this.
    server.0.restart().unwrap();
    assert_eq!(
        next_wake(&mut watch).await,
        Wake::Recheck,
        "waiters look again after a reconnect"
    );
    let after = granted(&backend, &request(&lock, &b, true)).await;
    assert!(after.token > before.token, "{after:?} after {before:?}");
    assert_eq!(
        release(&backend, &holding, before.token).await,
        ReleaseOutcome::NotHeld
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_goes_away_makes_calls_unavailable() {
    let mut server = Server::start();
    let backend = RedisBackend::builder(server.url())
        .command_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let lock = name();
    granted(&backend, &request(&lock, &owner("a"), true)).await;
    server.0.stop();
    let started = std::time::Instant::now();
    let err = backend
        .acquire(&request(&lock, &owner("b"), true))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded by the command timeout"
    );
    let endpoint = format!("127.0.0.1:{}", server.0.port());
    assert!(
        matches!(&err, Error::Unavailable { endpoint: e, .. } if *e == endpoint),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_work_and_never_show() {
    const SECRET: &str = "s3cret-for-this-test";
    let server =
        Server(fairlock_testsupport::RedisServer::start_with(&["--requirepass", SECRET]).unwrap());
    let url = format!("redis://:{SECRET}@127.0.0.1:{}", server.0.port());
    let backend = RedisBackend::connect(&url).await.unwrap();
    granted(&backend, &request(&name(), &owner("a"), true)).await;
    let shown = format!("{backend:?} {:?}", RedisBackend::builder(url));
    assert!(!shown.contains(SECRET), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_on_clients_built_elsewhere() {
    use fairlock_redis::fred::clients::SubscriberClient;
    use fairlock_redis::fred::types::config::Config;
    let server = Server::start();
    let (pool, subscriber) = common::clients_of_our_own(&server).await;
    let backend = RedisBackend::from_clients(pool, subscriber, "mine:").unwrap();
    assert_eq!(backend.prefix(), "mine:");
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    let holding = request(&lock, &a, true);
    let grant = granted(&backend, &holding).await;
    let waiting = request(&lock, &b, true);
    queued(&backend, &waiting).await;
    let mut watch = backend.watch(&lock, &b).await.unwrap();
    release(&backend, &holding, grant.token).await;
    handed_over(&mut watch, &waiting).await;
    let keys = server.cli(&["--scan", "--pattern", &format!("mine:{{{lock}}}*")]);
    assert!(keys.contains(&format!("mine:{{{lock}}}:h")), "{keys}");
    assert!(matches!(
        RedisBackend::from_clients(
            backend.pool().clone(),
            SubscriberClient::new(Config::default(), None, None, None),
            "{bad}"
        ),
        Err(Error::InvalidArgument { .. })
    ));
}

/// A dropped backend on clients built elsewhere takes its channels off their subscriber and
/// ends its tasks (see `common::dropped_backend_leaves_no_subscription_or_task`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_backend_on_clients_built_elsewhere_leaves_no_subscription_or_task() {
    common::dropped_backend_leaves_no_subscription_or_task(&Server::start(), "SHARDCHANNELS").await;
}

/// Two backends on one subscriber made elsewhere (the second made while the first is dropped,
/// whose tasks may still run, or both kept): a lock's channel is the same for both, so neither
/// the first's linger nor its drop may unsubscribe it while the second still watches the lock.
/// Before, both did, and the second's waiters heard nothing on it (`A`, and the wake-ups of
/// owners shared between processes) until a reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_sharing_a_subscriber_keep_the_channels_the_other_watches() {
    let server = Server::start();
    let (pool, subscriber) = common::clients_of_our_own(&server).await;
    let first = RedisBackend::from_clients(pool.clone(), subscriber.clone(), "two:").unwrap();
    let second = RedisBackend::from_clients(pool.clone(), subscriber.clone(), "two:").unwrap();
    let lock = name();
    let pattern = format!("two:{{{}}}:c*", lock.as_str());
    let listed = || sorted_lines(&server, &["PUBSUB", "SHARDCHANNELS", &pattern]);
    let shared = format!("two:{{{}}}:c", lock.as_str());
    let mut wakes = second.watch(&lock, &owner("b")).await.unwrap();
    assert_eq!(listed().len(), 2, "the lock's channel and the second's own");
    drop(first.watch(&lock, &owner("a")).await.unwrap());
    assert_eq!(listed().len(), 3, "and the first's own: {:?}", listed());
    // The first's linger (2 s) runs out: its own channel goes, the shared one stays.
    let started = std::time::Instant::now();
    while listed().len() > 2 {
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", listed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        listed().contains(&shared),
        "after the linger: {:?}",
        listed()
    );
    // The same when the first is dropped with the channel lingering.
    drop(first.watch(&lock, &owner("a")).await.unwrap());
    assert_eq!(listed().len(), 3, "{:?}", listed());
    drop(first);
    while listed().len() > 2 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            listed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(listed().contains(&shared), "after the drop: {:?}", listed());
    // And the second's watch hears what is published there.
    server.cli(&["SPUBLISH", &shared, "A"]);
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(2), wakes.recv()).await,
        Ok(Some(fairlock::backend::Wake::Recheck))
    );
}

#[test]
fn the_backend_is_a_shareable_trait_object() {
    fn shareable<T: Send + Sync + 'static>() {}
    shareable::<RedisBackend>();
    let _erase: fn(RedisBackend) -> std::sync::Arc<dyn LockBackend> = |b| std::sync::Arc::new(b);
}

/// `unlock()` whose release is applied but whose reply is lost with the connection: fred
/// reconnects and sends the release again, unseen by the core, and the second copy finds the
/// hold gone. That is a release, not a lost lease. Failed before the scripts remembered
/// releases: the second copy answered `N` and `unlock()` returned `LeaseLost` (seen in the
/// Sentinel failover tests, where the release reached a primary just before it died). On
/// Redis 7 (FCALL), whose command names the release function.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlock_sent_again_by_the_client_after_a_lost_reply_is_a_release() {
    use fairlock::LockClient;
    use fairlock_testsupport::LossyProxy;

    let server = Server::start();
    let proxy = LossyProxy::start(server.0.addr()).unwrap();
    let backend = RedisBackend::connect(&format!("redis://{}", proxy.addr()))
        .await
        .unwrap();
    let client = LockClient::new(backend);
    let lock = client.fair_lock(name().as_str()).unwrap();
    for _ in 0..3 {
        let guard = lock.lock().await.unwrap();
        // Not before: the library's load also names the release function.
        proxy.lose_reply_to(b"fairlock_release");
        guard
            .unlock()
            .await
            .expect("the release was applied: unlock() must say so");
        assert!(lock.state().await.unwrap().holder.is_none());
    }
    assert_eq!(proxy.lost(), 3, "every release lost its first reply");
}

/// The connections a builder makes keep TCP keepalive on: a connection a NAT or firewall
/// dropped in silence is found broken and made again (the subscriber's included, which
/// otherwise writes nothing that could fail, so its waiters would hear of hand-overs only at
/// their heartbeats), and an idle one is not dropped in the first place. Read from the
/// kernel's socket table: an idle established socket with keepalive has its keepalive timer
/// running (`tr` 2), one without has no timer (`tr` 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_keep_tcp_keepalive_on() {
    let server = Server::start();
    let backend = RedisBackend::builder(server.url())
        .pool_size(2)
        .connect()
        .await
        .unwrap();
    // A subscribed channel: the subscriber connection is open and idle.
    let _watch = backend.watch(&name(), &owner("a")).await.unwrap();
    let port = format!("{:04X}", server.0.port());
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    // Our side of each connection to the server: its remote address is the server's.
    let timers: Vec<&str> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let established = fields.get(3) == Some(&"01");
            let to_server = fields.get(2)?.ends_with(&format!(":{port}"));
            (established && to_server).then(|| fields[5].split(':').next().unwrap_or(""))
        })
        .collect();
    // Two pooled connections and the subscriber, at least.
    assert!(timers.len() >= 3, "connections to the server: {timers:?}");
    assert!(
        timers.iter().all(|timer| *timer == "02"),
        "timers (02: keepalive) of the connections to the server: {timers:?}"
    );
}

/// Calls that find the function library gone while the server then stops answering: those
/// queued behind the one loading it do not each make their call in turn while holding the
/// load's lock, which made the k-th wait k command timeouts. They wait for the load, then
/// call at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_queued_behind_a_failing_library_load_do_not_wait_in_turn() {
    use fairlock_testsupport::LossyProxy;

    const COMMAND_TIMEOUT: Duration = Duration::from_millis(400);
    const CALLS: u32 = 4;
    let server = Server::start();
    let proxy = LossyProxy::start(server.0.addr()).unwrap();
    let backend = RedisBackend::builder(format!("redis://{}", proxy.addr()))
        .pool_size(1)
        .command_timeout(COMMAND_TIMEOUT)
        .connect()
        .await
        .unwrap();
    granted(&backend, &request(&name(), &owner("a"), true)).await;
    assert_eq!(server.cli(&["FUNCTION", "FLUSH"]), "OK");
    // The load reaches the server; from it on, no reply comes back.
    proxy.stall_replies_from(b"FUNCTION");
    let started = tokio::time::Instant::now();
    let calls: Vec<_> = (0..CALLS)
        .map(|_| {
            let backend = backend.clone();
            tokio::spawn(async move {
                let result = backend.acquire(&request(&name(), &owner("a"), true)).await;
                (result.is_err(), started.elapsed())
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    let mut failed = 0;
    for call in calls {
        let (err, took) = call.await.unwrap();
        failed += u32::from(err);
        slowest = slowest.max(took);
    }
    proxy.release();
    assert_eq!(failed, CALLS, "every call met the silent server");
    // The load's timeout, then the calls' own, together; before, one more per queued call
    // (1.6 s).
    assert!(
        slowest < COMMAND_TIMEOUT * 3,
        "the slowest of {CALLS} calls took {slowest:?} (command timeout {COMMAND_TIMEOUT:?})"
    );
    granted(&backend, &request(&name(), &owner("a"), true)).await;
}

/// After `FUNCTION FLUSH`, calls made at once all find their function missing: one load
/// serves them all, including calls whose "missing" reply arrives after that load ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_library_load_serves_the_calls_that_found_it_missing() {
    let server = Server::start();
    let backend = RedisBackend::builder(server.url())
        .pool_size(4)
        .connect()
        .await
        .unwrap();
    granted(&backend, &request(&name(), &owner("a"), true)).await;
    for round in 0..5 {
        assert_eq!(server.cli(&["FUNCTION", "FLUSH"]), "OK");
        let loads_before = server.command_calls("function|load");
        let calls: Vec<_> = (0..16)
            .map(|_| {
                let backend = backend.clone();
                tokio::spawn(async move {
                    granted(&backend, &request(&name(), &owner("a"), true)).await;
                })
            })
            .collect();
        for call in calls {
            call.await.unwrap();
        }
        let loads = server.command_calls("function|load") - loads_before;
        assert_eq!(loads, 1, "round {round}: {loads} loads for 16 calls");
    }
}

//! The fault suite against PostgreSQL: separate contender processes on one server, killed
//! with SIGKILL while holding or waiting, the listening connections killed with
//! `pg_terminate_backend` again and again, and the server restarted under contention.
//!
//! The same checks as `exclusion.rs`, `crash.rs`, `lost_notifications.rs` and `restart.rs` make
//! against Redis. What differs is what a restart keeps: PostgreSQL keeps every committed hold
//! and queue entry (crash recovery from its WAL), so a restart shorter than the leases loses
//! nothing, and a longer one ends the holds by their leases only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock::{Error, FairLock, LockClient, LockGuard, LockOptions};
use fairlock_faults::contender::{assert_exclusive, Contender, Spec};
use fairlock_faults::holds::{Hold, Holds};
use fairlock_faults::redis_env::{bounded, options, Injector};
use fairlock_faults::store_view::{lease_floor, observer, wait_for_waiters};
use fairlock_postgres::PostgresBackend;
use fairlock_testsupport::PostgresServer;
use rand::Rng;
use tokio::time::sleep;

const CONTENDER: &str = env!("CARGO_BIN_EXE_contender");
/// Slack allowed on top of a lease or TTL before the next process must hold.
const SLACK: Duration = Duration::from_secs(1);
/// Rounding between the store's clock and this process's clock.
const ROUNDING: Duration = Duration::from_millis(5);
/// Short waiter TTL, so a dead waiter is noticed quickly.
const TTL: Duration = Duration::from_secs(2);

fn server() -> PostgresServer {
    PostgresServer::start().expect("postgres starts")
}

/// A client with its own backend (pool and listening connection), as a process has.
async fn client(url: &str, options: LockOptions) -> LockClient {
    let backend = bounded(
        "connecting a backend",
        Duration::from_secs(10),
        PostgresBackend::builder(url).pool_size(2).connect(),
    )
    .await
    .unwrap_or_else(|err| panic!("connecting to {url}: {err}"));
    LockClient::new(backend).with_options(options).unwrap()
}

/// 16 processes × 100 acquisitions, each doing SELECT, pause, upsert + 1 of one row under the
/// lock: any two overlapping holders would lose an increment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_processes_never_hold_at_once() {
    const PROCESSES: usize = 16;
    const EACH: u64 = 100;
    let server = server();
    server
        .psql("CREATE TABLE fault_counter (key text PRIMARY KEY, value bigint NOT NULL)")
        .unwrap();
    // Create fairlock's schema once, before 16 processes start at the same moment.
    drop(observer(&server.url()).await);
    let spec = Spec {
        url: server.url(),
        name: "exclusion".into(),
        loop_count: Some(EACH),
        counter: Some("faults".into()),
        ..Spec::default()
    };
    let started = Instant::now();
    let mut contenders: Vec<Contender> = (0..PROCESSES)
        .map(|i| Contender::spawn(CONTENDER, format!("p{i}"), &spec))
        .collect();
    let deadline = started + Duration::from_secs(120);
    for contender in &mut contenders {
        contender.done(deadline).await;
    }
    let elapsed = started.elapsed();
    let count = server
        .psql("SELECT value FROM fault_counter WHERE key = 'faults'")
        .unwrap();
    assert_eq!(
        count,
        (PROCESSES as u64 * EACH).to_string(),
        "lost increments"
    );
    let mut holds = Vec::new();
    for contender in &mut contenders {
        let mine = contender.holds();
        assert_eq!(mine.len() as u64, EACH, "{}: holds", contender.label());
        assert!(mine.iter().all(|h| h.end_ns != u128::MAX), "all released");
        holds.extend(mine);
    }
    let holds = assert_exclusive(holds);
    assert_eq!(holds.len(), PROCESSES * EACH as usize);
    println!(
        "{} acquisitions by {PROCESSES} processes in {elapsed:?}, counter {count}",
        holds.len()
    );
}

/// One process holds; eight more queue one at a time; on release they get the lock in
/// exactly the order they queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_are_served_in_queue_order() {
    const WAITERS: usize = 8;
    let server = server();
    let name = "fifo";
    let store = observer(&server.url()).await;
    let base = Spec::on(server.url(), name);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut holder = Contender::spawn(CONTENDER, "holder", &base);
    holder.acquired(0, deadline).await;
    let waiter_spec = Spec {
        hold: Some(Duration::from_millis(20)),
        ..base.clone()
    };
    let mut waiters = Vec::new();
    let mut owners = Vec::new();
    for i in 0..WAITERS {
        let mut waiter = Contender::spawn(CONTENDER, format!("w{i}"), &waiter_spec);
        owners.push(waiter.ready(deadline).await);
        let expected: Vec<&str> = owners.iter().map(String::as_str).collect();
        wait_for_waiters(&store, name, &expected, deadline).await;
        waiters.push(waiter);
    }
    holder.release();
    holder.done(deadline).await;
    for waiter in &mut waiters {
        waiter.done(deadline).await;
    }
    let mut holds = holder.holds();
    for waiter in &mut waiters {
        holds.extend(waiter.holds());
    }
    let order: Vec<String> = assert_exclusive(holds)
        .into_iter()
        .map(|hold| hold.who)
        .collect();
    let expected: Vec<String> = std::iter::once("holder".to_owned())
        .chain((0..WAITERS).map(|i| format!("w{i}")))
        .collect();
    assert_eq!(order, expected, "acquisition order");
}

/// A holder with a 2 s watchdog lease is SIGKILLed: the waiting process holds within the
/// lease + 1 s, but not before the lease ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_is_replaced_after_its_lease() {
    const LEASE: Duration = Duration::from_secs(2);
    let server = server();
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
    tokio::time::sleep(LEASE / 2).await;
    let (earliest_expiry, _) = lease_floor(&store, name).await;
    let killed = holder.kill();
    let acquired = waiter.acquired(0, killed + LEASE + SLACK).await.at;
    println!("hand-over {:?} after SIGKILL", acquired - killed);
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

/// The head waiter is SIGKILLed and the lock released at once: the store hands it to the
/// dead process, and that pending grant lasts only the waiter TTL; then the next waiters
/// hold, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_head_waiter_delays_the_queue_by_at_most_its_ttl() {
    let server = server();
    let name = "crash-head";
    let store = observer(&server.url()).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut holder, mut waiters, owners) = holder_and_queue(&server, &store, name, deadline).await;
    let killed = waiters[0].kill();
    holder.release();
    holder.done(deadline).await;
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
    let server = server();
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
    holder.release();
    let last = waiters[2].acquired(0, killed + TTL + SLACK).await.at;
    println!("the last waiter holds {:?} after SIGKILL", last - killed);
    finish_in_order(holder, waiters, &["holder", "w0", "w2"], deadline).await;
}

/// A holder (released on demand) and three waiters w0, w1, w2 with a 2 s TTL, queued in
/// that order; returns them and the waiters' owner ids.
async fn holder_and_queue(
    server: &PostgresServer,
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

async fn finish_in_order(
    holder: Contender,
    waiters: Vec<Contender>,
    expected: &[&str],
    deadline: Instant,
) {
    let mut holder = holder;
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

/// Waiter TTL: heartbeats every 200 ms.
const WAITER_TTL: Duration = Duration::from_millis(600);
const HEARTBEAT: Duration = Duration::from_millis(200);
/// What a hand-over may take beyond one heartbeat: the confirming round trip, the release's
/// round trip and a loaded machine's scheduling; still well below the waiter TTL.
const HANDOVER_SLACK: Duration = Duration::from_millis(300);

/// The listening connections are killed with `pg_terminate_backend` every 70 ms while six
/// contenders (each its own backend) hand a lock around: every hand-over still completes
/// within a heartbeat (lost notifications are made up by the heartbeat or by the recheck
/// each backend sends its waiters when it listens again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_listening_connections_cost_at_most_a_heartbeat() {
    const CONTENDERS: usize = 6;
    const ROUNDS: usize = 8;
    let server = server();
    let url = server.url();
    let opts = options(Duration::from_secs(10), WAITER_TTL);
    let killed = Arc::new(AtomicU64::new(0));
    let counted = killed.clone();
    let psql = PsqlKiller(server.port());
    let killer = Injector::every(Duration::from_millis(70), move || {
        let count = psql.terminate_listeners();
        counted.fetch_add(count, Ordering::Relaxed);
    });
    let holds = Holds::new();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for who in 0..CONTENDERS {
        let lock = client(&url, opts.clone()).await.fair_lock("busy").unwrap();
        tasks.push(tokio::spawn(contender(lock, who, ROUNDS, holds.clone())));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed();
    let kills = killer.stop();
    let killed = killed.load(Ordering::Relaxed);
    let sorted = holds.assert_exclusive();
    assert_eq!(
        sorted.len(),
        CONTENDERS * ROUNDS,
        "every acquisition completed"
    );
    let gaps = holds.gaps();
    let worst = gaps.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{} hand-overs in {elapsed:?} under {kills} rounds of pg_terminate_backend ({killed} \
         listening connections killed): worst gap {worst:?}",
        gaps.len()
    );
    assert!(
        worst <= HEARTBEAT + HANDOVER_SLACK,
        "a hand-over took {worst:?}, more than a heartbeat ({HEARTBEAT:?}) + {HANDOVER_SLACK:?}"
    );
    assert!(
        killed >= 10,
        "only {killed} listening connections were killed"
    );
}

/// Kills the server's listening connections with `pg_terminate_backend`, through `psql`.
struct PsqlKiller(u16);

impl PsqlKiller {
    fn terminate_listeners(&self) -> u64 {
        let output =
            std::process::Command::new(fairlock_testsupport::require_postgres().join("psql"))
                .args([
                    "-X",
                    "-A",
                    "-t",
                    "-q",
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "postgres",
                    "-d",
                    "postgres",
                ])
                .arg("-p")
                .arg(self.0.to_string())
                .arg("-c")
                .arg(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()",
                )
                .stdin(std::process::Stdio::null())
                .output()
                .expect("psql runs");
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .unwrap_or(0)
    }
}

async fn contender(lock: FairLock, who: usize, rounds: usize, holds: Holds) {
    for _ in 0..rounds {
        let guard = bounded("lock()", Duration::from_secs(20), lock.lock())
            .await
            .unwrap_or_else(|err| panic!("contender {who}: {err}"));
        let start = tokio::time::Instant::now();
        let hold_for = Duration::from_millis(rand::thread_rng().gen_range(5..25));
        sleep(hold_for).await;
        assert!(!guard.is_lease_lost(), "contender {who} lost its lease");
        holds.push(Hold {
            who,
            token: guard.fencing_token(),
            start,
            end: tokio::time::Instant::now(),
        });
        bounded("unlock()", Duration::from_secs(10), guard.unlock())
            .await
            .unwrap_or_else(|err| panic!("contender {who}: unlock: {err}"));
        sleep(Duration::from_millis(2)).await;
    }
}

/// The watchdog lease of the holder that outlives the outage: renewed every 500 ms.
const LEASE: Duration = Duration::from_millis(1500);
/// The watchdog lease of the holder that rides out a quick restart: long enough for the
/// server to come back on a loaded machine (a restart takes about a second).
const LONG_LEASE: Duration = Duration::from_secs(6);
/// No single call may take longer than this, faults included.
const CALL_LIMIT: Duration = Duration::from_secs(20);
const RESTART_WAITERS: usize = 4;

/// Holds `guard` for a moment and releases it, recording the hold.
async fn hold(guard: LockGuard, who: usize, holds: &Holds) {
    let start = tokio::time::Instant::now();
    sleep(Duration::from_millis(20)).await;
    holds.push(Hold {
        who,
        token: guard.fencing_token(),
        start,
        end: tokio::time::Instant::now(),
    });
    bounded("unlock", CALL_LIMIT, guard.unlock())
        .await
        .unwrap_or_else(|err| panic!("contender {who}: unlock after the restart: {err}"));
}

/// A holder and four waiters on one lock; the server is shut down at once (immediate
/// shutdown: every connection drops, nothing is checkpointed), stays down for `outage`, and
/// starts again with its data (crash recovery). Returns whether the holder's lease was lost.
async fn restart_under_contention(outage: Duration, lease: Duration) -> bool {
    let mut server = server();
    let url = server.url();
    // Waiters keep their places while the server is down for less than their TTL.
    let opts = options(lease, Duration::from_secs(10));
    let lock = client(&url, opts.clone())
        .await
        .fair_lock("contended")
        .unwrap();
    let held = lock.lock().await.unwrap();
    let token_before = held.fencing_token();
    let holds = Holds::new();
    let mut waiters = Vec::new();
    for who in 0..RESTART_WAITERS {
        let mine = client(&url, opts.clone())
            .await
            .fair_lock("contended")
            .unwrap();
        let holds = holds.clone();
        waiters.push(tokio::spawn(async move {
            let guard = bounded("a waiter's lock()", CALL_LIMIT, mine.lock())
                .await
                .unwrap_or_else(|err| panic!("waiter {who}: {err}"));
            hold(guard, who, &holds).await;
        }));
        let deadline = Instant::now() + CALL_LIMIT;
        while lock.state().await.unwrap().waiters.len() < who + 1 {
            assert!(Instant::now() < deadline, "waiter {who} never queued");
            sleep(Duration::from_millis(10)).await;
        }
    }
    let down = tokio::time::Instant::now();
    tokio::task::block_in_place(|| {
        server.stop();
        std::thread::sleep(outage);
        server.restart().unwrap();
    });
    let back = down.elapsed();
    let lost = if outage > lease + Duration::from_millis(500) {
        // Renewals failed all along: the local deadline alone fires the signal.
        bounded("the lost-lease signal", lease, held.lease_lost()).await;
        true
    } else {
        // Back within the lease: the next renewals succeed and the hold is intact.
        sleep(lease).await;
        held.is_lease_lost()
    };
    let holder_end = tokio::time::Instant::now();
    match held.unlock().await {
        Ok(()) => assert!(!lost, "unlocked a hold whose lease was lost"),
        Err(err) => assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}"),
    }
    for waiter in waiters {
        waiter.await.unwrap();
    }
    let holds = holds.assert_exclusive();
    assert_eq!(
        holds.len(),
        RESTART_WAITERS,
        "every waiter acquired after the restart"
    );
    let mut last = token_before;
    for hold in &holds {
        assert!(hold.start >= down);
        if !lost {
            assert!(
                hold.start >= holder_end - Duration::from_millis(50),
                "{hold:?}"
            );
        }
        assert!(hold.token > last, "tokens {last} then {}", hold.token);
        last = hold.token;
    }
    let order: Vec<usize> = holds.iter().map(|hold| hold.who).collect();
    assert_eq!(
        order,
        (0..RESTART_WAITERS).collect::<Vec<_>>(),
        "FIFO across the restart"
    );
    eprintln!(
        "outage {outage:?}: back after {back:?}; lease lost: {lost}; then {order:?} in order, \
         tokens grew"
    );
    lost
}

/// A quick restart: PostgreSQL keeps the hold and the queue, the holder's renewals resume,
/// and the waiters are served in their order once it unlocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quick_restart_keeps_holds_and_queue() {
    assert!(
        !restart_under_contention(Duration::ZERO, LONG_LEASE).await,
        "the lease survived"
    );
}

/// Down for longer than the lease: the holder learns by its local deadline that its lease is
/// lost; once the server is back the waiters are served in order with higher tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_lease_ends_the_hold_by_its_lease() {
    assert!(restart_under_contention(LEASE + Duration::from_millis(1000), LEASE).await);
}

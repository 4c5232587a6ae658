//! The PostgreSQL backend's own promises, beyond the conformance suite: schema creation,
//! typed errors, one listening connection restored after it is killed, nothing left behind,
//! tokens across the collection of an idle lock's row.

mod common;

use std::time::{Duration, Instant};

use common::{name, owner, request, Server};
use fairlock::backend::{AcquireOutcome, LockBackend, ReleaseOutcome};
use fairlock::{Error, LockClient, LockOptions};
use fairlock_postgres::PostgresBackend;

fn count(server: &Server, sql: &str) -> u64 {
    server.psql(sql).parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_use_creates_the_schema_once() {
    let server = Server::start();
    let connects = (0..8).map(|_| {
        PostgresBackend::builder(server.url())
            .schema("race")
            .pool_size(1)
            .connect()
    });
    let backends: Vec<PostgresBackend> = futures::future::join_all(connects)
        .await
        .into_iter()
        .map(|backend| backend.expect("every concurrent first use succeeds"))
        .collect();
    let lock = name();
    let first = request(&lock, &owner("a"), true);
    assert!(matches!(
        backends[0].acquire(&first).await.unwrap(),
        AcquireOutcome::Granted(_)
    ));
    assert_eq!(
        backends[7]
            .inspect(&lock)
            .await
            .unwrap()
            .holder
            .unwrap()
            .owner,
        "a"
    );
    assert_eq!(count(&server, "SELECT count(*) FROM race.meta"), 1);
}

#[tokio::test]
async fn invalid_schemas_and_urls_are_rejected_before_connecting() {
    for schema in ["", "Upper", "a;b", "x\"; DROP SCHEMA public; --", "9x"] {
        let error = PostgresBackend::builder("postgres://127.0.0.1:1/x")
            .schema(schema)
            .connect()
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::InvalidArgument { .. }),
            "{schema:?}: {error}"
        );
    }
    let error = PostgresBackend::connect("postgres://host:notaport/x")
        .await
        .unwrap_err();
    assert!(matches!(error, Error::InvalidArgument { .. }), "{error}");
}

/// Durations too long for the server's intervals (or to multiply) are refused at connect,
/// not a panic there, nor a backend whose every call fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_past_the_limit_are_rejected_at_connect() {
    let server = Server::start();
    let too_long = fairlock::MAX_DURATION + Duration::from_secs(1);
    for builder in [
        PostgresBackend::builder(server.url()).connect_timeout(Duration::MAX),
        PostgresBackend::builder(server.url()).connect_timeout(too_long),
        PostgresBackend::builder(server.url()).fence_margin(Duration::MAX),
    ] {
        let outcome = builder.connect().await;
        assert!(
            matches!(outcome, Err(Error::InvalidArgument { .. })),
            "{:?}",
            outcome.map(|_| "connected")
        );
    }
}

/// With `from_pool`, the pool's waits are the caller's: one without a wait timeout, all of
/// whose connections are taken, does not hold an operation forever. It fails as
/// `Unavailable` within the connect timeout (5 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_with_no_connection_free_keeps_operations_bounded() {
    use fairlock_postgres::{deadpool_postgres, tokio_postgres};
    let server = Server::start();
    let config: tokio_postgres::Config = server.url().parse().unwrap();
    let manager = deadpool_postgres::Manager::new(config.clone(), tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(1)
        .build()
        .unwrap();
    let backend = PostgresBackend::from_pool(pool.clone(), config, "fairlock")
        .await
        .unwrap();
    let taken = pool.get().await.unwrap();
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(20), backend.inspect(&name())).await;
    assert!(
        matches!(outcome, Ok(Err(Error::Unavailable { .. }))),
        "{outcome:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    drop(taken);
    backend.inspect(&name()).await.unwrap();
}

/// The functions need READ COMMITTED: under REPEATABLE READ a read after the row lock sees
/// the snapshot from before the wait, and can miss a change committed meanwhile (an abandon
/// that spent the attempt, re-queued by a re-sent acquire). With the database's default set
/// to REPEATABLE READ, the builder's sessions still run READ COMMITTED and work; sessions of
/// a caller's pool at that default get a clear error, not a lock that may break.
/// Under REPEATABLE READ a call could miss what committed while it waited for the lock's row;
/// under SERIALIZABLE every call that waited for it would fail and be retried as an outage,
/// again and again on a busy lock. Both are refused with a typed error; the backend's own
/// sessions run READ COMMITTED whatever the database's default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_isolation_levels_are_refused_and_the_builders_run_read_committed() {
    for level in ["repeatable read", "serializable"] {
        isolation_is_refused(level).await;
    }
}

async fn isolation_is_refused(level: &str) {
    use fairlock_postgres::{deadpool_postgres, tokio_postgres};
    let server = Server::start();
    let database = server.psql("SELECT current_database()");
    server.psql(&format!(
        "ALTER DATABASE \"{database}\" SET default_transaction_isolation TO '{level}'"
    ));
    let backend = server.backend().await;
    let lock = name();
    let holder = owner("holder");
    let first = request(&lock, &holder, false);
    let granted = backend.acquire(&first).await.unwrap();
    let AcquireOutcome::Granted(grant) = granted else {
        panic!("{granted:?}");
    };
    let released = backend
        .release(&lock, &holder, grant.token, first.attempt)
        .await
        .unwrap();
    assert_eq!(released, ReleaseOutcome::Released { remaining: 0 });

    let config: tokio_postgres::Config = server.url().parse().unwrap();
    let manager = deadpool_postgres::Manager::new(config.clone(), tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(2)
        .build()
        .unwrap();
    let theirs = PostgresBackend::from_pool(pool, config, "fairlock")
        .await
        .unwrap();
    let refused = theirs.acquire(&request(&lock, &holder, false)).await;
    assert!(
        matches!(&refused, Err(Error::Backend { source, .. }) if source.to_string().contains("READ COMMITTED")),
        "{level}: {refused:?}"
    );
    assert!(backend.inspect(&lock).await.unwrap().holder.is_none());
}

/// fairlock sessions waiting on a row lock (the statements a stall leaves behind).
fn fairlock_sessions_waiting(server: &Server) -> u64 {
    count(
        server,
        "SELECT count(*) FROM pg_stat_activity \
         WHERE application_name = 'fairlock' AND wait_event_type = 'Lock'",
    )
}

/// Waits up to 5 s for no fairlock session to wait on a row lock.
async fn no_fairlock_session_waits(server: &Server, what: &str) {
    let mut waiting = u64::MAX;
    for _ in 0..50 {
        waiting = fairlock_sessions_waiting(server);
        if waiting == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} still waits on the server ({waiting} sessions)");
}

/// A statement the caller stopped waiting for (the 10 s operation bound passed, or the
/// caller's future was dropped) is cancelled on the server, not left waiting on a row lock
/// with a session of its own: during a stall, each retry would leave another. (A session
/// outside fairlock holds the lock's row.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_given_up_are_cancelled_on_the_server() {
    use fairlock_postgres::tokio_postgres;
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    let holder = owner("holder");
    let first = request(&lock, &holder, false);
    let AcquireOutcome::Granted(grant) = backend.acquire(&first).await.unwrap() else {
        panic!("a fresh lock is granted");
    };
    let (blocker, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    blocker
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM fairlock.locks WHERE name = '{lock}' FOR UPDATE"
        ))
        .await
        .unwrap();

    // A call dropped while it waits.
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        backend.acquire(&request(&lock, &owner("dropped"), true)),
    )
    .await;
    assert!(dropped.is_err(), "{dropped:?}");
    no_fairlock_session_waits(&server, "a dropped call's statement").await;

    // A call that runs out of its 10 s.
    let started = Instant::now();
    let timed_out = backend
        .release(&lock, &holder, grant.token, first.attempt)
        .await;
    assert!(
        matches!(timed_out, Err(Error::Unavailable { .. })),
        "{timed_out:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    no_fairlock_session_waits(&server, "a timed-out call's statement").await;

    blocker.batch_execute("ROLLBACK").await.unwrap();
    let released = backend
        .release(&lock, &holder, grant.token, first.attempt)
        .await
        .unwrap();
    assert_eq!(released, ReleaseOutcome::Released { remaining: 0 });
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable() {
    let port = fairlock_testsupport::free_port().unwrap();
    let started = Instant::now();
    let error = PostgresBackend::builder(format!("postgres://postgres@127.0.0.1:{port}/postgres"))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Unavailable { .. }), "{error}");
    assert!(error.to_string().contains(&port.to_string()), "{error}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_are_separate() {
    let server = Server::start();
    let a = PostgresBackend::builder(server.url())
        .schema("tenant_a")
        .connect()
        .await
        .unwrap();
    let b = PostgresBackend::builder(server.url())
        .schema("tenant_b")
        .connect()
        .await
        .unwrap();
    let lock = name();
    for backend in [&a, &b] {
        assert!(matches!(
            backend
                .acquire(&request(&lock, &owner("x"), false))
                .await
                .unwrap(),
            AcquireOutcome::Granted(_)
        ));
    }
    assert_eq!(a.schema(), "tenant_a");
    assert_eq!(b.channel(), "tenant_b_wake");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_tables_are_a_conflict() {
    let server = Server::start();
    server.psql("CREATE SCHEMA other; CREATE TABLE other.locks (id int PRIMARY KEY)");
    let error = PostgresBackend::builder(server.url())
        .schema("other")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Conflict { .. }), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_denied_is_a_typed_error() {
    let server = Server::start();
    server.psql("CREATE ROLE weak LOGIN; REVOKE CREATE ON DATABASE postgres FROM PUBLIC");
    let port = server.0.port();
    let error = PostgresBackend::connect(&format!("postgres://weak@127.0.0.1:{port}/postgres"))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Backend { .. }), "{error:?}");
    assert!(error.to_string().contains("permission denied"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_schema_is_created_again() {
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    backend
        .acquire(&request(&lock, &owner("a"), false))
        .await
        .unwrap();
    server.psql("DROP SCHEMA fairlock CASCADE");
    let outcome = backend
        .acquire(&request(&lock, &owner("b"), false))
        .await
        .unwrap();
    assert!(matches!(outcome, AcquireOutcome::Granted(_)), "{outcome:?}");
}

/// A schema installed by a version whose `spent` table had no `released` column gains it when
/// this version installs its functions, and a re-sent release then answers as the first did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_versions_spent_table_gains_the_released_column() {
    let server = Server::start();
    drop(server.backend().await);
    server.psql(
        "ALTER TABLE fairlock.spent DROP COLUMN released; \
         UPDATE fairlock.meta SET version = 'an earlier version'",
    );
    let backend = server.backend().await;
    let lock = name();
    let a = owner("a");
    let first = request(&lock, &a, false);
    let AcquireOutcome::Granted(grant) = backend.acquire(&first).await.unwrap() else {
        panic!("a free lock is granted");
    };
    for _ in 0..2 {
        let released = backend
            .release(&lock, &a, grant.token, first.attempt)
            .await
            .unwrap();
        assert_eq!(released, ReleaseOutcome::Released { remaining: 0 });
    }
}

/// Whether the `LISTEN` connections of the server, by backend pid.
fn listeners(server: &Server) -> Vec<String> {
    let pids = server.psql(
        "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()",
    );
    pids.lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_listening_connection_whatever_the_waiters() {
    let server = Server::start();
    let backend = server.backend().await;
    let client = LockClient::new(backend.clone());
    let holder = LockClient::new(server.backend().await);
    let names: Vec<String> = (0..40).map(|i| format!("many-{i}")).collect();
    let mut guards = Vec::new();
    for lock in &names {
        guards.push(holder.fair_lock(lock).unwrap().lock().await.unwrap());
    }
    let waits: Vec<_> = names
        .iter()
        .map(|lock| {
            let lock = client.fair_lock(lock).unwrap();
            tokio::spawn(async move { lock.lock().await.unwrap().unlock().await.unwrap() })
        })
        .collect();
    while backend.watch_count() < names.len() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // One per backend instance: `backend` and `holder`'s.
    assert_eq!(listeners(&server).len(), 2);
    for guard in guards {
        guard.unlock().await.unwrap();
    }
    for wait in waits {
        wait.await.unwrap();
    }
    assert_eq!(backend.watch_count(), 0, "every watch unregistered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_listening_connection_comes_back() {
    let server = Server::start();
    let waiter_backend = server.backend().await;
    let holder_backend = server.backend().await;
    // Heartbeats every 20 s: a waiter woken sooner was woken by a notification.
    let options = LockOptions::default().with_waiter_ttl(Duration::from_secs(60));
    let waiters = LockClient::new(waiter_backend.clone())
        .with_options(options.clone())
        .unwrap();
    let holders = LockClient::new(holder_backend)
        .with_options(options)
        .unwrap();
    for round in 0..3 {
        let before = listeners(&server);
        assert_eq!(before.len(), 2, "round {round}: {before:?}");
        server.psql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()",
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = listeners(&server);
            if now.len() == 2 && now.iter().all(|pid| !before.contains(pid)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the listeners did not come back: {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(waiter_backend.wait_listening(Duration::from_secs(5)).await);
        let lock = format!("relisten-{round}");
        let held = holders.fair_lock(&lock).unwrap().lock().await.unwrap();
        let wait = {
            let lock = waiters.fair_lock(&lock).unwrap();
            tokio::spawn(async move {
                let guard = lock.lock().await.unwrap();
                let at = Instant::now();
                guard.unlock().await.unwrap();
                at
            })
        };
        while holders.state(&lock).await.unwrap().waiters.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let released = Instant::now();
        held.unlock().await.unwrap();
        let granted = wait.await.unwrap();
        assert!(
            granted - released < Duration::from_secs(3),
            "round {round}: woken after {:?}, not by a notification",
            granted - released
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_waiters_of_a_lock_nobody_touches_are_deleted() {
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    let holding = fairlock::backend::AcquireRequest {
        lease: Duration::from_millis(300),
        ..request(&lock, &owner("holder"), false)
    };
    backend.acquire(&holding).await.unwrap();
    for i in 0..3 {
        let waiting = fairlock::backend::AcquireRequest {
            waiter_ttl: Duration::from_millis(300),
            ..request(&lock, &owner(&format!("w{i}")), true)
        };
        backend.acquire(&waiting).await.unwrap();
    }
    assert_eq!(count(&server, "SELECT count(*) FROM fairlock.waiters"), 3);
    // Everyone dies: nobody calls on this lock again. Any operation on another lock deletes
    // the dead entries, long before the fence margin.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(backend.inspect(&lock).await.unwrap().waiters.is_empty());
    backend
        .acquire(&request(&name(), &owner("other"), false))
        .await
        .unwrap();
    assert_eq!(count(&server, "SELECT count(*) FROM fairlock.waiters"), 0);
}

/// A backend whose idle locks' rows may be collected a second after their last use.
async fn with_a_one_second_fence(server: &Server) -> PostgresBackend {
    PostgresBackend::builder(server.url())
        .fence_margin(Duration::from_secs(1))
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_lock_leaves_only_its_fence_and_tokens_survive_its_collection() {
    let server = Server::start();
    let backend = with_a_one_second_fence(&server).await;
    let lock = name();
    let holder = owner("holder");
    // The row outlives the longest lease or waiter deadline it ever had by the margin.
    let short = |request: fairlock::backend::AcquireRequest| fairlock::backend::AcquireRequest {
        lease: Duration::from_millis(300),
        waiter_ttl: Duration::from_millis(300),
        ..request
    };
    let holding = short(request(&lock, &holder, true));
    let AcquireOutcome::Granted(first) = backend.acquire(&holding).await.unwrap() else {
        panic!("granted");
    };
    let waiting = short(request(&lock, &owner("waiter"), true));
    backend.acquire(&waiting).await.unwrap();
    backend
        .abandon(&lock, &waiting.owner, waiting.attempt)
        .await
        .unwrap();
    assert_eq!(
        backend
            .release(&lock, &holder, first.token, holding.attempt)
            .await
            .unwrap(),
        ReleaseOutcome::Released { remaining: 0 }
    );
    // Free, no waiters: the lock's row (its last token) is all that is left of it, besides
    // the ended-attempt records, which expire after the resend horizon.
    assert_eq!(count(&server, "SELECT count(*) FROM fairlock.waiters"), 0);
    assert_eq!(
        count(
            &server,
            "SELECT count(*) FROM fairlock.locks WHERE owner IS NOT NULL"
        ),
        0
    );
    assert_eq!(count(&server, "SELECT count(*) FROM fairlock.locks"), 1);
    // After the fence margin, any operation collects it.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    backend
        .acquire(&request(&name(), &owner("other"), false))
        .await
        .unwrap();
    let left = server.psql(&format!(
        "SELECT count(*) FROM fairlock.locks WHERE name = '{lock}'"
    ));
    assert_eq!(left, "0", "the idle lock's row was collected");
    // The token still increases: it never falls below the server's clock in microseconds.
    let AcquireOutcome::Granted(again) = backend
        .acquire(&request(&lock, &holder, false))
        .await
        .unwrap()
    else {
        panic!("granted");
    };
    assert!(
        again.token > first.token,
        "{} then {}",
        first.token,
        again.token
    );
}

/// A force release sent again after the lock's row was collected still answers as its first
/// copy did (its `forced` row lives for the resend horizon), and an expired `forced` row is
/// deleted by a later call on any lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_released_tokens_outlive_the_lock_row_and_are_collected() {
    let server = Server::start();
    let backend = with_a_one_second_fence(&server).await;
    let lock = name();
    let short = fairlock::backend::AcquireRequest {
        lease: Duration::from_millis(300),
        ..request(&lock, &owner("holder"), false)
    };
    let AcquireOutcome::Granted(held) = backend.acquire(&short).await.unwrap() else {
        panic!("granted");
    };
    assert!(backend.force_release(&lock, held.token).await.unwrap());
    tokio::time::sleep(Duration::from_millis(1600)).await;
    backend
        .acquire(&request(&name(), &owner("other"), false))
        .await
        .unwrap();
    let rows = format!("SELECT count(*) FROM fairlock.locks WHERE name = '{lock}'");
    assert_eq!(server.psql(&rows), "0", "the idle lock's row was collected");
    assert!(backend.force_release(&lock, held.token).await.unwrap());
    assert!(!backend.force_release(&lock, held.token + 1).await.unwrap());

    // A record made with a 100 ms horizon (through the SQL function itself) is deleted once
    // that has passed.
    let other = name();
    let AcquireOutcome::Granted(brief) = backend
        .acquire(&request(&other, &owner("holder"), false))
        .await
        .unwrap()
    else {
        panic!("granted");
    };
    let freed = server.psql(&format!(
        "SELECT fairlock.force_release('{other}', {}, 100, 1000)",
        brief.token
    ));
    assert_eq!(freed, "t");
    let forced = format!("SELECT count(*) FROM fairlock.forced WHERE name = '{other}'");
    assert_eq!(server.psql(&forced), "1");
    tokio::time::sleep(Duration::from_millis(300)).await;
    backend
        .acquire(&request(&name(), &owner("other"), false))
        .await
        .unwrap();
    assert_eq!(
        server.psql(&forced),
        "0",
        "the expired record was collected"
    );
}

/// An `abandon` that reaches a lock whose row an `acquire` of the same attempt is inserting
/// (uncommitted: the lock's first use) waits for it and then ends the grant, instead of
/// spending the attempt beside a grant that commits afterwards and holds the lock until its
/// lease ends (found by review; abandon returned at once and the hold stayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandon_waits_for_a_first_acquire_in_flight() {
    use fairlock::backend::LockBackend;

    let server = common::Server::start();
    let backend = server.backend().await;
    let lock = common::name();
    let caller = common::owner("caller");
    let request = common::request(&lock, &caller, true);
    // Installs the schema, on another lock.
    backend.inspect(&common::name()).await.unwrap();

    let (mut client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let transaction = client.transaction().await.unwrap();
    let granted: String = transaction
        .query_one(
            "SELECT fairlock.acquire($1, $2, $3, 30000, 10000, true, 60000, 600000)",
            &[
                &lock.as_str(),
                &caller.as_str(),
                &uuid::Uuid::from_u128(request.attempt.as_u128()),
            ],
        )
        .await
        .unwrap()
        .get(0);
    assert!(granted.starts_with("G "), "{granted}");

    let abandoning = {
        let backend = backend.clone();
        let (lock, caller, attempt) = (lock.clone(), caller.clone(), request.attempt);
        tokio::spawn(async move { backend.abandon(&lock, &caller, attempt).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !abandoning.is_finished(),
        "abandon did not wait for the acquire in flight"
    );
    transaction.commit().await.unwrap();
    abandoning.await.unwrap().unwrap();
    let state = backend.inspect(&lock).await.unwrap();
    assert!(
        state.holder.is_none(),
        "the abandoned grant still holds: {state:?}"
    );
}

/// A new version's install beside an operation in flight (a transaction holding a lock's row
/// and a write to the queue, about to update the row): neither waits for the other in a cycle.
/// `CREATE INDEX IF NOT EXISTS` locked the tables before it looked, so the install took the
/// locks table, then waited for the queue's writer, which waited for it: PostgreSQL aborted
/// one of them as a deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_beside_an_operation_in_flight_does_not_deadlock() {
    use fairlock_postgres::tokio_postgres::{self, NoTls};
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    let holding = request(&lock, &owner("a"), true);
    backend.acquire(&holding).await.unwrap();

    // An operation in flight, by hand: the lock's row, then a queue entry.
    let (operation, connection) = tokio_postgres::connect(&server.url(), NoTls).await.unwrap();
    tokio::spawn(connection);
    operation.batch_execute("BEGIN").await.unwrap();
    operation
        .execute(
            "SELECT 1 FROM fairlock.locks WHERE name = $1 FOR UPDATE",
            &[&lock.as_str()],
        )
        .await
        .unwrap();
    operation
        .execute(
            "INSERT INTO fairlock.waiters (name, seq, attempt, owner, ttl_ms, deadline) \
             VALUES ($1, 1000000, gen_random_uuid(), 'b', 5000, clock_timestamp() + interval '5 s')",
            &[&lock.as_str()],
        )
        .await
        .unwrap();

    // Another version is installed (its meta row differs), by a backend connecting now.
    server.psql("DELETE FROM fairlock.meta");
    let url = server.url();
    let installing = tokio::spawn(async move { PostgresBackend::connect(&url).await });
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The operation goes on: it updates the lock's row and commits.
    let updated = operation
        .execute(
            "UPDATE fairlock.locks SET gc_after = gc_after WHERE name = $1",
            &[&lock.as_str()],
        )
        .await;
    let committed = operation.batch_execute("COMMIT").await;
    let installed = installing.await.unwrap();
    assert!(updated.is_ok(), "the operation failed: {updated:?}");
    assert!(committed.is_ok(), "the operation failed: {committed:?}");
    assert!(
        installed.is_ok(),
        "the install failed: {:?}",
        installed.err()
    );
}

/// A call PostgreSQL aborts to break a deadlock (40P01) was rolled back whole: it is an outage
/// the core rides out (`Unavailable`), as a lost connection is, not a backend error that ends a
/// `lock()` at once. Made here by another session that takes a waiter's queue entry, then the
/// lock's row, while the waiter's heartbeat holds the lock's row and waits for its entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_aborted_as_a_deadlock_is_an_outage() {
    use fairlock_postgres::tokio_postgres::{self, NoTls};
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    backend
        .acquire(&request(&lock, &owner("a"), true))
        .await
        .unwrap();
    let waiting = request(&lock, &owner("b"), true);
    assert!(matches!(
        backend.acquire(&waiting).await.unwrap(),
        AcquireOutcome::Queued { .. }
    ));

    let (other, connection) = tokio_postgres::connect(&server.url(), NoTls).await.unwrap();
    tokio::spawn(connection);
    other.batch_execute("BEGIN").await.unwrap();
    other
        .execute(
            "SELECT 1 FROM fairlock.waiters WHERE name = $1 AND attempt = $2 FOR UPDATE",
            &[
                &lock.as_str(),
                &uuid::Uuid::from_u128(waiting.attempt.as_u128()),
            ],
        )
        .await
        .unwrap();
    let heartbeat = {
        let (backend, waiting) = (backend.clone(), waiting.clone());
        tokio::spawn(async move { backend.acquire(&waiting).await })
    };
    // The heartbeat waits first, so its deadlock check (after `deadlock_timeout`, 1 s) runs
    // first and aborts it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    other
        .execute(
            "SELECT 1 FROM fairlock.locks WHERE name = $1 FOR UPDATE",
            &[&lock.as_str()],
        )
        .await
        .unwrap();
    other.batch_execute("COMMIT").await.unwrap();
    let aborted = heartbeat.await.unwrap();
    assert!(
        matches!(&aborted, Err(Error::Unavailable { source, .. }) if format!("{source:?}").contains("40P01")),
        "{aborted:?}"
    );
    // Nothing of it stayed: the next heartbeat finds the waiter where it was.
    assert!(matches!(
        backend.acquire(&waiting).await.unwrap(),
        AcquireOutcome::Queued { .. }
    ));
}

/// A call that finds the schema gone installs it again within its time bound: an installer
/// that never finishes (here another session holding the installers' advisory lock) makes it
/// fail as an outage after the operation timeout (10 s), not wait for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reinstall_that_cannot_finish_keeps_the_call_bounded() {
    use fairlock_postgres::tokio_postgres::{self, NoTls};
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    backend.inspect(&lock).await.unwrap();
    server.psql("DROP SCHEMA fairlock CASCADE");
    let (installer, connection) = tokio_postgres::connect(&server.url(), NoTls).await.unwrap();
    tokio::spawn(connection);
    installer
        .batch_execute("BEGIN; SELECT pg_advisory_xact_lock(hashtext('fairlock schema fairlock'))")
        .await
        .unwrap();
    let started = Instant::now();
    let inspected = tokio::time::timeout(Duration::from_secs(30), backend.inspect(&lock))
        .await
        .expect("the call waited past its bound");
    assert!(
        matches!(inspected, Err(Error::Unavailable { .. })),
        "{inspected:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    installer.batch_execute("ROLLBACK").await.unwrap();
    // Once the other installer is gone, the next call installs the schema again.
    backend.inspect(&lock).await.unwrap();
}

/// A database or role whose `lock_timeout` is shorter than a wait for a busy lock's row makes
/// the call fail with `lock_not_available`, rolled back whole: an outage the core rides out,
/// not a backend error that ends `lock()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_timeout_of_the_database_is_an_outage() {
    use fairlock_postgres::tokio_postgres::{self, NoTls};
    let server = Server::start();
    let database = server.psql("SELECT current_database()");
    server.psql(&format!(
        "ALTER DATABASE \"{database}\" SET lock_timeout TO '100ms'"
    ));
    let backend = server.backend().await;
    let lock = name();
    let first = request(&lock, &owner("holder"), false);
    let AcquireOutcome::Granted(_) = backend.acquire(&first).await.unwrap() else {
        panic!("a fresh lock is granted");
    };
    // Another session keeps the lock's row locked for a while.
    let (client, connection) = tokio_postgres::connect(&server.url(), NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM fairlock.locks WHERE name = '{lock}' FOR UPDATE"
        ))
        .await
        .unwrap();
    let waited = backend
        .acquire(&request(&lock, &owner("waiter"), true))
        .await;
    client.batch_execute("ROLLBACK").await.unwrap();
    assert!(
        matches!(waited, Err(Error::Unavailable { .. })),
        "{waited:?}"
    );
    assert!(matches!(
        backend
            .acquire(&request(&lock, &owner("waiter"), true))
            .await,
        Ok(AcquireOutcome::Queued { .. })
    ));
}

/// `holder()` reads the lock's row alone, not its queue: it answers while another session
/// keeps the waiters table locked, where `inspect` (which reads the queue) waits. `is_held`
/// and `force_unlock` ask it, the CLI's holder check every second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_reads_no_queue() {
    use fairlock_postgres::tokio_postgres::{self, NoTls};
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    let first = request(&lock, &owner("holder"), false);
    let AcquireOutcome::Granted(grant) = backend.acquire(&first).await.unwrap() else {
        panic!("a fresh lock is granted");
    };
    for i in 0..3 {
        let queued = backend
            .acquire(&request(&lock, &owner(&format!("w{i}")), true))
            .await
            .unwrap();
        assert!(matches!(queued, AcquireOutcome::Queued { .. }));
    }
    let (client, connection) = tokio_postgres::connect(&server.url(), NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute("BEGIN; LOCK TABLE fairlock.waiters IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let held = tokio::time::timeout(Duration::from_secs(2), backend.holder(&lock)).await;
    client.batch_execute("ROLLBACK").await.unwrap();
    let held = held
        .expect("holder() waited for the queue")
        .unwrap()
        .expect("held");
    assert_eq!(
        (
            held.owner.as_str(),
            held.token,
            held.hold_count,
            held.confirmed
        ),
        ("holder", grant.token, 1, true)
    );
    assert!(backend.holder(&name()).await.unwrap().is_none());
}

/// `from_pool` given up while it creates the schema (its future dropped; or timed out) leaves
/// the caller's pool usable at once: the connection whose install may still run (here waiting
/// for another installer) leaves the pool instead of making the next user wait behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_given_up_leaves_the_callers_pool_usable() {
    use fairlock_postgres::{deadpool_postgres, tokio_postgres};
    let server = Server::start();
    let (installer, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    installer
        .batch_execute("BEGIN; SELECT pg_advisory_xact_lock(hashtext('fairlock schema theirs'))")
        .await
        .unwrap();
    let config: tokio_postgres::Config = server.url().parse().unwrap();
    let manager = deadpool_postgres::Manager::new(config.clone(), tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(1)
        .build()
        .unwrap();
    let given_up = tokio::time::timeout(
        Duration::from_millis(500),
        PostgresBackend::from_pool(pool.clone(), config, "theirs"),
    )
    .await;
    assert!(
        given_up.is_err(),
        "the install waits for the other installer"
    );
    let used = tokio::time::timeout(Duration::from_secs(3), async {
        let client = pool.get().await.unwrap();
        client.query_one("SELECT 1", &[]).await.unwrap()
    })
    .await;
    installer.batch_execute("ROLLBACK").await.unwrap();
    assert!(
        used.is_ok(),
        "the pool's connection was left running the install"
    );
}

/// A newcomer whose call deletes the dead head (d) of a free lock tells the live waiter
/// behind it (b), which was not the head at its last call and would otherwise wait for its
/// heartbeat (the contract's SHOULD; the Redis scripts and the memory backend do the same).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_that_clears_a_dead_head_wakes_the_live_one() {
    use fairlock::backend::{AcquireRequest, Wake};
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    let holding = AcquireRequest {
        lease: Duration::from_millis(200),
        ..request(&lock, &owner("a"), true)
    };
    assert!(matches!(
        backend.acquire(&holding).await.unwrap(),
        AcquireOutcome::Granted(_)
    ));
    let dying = AcquireRequest {
        waiter_ttl: Duration::from_millis(100),
        ..request(&lock, &owner("d"), true)
    };
    let b = request(&lock, &owner("b"), true);
    let queued = backend.acquire(&dying).await.unwrap();
    assert!(
        matches!(queued, AcquireOutcome::Queued { .. }),
        "{queued:?}"
    );
    let queued = backend.acquire(&b).await.unwrap();
    assert!(
        matches!(
            queued,
            AcquireOutcome::Queued {
                retry_after: None,
                ..
            }
        ),
        "b is not the head (no hint to look when the lease ends): {queued:?}"
    );
    let mut watch = backend.watch(&lock, &b.owner).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A newcomer finds the lock free, deletes d and queues behind b.
    let newcomer = backend
        .acquire(&request(&lock, &owner("e"), true))
        .await
        .unwrap();
    assert!(matches!(newcomer, AcquireOutcome::Queued { .. }));
    let wake = tokio::time::timeout(Duration::from_secs(2), watch.recv()).await;
    assert_eq!(
        wake,
        Ok(Some(Wake::Recheck)),
        "b heads a free lock and was not told"
    );
}

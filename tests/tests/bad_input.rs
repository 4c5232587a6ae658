//! Bad and odd input: names, durations, releases of holds that are not ours, foreign data at a
//! lock's keys, wrong credentials and servers that are not there.
//!
//! Each must end in a typed `fairlock::Error` (matched by variant, never by message), never a
//! panic or a hang, and must not disturb any other lock: a sentinel lock is held on its own
//! connections throughout, and checked after each case (same owner, same token, count 1,
//! lease not lost).
//!
//! A double unlock cannot be written: `LockGuard::unlock` takes the guard by value. The nearest
//! thing is tested instead: releasing through a guard whose hold already ended, after someone
//! else (or the same owner, again) acquired the lock.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use fairlock::{Error, LockClient, LockGuard, LockOptions, Owner, MAX_DURATION};
use fairlock_faults::redis_env::{bounded, cli, client, options};
use fairlock_redis::RedisBackend;
use fairlock_testsupport::{free_port, RedisServer};
use tokio::time::sleep;

const LIMIT: Duration = Duration::from_secs(10);

/// A lock held on its own connections for the whole test, checked after every case.
struct Sentinel {
    client: LockClient,
    guard: LockGuard,
    owner: String,
}

impl Sentinel {
    async fn hold(url: &str) -> Sentinel {
        let client = client(url, LockOptions::default()).await;
        let lock = client.fair_lock("sentinel").unwrap();
        let owner = lock.owner().as_str().to_owned();
        let guard = lock.lock().await.unwrap();
        Sentinel {
            client,
            guard,
            owner,
        }
    }

    async fn check(&self, after: &str) {
        let state = self.client.state("sentinel").await.unwrap();
        let holder = state
            .holder
            .unwrap_or_else(|| panic!("after {after}: the sentinel lock is free"));
        assert_eq!(
            (holder.owner.as_str(), holder.token, holder.hold_count),
            (self.owner.as_str(), self.guard.fencing_token(), 1),
            "after {after}: the sentinel lock changed"
        );
        assert!(
            state.waiters.is_empty(),
            "after {after}: {:?}",
            state.waiters
        );
        assert!(!self.guard.is_lease_lost(), "after {after}");
    }

    async fn release(self) {
        self.guard.unlock().await.unwrap();
    }
}

fn invalid<T: std::fmt::Debug>(what: &str, result: fairlock::Result<T>) {
    match result {
        Err(Error::InvalidArgument { .. }) => {}
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_are_refused_and_odd_names_are_separate_locks() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let sentinel = Sentinel::hold(&url).await;
    let a = client(&url, LockOptions::default()).await;
    let b = client(&url, LockOptions::default()).await;

    let huge = "x".repeat(1 << 20);
    let too_long = "y".repeat(fairlock::MAX_NAME_LEN + 1);
    for (what, name) in [
        ("an empty name", ""),
        ("a 1 MiB name", huge.as_str()),
        ("a name one byte too long", too_long.as_str()),
        ("a name with NUL", "a\0b"),
    ] {
        invalid(what, a.fair_lock(name));
        invalid(what, a.state(name).await);
        invalid(what, a.force_unlock(name).await);
        sentinel.check(what).await;
    }

    // Valid, if odd: each is its own lock, exclusive and fenced like any other, and none is
    // the sentinel (`{sentinel}` must not reach the keys of `sentinel`).
    let longest = "é".repeat(fairlock::MAX_NAME_LEN / 2);
    let odd = [
        "{sentinel}",
        "sentinel ",
        "{",
        "}",
        "a{b}c",
        "}{",
        "a:b:c",
        ":h",
        "with space",
        "line\nbreak",
        "ünïcødé 锁 🔒",
        "#digest-lookalike",
        longest.as_str(),
    ];
    for name in odd {
        let first = a.fair_lock(name).unwrap();
        let second = b.fair_lock(name).unwrap();
        let held = bounded("lock()", LIMIT, first.lock()).await.unwrap();
        let err = second.try_lock().await.unwrap_err();
        assert!(matches!(err, Error::WouldBlock { .. }), "{name:?}: {err:?}");
        let state = first.state().await.unwrap();
        assert_eq!(state.name, name);
        assert_eq!(state.holder.unwrap().token, held.fencing_token());
        held.unlock().await.unwrap();
        let next = bounded("lock()", LIMIT, second.lock()).await.unwrap();
        assert!(next.fencing_token() > 0);
        next.unlock().await.unwrap();
        sentinel.check(&format!("the name {name:?}")).await;
    }
    sentinel.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_huge_and_overflowing_durations_are_refused() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let sentinel = Sentinel::hold(&url).await;
    let c = client(&url, LockOptions::default()).await;
    let over = MAX_DURATION + Duration::from_millis(1);

    for (what, lease) in [
        ("a zero lease", Duration::ZERO),
        ("a sub-millisecond lease", Duration::from_micros(999)),
        ("a lease over the limit", over),
        ("Duration::MAX as lease", Duration::MAX),
    ] {
        invalid(what, c.fair_lock("d").unwrap().with_lease(lease));
    }
    let bad_options = [
        (
            "a zero watchdog lease",
            options(Duration::ZERO, Duration::from_secs(5)),
        ),
        (
            "Duration::MAX as watchdog lease",
            options(Duration::MAX, Duration::from_secs(5)),
        ),
        (
            "a zero waiter TTL",
            options(Duration::from_secs(30), Duration::ZERO),
        ),
        (
            "a 1 ms waiter TTL",
            options(Duration::from_secs(30), Duration::from_millis(1)),
        ),
        (
            "a waiter TTL over the limit",
            options(Duration::from_secs(30), over),
        ),
        (
            "Duration::MAX as waiter TTL",
            options(Duration::from_secs(30), Duration::MAX),
        ),
    ];
    for (what, opts) in bad_options {
        invalid(what, c.fair_lock("d").unwrap().with_options(opts.clone()));
        invalid(what, c.clone().with_options(opts));
    }
    let lock = c.fair_lock("d").unwrap();
    invalid(
        "Duration::MAX as wait",
        lock.try_lock_for(Duration::MAX).await,
    );
    invalid("a wait over the limit", lock.try_lock_for(over).await);

    // The limits themselves are accepted, and reach Redis without overflowing: a lease of
    // 365 days is stored as such.
    let longest = c
        .fair_lock("d")
        .unwrap()
        .with_options(
            LockOptions::default()
                .with_lease(MAX_DURATION)
                .with_watchdog_lease(MAX_DURATION)
                .with_waiter_ttl(MAX_DURATION)
                .with_outage_budget(std::time::Duration::from_secs(30)),
        )
        .unwrap();
    let held = bounded("try_lock_for", LIMIT, longest.try_lock_for(MAX_DURATION))
        .await
        .unwrap();
    let remaining = longest
        .state()
        .await
        .unwrap()
        .holder
        .unwrap()
        .lease_remaining;
    assert!(
        remaining > MAX_DURATION - Duration::from_secs(60),
        "{remaining:?}"
    );
    invalid("extend by zero", held.extend(Duration::ZERO).await);
    invalid("extend by Duration::MAX", held.extend(Duration::MAX).await);
    // A zero wait is a try: busy, so refused at once, and the hold is untouched.
    let other = c.fair_lock("d").unwrap();
    let err = bounded("try_lock_for(0)", LIMIT, other.try_lock_for(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::WouldBlock { .. }), "{err:?}");
    let state = longest.state().await.unwrap();
    assert_eq!(state.holder.unwrap().token, held.fencing_token());
    assert!(state.waiters.is_empty());
    assert!(!held.is_lease_lost());
    held.unlock().await.unwrap();
    sentinel.check("bad durations").await;
    sentinel.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_a_hold_that_ended_never_frees_the_next_one() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let sentinel = Sentinel::hold(&url).await;
    let a = client(&url, LockOptions::default()).await;
    let b = client(&url, LockOptions::default()).await;

    // Force-released, then taken by another owner: the old guard's release and extend fail
    // with LeaseLost and leave the new hold alone.
    let old = a.fair_lock("taken").unwrap().lock().await.unwrap();
    assert!(b.force_unlock("taken").await.unwrap());
    let lock_b = b.fair_lock("taken").unwrap();
    let new = bounded("lock()", LIMIT, lock_b.lock()).await.unwrap();
    let err = old.extend(Duration::from_secs(30)).await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    let err = old.unlock().await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    let holder = lock_b.state().await.unwrap().holder.unwrap();
    assert_eq!(
        (holder.owner.as_str(), holder.token),
        (lock_b.owner().as_str(), new.fencing_token())
    );
    new.unlock().await.unwrap();
    // Nobody holds it now: a second force release says so.
    assert!(!b.force_unlock("taken").await.unwrap());

    // The same owner, again: a fixed lease ends, the owner acquires anew; the first guard's
    // release names the old token and must not release the new hold.
    let owner = Owner::new("one-job").unwrap();
    let first = a
        .fair_lock_as("expiring", owner.clone())
        .unwrap()
        .with_lease(Duration::from_millis(150))
        .unwrap();
    let stale = first.lock().await.unwrap();
    bounded("the lease to end", LIMIT, stale.lease_lost()).await;
    sleep(Duration::from_millis(100)).await;
    let again = b.fair_lock_as("expiring", owner).unwrap();
    let fresh = bounded("lock()", LIMIT, again.lock()).await.unwrap();
    assert_eq!(fresh.hold_count(), 1, "a new hold, not a re-entry");
    assert!(fresh.fencing_token() > stale.fencing_token());
    let err = stale.unlock().await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    let holder = again.state().await.unwrap().holder.unwrap();
    assert_eq!(
        (holder.token, holder.hold_count),
        (fresh.fencing_token(), 1)
    );
    fresh.unlock().await.unwrap();
    sentinel.check("stale releases").await;
    sentinel.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_data_at_any_key_of_a_lock_is_a_conflict() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let port = server.port();
    let sentinel = Sentinel::hold(&url).await;
    let c = client(
        &url,
        options(Duration::from_secs(30), Duration::from_secs(1)),
    )
    .await;
    let conflict = |what: String, result: fairlock::Result<()>| match result {
        Err(Error::Conflict { name, .. }) => assert_eq!(name, "victim", "{what}"),
        other => panic!("{what}: expected Conflict, got {other:?}"),
    };
    // The lock has been used, so its fence key exists; each key in turn holds a string.
    c.fair_lock("victim")
        .unwrap()
        .lock()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    let other = client(
        &url,
        options(Duration::from_secs(30), Duration::from_secs(1)),
    )
    .await;
    // Every call either works without touching the foreign value or is refused with
    // Conflict; and a call that needs the key is refused. `:h`, `:f` and `:x` (spent attempts)
    // are read by every acquisition; the queue's keys (`:q`, `:z`, `:w`) only once someone has
    // to wait, so for those a second owner queues behind a holder.
    let ok_or_conflict = |what: String, result: fairlock::Result<()>| match result {
        Ok(()) | Err(Error::Conflict { .. }) => {}
        Err(err) => panic!("{what}: expected success or Conflict, got {err:?}"),
    };
    for suffix in ["h", "q", "z", "w", "f", "x"] {
        let key = format!("fairlock:{{victim}}:{suffix}");
        let queue_key = ["q", "z", "w"].contains(&suffix);
        let holder = if queue_key {
            Some(c.fair_lock("victim").unwrap().lock().await.unwrap())
        } else {
            None
        };
        assert_eq!(cli(port, None, &["SET", &key, "foreign"]), "OK");
        let lock = other.fair_lock("victim").unwrap();
        if !queue_key {
            conflict(
                format!("try_lock with a string at :{suffix}"),
                lock.try_lock().await.map(drop),
            );
        }
        conflict(
            format!("lock with a string at :{suffix}"),
            bounded("lock()", LIMIT, lock.lock()).await.map(drop),
        );
        ok_or_conflict(
            format!("state with a string at :{suffix}"),
            c.state("victim").await.map(drop),
        );
        if let Some(holder) = holder {
            // The hold itself lives at `:h` and is untouched: it can still be renewed.
            holder.extend(Duration::from_secs(30)).await.unwrap();
            ok_or_conflict(
                format!("unlock with a string at :{suffix}"),
                holder.unlock().await,
            );
        }
        ok_or_conflict(
            format!("force_unlock with a string at :{suffix}"),
            c.force_unlock("victim").await.map(drop),
        );
        // A release that empties the queue deletes the queue's keys, whatever they hold (they
        // are the lock's own keys), so the foreign value may be gone; otherwise it is intact.
        let value = cli(port, None, &["GET", &key]);
        assert!(
            value == "foreign" || value.is_empty(),
            ":{suffix}: {value:?}"
        );
        cli(port, None, &["DEL", &key]);
        // Whatever was refused left the lock usable once the foreign key is gone.
        c.force_unlock("victim").await.unwrap();
        let guard = bounded("lock()", LIMIT, lock.lock()).await.unwrap();
        guard.unlock().await.unwrap();
        sentinel.check(&format!("a string at :{suffix}")).await;
    }
    // A hash of the right type but without fairlock's fields at the holder key: nothing
    // documents it as a conflict (it reads as "no holder"), so only ask for no panic, a typed
    // outcome, and a consistent hold if it was granted.
    let key = "fairlock:{victim}:h";
    cli(port, None, &["HSET", key, "unrelated", "field"]);
    let lock = c.fair_lock("victim").unwrap();
    match lock.try_lock().await {
        Ok(guard) => {
            let holder = lock.state().await.unwrap().holder.unwrap();
            assert_eq!(holder.token, guard.fencing_token());
            guard.unlock().await.unwrap();
        }
        Err(Error::Backend { .. } | Error::Conflict { .. } | Error::WouldBlock { .. }) => {}
        Err(err) => panic!("try_lock over a foreign hash: {err:?}"),
    }
    cli(port, None, &["DEL", key]);
    // With the foreign data gone, the lock works again.
    let guard = bounded("lock()", LIMIT, lock.lock()).await.unwrap();
    guard.unlock().await.unwrap();
    sentinel.check("foreign data").await;
    sentinel.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused_in_bounded_time_without_showing_it() {
    const SECRET: &str = "right-secret-for-this-test";
    let server = RedisServer::start_with(&["--requirepass", SECRET]).unwrap();
    let port = server.port();
    let good = format!("redis://:{SECRET}@127.0.0.1:{port}");
    let sentinel = Sentinel::hold(&good).await;
    for (what, url) in [
        (
            "a wrong password",
            format!("redis://:wrong-one@127.0.0.1:{port}"),
        ),
        (
            "a wrong user",
            format!("redis://nobody:{SECRET}@127.0.0.1:{port}"),
        ),
        ("no password", format!("redis://127.0.0.1:{port}")),
    ] {
        let result = bounded(
            what,
            LIMIT,
            RedisBackend::builder(url)
                .connect_timeout(Duration::from_secs(2))
                .connect(),
        )
        .await;
        let err = result.err().unwrap_or_else(|| panic!("{what}: connected"));
        assert!(
            matches!(err, Error::Backend { .. } | Error::Unavailable { .. }),
            "{what}: {err:?}"
        );
        let shown = format!("{err} {err:?}");
        assert!(
            !shown.contains(SECRET) && !shown.contains("wrong-one"),
            "{shown}"
        );
        sentinel.check(what).await;
    }
    sentinel.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_that_are_not_there_or_not_redis_fail_in_bounded_time() {
    // Nothing listens on a free port.
    let port = free_port().unwrap();
    let url = format!("redis://127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let err = bounded(
        "connecting to nothing",
        LIMIT,
        RedisBackend::builder(url)
            .connect_timeout(Duration::from_secs(1))
            .connect(),
    )
    .await
    .expect_err("connected to nothing");
    assert!(
        matches!(&err, Error::Unavailable { endpoint, .. } if *endpoint == format!("127.0.0.1:{port}")),
        "{err:?}"
    );
    let nothing = started.elapsed();

    // Something listens but is not Redis: one peer that answers garbage, one that never answers.
    for garbage in [true, false] {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let peer = std::thread::spawn(move || {
            let Ok((mut socket, _)) = listener.accept() else {
                return;
            };
            let mut buffer = [0u8; 256];
            let _ = socket.read(&mut buffer);
            if garbage {
                let _ = socket.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
            }
            // Hold the connection open (unanswered) until the client gives up.
            std::thread::sleep(Duration::from_secs(4));
        });
        let started = std::time::Instant::now();
        let result = bounded(
            "connecting to a non-Redis peer",
            LIMIT,
            RedisBackend::builder(format!("redis://127.0.0.1:{port}"))
                .connect_timeout(Duration::from_secs(1))
                .command_timeout(Duration::from_secs(1))
                .connect(),
        )
        .await;
        let err = result.expect_err("connected to something that is not Redis");
        assert!(
            matches!(err, Error::Unavailable { .. } | Error::Backend { .. }),
            "garbage={garbage}: {err:?}"
        );
        eprintln!(
            "a peer that {}: {:?} after {:?}",
            if garbage {
                "answers garbage"
            } else {
                "never answers"
            },
            err,
            started.elapsed()
        );
        peer.join().unwrap();
    }
    eprintln!("nothing listening: Unavailable after {nothing:?}");
}

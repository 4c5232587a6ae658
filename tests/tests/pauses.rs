//! A server that stops answering for longer than the lease while a guard is held.
//!
//! What is promised (docs/design.md, *Leases and the lost-lease signal*): the holder's
//! `lease_lost()` fires no later than the store's expiry, by its local deadline alone (the
//! last renewal's send time plus the lease) even if no reply ever comes; the next holder gets
//! a greater fencing token; and no call hangs: each returns within the command timeout, or soon
//! after the server answers again.
//!
//! Three ways to pause: `CLIENT PAUSE ALL` (commands queue, the server runs), `DEBUG SLEEP`
//! (the server's one thread is blocked) and SIGSTOP (the process is frozen, as a hung host).

use std::time::Duration;

use fairlock::Error;
use fairlock_faults::redis_env::{bounded, cli, client, options, COMMAND_TIMEOUT};
use fairlock_testsupport::RedisServer;
use tokio::time::{sleep, Instant};

/// The holder's watchdog lease: renewed every 333 ms.
const LEASE: Duration = Duration::from_secs(1);
/// How long the server stops answering: well over the lease, well under the command timeout.
const PAUSE: Duration = Duration::from_millis(2500);
/// Timer and scheduling delays on a loaded machine.
const MARGIN: Duration = Duration::from_millis(700);

/// How to stop the server answering for `PAUSE`; returns once the pause is in force.
#[derive(Clone, Copy, Debug)]
enum Pause {
    ClientPauseAll,
    DebugSleep,
    Sigstop,
}

async fn pause_while_held(how: Pause) {
    assert!(PAUSE + Duration::from_secs(1) < COMMAND_TIMEOUT);
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let opts = options(LEASE, Duration::from_millis(900));
    let holder = client(&url, opts.clone())
        .await
        .fair_lock("paused")
        .unwrap();
    let next = client(&url, opts.clone())
        .await
        .fair_lock("paused")
        .unwrap();
    let observer = client(&url, opts).await;
    let held = holder.lock().await.unwrap();
    let waiter = tokio::spawn(async move {
        let guard = next.lock().await;
        (guard, Instant::now())
    });
    bounded("queueing", Duration::from_secs(5), async {
        while holder.state().await.unwrap().waiters.is_empty() {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // Let a renewal land, so the pause starts mid-lease.
    sleep(LEASE / 2).await;

    let port = server.port();
    let paused = Instant::now();
    let pause_ms = PAUSE.as_millis().to_string();
    let resumer = match how {
        Pause::ClientPauseAll => {
            assert_eq!(
                cli(port, None, &["CLIENT", "PAUSE", &pause_ms, "ALL"]),
                "OK"
            );
            None
        }
        Pause::DebugSleep => {
            let seconds = format!("{}", PAUSE.as_secs_f64());
            Some(std::thread::spawn(move || {
                cli(port, None, &["DEBUG", "SLEEP", &seconds]);
            }))
        }
        Pause::Sigstop => {
            server.pause_process().unwrap();
            None
        }
    };
    // A read issued during the pause: it must come back once the server answers again.
    let probe = tokio::spawn(async move {
        sleep(Duration::from_millis(100)).await;
        let result = observer.state("paused").await;
        (result, Instant::now())
    });

    // The holder's signal fires on its local deadline, at most a lease after the last
    // renewal that succeeded, so within a lease of the pause: before the pause ends.
    bounded("the lost-lease signal", LEASE + MARGIN, held.lease_lost()).await;
    let lost_at = Instant::now();
    assert!(
        lost_at < paused + PAUSE,
        "the signal came {:?} after the pause began, not before the server answered again",
        lost_at - paused
    );

    if let Pause::Sigstop = how {
        let left = (paused + PAUSE).saturating_duration_since(Instant::now());
        sleep(left).await;
        server.resume_process().unwrap();
    }
    let resumed = paused + PAUSE;
    if let Some(thread) = resumer {
        thread.join().unwrap();
    }

    // No hang: the call made during the pause and the waiter finish soon after it ends.
    let (state, probed_at) = bounded("the read made during the pause", PAUSE * 2, probe)
        .await
        .unwrap();
    state.unwrap();
    let (guard, acquired_at) = bounded("the waiter's lock()", PAUSE * 2, waiter)
        .await
        .unwrap();
    let guard = guard.unwrap_or_else(|err| panic!("{how:?}: the waiter failed: {err}"));
    for (what, at) in [("read", probed_at), ("waiter", acquired_at)] {
        assert!(
            at.saturating_duration_since(resumed) < Duration::from_secs(3),
            "{how:?}: the {what} returned {:?} after the pause ended",
            at - resumed
        );
    }
    assert!(
        guard.fencing_token() > held.fencing_token(),
        "{how:?}: the next holder's token {} is not above {}",
        guard.fencing_token(),
        held.fencing_token()
    );
    // The old holder was told before the new one could start.
    assert!(lost_at < acquired_at, "{how:?}: lost after the next grant");
    assert!(
        !guard.is_lease_lost(),
        "{how:?}: the new holder's guard is already lost"
    );
    // The new hold is renewed normally after the pause: it outlives its first lease.
    tokio::select! {
        _ = guard.lease_lost() => panic!("{how:?}: the new holder lost its lease"),
        _ = sleep(LEASE + LEASE / 2) => {}
    }
    let err = held.unlock().await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{how:?}: {err:?}");
    let state = holder.state().await.unwrap().holder.unwrap();
    assert_eq!(
        state.token,
        guard.fencing_token(),
        "{how:?}: the old unlock freed it"
    );
    guard.unlock().await.unwrap();
    eprintln!(
        "{how:?} for {PAUSE:?}: lease lost {:?} into the pause; the read returned {:?} and the \
         waiter acquired {:?} after it ended",
        lost_at - paused,
        probed_at.saturating_duration_since(resumed),
        acquired_at.saturating_duration_since(resumed),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_all_longer_than_the_lease() {
    pause_while_held(Pause::ClientPauseAll).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_sleep_longer_than_the_lease() {
    pause_while_held(Pause::DebugSleep).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_process_longer_than_the_lease() {
    pause_while_held(Pause::Sigstop).await;
}

//! Thousands of acquisitions cancelled at random points: while waiting, around the moment of
//! the grant, and while holding (guards dropped, tasks aborted).
//!
//! What is promised (docs/design.md, *Cancellation*, and `# Cancel safety` on `lock`): a
//! dropped future leaves nothing behind; its place in the queue and any grant that arrives
//! after the drop are given back in the background. So once the storm is over (and that
//! background clean-up had a moment), every lock is free with nobody queued, only the fence
//! key of each lock remains, and a fresh `lock()` is granted at once. The waiter TTL and the
//! lease are far longer than the test, so nothing here can be explained by expiry: only the
//! clean-up can have removed what the cancelled calls left.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fairlock::{Error, LockClient};
use fairlock_faults::redis_env::{bounded, client, lasting_keys, options};
use fairlock_testsupport::RedisServer;
use rand::Rng;
use tokio::time::{sleep, Instant};

const LOCKS: [&str; 4] = ["storm-a", "storm-b", "storm-c", "storm-d"];
/// Separate backends (connections), as separate processes would be.
const BACKENDS: usize = 4;
const WAVES: usize = 10;
const PER_WAVE: usize = 250;
/// Far longer than the test: leftovers cannot expire before they are checked.
const LEASE: Duration = Duration::from_secs(60);
const WAITER_TTL: Duration = Duration::from_secs(60);

/// Holders of each lock at this moment, counted while a guard is held; dropped (and so
/// decremented) before the guard is, so it never counts a hold the store has ended.
struct Holding(&'static AtomicUsize);

impl Holding {
    fn enter(count: &'static AtomicUsize, lock: &str) -> Holding {
        let before = count.fetch_add(1, Ordering::SeqCst);
        assert_eq!(before, 0, "two holders of {lock} at once");
        Holding(count)
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

static HOLDERS: [AtomicUsize; 4] = [
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
];

/// What became of one cancelled-or-not acquisition.
#[derive(Default)]
struct Tally {
    acquired: AtomicUsize,
    timed_out: AtomicUsize,
    refused: AtomicUsize,
}

/// One acquisition with a random way to give up, and a random hold if it gets the lock.
async fn one(client: LockClient, index: usize, tally: Arc<Tally>) {
    let (which, wait, hold, bounded_call) = {
        let mut rng = rand::thread_rng();
        (
            rng.gen_range(0..LOCKS.len()),
            Duration::from_micros(rng.gen_range(0..150_000)),
            Duration::from_micros(rng.gen_range(0..3_000)),
            rng.gen_bool(0.3),
        )
    };
    let lock = client.fair_lock(LOCKS[which]).unwrap();
    let result = if bounded_call {
        // The library's own bounded wait, itself cut short at random by the outer timeout.
        tokio::time::timeout(wait * 2, lock.try_lock_for(wait)).await
    } else {
        tokio::time::timeout(wait, lock.lock()).await
    };
    match result {
        Ok(Ok(guard)) => {
            // Declared after the guard, so dropped before it when the task is aborted.
            let holding = Holding::enter(&HOLDERS[which], LOCKS[which]);
            tally.acquired.fetch_add(1, Ordering::Relaxed);
            sleep(hold).await;
            drop(holding);
            if index % 2 == 0 {
                // Released through `unlock`; the others are dropped (released in the background).
                let _ = guard.unlock().await;
            }
        }
        Ok(Err(Error::Timeout { .. } | Error::WouldBlock { .. })) => {
            tally.refused.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Err(err)) => panic!("acquisition {index}: {err:?}"),
        Err(_elapsed) => {
            tally.timed_out.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_cancelled_acquisitions_leave_nothing_behind() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let opts = options(LEASE, WAITER_TTL);
    let mut clients = Vec::new();
    for _ in 0..BACKENDS {
        clients.push(client(&url, opts.clone()).await);
    }
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let mut aborted = 0;
    for wave in 0..WAVES {
        let mut tasks = Vec::new();
        for i in 0..PER_WAVE {
            let index = wave * PER_WAVE + i;
            let client = clients[index % BACKENDS].clone();
            tasks.push(tokio::spawn(one(client, index, tally.clone())));
        }
        // Abort a random third of them at random moments: waiting, being granted or holding.
        let mut victims: Vec<_> = tasks
            .iter()
            .filter(|_| rand::thread_rng().gen_bool(0.33))
            .map(|task| task.abort_handle())
            .collect();
        while !victims.is_empty() {
            let pause = Duration::from_micros(rand::thread_rng().gen_range(0..200));
            sleep(pause).await;
            let at = rand::thread_rng().gen_range(0..victims.len());
            victims.swap_remove(at).abort();
            aborted += 1;
        }
        for task in tasks {
            match bounded("a storm task", Duration::from_secs(30), task).await {
                Ok(()) => {}
                Err(join) if join.is_cancelled() => {}
                Err(join) => std::panic::resume_unwind(join.into_panic()),
            }
        }
    }
    let storm = started.elapsed();

    // The clean-up runs in background tasks: give it a bounded moment, then everything must be
    // gone. With a 60 s lease and TTL, nothing here ends by expiry.
    let observer = client(&url, opts.clone()).await;
    let settled = Instant::now();
    bounded("the background clean-up", Duration::from_secs(5), async {
        loop {
            let mut busy = Vec::new();
            for name in LOCKS {
                let state = observer.state(name).await.unwrap();
                if state.holder.is_some() || !state.waiters.is_empty() {
                    busy.push(state);
                }
            }
            if busy.is_empty() {
                break;
            }
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let settle = settled.elapsed();

    let keys = lasting_keys(server.port());
    let expected: Vec<String> = LOCKS
        .iter()
        .map(|n| format!("fairlock:{{{n}}}:f"))
        .collect();
    assert_eq!(keys, expected, "only the fence keys remain");

    for name in LOCKS {
        let lock = observer.fair_lock(name).unwrap();
        let asked = Instant::now();
        let guard = bounded("a fresh lock()", Duration::from_secs(1), lock.lock())
            .await
            .unwrap();
        let took = asked.elapsed();
        guard.unlock().await.unwrap();
        assert!(took < Duration::from_secs(1), "{name}: {took:?}");
    }
    eprintln!(
        "{} acquisitions over {} locks in {storm:?}: {} acquired, {} refused (Timeout or \
         WouldBlock), {} cut short by a timeout, {aborted} tasks aborted; clean after {settle:?}",
        WAVES * PER_WAVE,
        LOCKS.len(),
        tally.acquired.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed),
        tally.timed_out.load(Ordering::Relaxed),
    );
    assert!(
        tally.acquired.load(Ordering::Relaxed) > 50,
        "the storm must include holds"
    );
}

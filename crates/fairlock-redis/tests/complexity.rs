//! Each lock operation runs a bounded number of Redis commands, however long the queue: the
//! scripts never walk the waiters (only `inspect` does). Counted with `INFO commandstats`,
//! which includes the commands a script runs.

mod common;

/// The most commands one operation may run, whatever the queue length: about 10 to check the
/// lock's keys before the first write and keep the ended-attempt records, the rest for the
/// operation itself (around 30 for a release that hands over).
const BUDGET: u64 = 40;

use common::{name, owner, request, Server};
use fairlock::backend::{AcquireOutcome, LockBackend};
use fairlock_redis::RedisBackend;

/// Commands the server has run, but the `INFO` calls that read the counts.
fn commands_run(server: &Server) -> u64 {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter(|line| line.starts_with("cmdstat_") && !line.starts_with("cmdstat_info:"))
        .filter_map(|line| {
            line.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// How many commands `operation` made the server run.
async fn cost<F: std::future::Future>(server: &Server, operation: F) -> u64 {
    let before = commands_run(server);
    operation.await;
    commands_run(server) - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_do_not_walk_the_queue() {
    let server = Server::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let lock = name();
    let holder = owner("holder");
    let holding = request(&lock, &holder, true);
    let AcquireOutcome::Granted(grant) = backend.acquire(&holding).await.unwrap() else {
        panic!("the first acquire is granted");
    };
    const WAITERS: usize = 2000;
    let requests: Vec<_> = (0..WAITERS)
        .map(|i| request(&lock, &owner(&format!("w{i}")), true))
        .collect();
    for chunk in requests.chunks(64) {
        let joins = chunk.iter().map(|r| backend.acquire(r));
        for outcome in futures::future::join_all(joins).await {
            assert!(matches!(outcome.unwrap(), AcquireOutcome::Queued { .. }));
        }
    }

    // Joining at the back, heart-beating from the middle, and leaving from the middle.
    let newcomer = owner("newcomer");
    let join_request = request(&lock, &newcomer, true);
    let join = cost(&server, backend.acquire(&join_request)).await;
    let middle = &requests[WAITERS / 2];
    let heartbeat = cost(&server, backend.acquire(middle)).await;
    let leave = cost(
        &server,
        backend.abandon(&lock, &middle.owner, middle.attempt),
    )
    .await;
    // A non-queueing try while many wait.
    let try_request = request(&lock, &owner("try"), false);
    let busy = cost(&server, backend.acquire(&try_request)).await;
    for (what, commands) in [
        ("join", join),
        ("heartbeat", heartbeat),
        ("leave", leave),
        ("busy", busy),
    ] {
        println!("{what}: {commands} commands");
        assert!(
            commands <= BUDGET,
            "{what} ran {commands} commands with {WAITERS} waiters"
        );
    }

    // A release hands over to the head, whatever stands behind it.
    let head = backend.inspect(&lock).await.unwrap().waiters[0]
        .owner
        .clone();
    let release = cost(
        &server,
        backend.release(&lock, &holder, grant.token, holding.attempt),
    )
    .await;
    println!("release: {release} commands");
    assert!(
        release <= BUDGET,
        "release ran {release} commands with {WAITERS} waiters"
    );
    let state = backend.inspect(&lock).await.unwrap();
    assert_eq!(state.holder.unwrap().owner, head);
    // All but the head (now holding) and the leaver, plus the newcomer.
    assert_eq!(state.waiters.len(), WAITERS - 1);
}

//! Mutual exclusion and FIFO order between separate OS processes sharing one Redis.
//!
//! The holders' `[ACQ, REL]` intervals are stamped with each process's wall clock: they all
//! run on this machine, so those clocks are one and the same and the intervals can be compared.

use std::time::{Duration, Instant};

use fairlock_faults::contender::{assert_exclusive, Contender, Spec};
use fairlock_faults::store_view::{observer, wait_for_waiters};
use fairlock_testsupport::RedisServer;

const CONTENDER: &str = env!("CARGO_BIN_EXE_contender");

/// 16 processes × 100 acquisitions, each doing GET, pause, SET + 1 on one key under the lock:
/// any two overlapping holders would lose an increment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_processes_never_hold_at_once() {
    const PROCESSES: usize = 16;
    const EACH: u64 = 100;
    let server = RedisServer::start().expect("redis-server");
    let spec = Spec {
        url: server.url(),
        name: "exclusion".into(),
        loop_count: Some(EACH),
        counter: Some("faults:counter".into()),
        ..Spec::default()
    };
    let started = Instant::now();
    let mut contenders: Vec<Contender> = (0..PROCESSES)
        .map(|i| Contender::spawn(CONTENDER, format!("p{i}"), &spec))
        .collect();
    // 1600 hand-overs between 16 processes on 2 shared cores: a few seconds, 60 s at worst.
    let deadline = started + Duration::from_secs(60);
    for contender in &mut contenders {
        contender.done(deadline).await;
    }
    let elapsed = started.elapsed();

    let count = server.cli(&["GET", "faults:counter"]).expect("GET");
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
    let server = RedisServer::start().expect("redis-server");
    let name = "fifo";
    let store = observer(&server.url()).await;
    let base = Spec {
        url: server.url(),
        name: name.into(),
        ..Spec::default()
    };
    let deadline = Instant::now() + Duration::from_secs(40);

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
        // Start the next only once this one is visibly in line behind the others.
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
    println!("served in order: {order:?}");
}

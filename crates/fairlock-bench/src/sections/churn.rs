//! Section 8, churn: the slowest single script call while a lock's queue churns, which is the
//! time the whole Redis node is blocked by fairlock (every other client waits meanwhile), and
//! the keys an idle lock leaves once its fence margin has passed.
//!
//! - Join-and-leave: behind a live head waiter, 200,000 owners join and give up; one live
//!   waiter joins behind them; then the holder hands over to the head and the head to the last.
//! - Simultaneous deaths: 100,000 waiters join with one liveness TTL and die together (their
//!   process crashed); one live waiter joins behind them; then the holder releases and the live
//!   waiter asks until it holds, as its wake-up makes it.
//!
//! Script time is read from `SLOWLOG`, which logs whole script calls (`FCALL` on Redis 7, where
//! the scripts run as functions; `EVALSHA` on 6.2). During the churn the threshold is 100 µs
//! (so the log never overflows); around the hand-overs it is 0, so every call is timed.
//!
//! Redis 7 also logs each command a script runs. Every such command here costs O(log n) at most
//! (`crates/fairlock-redis/tests/complexity.rs` bounds how many a call runs), so when one of
//! them took milliseconds, Redis itself was stalled (descheduled on a busy machine, page
//! faults): the slowest of them is reported as the stall floor next to the slowest call.

use std::time::{Duration, Instant};

use fairlock::backend::{AcquireOutcome, AcquireRequest, AttemptId};
use fairlock::{BoxError, LockBackend, LockClient, LockName, Owner};
use fred::prelude::{Client, ClientLike};
use fred::types::{CustomCommand, Value};
use futures::{StreamExt, TryStreamExt};

use crate::bench::Bench;
use crate::connect;
use crate::report::{Figure, Section};

const CONCURRENCY: usize = 64;
const LONG: Duration = Duration::from_secs(600);
/// Calls slower than this are logged during the churn itself.
const CHURN_THRESHOLD_US: u64 = 100;
/// The target for the slowest call.
const TARGET_US: f64 = 1_000.0;

pub(crate) async fn run(bench: &Bench) -> Result<Section, BoxError> {
    let leavers = bench.scale(200_000, 20_000);
    let deaths = bench.scale(100_000, 10_000);
    let idle_names = bench.scale(10_000, 1_000);
    let backend = bench.backend().await?;

    let join_and_leave = join_and_leave(bench, backend.as_ref(), leavers).await?;
    let deaths_run = simultaneous_deaths(bench, backend.as_ref(), deaths).await?;
    let (idle_left, margin) = idle_names_left(bench, idle_names).await?;

    let mut section = Section::new(
        "churn",
        "Script time under queue churn, and keys of idle locks",
    );
    for (what, churn) in [
        (format!("{leavers} join-and-leave"), &join_and_leave),
        (format!("{deaths} simultaneous waiter deaths"), &deaths_run),
    ] {
        section.push(
            Figure::new(
                format!("slowest script call, {what}"),
                churn.slowest_us,
                "µs",
            )
            .target("<= 1 ms", churn.slowest_us <= TARGET_US),
        );
    }
    section.push(Figure::new(
        format!(
            "script calls over 1 ms, {leavers} join-and-leave (of about {})",
            2 * leavers
        ),
        join_and_leave.calls_over_1ms as f64,
        "",
    ));
    let (floor_command, floor_us) = [&join_and_leave.slowest_inner, &deaths_run.slowest_inner]
        .into_iter()
        .max_by_key(|(_, us)| *us)
        .cloned()
        .unwrap_or_default();
    section.push(Figure::new(
        "stall floor: slowest single command run inside those scripts (each of bounded cost)",
        floor_us as f64,
        "µs",
    ));
    section.push(Figure::new(
        format!("{deaths} simultaneous waiter deaths: the live waiter behind them holds after"),
        deaths_run.served.as_secs_f64() * 1e3,
        "ms",
    ));
    section.push(
        Figure::new(
            format!("keys left after {idle_names} lock names were used and left idle past the fence margin"),
            idle_left as f64,
            "",
        )
        .target("0", idle_left == 0),
    );
    let floor = if floor_command.is_empty() {
        // Redis 6.2 logs a script call, not the commands it runs.
        "No command run inside a script was logged, so the stall floor is 0.".to_string()
    } else {
        format!("The stall floor was a `{floor_command}`.")
    };
    section.note(format!(
        "join-and-leave: {leavers} owners join behind a live head and abandon, {CONCURRENCY} at a \
         time ({:.1} s), {} calls of the churn took over {CHURN_THRESHOLD_US} µs; then the \
         hand-overs to the head and to the waiter behind the churn, every call timed. Deaths: \
         {deaths} waiters with one TTL joined in {:.1} s and were left to expire; the release \
         and the live waiter's calls until it held ({} calls) were each timed. Idle names: each \
         of {idle_names} names locked and unlocked once with a fence margin of {} ms, then left \
         past the margin and the resend horizon (the spent-attempt records' life, {} s); `SCAN` \
         counts what is left under their prefix. {floor}",
        join_and_leave.churn_took.as_secs_f64(),
        join_and_leave.slow_churn_calls,
        deaths_run.churn_took.as_secs_f64(),
        deaths_run.calls,
        margin.as_millis(),
        fairlock::backend::RESEND_HORIZON.as_secs(),
    ));
    Ok(section)
}

struct Churn {
    slowest_us: f64,
    calls_over_1ms: usize,
    /// The slowest command run inside a script, and its µs.
    slowest_inner: Slowest,
    churn_took: Duration,
    slow_churn_calls: usize,
    served: Duration,
    calls: usize,
}

impl Churn {
    /// From what the slow log showed during the churn and around the timed calls (`calls`
    /// of them, the threshold at 0). Fails when the timed window's log misses any of them (as
    /// every call was missed while only `EVALSHA` counted).
    fn new(
        (churn_slow, churn_inner): (Vec<u64>, Slowest),
        (timed, timed_inner): (Vec<u64>, Slowest),
        churn_took: Duration,
        served: Duration,
        calls: usize,
    ) -> Result<Self, BoxError> {
        if timed.len() < calls {
            return Err(format!(
                "the slow log shows {} script calls of the {calls} made with its threshold at 0",
                timed.len()
            )
            .into());
        }
        Ok(Churn {
            slowest_us: churn_slow.iter().chain(&timed).copied().max().unwrap_or(0) as f64,
            calls_over_1ms: churn_slow
                .iter()
                .chain(&timed)
                .filter(|us| **us > 1_000)
                .count(),
            slowest_inner: std::cmp::max_by_key(churn_inner, timed_inner, |(_, us)| *us),
            churn_took,
            slow_churn_calls: churn_slow.len(),
            served,
            calls,
        })
    }
}

fn request(name: &LockName, owner: &str, waiter_ttl: Duration) -> Result<AcquireRequest, BoxError> {
    Ok(AcquireRequest {
        name: name.clone(),
        owner: Owner::new(owner)?,
        attempt: AttemptId::random(),
        lease: LONG,
        waiter_ttl,
        queue: true,
    })
}

async fn granted(backend: &dyn LockBackend, request: &AcquireRequest) -> Result<u64, BoxError> {
    match backend.acquire(request).await? {
        AcquireOutcome::Granted(grant) => Ok(grant.token),
        other => Err(format!("{}: expected a grant, got {other:?}", request.owner).into()),
    }
}

async fn queued(backend: &dyn LockBackend, request: &AcquireRequest) -> Result<(), BoxError> {
    match backend.acquire(request).await? {
        AcquireOutcome::Queued { .. } => Ok(()),
        other => Err(format!("{}: expected to queue, got {other:?}", request.owner).into()),
    }
}

async fn join_and_leave(
    bench: &Bench,
    backend: &dyn LockBackend,
    leavers: usize,
) -> Result<Churn, BoxError> {
    let name = LockName::new(bench.lock_name("churn-leave"))?;
    let holder = request(&name, "holder", LONG)?;
    let token = granted(backend, &holder).await?;
    let head = request(&name, "head", LONG)?;
    queued(backend, &head).await?;

    slowlog_reset(&bench.admin, CHURN_THRESHOLD_US).await?;
    let started = Instant::now();
    futures::stream::iter(0..leavers)
        .map(|i| {
            let name = &name;
            async move {
                let leaver = request(name, &format!("leaver-{i}"), LONG)?;
                queued(backend, &leaver).await?;
                backend.abandon(name, &leaver.owner, leaver.attempt).await?;
                Ok::<_, BoxError>(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<()>()
        .await?;
    let churn_took = started.elapsed();
    let last = request(&name, "last", LONG)?;
    queued(backend, &last).await?;
    let churn = slowlog_durations(&bench.admin).await?;

    slowlog_reset(&bench.admin, 0).await?;
    let served_from = Instant::now();
    backend
        .release(&name, &holder.owner, token, holder.attempt)
        .await?;
    let head_token = granted(backend, &head).await?;
    backend
        .release(&name, &head.owner, head_token, head.attempt)
        .await?;
    let last_token = granted(backend, &last).await?;
    let served = served_from.elapsed();
    let timed = slowlog_durations(&bench.admin).await?;
    backend
        .release(&name, &last.owner, last_token, last.attempt)
        .await?;
    // Timed: the two releases and the two grants.
    Churn::new(churn, timed, churn_took, served, 4)
}

async fn simultaneous_deaths(
    bench: &Bench,
    backend: &dyn LockBackend,
    deaths: usize,
) -> Result<Churn, BoxError> {
    let name = LockName::new(bench.lock_name("churn-deaths"))?;
    let holder = request(&name, "holder", LONG)?;
    let token = granted(backend, &holder).await?;
    // Long enough to queue them all, so they die together afterwards.
    let ttl = bench.scale(Duration::from_secs(30), Duration::from_secs(8));

    slowlog_reset(&bench.admin, CHURN_THRESHOLD_US).await?;
    let started = Instant::now();
    futures::stream::iter(0..deaths)
        .map(|i| {
            let name = &name;
            async move { queued(backend, &request(name, &format!("doomed-{i}"), ttl)?).await }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<()>()
        .await?;
    let churn_took = started.elapsed();
    if churn_took >= ttl {
        return Err(
            format!("queueing {deaths} waiters took {churn_took:?}, over their TTL").into(),
        );
    }
    let survivor = request(&name, "survivor", LONG)?;
    queued(backend, &survivor).await?;
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    let churn = slowlog_durations(&bench.admin).await?;

    slowlog_reset(&bench.admin, 0).await?;
    let served_from = Instant::now();
    backend
        .release(&name, &holder.owner, token, holder.attempt)
        .await?;
    let mut calls = 1;
    let survivor_token = loop {
        calls += 1;
        match backend.acquire(&survivor).await? {
            AcquireOutcome::Granted(grant) => break grant.token,
            AcquireOutcome::Queued { .. } if calls < 100_000 => {}
            other => return Err(format!("the survivor was not served: {other:?}").into()),
        }
    };
    let served = served_from.elapsed();
    let timed = slowlog_durations(&bench.admin).await?;
    backend
        .release(&name, &survivor.owner, survivor_token, survivor.attempt)
        .await?;
    Churn::new(churn, timed, churn_took, served, calls)
}

/// Locks and unlocks `names` distinct locks once each through a backend with a short fence
/// margin, waits out the margin, and counts the keys left under their prefix.
async fn idle_names_left(bench: &Bench, names: usize) -> Result<(usize, Duration), BoxError> {
    let margin = Duration::from_secs(2);
    let backend = connect::backend(
        &bench.url,
        connect::Options {
            pool_size: Some(bench.config.pool_size),
            fence_margin: Some(margin),
        },
    )
    .await?;
    let client = LockClient::from_arc(backend);
    let prefix = bench.lock_name("idle-");
    futures::stream::iter(0..names)
        .map(|i| {
            let client = &client;
            let name = format!("{prefix}{i}");
            async move {
                client.fair_lock(&name)?.lock().await?.unlock().await?;
                Ok::<_, BoxError>(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<()>()
        .await?;
    // The fence outlives the lock by the margin; spent-attempt records by the resend horizon.
    let wait = margin.max(fairlock::backend::RESEND_HORIZON) + Duration::from_secs(1);
    tokio::time::sleep(wait).await;
    let pattern = format!("*{{{prefix}*");
    let mut left = 0;
    let mut cursor = "0".to_string();
    loop {
        let page: Vec<Value> = bench
            .admin
            .custom(
                CustomCommand::new_static("SCAN", None::<u16>, false),
                vec![cursor.as_str(), "MATCH", pattern.as_str(), "COUNT", "1000"],
            )
            .await?;
        let [next, batch] = <[Value; 2]>::try_from(page).map_err(|_| "SCAN: unexpected reply")?;
        left += batch.convert::<Vec<String>>()?.len();
        cursor = next.convert()?;
        if cursor == "0" {
            return Ok((left, margin));
        }
    }
}

/// Empties the slow log and logs calls from `threshold_us` on.
async fn slowlog_reset(admin: &Client, threshold_us: u64) -> Result<(), BoxError> {
    let threshold = threshold_us.to_string();
    let _: Value = admin
        .custom(
            CustomCommand::new_static("CONFIG", None::<u16>, false),
            vec!["SET", "slowlog-log-slower-than", threshold.as_str()],
        )
        .await?;
    let _: Value = admin
        .custom(
            CustomCommand::new_static("CONFIG", None::<u16>, false),
            vec!["SET", "slowlog-max-len", "100000"],
        )
        .await?;
    let _: Value = admin
        .custom(
            CustomCommand::new_static("SLOWLOG", None::<u16>, false),
            vec!["RESET"],
        )
        .await?;
    Ok(())
}

/// The durations (µs) of the script calls in the slow log, and the slowest command run
/// inside a script with its duration (the bench sends nothing else meanwhile but its
/// `SLOWLOG` and `CONFIG`).
async fn slowlog_durations(admin: &Client) -> Result<(Vec<u64>, Slowest), BoxError> {
    let (scripts, inner) = split_scripts(slowlog_entries(admin).await?);
    let slowest = inner
        .into_iter()
        .max_by_key(|(_, us)| *us)
        .unwrap_or_default();
    Ok((scripts, slowest))
}

/// A command and its duration in µs.
type Slowest = (String, u64);

/// Splits slow-log entries into the durations of whole script calls and the commands run
/// inside them. The bench's own `SLOWLOG` and `CONFIG` calls are left out: a `SLOWLOG RESET`
/// is logged once done, and freeing a long log takes milliseconds.
fn split_scripts(entries: Vec<(String, u64)>) -> (Vec<u64>, Vec<(String, u64)>) {
    let (scripts, inner): (Vec<_>, Vec<_>) = entries
        .into_iter()
        .filter(|(command, _)| !matches!(command.as_str(), "SLOWLOG" | "CONFIG"))
        .partition(|(command, _)| is_script_call(command));
    (scripts.into_iter().map(|(_, us)| us).collect(), inner)
}

/// A call of a script or function, as the slow log names it (upper case). The backend calls
/// `FCALL` on Redis 7 and `EVALSHA` on 6.2; a check of `EVAL*` alone read every call on Redis 7
/// as a command inside a script, and the slowest call as 0 µs.
fn is_script_call(command: &str) -> bool {
    matches!(
        command,
        "EVAL" | "EVALSHA" | "EVAL_RO" | "EVALSHA_RO" | "FCALL" | "FCALL_RO"
    )
}

/// Every entry of the slow log as (command, duration in µs); then sets the threshold back to
/// 10 ms.
async fn slowlog_entries(admin: &Client) -> Result<Vec<(String, u64)>, BoxError> {
    let entries: Vec<Value> = admin
        .custom(
            CustomCommand::new_static("SLOWLOG", None::<u16>, false),
            vec!["GET", "-1"],
        )
        .await?;
    let mut timed = Vec::new();
    for entry in entries {
        // [id, timestamp, duration µs, [command, args...], client, name]
        let Value::Array(fields) = entry else {
            return Err("SLOWLOG GET: unexpected entry".into());
        };
        let duration: u64 = fields
            .get(2)
            .cloned()
            .ok_or("SLOWLOG GET: entry without a duration")?
            .convert()?;
        let command = match fields.get(3) {
            Some(Value::Array(words)) => words
                .first()
                .and_then(Value::as_string)
                .unwrap_or_default()
                .to_ascii_uppercase(),
            _ => String::new(),
        };
        timed.push((command, duration));
    }
    let _: Value = admin
        .custom(
            CustomCommand::new_static("CONFIG", None::<u16>, false),
            vec!["SET", "slowlog-log-slower-than", "10000"],
        )
        .await?;
    Ok(timed)
}

#[cfg(test)]
mod tests {
    use super::*;

    use fairlock::backend::AcquireOutcome;
    use fairlock_testsupport::RedisServer;
    use fred::prelude::{Builder, Config as RedisConfig};

    #[test]
    fn every_kind_of_script_call_counts_as_one() {
        let entries = [
            ("FCALL", 40),
            ("HSET", 3),
            ("EVALSHA", 50),
            ("FCALL_RO", 20),
            ("EVAL", 30),
            ("TIME", 1),
            ("SLOWLOG", 400),
            ("CONFIG", 2),
        ];
        let (scripts, inner) = split_scripts(
            entries
                .iter()
                .map(|(command, us)| (command.to_string(), *us))
                .collect(),
        );
        assert_eq!(scripts, [40, 50, 20, 30]);
        assert_eq!(inner, [("HSET".to_string(), 3), ("TIME".to_string(), 1)]);
    }

    /// The backend's calls, as the slow log of a real server shows them: each is one script
    /// call, and the commands it ran are logged apart.
    #[tokio::test]
    async fn the_slow_log_shows_each_backend_call_as_a_script_call() {
        fairlock_testsupport::require_redis();
        let server = RedisServer::start().unwrap();
        let admin = Builder::from_config(RedisConfig::from_url(&server.url()).unwrap())
            .build()
            .unwrap();
        admin.init().await.unwrap();
        let backend = connect::backend(&server.url(), connect::Options::default())
            .await
            .unwrap();
        let name = LockName::new("slowlog").unwrap();
        let holder = request(&name, "holder", LONG).unwrap();
        // Loads the scripts, which the slow log would show too.
        let token = granted(backend.as_ref(), &holder).await.unwrap();
        backend
            .release(&name, &holder.owner, token, holder.attempt)
            .await
            .unwrap();

        slowlog_reset(&admin, 0).await.unwrap();
        let next = request(&name, "next", LONG).unwrap();
        let outcome = backend.acquire(&next).await.unwrap();
        let AcquireOutcome::Granted(grant) = outcome else {
            panic!("{outcome:?}");
        };
        backend
            .release(&name, &next.owner, grant.token, next.attempt)
            .await
            .unwrap();
        let entries = slowlog_entries(&admin).await.unwrap();
        // The grant's write, run inside the acquire.
        assert!(
            entries.iter().any(|(command, _)| command == "HSET"),
            "{entries:?}"
        );
        let (scripts, _) = split_scripts(entries.clone());
        assert_eq!(scripts.len(), 2, "{entries:?}");
    }
}

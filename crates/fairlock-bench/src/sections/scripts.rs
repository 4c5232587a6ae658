//! Section 10, script cost: the server time of one lock script call, per path through the
//! scripts (uncontended acquire, release, join, heartbeat, release with hand-over, the
//! grantee's confirmation, leaving the queue).
//!
//! The private server runs nothing else meanwhile, so the growth of `FCALL`'s `usec` (Redis 7,
//! where the scripts run as functions; `EVALSHA`'s on 6.2) in `INFO commandstats` across one
//! call is that call's server time (Redis counts whole
//! microseconds per call, so single calls are quantised: the figure is the mean over many).
//! The calls go through `LockBackend` directly, so no heartbeat or renewal runs between them.

use std::time::Duration;

use fairlock::backend::{AcquireOutcome, AcquireRequest, AttemptId, ReleaseOutcome};
use fairlock::{BoxError, LockBackend, LockName, Owner};

use crate::bench::Bench;
use crate::report::{Figure, Section};

const LEASE: Duration = Duration::from_secs(30);
const WAITER_TTL: Duration = Duration::from_secs(30);

/// The paths measured, in the order one cycle runs them.
const PATHS: [&str; 7] = [
    "uncontended acquire",
    "join the queue",
    "heartbeat (queued, again)",
    "release with hand-over",
    "confirm a hand-over",
    "release (nobody waiting)",
    "leave the queue (abandon)",
];

/// Server µs, calls and Redis commands run inside the scripts, per path.
#[derive(Default)]
struct Totals {
    /// Warming up: a call may load the function library first (two script calls).
    warming: bool,
    usec: [u64; PATHS.len()],
    calls: [u64; PATHS.len()],
    commands: [u64; PATHS.len()],
}

/// What `INFO commandstats` says so far.
#[derive(Clone, Copy)]
struct Stats {
    /// Script calls of either kind: `FCALL` (Redis 7) or `EVALSHA`.
    script_calls: u64,
    script_usec: u64,
    /// Calls of every other command but `INFO`: within one script call, those it ran.
    other_calls: u64,
}

pub(crate) async fn run(bench: &Bench) -> Result<Section, BoxError> {
    let cycles = bench.scale(300, 30);
    let backend = bench.backend().await?;
    let name = LockName::new(bench.lock_name("scripts"))?;
    let mut totals = Totals::default();
    // Warms the server (the first call loads the function library, or sends the script after
    // `NOSCRIPT`).
    let mut warm_up = Totals {
        warming: true,
        ..Totals::default()
    };
    cycle(bench, backend.as_ref(), &name, &mut warm_up).await?;
    for _ in 0..cycles {
        cycle(bench, backend.as_ref(), &name, &mut totals).await?;
    }
    let trivial = trivial_evalsha(bench, cycles).await?;

    let mut section = Section::new("scripts", "Server time per lock script call");
    for (index, path) in PATHS.iter().enumerate() {
        let calls = totals.calls[index].max(1) as f64;
        let mean = totals.usec[index] as f64 / calls;
        let figure = Figure::new(format!("server time: {path}"), mean, "µs");
        section.push(match *path {
            "uncontended acquire" => figure.target("<= 4 µs", mean <= 4.0),
            "release with hand-over" => figure.target("<= 12 µs", mean <= 12.0),
            _ => figure,
        });
        section.push(Figure::new(
            format!("Redis commands per call: {path}"),
            totals.commands[index] as f64 / calls,
            "",
        ));
    }
    section.push(Figure::new(
        "server time: trivial EVALSHA `return 1`",
        trivial,
        "µs",
    ));
    section.note(format!(
        "mean over {cycles} calls per path on one lock, one call at a time, from the growth of \
         `usec` for FCALL (Redis 7: the scripts run as functions) and EVALSHA in INFO \
         commandstats across each call (whole µs per call; single \
         cold calls cost more than the same script in a busy loop, and a busy machine inflates \
         them further); commands per call = growth of every other command's `calls` (Redis \
         counts the commands a script runs); `return 1` is measured the same way. A cycle: A \
         acquires a free lock, B joins, B heartbeats, A releases (handing over to B), B \
         confirms, C joins and leaves, B releases"
    ));
    Ok(section)
}

async fn stats(bench: &Bench) -> Result<Stats, BoxError> {
    let mut stats = Stats {
        script_calls: 0,
        script_usec: 0,
        other_calls: 0,
    };
    for (field, value) in bench.info("commandstats").await? {
        let Some(command) = field.strip_prefix("cmdstat_") else {
            continue;
        };
        let number = |name: &str| -> Result<u64, BoxError> {
            let value = value
                .split(',')
                .find_map(|part| part.strip_prefix(name))
                .ok_or_else(|| format!("{field} has no {name}"))?;
            Ok(value.parse()?)
        };
        match command {
            "evalsha" | "fcall" => {
                stats.script_calls += number("calls=")?;
                stats.script_usec += number("usec=")?;
            }
            "info" => {}
            _ => stats.other_calls += number("calls=")?,
        }
    }
    Ok(stats)
}

/// Runs `call`, adding its server time to `path`'s total; checks it was one script call.
async fn timed<T, F>(
    bench: &Bench,
    totals: &mut Totals,
    path: usize,
    call: F,
) -> Result<T, BoxError>
where
    F: std::future::Future<Output = fairlock::Result<T>>,
{
    let before = stats(bench).await?;
    let value = call.await?;
    let after = stats(bench).await?;
    if after.script_calls != before.script_calls + 1 && !totals.warming {
        return Err(format!(
            "{}: expected one script call, the server ran {}",
            PATHS[path],
            after.script_calls.saturating_sub(before.script_calls)
        )
        .into());
    }
    totals.usec[path] += after.script_usec - before.script_usec;
    totals.calls[path] += 1;
    totals.commands[path] += after.other_calls - before.other_calls;
    Ok(value)
}

fn request(name: &LockName, owner: &Owner, attempt: AttemptId, queue: bool) -> AcquireRequest {
    AcquireRequest {
        name: name.clone(),
        owner: owner.clone(),
        attempt,
        lease: LEASE,
        waiter_ttl: WAITER_TTL,
        queue,
    }
}

async fn cycle(
    bench: &Bench,
    backend: &dyn LockBackend,
    name: &LockName,
    totals: &mut Totals,
) -> Result<(), BoxError> {
    let (a, b, c) = (Owner::unique(), Owner::unique(), Owner::unique());
    let (a1, b1, c1) = (
        AttemptId::random(),
        AttemptId::random(),
        AttemptId::random(),
    );
    let granted = |outcome: AcquireOutcome, what: &str| match outcome {
        AcquireOutcome::Granted(grant) => Ok(grant.token),
        other => Err(format!("{what}: expected a grant, got {other:?}")),
    };
    let queued = |outcome: AcquireOutcome, what: &str| match outcome {
        AcquireOutcome::Queued { .. } => Ok(()),
        other => Err(format!("{what}: expected to queue, got {other:?}")),
    };

    let outcome = timed(
        bench,
        totals,
        0,
        backend.acquire(&request(name, &a, a1, false)),
    )
    .await?;
    let token_a = granted(outcome, PATHS[0])?;
    let outcome = timed(
        bench,
        totals,
        1,
        backend.acquire(&request(name, &b, b1, true)),
    )
    .await?;
    queued(outcome, PATHS[1])?;
    let outcome = timed(
        bench,
        totals,
        2,
        backend.acquire(&request(name, &b, b1, true)),
    )
    .await?;
    queued(outcome, PATHS[2])?;
    let released = timed(bench, totals, 3, backend.release(name, &a, token_a, a1)).await?;
    if !matches!(released, ReleaseOutcome::Released { .. }) {
        return Err(format!("{}: got {released:?}", PATHS[3]).into());
    }
    let outcome = timed(
        bench,
        totals,
        4,
        backend.acquire(&request(name, &b, b1, true)),
    )
    .await?;
    let token_b = granted(outcome, PATHS[4])?;
    // A waiter that leaves: joins (not counted again) and abandons.
    queued(backend.acquire(&request(name, &c, c1, true)).await?, "join")?;
    timed(bench, totals, 6, backend.abandon(name, &c, c1)).await?;
    let released = timed(bench, totals, 5, backend.release(name, &b, token_b, b1)).await?;
    if !matches!(released, ReleaseOutcome::Released { .. }) {
        return Err(format!("{}: got {released:?}", PATHS[5]).into());
    }
    Ok(())
}

/// Mean server µs of `EVALSHA` of `return 1`, over `calls` calls made one at a time as the
/// lock scripts' are.
async fn trivial_evalsha(bench: &Bench, calls: usize) -> Result<f64, BoxError> {
    use fred::interfaces::LuaInterface;
    let client = bench.fred_client().await?;
    let sha: String = client.script_load("return 1").await?;
    let _: i64 = client.evalsha(&sha, (), ()).await?;
    let mut totals = Totals::default();
    for _ in 0..calls {
        let call = async {
            client
                .evalsha::<i64, _, _, _>(&sha, (), ())
                .await
                .map_err(|err| fairlock::Error::Backend {
                    backend: "fred",
                    source: Box::new(err),
                })
        };
        timed(bench, &mut totals, 0, call).await?;
    }
    Ok(totals.usec[0] as f64 / totals.calls[0].max(1) as f64)
}

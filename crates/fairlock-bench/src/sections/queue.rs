//! Section 5, queue length: the cost of one enqueue, one release that hands the lock over and
//! one waiter leaving, with 0 to 10,000 other waiters already queued on the lock.
//!
//! The queue is filled with fake owners through `LockBackend::acquire` directly (concurrent
//! calls, long liveness TTL), so no task or heartbeat per waiter runs in this process.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock::backend::{AcquireOutcome, AcquireRequest, AttemptId, ReleaseOutcome};
use fairlock::{BoxError, LockBackend, LockName, Owner};
use futures::{StreamExt, TryStreamExt};

use crate::bench::Bench;
use crate::report::{Figure, Section};
use crate::stats::Samples;

/// Longer than any run: fake owners never heartbeat.
const LONG: Duration = Duration::from_secs(600);
const FILL_CONCURRENCY: usize = 64;

struct Costs {
    waiters: usize,
    enqueue: Samples,
    handoff: Samples,
    leave: Samples,
    fill: Duration,
}

pub(crate) async fn run(bench: &Bench) -> Result<Section, BoxError> {
    let sizes: &[usize] = bench.scale(&[0, 100, 1_000, 10_000], &[0, 100, 1_000]);
    let repetitions = bench.scale(300, 60);
    let backend = bench.backend().await?;
    let mut all = Vec::new();
    for &waiters in sizes {
        let name = LockName::new(bench.lock_name(&format!("queue-{waiters}")))?;
        all.push(measure(&backend, &name, waiters, repetitions).await?);
    }

    let mut section = Section::new("queue", "Queue operations vs queue length");
    let base = &all[0];
    let largest = &all[all.len() - 1];
    for (what, pick) in [
        (
            "enqueue",
            (|c: &Costs| c.enqueue.median()) as fn(&Costs) -> Duration,
        ),
        ("release with hand-over", |c: &Costs| c.handoff.median()),
        ("waiter leaving", |c: &Costs| c.leave.median()),
    ] {
        for costs in &all {
            section.push(Figure::micros(
                format!("{what} p50, {} waiters", costs.waiters),
                pick(costs),
            ));
        }
        let ratio = super::support::ratio(pick(largest), pick(base));
        section.push(
            Figure::new(
                format!("{what}: {} waiters / empty", largest.waiters),
                ratio,
                "x",
            )
            // The target is at 10,000 waiters; a `--quick` run's largest queue is
            // 1,000, which the figure's name says.
            .target("<= 1.5x", ratio <= 1.5),
        );
    }
    section.note(format!(
        "median of {repetitions} single operations per queue length, one at a time; \"N waiters\" \
         = N others queued: enqueue joins behind N, leave removes the last of N+1, a release hands \
         the lock to the head with N behind it. Filling 10,000 (or the largest) took {:.2} s \
         with {FILL_CONCURRENCY} concurrent `acquire` calls",
        largest.fill.as_secs_f64()
    ));
    Ok(section)
}

/// The first step of a fresh attempt of `owner`.
fn request(name: &LockName, owner: Owner, queue: bool) -> AcquireRequest {
    step(name, owner, AttemptId::random(), queue)
}

/// A step of `attempt`, which `owner` started earlier.
fn step(name: &LockName, owner: Owner, attempt: AttemptId, queue: bool) -> AcquireRequest {
    AcquireRequest {
        name: name.clone(),
        owner,
        attempt,
        lease: LONG,
        waiter_ttl: LONG,
        queue,
    }
}

async fn measure(
    backend: &Arc<dyn LockBackend>,
    name: &LockName,
    waiters: usize,
    repetitions: usize,
) -> Result<Costs, BoxError> {
    // The holder and the queue entries are attempts: (owner, attempt) pairs.
    let first = request(name, Owner::new("holder")?, false);
    let mut holder = (first.owner.clone(), first.attempt);
    let AcquireOutcome::Granted(grant) = backend.acquire(&first).await? else {
        return Err(format!("{name}: a fresh lock was not granted").into());
    };
    let mut token = grant.token;

    let started = Instant::now();
    futures::stream::iter(0..waiters)
        .map(|i| {
            let request = request(
                name,
                Owner::new(format!("filler-{i}")).expect("valid owner"),
                true,
            );
            async move {
                match backend.acquire(&request).await? {
                    AcquireOutcome::Queued { .. } => Ok(()),
                    other => Err(BoxError::from(format!("filler was not queued: {other:?}"))),
                }
            }
        })
        .buffer_unordered(FILL_CONCURRENCY)
        .try_collect::<()>()
        .await?;
    let fill = started.elapsed();
    // The fillers' order is whatever the concurrent calls made it: read it once.
    let state = backend.inspect(name).await?;
    if state.waiters.len() != waiters {
        return Err(format!(
            "{name}: {} waiters queued, expected {waiters}",
            state.waiters.len()
        )
        .into());
    }
    let mut queue: VecDeque<(Owner, AttemptId)> = state
        .waiters
        .iter()
        .map(|waiter| Ok::<_, BoxError>((Owner::new(&waiter.owner)?, waiter.attempt)))
        .collect::<Result<_, _>>()?;

    let mut enqueue = Samples::with_capacity(repetitions);
    let mut handoff = Samples::with_capacity(repetitions);
    let mut leave = Samples::with_capacity(repetitions);
    for repetition in 0..repetitions + 10 {
        let warm = repetition >= 10;
        let probe = request(name, Owner::new(format!("probe-{repetition}"))?, true);
        let t = Instant::now();
        let outcome = backend.acquire(&probe).await?;
        let enqueued = t.elapsed();
        if !matches!(outcome, AcquireOutcome::Queued { .. }) {
            return Err(format!("{name}: probe not queued: {outcome:?}").into());
        }
        let t = Instant::now();
        backend.abandon(name, &probe.owner, probe.attempt).await?;
        let left = t.elapsed();

        // Keep the length: one more at the tail, then the holder hands over to the head.
        let next = request(name, Owner::new(format!("next-{repetition}"))?, true);
        backend.acquire(&next).await?;
        queue.push_back((next.owner, next.attempt));
        let t = Instant::now();
        let released = backend.release(name, &holder.0, token, holder.1).await?;
        let handed = t.elapsed();
        if released != (ReleaseOutcome::Released { remaining: 0 }) {
            return Err(format!("{name}: release by the holder: {released:?}").into());
        }
        holder = queue.pop_front().ok_or("the queue ran empty")?;
        // The head confirms its pending grant, as a woken waiter would.
        match backend
            .acquire(&step(name, holder.0.clone(), holder.1, true))
            .await?
        {
            AcquireOutcome::Granted(grant) => token = grant.token,
            other => {
                return Err(format!("{name}: the head was not handed the lock: {other:?}").into())
            }
        }
        if warm {
            enqueue.push(enqueued);
            leave.push(left);
            handoff.push(handed);
        }
    }

    backend.force_release(name, token).await?;
    futures::stream::iter(queue)
        .map(|(owner, attempt)| async move { backend.abandon(name, &owner, attempt).await })
        .buffer_unordered(FILL_CONCURRENCY)
        .try_collect::<()>()
        .await?;
    Ok(Costs {
        waiters,
        enqueue,
        handoff,
        leave,
        fill,
    })
}

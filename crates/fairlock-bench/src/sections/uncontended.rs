//! Section 2, uncontended: one task acquiring and releasing a lock nobody else wants.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock::backend::{AcquireOutcome, AcquireRequest, AttemptId, ReleaseOutcome};
use fairlock::{BoxError, LockBackend, LockClient, LockName, LockOptions, Owner};

use super::limit::RoundTrips;
use super::support::ratio;
use crate::bench::Bench;
use crate::report::{Figure, Section};
use crate::stats::Samples;

pub(crate) async fn run(bench: &Bench) -> Result<Section, BoxError> {
    let backend = bench.backend().await?;
    let client = LockClient::from_arc(backend.clone());
    let lock = client.fair_lock(&bench.lock_name("uncontended"))?;
    let rounds = bench.scale(4_000, 400);
    for _ in 0..100 {
        lock.lock().await?.unlock().await?;
    }
    // The store calls alone, as the core makes them for an uncontended `lock()` and
    // `unlock()`: what `lock()` costs above them is the core's own part. The two run in
    // alternating blocks, so that both see the same machine (its speed drifts within a run).
    let raw = RawCalls {
        backend,
        name: LockName::new(bench.lock_name("uncontended-raw"))?,
        owner: Owner::unique(),
        options: LockOptions::default(),
    };
    for _ in 0..100 {
        raw.pair().await?;
    }
    let mut acquire = Samples::with_capacity(rounds);
    let mut release = Samples::with_capacity(rounds);
    let mut raw_acquire = Samples::with_capacity(rounds);
    let mut raw_release = Samples::with_capacity(rounds);
    // The round trip the ratio target counts in, measured in blocks of its own between the
    // others (see RoundTrips).
    let trips = RoundTrips::new(bench).await?;
    trips.sample(100, &mut Samples::with_capacity(100)).await?;
    let mut evalsha = Samples::with_capacity(rounds);
    let mut locking = Duration::ZERO;
    let (mut server_calls, mut server_usec) = (0, 0);
    let block = 200;
    for _ in 0..rounds.div_ceil(block) {
        let started = Instant::now();
        for _ in 0..block {
            let asked = Instant::now();
            let guard = lock.lock().await?;
            let acquired = Instant::now();
            guard.unlock().await?;
            acquire.push(acquired - asked);
            release.push(acquired.elapsed());
        }
        locking += started.elapsed();
        let before = bench.script_stats().await?;
        for _ in 0..block {
            let (acquired, released) = raw.pair().await?;
            raw_acquire.push(acquired);
            raw_release.push(released);
        }
        let after = bench.script_stats().await?;
        server_calls += after.0 - before.0;
        server_usec += after.1 - before.1;
        trips.sample(block, &mut evalsha).await?;
    }
    trips.close().await;
    let pairs_per_s = acquire.len() as f64 / locking.as_secs_f64();
    let server_per_call =
        Duration::from_secs_f64(server_usec as f64 / 1e6 / server_calls.max(1) as f64);

    // `try_lock` never waits, so it needs no wake-up registration: the difference to `lock`
    // is what registering costs.
    let mut try_acquire = Samples::with_capacity(rounds);
    for _ in 0..rounds / 4 {
        let asked = Instant::now();
        let guard = lock.try_lock().await?;
        try_acquire.push(asked.elapsed());
        guard.unlock().await?;
    }

    let acquire_ratio = ratio(acquire.median(), evalsha.median());
    let mut section = Section::new("uncontended", "One task, one lock");
    section.push(Figure::micros("`lock()` acquire p50", acquire.median()));
    section.push(Figure::micros(
        "`lock()` acquire p99",
        acquire.percentile(99.0),
    ));
    section.push(Figure::micros(
        "EVALSHA `return 1` round trip p50, in blocks between these",
        evalsha.median(),
    ));
    section.push(
        Figure::new(
            "`lock()` acquire p50 / EVALSHA p50 (in blocks between these)",
            acquire_ratio,
            "x",
        )
        .target("<= 1.5x", acquire_ratio <= 1.5),
    );
    section.push(Figure::new(
        "`lock()` acquire p50 / section 1's EVALSHA p50",
        ratio(acquire.median(), bench.limit.evalsha),
        "x",
    ));
    section.push(Figure::micros(
        "`try_lock()` acquire p50",
        try_acquire.median(),
    ));
    section.push(Figure::micros(
        "store call alone: acquire p50",
        raw_acquire.median(),
    ));
    section.push(Figure::micros(
        "store calls alone: server time per call (acquire and release, mean)",
        server_per_call,
    ));
    section.push(Figure::micros(
        "`lock()` p50 - store call alone p50: the core's part",
        acquire.median().saturating_sub(raw_acquire.median()),
    ));
    section.push(Figure::micros("`unlock()` p50", release.median()));
    section.push(Figure::micros(
        "store call alone: release p50",
        raw_release.median(),
    ));
    section.push(Figure::new(
        "acquire+release pairs per second",
        pairs_per_s,
        "/s",
    ));
    section.push(Figure::new(
        "pairs/s x EVALSHA p50 (1.0 = one round trip per pair)",
        pairs_per_s * evalsha.median().as_secs_f64(),
        "",
    ));
    section.note(format!(
        "{rounds} sequential `lock()`+`unlock()` pairs on one lock from one task; default \
         options (watchdog lease). A pair needs at least 2 round trips (acquire, release). \
         In blocks of {block}, alternating with as many acquire+release pairs made straight \
         on the backend (the store calls alone, on another lock) and as many EVALSHA round \
         trips made as section 1 makes them, the ratio target's denominator; the server time \
         per call is the mean over the store calls alone (`INFO commandstats`)"
    ));
    Ok(section)
}

/// Acquire and release straight on the backend, as the core asks for an uncontended hold.
struct RawCalls {
    backend: Arc<dyn LockBackend>,
    name: LockName,
    owner: Owner,
    options: LockOptions,
}

impl RawCalls {
    /// One acquire and its release: how long each took.
    async fn pair(&self) -> Result<(Duration, Duration), BoxError> {
        let request = AcquireRequest {
            name: self.name.clone(),
            owner: self.owner.clone(),
            attempt: AttemptId::random(),
            lease: self.options.watchdog_lease,
            waiter_ttl: self.options.waiter_ttl,
            // As the core's first ask.
            queue: false,
        };
        let asked = Instant::now();
        let AcquireOutcome::Granted(grant) = self.backend.acquire(&request).await? else {
            return Err("an uncontended acquire was not granted".into());
        };
        let acquired = Instant::now();
        let outcome = self
            .backend
            .release(&self.name, &self.owner, grant.token, request.attempt)
            .await?;
        if outcome != (ReleaseOutcome::Released { remaining: 0 }) {
            return Err(format!("an uncontended release answered {outcome:?}").into());
        }
        Ok((acquired - asked, acquired.elapsed()))
    }
}

//! Section 2, uncontended: one task acquiring and releasing a lock nobody else wants.

use std::time::Instant;

use fairlock::backend::{AcquireOutcome, AcquireRequest, AttemptId, ReleaseOutcome};
use fairlock::{BoxError, LockClient, LockName, LockOptions, Owner};

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
    let mut acquire = Samples::with_capacity(rounds);
    let mut release = Samples::with_capacity(rounds);
    let started = Instant::now();
    for _ in 0..rounds {
        let asked = Instant::now();
        let guard = lock.lock().await?;
        let acquired = Instant::now();
        guard.unlock().await?;
        acquire.push(acquired - asked);
        release.push(acquired.elapsed());
    }
    let pairs_per_s = rounds as f64 / started.elapsed().as_secs_f64();

    // `try_lock` never waits, so it needs no wake-up registration: the difference to `lock`
    // is what registering costs.
    let mut try_acquire = Samples::with_capacity(rounds);
    for _ in 0..rounds / 4 {
        let asked = Instant::now();
        let guard = lock.try_lock().await?;
        try_acquire.push(asked.elapsed());
        guard.unlock().await?;
    }

    // The store calls alone, as the core makes them for an uncontended `lock()` and
    // `unlock()`: what `lock()` costs above this is the core's own part.
    let name = LockName::new(bench.lock_name("uncontended-raw"))?;
    let owner = Owner::unique();
    let options = LockOptions::default();
    let mut raw_acquire = Samples::with_capacity(rounds);
    let mut raw_release = Samples::with_capacity(rounds);
    let mut stats_before = (0, 0);
    for round in 0..rounds + 100 {
        if round == 100 {
            stats_before = bench.script_stats().await?;
        }
        let request = AcquireRequest {
            name: name.clone(),
            owner: owner.clone(),
            attempt: AttemptId::random(),
            lease: options.watchdog_lease,
            waiter_ttl: options.waiter_ttl,
            // As the core's first ask.
            queue: false,
        };
        let asked = Instant::now();
        let AcquireOutcome::Granted(grant) = backend.acquire(&request).await? else {
            return Err("an uncontended acquire was not granted".into());
        };
        let acquired = Instant::now();
        let outcome = backend
            .release(&name, &owner, grant.token, request.attempt)
            .await?;
        if outcome != (ReleaseOutcome::Released { remaining: 0 }) {
            return Err(format!("an uncontended release answered {outcome:?}").into());
        }
        if round >= 100 {
            raw_acquire.push(acquired - asked);
            raw_release.push(acquired.elapsed());
        }
    }

    let stats_after = bench.script_stats().await?;
    let server_per_call = std::time::Duration::from_secs_f64(
        (stats_after.1 - stats_before.1) as f64
            / 1e6
            / (stats_after.0 - stats_before.0).max(1) as f64,
    );

    let evalsha = bench.limit.evalsha;
    let acquire_ratio = ratio(acquire.median(), evalsha);
    let mut section = Section::new("uncontended", "One task, one lock");
    section.push(Figure::micros("`lock()` acquire p50", acquire.median()));
    section.push(Figure::micros(
        "`lock()` acquire p99",
        acquire.percentile(99.0),
    ));
    section.push(
        Figure::new("`lock()` acquire p50 / EVALSHA p50", acquire_ratio, "x")
            .target("<= 1.5x", acquire_ratio <= 1.5),
    );
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
        "`lock()` above its store call, p50 difference",
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
        pairs_per_s * evalsha.as_secs_f64(),
        "",
    ));
    section.note(format!(
        "{rounds} sequential `lock()`+`unlock()` pairs on one lock from one task; default \
         options (watchdog lease). A pair needs at least 2 round trips (acquire, release)"
    ));
    Ok(section)
}

//! Section 1, the limit: what one round trip costs from the same client library (fred), for a
//! bare `PING` and for `EVALSHA` of `return 1`, the cheapest possible lock operation.

use std::time::{Duration, Instant};

use fairlock::BoxError;
use fred::prelude::{Client, ClientLike, LuaInterface};

use crate::bench::{Bench, Limit};
use crate::report::{Figure, Section};
use crate::stats::Samples;

/// As the processes section's workers hold the lock.
const HOLD: Duration = Duration::from_millis(1);

/// Round trips of `EVALSHA` of `return 1` from one fred client on one connection: the
/// denominator of the ratio targets. The machine's speed drifts within a run, at times by a
/// quarter between sections, so section 2 also measures these in blocks between its own
/// (see docs/performance-history.md, *Stop 30*). The hand-over sections keep section 1's: round
/// trips made just before and after their workers ran did not follow the drift better.
pub(crate) struct RoundTrips {
    client: Client,
    sha: String,
}

impl RoundTrips {
    pub(crate) async fn new(bench: &Bench) -> Result<Self, BoxError> {
        let client = bench.fred_client().await?;
        let sha: String = client.script_load("return 1").await?;
        Ok(RoundTrips { client, sha })
    }

    /// One round trip, timed.
    pub(crate) async fn one(&self) -> Result<Duration, BoxError> {
        let started = Instant::now();
        let one: i64 = self
            .client
            .evalsha(
                self.sha.as_str(),
                Vec::<String>::new(),
                Vec::<String>::new(),
            )
            .await?;
        let elapsed = started.elapsed();
        if one != 1 {
            return Err(format!("EVALSHA of `return 1` returned {one}").into());
        }
        Ok(elapsed)
    }

    /// `rounds` round trips, back to back, into `samples`.
    pub(crate) async fn sample(
        &self,
        rounds: usize,
        samples: &mut Samples,
    ) -> Result<(), BoxError> {
        for _ in 0..rounds {
            samples.push(self.one().await?);
        }
        Ok(())
    }

    pub(crate) async fn close(self) {
        let _ = self.client.quit().await;
    }
}

pub(crate) async fn run(bench: &Bench) -> Result<(Limit, Section), BoxError> {
    let trips = RoundTrips::new(bench).await?;
    let rounds = bench.scale(5_000, 500);
    let mut ping = Samples::with_capacity(rounds);
    let mut evalsha = Samples::with_capacity(rounds);
    // Interleaved, so both see the same conditions; the first rounds warm up.
    for round in 0..rounds + 200 {
        let started = Instant::now();
        let _: String = trips.client.ping(None).await?;
        let pinged = started.elapsed();
        let evalshaed = trips.one().await?;
        if round >= 200 {
            ping.push(pinged);
            evalsha.push(evalshaed);
        }
    }
    // The same call after a worker's 1 ms hold (mostly asleep, spinning at the end), as a
    // hand-over's release comes after one: the server was idle meanwhile, which a
    // back-to-back round trip never lets it be.
    let idle_rounds = bench.scale(1_500, 100);
    let mut after_hold = Samples::with_capacity(idle_rounds);
    for _ in 0..idle_rounds {
        crate::worker::hold_for(HOLD);
        after_hold.push(trips.one().await?);
    }
    trips.close().await;

    let limit = Limit {
        evalsha: evalsha.median(),
        evalsha_after_hold: after_hold.median(),
    };
    let mut section = Section::new("limit", "Round trip of the client library");
    section.push(Figure::micros("PING round trip p50", ping.median()));
    section.push(Figure::micros("PING round trip p99", ping.percentile(99.0)));
    section.push(Figure::micros(
        "EVALSHA `return 1` round trip p50",
        evalsha.median(),
    ));
    section.push(Figure::micros(
        "EVALSHA `return 1` round trip p99",
        evalsha.percentile(99.0),
    ));
    section.push(Figure::micros(
        "EVALSHA `return 1` round trip p50 after a 1 ms hold",
        after_hold.median(),
    ));
    section.note(format!(
        "{rounds} sequential rounds from one fred client on one connection over loopback; \
         this is the floor every lock operation stands on (one script call = one round trip); \
         'after a 1 ms hold': {idle_rounds} more, each after the client held for 1 ms as a \
         benchmark worker does (asleep, then spinning its last 200 µs; the server idle meanwhile): \
         the floor a hand-over's release stands on"
    ));
    Ok((limit, section))
}

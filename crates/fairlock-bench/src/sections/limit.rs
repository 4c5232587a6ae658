//! Section 1, the limit: what one round trip costs from the same client library (fred), for a
//! bare `PING` and for `EVALSHA` of `return 1`, the cheapest possible lock operation.

use std::time::Instant;

use fairlock::BoxError;
use fred::prelude::{ClientLike, LuaInterface};

use crate::bench::{Bench, Limit};
use crate::report::{Figure, Section};
use crate::stats::Samples;

pub(crate) async fn run(bench: &Bench) -> Result<(Limit, Section), BoxError> {
    let client = bench.fred_client().await?;
    let sha: String = client.script_load("return 1").await?;
    let rounds = bench.scale(5_000, 500);
    let mut ping = Samples::with_capacity(rounds);
    let mut evalsha = Samples::with_capacity(rounds);
    // Interleaved, so both see the same conditions; the first rounds warm up.
    for round in 0..rounds + 200 {
        let started = Instant::now();
        let _: String = client.ping(None).await?;
        let pinged = Instant::now();
        let one: i64 = client
            .evalsha(sha.as_str(), Vec::<String>::new(), Vec::<String>::new())
            .await?;
        let done = Instant::now();
        if one != 1 {
            return Err(format!("EVALSHA of `return 1` returned {one}").into());
        }
        if round >= 200 {
            ping.push(pinged - started);
            evalsha.push(done - pinged);
        }
    }
    let _ = client.quit().await;

    let limit = Limit {
        evalsha: evalsha.median(),
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
    section.note(format!(
        "{rounds} sequential rounds from one fred client on one connection over loopback; \
         this is the floor every lock operation stands on (one script call = one round trip)"
    ));
    Ok((limit, section))
}

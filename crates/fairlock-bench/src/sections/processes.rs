//! Section 11, hand-over between processes: N separate OS processes each run this binary's
//! protocol worker (`fairlock-bench worker`, see `bench-protocol.md`) on one lock, as the
//! external harness runs them, looping acquire, hold 1 ms, release until a common deadline.
//! Reports the gap between one worker's release and the next worker's acquisition, the
//! acquisitions per second, Jain's index over the workers and the hold length they measured.
//! Unlike the harness, it also asks the workers for their `STAGE` lines
//! ([`crate::stages`]), to split each hand-over into stages.

use std::process::Stdio;
use std::time::Duration;

use fairlock::BoxError;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::bench::Bench;
use crate::clock::EpochClock;
use crate::report::{Figure, Section};
use crate::stats::{jain_index, Samples};

const HOLD_US: u64 = 1_000;
/// Time for the workers to start, connect and warm up before the common start.
const START_DELAY: Duration = Duration::from_millis(1_500);

/// One line a worker printed: `id t_req t_acq t_rel_start` (epoch ns).
#[derive(Clone, Copy, Debug)]
struct Line {
    who: usize,
    t_req: u128,
    t_acq: u128,
    t_rel_start: u128,
}

/// A `STAGE id t_acq token heard_ns` line: the worker's process heard of the hand-over that
/// granted its hold at `t_acq` (fencing `token`) at `heard_ns`.
#[derive(Clone, Copy, Debug)]
struct Heard {
    token: u64,
    heard_ns: u128,
}

pub(crate) async fn run(bench: &Bench) -> Result<Section, BoxError> {
    let duration = bench.scale(Duration::from_secs(3), Duration::from_millis(500));
    let mut section = Section::new("processes", "Hand-over between worker processes");
    for workers in [2usize, 8] {
        measure(bench, &mut section, workers, duration).await?;
    }
    section.note(format!(
        "N `fairlock-bench worker` processes (own runtime and connections each, default \
         settings, fixed lease {} ms) loop acquire / hold {HOLD_US} µs / release on one lock for \
         {duration:?} from a common start; gap = t_acq(next) - t_rel_start(previous) for each \
         hold taken by a different worker that was already waiting; hold = t_rel_start - t_acq \
         as the workers measured it",
        10_000
    ));
    Ok(section)
}

async fn measure(
    bench: &Bench,
    section: &mut Section,
    workers: usize,
    duration: Duration,
) -> Result<(), BoxError> {
    let clock = EpochClock::new();
    let start_ns = clock.now_ns() + START_DELAY.as_nanos();
    let deadline_ns = start_ns + duration.as_nanos();
    let name = bench.lock_name(&format!("processes-{workers}"));
    let exe = std::env::current_exe()?;
    let scripts_before = bench.script_stats().await?.0;
    let mut children = Vec::with_capacity(workers);
    for id in 0..workers {
        let child = Command::new(&exe)
            .args(["worker", "fairlock", &name, &id.to_string(), "0"])
            .arg(HOLD_US.to_string())
            .arg(start_ns.to_string())
            .arg(deadline_ns.to_string())
            .env("LOCKBENCH_REDIS_URL", &bench.url)
            .env(crate::stages::ENV, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        children.push(child);
    }
    let mut readers = Vec::with_capacity(workers);
    for mut child in children {
        readers.push(tokio::spawn(async move {
            let stdout = child.stdout.take().ok_or("no stdout")?;
            let stderr = child.stderr.take().ok_or("no stderr")?;
            let errors = tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                let mut failures = Vec::new();
                let mut heard = Vec::new();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(stage) = line.strip_prefix("STAGE ") {
                        heard.extend(parse_stage(stage));
                    } else if !line.starts_with("READY ") {
                        failures.push(line);
                    }
                }
                (failures, heard)
            });
            let mut lines = BufReader::new(stdout).lines();
            let mut out = Vec::new();
            while let Some(line) = lines.next_line().await? {
                out.push(parse(&line)?);
            }
            let status = child.wait().await?;
            let (stderr, heard) = errors.await?;
            if !status.success() {
                return Err(format!("worker exited with {status}: {stderr:?}").into());
            }
            Ok::<_, BoxError>((out, failures(&stderr), heard))
        }));
    }
    let mut holds = Vec::new();
    let (mut failed, mut failed_releases) = (0, 0);
    let mut heard = std::collections::HashMap::new();
    for reader in readers {
        let (lines, (acquisitions, releases), heard_by_worker) = reader.await??;
        holds.extend(lines);
        failed += acquisitions;
        failed_releases += releases;
        heard.extend(heard_by_worker);
    }
    holds.sort_by_key(|line| line.t_acq);
    // Includes each worker's warm-up (two calls) and the calls of its last, cut-off wait.
    let scripts = bench.script_stats().await?.0 - scripts_before;

    let mut gaps = Samples::with_capacity(holds.len());
    let mut stages = Stages::default();
    let mut overlaps = 0;
    for pair in holds.windows(2) {
        let (previous, next) = (pair[0], pair[1]);
        if next.t_acq < previous.t_rel_start {
            overlaps += 1;
        }
        if next.who != previous.who && next.t_req < previous.t_rel_start {
            gaps.push(nanos(next.t_acq.saturating_sub(previous.t_rel_start)));
            if let Some(&heard) = heard.get(&(next.who, next.t_acq)) {
                stages.add(previous, next, heard);
            }
        }
    }
    let mut hold_lengths = Samples::with_capacity(holds.len());
    let mut per_worker = vec![0u64; workers];
    for line in &holds {
        hold_lengths.push(nanos(line.t_rel_start.saturating_sub(line.t_acq)));
        per_worker[line.who] += 1;
    }
    let span = holds
        .iter()
        .map(|line| line.t_rel_start)
        .max()
        .unwrap_or(start_ns)
        .saturating_sub(start_ns);
    let per_second = holds.len() as f64 / nanos(span).as_secs_f64().max(1e-9);
    let jain = jain_index(&per_worker);
    let gap_p50 = gaps.median();
    let ratio = super::support::ratio(gap_p50, bench.limit.evalsha);

    section.push(Figure::micros(
        format!("{workers} processes: hand-over gap p50"),
        gap_p50,
    ));
    section.push(
        Figure::new(
            format!("{workers} processes: hand-over gap p50 / EVALSHA p50"),
            ratio,
            "x",
        )
        .target("<= 3x", !gaps.is_empty() && ratio <= 3.0),
    );
    section.push(Figure::new(
        format!("{workers} processes: hand-over gap p50 / EVALSHA p50 after a 1 ms hold"),
        super::support::ratio(gap_p50, bench.limit.evalsha_after_hold),
        "x",
    ));
    let p99 = gaps.percentile(99.0);
    section.push(
        Figure::micros(format!("{workers} processes: hand-over gap p99"), p99).target(
            "<= 1000 µs",
            !gaps.is_empty() && p99 <= Duration::from_millis(1),
        ),
    );
    stages.report(section, workers, gaps.len());
    section.push(Figure::new(
        format!("{workers} processes: acquisitions per second"),
        per_second,
        "/s",
    ));
    section.push(
        Figure::new(format!("{workers} processes: Jain's index"), jain, "")
            .target(">= 0.999", jain >= 0.999),
    );
    // The protocol asks for the hold within 5 %: the p99 shows what the worker's sleep
    // overshoots when the machine is busy.
    let asked = Duration::from_micros(HOLD_US);
    let within = |length: Duration| length.abs_diff(asked) <= asked / 20;
    let hold_p50 = hold_lengths.median();
    section.push(
        Figure::micros(
            format!("{workers} processes: hold length p50 (asked {HOLD_US} µs)"),
            hold_p50,
        )
        .target("within 5 %", !holds.is_empty() && within(hold_p50)),
    );
    section.push(Figure::micros(
        format!("{workers} processes: hold length p99"),
        hold_lengths.percentile(99.0),
    ));
    section.push(
        Figure::new(
            format!("{workers} processes: overlapping holds"),
            overlaps as f64,
            "",
        )
        .target("0", overlaps == 0),
    );
    section.push(Figure::new(
        format!("{workers} processes: script calls per acquisition"),
        scripts as f64 / holds.len().max(1) as f64,
        "",
    ));
    section.push(
        Figure::new(
            format!("{workers} processes: failed acquisitions"),
            failed as f64,
            "",
        )
        .target("0", failed == 0),
    );
    // A release that fails may be a hold that lapsed under its holder: as much a miss as a
    // failed acquisition, though the worker carries on.
    section.push(
        Figure::new(
            format!("{workers} processes: failed releases"),
            failed_releases as f64,
            "",
        )
        .target("0", failed_releases == 0),
    );
    Ok(())
}

/// A worker's failed acquisitions and failed releases, from the lines it printed on stderr
/// (`FAIL …` and `release by worker … failed: …`, see `worker.rs`).
fn failures(stderr: &[String]) -> (usize, usize) {
    let count = |prefix: &str| {
        stderr
            .iter()
            .filter(|line| line.starts_with(prefix))
            .count()
    };
    (count("FAIL "), count("release by worker "))
}

/// The stages of the hand-overs the grantee's process heard of by message (the others went
/// to a grantee that asked first: its own request was granted).
#[derive(Default)]
struct Stages {
    /// From the release's start to the start of the server function that handed over: the
    /// token is the server's clock in µs when that function started, and the workers' clocks
    /// are the same machine's.
    to_function: Samples,
    /// From there until the grantee's process got the message off its subscriber connection:
    /// the rest of the function, the message's way, and waking that process.
    to_heard: Samples,
    /// From there until the grantee's `lock()` returned: routing the message to the waiting
    /// call, waking it, and making the guard.
    to_acquired: Samples,
    /// Hand-overs the grantee heard of whose times did not fit the gap (left out above).
    misfits: usize,
}

impl Stages {
    fn add(&mut self, previous: Line, next: Line, heard: Heard) {
        let started = u128::from(heard.token) * 1_000;
        // A token is the server's clock only when it is above the last one (always, at these
        // rates); a skewed or stepped clock shows as a start outside the gap: left out.
        if started < previous.t_rel_start || started > heard.heard_ns || heard.heard_ns > next.t_acq
        {
            self.misfits += 1;
            return;
        }
        self.to_function.push(nanos(started - previous.t_rel_start));
        self.to_heard.push(nanos(heard.heard_ns - started));
        self.to_acquired.push(nanos(next.t_acq - heard.heard_ns));
    }

    fn report(&self, section: &mut Section, workers: usize, gaps: usize) {
        section.push(Figure::new(
            format!("{workers} processes: hand-overs heard by message / all"),
            (self.to_function.len() + self.misfits) as f64 / gaps.max(1) as f64,
            "",
        ));
        section.push(Figure::new(
            format!("{workers} processes: of those, times outside their gap (left out)"),
            self.misfits as f64,
            "",
        ));
        if self.to_function.is_empty() {
            // No stage to report: a median of nothing would read as 0 µs.
            return;
        }
        for (stage, samples) in [
            ("release starts -> its function starts", &self.to_function),
            ("-> grantee's process hears", &self.to_heard),
            ("-> grantee's `lock()` returns", &self.to_acquired),
        ] {
            section.push(Figure::micros(
                format!("{workers} processes: stage p50, {stage}"),
                samples.median(),
            ));
        }
    }
}

/// The worker and hold (`t_acq`) of a `STAGE` line (without its prefix), and what it says.
fn parse_stage(line: &str) -> Option<((usize, u128), Heard)> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [who, t_acq, token, heard_ns] = fields[..] else {
        return None;
    };
    Some((
        (who.parse().ok()?, t_acq.parse().ok()?),
        Heard {
            token: token.parse().ok()?,
            heard_ns: heard_ns.parse().ok()?,
        },
    ))
}

fn nanos(ns: u128) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

fn parse(line: &str) -> Result<Line, BoxError> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [who, t_req, t_acq, t_rel_start] = fields[..] else {
        return Err(format!("unexpected worker line {line:?}").into());
    };
    Ok(Line {
        who: who.parse()?,
        t_req: t_req.parse()?,
        t_acq: t_acq.parse()?,
        t_rel_start: t_rel_start.parse()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(who: usize, t_req: u128, t_acq: u128, t_rel_start: u128) -> Line {
        Line {
            who,
            t_req,
            t_acq,
            t_rel_start,
        }
    }

    #[test]
    fn failed_releases_are_counted_apart_from_failed_acquisitions() {
        let stderr = [
            "FAIL 1 100 200 timed out",
            "release by worker 1 failed: the lease was lost",
            "some warning",
            "FAIL 1 300 400 timed out",
        ]
        .map(String::from);
        assert_eq!(failures(&stderr), (2, 1));
    }

    #[test]
    fn parses_stage_lines() {
        let ((who, t_acq), heard) = parse_stage("3 5000 4 4500").unwrap();
        assert_eq!(
            (who, t_acq, heard.token, heard.heard_ns),
            (3, 5000, 4, 4500)
        );
        assert!(parse_stage("3 5000 4").is_none());
        assert!(parse_stage("3 5000 x 4500").is_none());
    }

    #[test]
    fn splits_a_hand_over_at_the_function_start_and_the_hearing() {
        // Released at 10 µs, the function started at 40 µs (token 40), heard at 90 µs,
        // acquired at 100 µs.
        let (previous, next) = (line(0, 0, 0, 10_000), line(1, 5_000, 100_000, 200_000));
        let mut stages = Stages::default();
        let heard = Heard {
            token: 40,
            heard_ns: 90_000,
        };
        stages.add(previous, next, heard);
        assert_eq!(stages.to_function.median(), Duration::from_micros(30));
        assert_eq!(stages.to_heard.median(), Duration::from_micros(50));
        assert_eq!(stages.to_acquired.median(), Duration::from_micros(10));
        // A token before the release (not the server's clock then), or a hearing after the
        // acquisition, does not fit: counted, not used.
        for heard in [
            Heard {
                token: 5,
                heard_ns: 90_000,
            },
            Heard {
                token: 40,
                heard_ns: 150_000,
            },
        ] {
            stages.add(previous, next, heard);
        }
        assert_eq!((stages.to_function.len(), stages.misfits), (1, 2));
    }
}

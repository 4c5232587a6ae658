//! The benchmark protocol worker (`/work/shared/bench-protocol.md`): one OS process, one
//! connection, fairlock's public API with default settings except the lease and the wait.
//!
//! Started by the processes section, with [`stages::ENV`](crate::stages::ENV) set, it also
//! prints `STAGE id t_acq token heard_ns` on stderr for each hold it got by a hand-over
//! message: when its process heard of it (see [`crate::stages`]).

use std::io::Write as _;
use std::time::Duration;

use fairlock::LockClient;

use crate::clock::EpochClock;
use crate::connect;
use crate::stages::Heard;

/// The worker's command line, in protocol order.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct WorkerArgs {
    /// A label from the orchestrator (ignored).
    lib: String,
    /// The lock's name.
    lock_name: String,
    /// Echoed in every output line.
    worker_id: u64,
    /// Acquisitions to make; 0: until DEADLINE_NS.
    k: u64,
    /// Hold time per acquisition, in microseconds.
    hold_us: u64,
    /// Unix epoch ns of the first request.
    start_ns: u128,
    /// Unix epoch ns at or after which no request starts (0 or absent: none).
    deadline_ns: Option<u128>,
}

fn env_ms(name: &str, default: u64) -> Result<Duration, String> {
    match std::env::var(name) {
        Ok(value) => value
            .trim()
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|err| format!("{name}={value:?}: {err}")),
        Err(_) => Ok(Duration::from_millis(default)),
    }
}

/// One line of reason: the protocol's lines are whitespace separated.
fn one_line(reason: &str) -> String {
    reason.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub(crate) async fn run(args: WorkerArgs) -> Result<(), String> {
    let clock = EpochClock::new();
    let url =
        std::env::var("LOCKBENCH_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let lease = env_ms("LOCKBENCH_LEASE_MS", 10_000)?;
    let wait = env_ms("LOCKBENCH_WAIT_MS", 60_000)?;
    let id = args.worker_id;
    let deadline_ns = args.deadline_ns.filter(|&d| d > 0);
    if args.k == 0 && deadline_ns.is_none() {
        return Err("K=0 (unbounded) needs DEADLINE_NS".into());
    }

    let heard = Heard::install_if_asked(clock)?;
    let backend = connect::backend(&url, connect::Options::default())
        .await
        .map_err(|err| format!("connecting to {url}: {err}"))?;
    let client = LockClient::from_arc(backend);
    let warmup_name = format!(
        "{}:warmup:{id}:{}",
        args.lock_name,
        uuid::Uuid::new_v4().simple()
    );
    let warmup = client
        .fair_lock(&warmup_name)
        .and_then(|lock| lock.with_lease(lease))
        .map_err(|err| err.to_string())?;
    let guard = warmup
        .try_lock_for(wait)
        .await
        .map_err(|err| format!("warm-up: {err}"))?;
    guard
        .unlock()
        .await
        .map_err(|err| format!("warm-up release: {err}"))?;
    // Constructed before the first t_req: only acquire and release are timed.
    let lock = client
        .fair_lock(&args.lock_name)
        .and_then(|lock| lock.with_lease(lease))
        .map_err(|err| err.to_string())?;
    let hold = Duration::from_micros(args.hold_us);

    let slack = args.start_ns as i128 - clock.now_ns() as i128;
    eprintln!("READY {id} {slack}");
    tokio::time::sleep_until(clock.instant_of(args.start_ns).into()).await;

    let stdout = std::io::stdout();
    let mut done = 0u64;
    while args.k == 0 || done < args.k {
        let t_req = clock.now_ns();
        if deadline_ns.is_some_and(|deadline| t_req >= deadline) {
            break;
        }
        done += 1;
        let guard = match lock.try_lock_for(wait).await {
            Ok(guard) => guard,
            Err(err) => {
                let t_fail = clock.now_ns();
                eprintln!("FAIL {id} {t_req} {t_fail} {}", one_line(&err.to_string()));
                continue;
            }
        };
        let t_acq = clock.now_ns();
        let token = guard.fencing_token();
        hold_for(hold);
        let t_rel_start = clock.now_ns();
        if let Err(err) = guard.unlock().await {
            // The hold happened; the line is still printed so the orchestrator sees it.
            eprintln!(
                "release by worker {id} failed: {}",
                one_line(&err.to_string())
            );
        }
        let mut out = stdout.lock();
        writeln!(out, "{id} {t_req} {t_acq} {t_rel_start}")
            .and_then(|()| out.flush())
            .map_err(|err| format!("stdout: {err}"))?;
        drop(out);
        // Outside the timed stretch: when this process heard of the hand-over it got, if any.
        if let Some(heard_ns) = heard.as_ref().and_then(|heard| heard.take(token)) {
            eprintln!("STAGE {id} {t_acq} {token} {heard_ns}");
        }
    }
    Ok(())
}

/// How far ahead of the end a hold stops sleeping and spins. A thread's sleep overshoots by
/// about 70 µs here (100 µs at p99: the kernel's default timer slack, then the wake-up), so
/// this leaves room for it; Tokio's timer, which fires on millisecond ticks, would turn a
/// 1 ms hold into about 2 (the protocol asks for HOLD_US within 5 %).
const SPIN: Duration = Duration::from_micros(200);

/// Holds for `hold`, precisely: sleeps while more than [`SPIN`] is left, then spins. Blocks
/// the calling thread, as a hold's work would.
///
/// The sleep matters on a small machine: spinning the whole hold, as this did while it slept
/// on Tokio's timer, kept one of two vCPUs from the server and the waiting processes.
pub(crate) fn hold_for(hold: Duration) {
    let end = std::time::Instant::now() + hold;
    if hold > SPIN {
        std::thread::sleep(hold - SPIN);
    }
    while std::time::Instant::now() < end {
        std::hint::spin_loop();
    }
}

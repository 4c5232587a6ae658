//! `fairlock exec`: wait for the lock, run the command while holding it, release it after.
//!
//! Three ways out besides the command ending: a signal while waiting (leave the queue, exit
//! 128+N), a signal while the command runs (pass it on, keep holding until the command ends),
//! and a lost lease (stop the command: SIGTERM, then SIGKILL after `--kill-after`; exit 76).

use std::future::Future;
use std::io::{ErrorKind, Write as _};
use std::pin::Pin;
use std::time::Duration;

use fairlock::{FairLock, LockClient, LockGuard};
use nix::sys::signal::Signal;
use tokio::process::Command;
use tokio::time::{sleep, sleep_until, Instant};

use crate::args::ExecArgs;
use crate::exit::{self, Failure, CANNOT_EXECUTE, INTERNAL, LEASE_LOST, NOT_FOUND};
use crate::signals::{self, Signals};

/// How long a signalled `fairlock` waits for its place in the queue to be given up before it
/// exits anyway (the place then ends with its liveness TTL).
const LEAVE_QUEUE_LIMIT: Duration = Duration::from_secs(2);

/// How often a holder with a fixed lease asks the store whether it still holds. The watchdog's
/// renewals tell a renewed holder, but a fixed lease has none, and a force unlock (or a store
/// that lost its data) must stop the command within about this long, not when the lease
/// ends. (The question is an `inspect`, which reads the lock's queue: once a second.)
const HOLD_CHECK: Duration = Duration::from_secs(1);

/// Runs `fairlock exec` and returns the exit code.
pub(crate) async fn exec(client: &LockClient, args: &ExecArgs) -> Result<u8, Failure> {
    // Catch signals before queueing, so none can end the process with a place left behind.
    let mut signals = Signals::catch()
        .map_err(|err| Failure::new(INTERNAL, format!("cannot catch signals: {err}")))?;
    let mut options = client.options().clone();
    options.lease = args.lease;
    options.watchdog_lease = args.watchdog_lease;
    let lock = client.fair_lock(&args.name)?.with_options(options)?;

    let guard = {
        let mut acquire = acquire(&lock, args.wait);
        tokio::select! {
            acquired = &mut acquire => acquired?,
            signal = signals.recv() => {
                // Dropping the future starts fairlock's own clean-up in a background task;
                // stay alive until it has taken effect.
                drop(acquire);
                wait_until_gone(client, &lock).await;
                return Ok(exit::signalled(signal as i32));
            }
        }
    };
    run_holding(guard, args, &mut signals).await
}

type Acquire<'a> = Pin<Box<dyn Future<Output = fairlock::Result<LockGuard>> + Send + 'a>>;

/// The acquisition `--wait` asks for: none (forever), `0` (try once), or a bound.
fn acquire(lock: &FairLock, wait: Option<Duration>) -> Acquire<'_> {
    match wait {
        None => Box::pin(lock.lock()),
        Some(Duration::ZERO) => Box::pin(lock.try_lock()),
        Some(wait) => Box::pin(lock.try_lock_for(wait)),
    }
}

/// Polls the lock until `lock`'s owner is neither queued nor holding (a grant that arrived
/// just as we left is given back too), for at most [`LEAVE_QUEUE_LIMIT`].
async fn wait_until_gone(client: &LockClient, lock: &FairLock) {
    let owner = lock.owner().as_str();
    let limit = Instant::now() + LEAVE_QUEUE_LIMIT;
    let mut absent_in_a_row = 0;
    while Instant::now() < limit {
        // Each look within what is left: a store that does not answer must not keep a
        // signalled `fairlock` for its command timeout.
        let looked = tokio::time::timeout_at(limit, client.state(lock.name().as_str())).await;
        let Ok(Ok(state)) = looked else {
            return;
        };
        let present = state
            .holder
            .as_ref()
            .is_some_and(|holder| holder.owner == owner)
            || state.waiters.iter().any(|waiter| waiter.owner == owner);
        // Twice in a row: a request of ours still in flight could land after a single look.
        absent_in_a_row = if present { 0 } else { absent_in_a_row + 1 };
        if absent_in_a_row == 2 {
            return;
        }
        sleep(Duration::from_millis(10)).await;
    }
}

/// Runs the command under `guard` and releases the lock when it ends.
async fn run_holding(
    guard: LockGuard,
    args: &ExecArgs,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let program = &args.command[0];
    let mut child = match Command::new(program)
        .args(&args.command[1..])
        .env("FAIRLOCK_NAME", &args.name)
        .env("FAIRLOCK_TOKEN", guard.fencing_token().to_string())
        .spawn()
    {
        Ok(child) => child,
        Err(err) => {
            let code = if err.kind() == ErrorKind::NotFound {
                NOT_FOUND
            } else {
                CANNOT_EXECUTE
            };
            let _ = guard.unlock().await;
            return Err(Failure::new(
                code,
                format!("cannot run {}: {err}", program.to_string_lossy()),
            ));
        }
    };

    let lease_lost = guard.lease_lost();
    tokio::pin!(lease_lost);
    let mut lost = false;
    let mut kill_at: Option<Instant> = None;
    // The store's answer to whether we still hold, while asked: a `false` marks the lease lost
    // (`is_held`), which `lease_lost` then reports.
    let mut next_check = Instant::now() + HOLD_CHECK;
    let mut check: Option<Pin<Box<dyn Future<Output = fairlock::Result<bool>> + Send + '_>>> = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            () = &mut lease_lost, if !lost => {
                lost = true;
                // The command first: a message that cannot be written must not keep it
                // running without the lock.
                let how = if args.kill_after.is_zero() {
                    signals::send(&child, Signal::SIGKILL);
                    "SIGKILL".to_owned()
                } else {
                    signals::send(&child, Signal::SIGTERM);
                    kill_at = Some(Instant::now() + args.kill_after);
                    format!(
                        "SIGTERM, then SIGKILL after {}",
                        humantime::format_duration(args.kill_after)
                    )
                };
                let _ = writeln!(
                    std::io::stderr(),
                    "fairlock: lease on lock {:?} was lost; stopping the command ({how})",
                    args.name,
                );
            }
            () = sleep_until(next_check), if args.lease.is_some() && check.is_none() && !lost => {
                check = Some(Box::pin(guard.is_held()));
            }
            _held = async { check.as_mut().expect("armed").await }, if check.is_some() => {
                // A failing store is the lease keeper's to judge.
                check = None;
                next_check = Instant::now() + HOLD_CHECK;
            }
            () = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                kill_at = None;
                signals::send(&child, Signal::SIGKILL);
            }
            signal = signals.recv() => signals::send(&child, signal),
        }
    };
    // A check still in flight borrows the guard, which the release takes.
    drop(check);
    let status = status
        .map_err(|err| Failure::new(INTERNAL, format!("waiting for the command failed: {err}")))?;

    let released = guard.unlock().await;
    if lost {
        // Already reported when it happened.
        return Ok(LEASE_LOST);
    }
    match released {
        Ok(()) => Ok(exit::of_child(status)),
        Err(fairlock::Error::LeaseLost { .. }) => Err(Failure::new(
            LEASE_LOST,
            format!(
                "lease on lock {:?} was lost before the command ended; another owner may have held the lock meanwhile",
                args.name
            ),
        )),
        Err(err) => {
            // The command ran under the lock; only the release failed, and the lease ends it.
            eprintln!("fairlock: warning: releasing lock {:?} failed ({err}); it ends with its lease", args.name);
            Ok(exit::of_child(status))
        }
    }
}

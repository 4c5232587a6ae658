//! A process that uses fairlock over Redis or PostgreSQL the way an application would, and
//! reports what it does as lines on standard output (see `fairlock_faults::protocol`) for the
//! fault suite's multi-process tests to check. The URL picks the store: `postgres://` or
//! `postgresql://` for PostgreSQL, anything else for Redis.
//!
//! ```text
//! contender --url URL --name LOCK [--mode loop|hold] [--count K] [--counter KEY]
//!           [--lease-ms N | --watchdog-ms N] [--ttl-ms N] [--hold-ms N]
//! ```
//!
//! - `loop`: K acquisitions; under each, a deliberately non-atomic GET, pause, SET + 1 of the
//!   counter key, so that any overlap of two holders loses an increment. On PostgreSQL the
//!   counter is the row `key` of the table `fault_counter (key text PRIMARY KEY, value
//!   bigint)`, which the test creates: a SELECT, pause, then an upsert of value + 1, each its
//!   own transaction.
//! - `hold` (default): one acquisition, held for `--hold-ms`, or else until the line `release`
//!   arrives on standard input. Tests SIGKILL it while it holds or while it waits.
//!
//! When standard input closes (the test process died) the contender exits at once, so that
//! no contender outlives its test.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use fairlock::{FairLock, LockBackend, LockClient, LockOptions};
use fairlock_faults::protocol::{epoch_ns, Event};
use fairlock_faults::store_view::is_postgres;
use fairlock_postgres::tokio_postgres;
use fairlock_postgres::PostgresBackend;
use fairlock_redis::fred::clients::Client as RedisClient;
use fairlock_redis::fred::prelude::{Builder, ClientLike, Config, KeysInterface};
use fairlock_redis::RedisBackend;
use tokio::sync::mpsc;

/// Pause between the counter's GET and SET: long enough that two overlapping holders would
/// surely interleave, short enough for 1600 acquisitions.
const RACE_WINDOW: Duration = Duration::from_micros(500);

#[derive(Debug, Default)]
struct Args {
    url: String,
    name: String,
    looping: bool,
    count: u64,
    counter: Option<String>,
    lease: Option<Duration>,
    watchdog: Option<Duration>,
    ttl: Option<Duration>,
    hold: Option<Duration>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        count: 1,
        ..Args::default()
    };
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        let value = argv.next().ok_or(format!("{flag} needs a value"))?;
        let number = || -> Result<u64, String> {
            value
                .parse()
                .map_err(|_| format!("{flag}: bad number {value}"))
        };
        match flag.as_str() {
            "--url" => args.url = value.clone(),
            "--name" => args.name = value.clone(),
            "--mode" => {
                args.looping = match value.as_str() {
                    "loop" => true,
                    "hold" => false,
                    other => return Err(format!("unknown mode {other}")),
                }
            }
            "--count" => args.count = number()?,
            "--counter" => args.counter = Some(value.clone()),
            "--lease-ms" => args.lease = Some(Duration::from_millis(number()?)),
            "--watchdog-ms" => args.watchdog = Some(Duration::from_millis(number()?)),
            "--ttl-ms" => args.ttl = Some(Duration::from_millis(number()?)),
            "--hold-ms" => args.hold = Some(Duration::from_millis(number()?)),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.url.is_empty() || args.name.is_empty() {
        return Err("--url and --name are required".into());
    }
    Ok(args)
}

/// Prints one event and flushes: the test reads each line as it happens.
fn emit(event: Event) {
    let mut out = std::io::stdout().lock();
    // A closed pipe means the test is gone; the stdin watcher ends the process then.
    let _ = writeln!(out, "{event}").and_then(|()| out.flush());
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => {
            emit(Event::Done);
            ExitCode::SUCCESS
        }
        Err(message) => {
            emit(Event::Fail(message));
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let args = parse_args()?;
    let releases = watch_stdin();
    let backend: std::sync::Arc<dyn LockBackend> = if is_postgres(&args.url) {
        std::sync::Arc::new(
            PostgresBackend::builder(&args.url)
                .pool_size(2)
                .connect()
                .await
                .map_err(|e| format!("connect: {e}"))?,
        )
    } else {
        std::sync::Arc::new(
            RedisBackend::connect(&args.url)
                .await
                .map_err(|e| format!("connect: {e}"))?,
        )
    };
    let mut options = LockOptions::default();
    options.lease = args.lease;
    if let Some(watchdog) = args.watchdog {
        options.watchdog_lease = watchdog;
    }
    if let Some(ttl) = args.ttl {
        options.waiter_ttl = ttl;
    }
    let client = LockClient::from_arc(backend)
        .with_options(options)
        .map_err(|e| format!("options: {e}"))?;
    let lock = client
        .fair_lock(&args.name)
        .map_err(|e| format!("lock name: {e}"))?;
    if args.looping {
        let key = args.counter.clone().ok_or("loop mode needs --counter")?;
        let counter = Counter::connect(&args.url, key).await?;
        ready(&lock);
        for seq in 0..args.count {
            let guard = acquire(&lock, seq).await?;
            let seen = counter.get().await?;
            tokio::time::sleep(RACE_WINDOW).await;
            counter.set(seen + 1).await?;
            let released_at = epoch_ns();
            guard
                .unlock()
                .await
                .map_err(|e| format!("unlock {seq}: {e}"))?;
            emit(Event::Rel {
                seq,
                epoch_ns: released_at,
            });
        }
        Ok(())
    } else {
        ready(&lock);
        hold(&lock, args.hold, releases).await
    }
}

/// The counter that loop mode increments non-atomically under the lock.
enum Counter {
    Redis(RedisClient, String),
    Postgres(tokio_postgres::Client, String),
}

impl Counter {
    async fn connect(url: &str, key: String) -> Result<Counter, String> {
        if is_postgres(url) {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .map_err(|e| format!("counter: {e}"))?;
            tokio::spawn(connection);
            return Ok(Counter::Postgres(client, key));
        }
        let client = Builder::from_config(Config::from_url(url).map_err(|e| e.to_string())?)
            .build()
            .map_err(|e| e.to_string())?;
        client.init().await.map_err(|e| format!("counter: {e}"))?;
        Ok(Counter::Redis(client, key))
    }

    async fn get(&self) -> Result<i64, String> {
        match self {
            Counter::Redis(client, key) => {
                let seen: Option<i64> = client.get(key).await.map_err(|e| e.to_string())?;
                Ok(seen.unwrap_or(0))
            }
            Counter::Postgres(client, key) => {
                let row = client
                    .query_opt("SELECT value FROM fault_counter WHERE key = $1", &[key])
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(row.map_or(0, |row| row.get(0)))
            }
        }
    }

    async fn set(&self, value: i64) -> Result<(), String> {
        match self {
            Counter::Redis(client, key) => client
                .set(key, value, None, None, false)
                .await
                .map_err(|e| e.to_string()),
            Counter::Postgres(client, key) => client
                .execute(
                    "INSERT INTO fault_counter (key, value) VALUES ($1, $2) \
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    &[key, &value],
                )
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
        }
    }
}

fn ready(lock: &FairLock) {
    emit(Event::Ready {
        owner: lock.owner().to_string(),
        epoch_ns: epoch_ns(),
    });
}

async fn acquire(lock: &FairLock, seq: u64) -> Result<fairlock::LockGuard, String> {
    emit(Event::Req { seq });
    let guard = lock.lock().await.map_err(|e| format!("lock {seq}: {e}"))?;
    emit(Event::Acq {
        seq,
        token: guard.fencing_token(),
        epoch_ns: epoch_ns(),
    });
    Ok(guard)
}

/// One acquisition, released after `hold`, or when told to, reporting a lost lease meanwhile.
async fn hold(
    lock: &FairLock,
    hold: Option<Duration>,
    mut releases: mpsc::UnboundedReceiver<()>,
) -> Result<(), String> {
    let guard = acquire(lock, 0).await?;
    let lost = guard.lease_lost();
    let until_release = async {
        match hold {
            Some(hold) => tokio::time::sleep(hold).await,
            None => {
                let _ = releases.recv().await;
            }
        }
    };
    tokio::pin!(until_release);
    tokio::select! {
        () = lost => {
            emit(Event::Lost { seq: 0, epoch_ns: epoch_ns() });
            // Keep "holding" as a careless application would: the store must not care.
            until_release.await;
        }
        () = &mut until_release => {}
    }
    let released_at = epoch_ns();
    guard.unlock().await.map_err(|e| format!("unlock: {e}"))?;
    emit(Event::Rel {
        seq: 0,
        epoch_ns: released_at,
    });
    Ok(())
}

/// Reads standard input on a thread of its own (a blocking read must not hold up the
/// runtime): each `release` line is sent on; at end of input (the test process is gone) the
/// whole process exits, holding or not.
fn watch_stdin() -> mpsc::UnboundedReceiver<()> {
    let (send, receive) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if line.trim() == "release" {
                let _ = send.send(());
            }
        }
        std::process::exit(3);
    });
    receive
}

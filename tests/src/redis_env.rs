//! A private `redis-server` per test, with contenders that each have their own connections
//! (as separate processes would), and fault injectors that run beside them.
//!
//! Fault injectors run `redis-cli` on plain threads rather than on the Tokio runtime: they
//! block on a child process, and their timing must not depend on how busy the runtime is.

use std::future::Future;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use fairlock::{LockClient, LockOptions};
use fairlock_redis::RedisBackend;

/// How long one backend call may wait for its reply, reconnections included. Short enough that
/// a call caught by a fault ends soon, long enough for a loaded machine and a server restart.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// A backend with its own connections (a pool and a subscriber) to the server at `url`.
///
/// # Panics
/// If it cannot connect within 5 s.
pub async fn backend(url: &str) -> RedisBackend {
    bounded(
        "connecting a backend",
        Duration::from_secs(10),
        RedisBackend::builder(url)
            .connect_timeout(Duration::from_secs(5))
            .command_timeout(COMMAND_TIMEOUT)
            .connect(),
    )
    .await
    .unwrap_or_else(|err| panic!("connecting to {url}: {err}"))
}

/// A client with its own backend connections and the given options.
///
/// # Panics
/// If it cannot connect, or the options are invalid.
pub async fn client(url: &str, options: LockOptions) -> LockClient {
    LockClient::new(backend(url).await)
        .with_options(options)
        .expect("valid options")
}

/// Options with a watchdog lease of `watchdog_lease` and a waiter TTL of `waiter_ttl`.
pub fn options(watchdog_lease: Duration, waiter_ttl: Duration) -> LockOptions {
    LockOptions::default()
        .with_watchdog_lease(watchdog_lease)
        .with_waiter_ttl(waiter_ttl)
        .with_outage_budget(Duration::from_secs(30))
}

/// Awaits `future`, failing the test if it takes longer than `limit`: no call may hang.
///
/// # Panics
/// When `limit` passes first.
pub async fn bounded<F: Future>(what: &str, limit: Duration, future: F) -> F::Output {
    match tokio::time::timeout(limit, future).await {
        Ok(output) => output,
        Err(_) => panic!("{what} did not finish within {limit:?}: a hang"),
    }
}

/// Runs `redis-cli -p port [-a password] args...` and returns its output, trimmed.
///
/// # Panics
/// If `redis-cli` cannot be run or fails.
pub fn cli(port: u16, password: Option<&str>, args: &[&str]) -> String {
    let mut command = Command::new("redis-cli");
    command.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(password) = password {
        command.args(["-a", password, "--no-auth-warning"]);
    }
    let output = command
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("redis-cli runs");
    assert!(
        output.status.success(),
        "redis-cli {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Every key on the server at `port` (by `SCAN`, so it works at any size), sorted.
pub fn all_keys(port: u16) -> Vec<String> {
    let mut keys: Vec<String> = cli(port, None, &["--scan"])
        .lines()
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect();
    keys.sort();
    keys
}

/// Every key on the server at `port` that stays: all but the locks' records of spent attempts
/// (`<prefix>{<name>}:x`), which expire by themselves at most
/// [`RESEND_HORIZON`](fairlock::backend::RESEND_HORIZON) after the lock's last grant or
/// release. Sorted.
///
/// # Panics
/// If such a record has no expiry, or one beyond the horizon.
pub fn lasting_keys(port: u16) -> Vec<String> {
    let horizon = i64::try_from(fairlock::backend::RESEND_HORIZON.as_millis()).unwrap_or(i64::MAX);
    let mut lasting = Vec::new();
    for key in all_keys(port) {
        if key.ends_with("}:x") {
            let ttl: i64 = cli(port, None, &["PTTL", &key]).parse().unwrap_or(-1);
            assert!(
                ttl > 0 && ttl <= horizon,
                "{key} must expire within the resend horizon: PTTL {ttl}"
            );
        } else {
            lasting.push(key);
        }
    }
    lasting
}

/// One integer field of `INFO <section>` (e.g. `commandstats`'s `cmdstat_eval` `calls`), or 0.
pub fn info_field(port: u16, section: &str, line_prefix: &str, field: &str) -> u64 {
    let info = cli(port, None, &["INFO", section]);
    let Some(line) = info.lines().find(|l| l.starts_with(line_prefix)) else {
        return 0;
    };
    line.split([':', ','])
        .find_map(|part| part.strip_prefix(&format!("{field}=")))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

/// A thread that runs a fault every `period` until stopped, counting how often it ran.
#[derive(Debug)]
pub struct Injector {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl Injector {
    /// Starts calling `fault` every `period` (the first call after one period).
    pub fn every(period: Duration, mut fault: impl FnMut() + Send + 'static) -> Injector {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut runs = 0;
            loop {
                std::thread::sleep(period);
                if stopped.load(Ordering::SeqCst) {
                    return runs;
                }
                fault();
                runs += 1;
            }
        });
        Injector {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the thread and returns how many times the fault ran.
    ///
    /// # Panics
    /// If the fault panicked.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.take().expect("not stopped yet");
        thread.join().expect("the fault injector panicked")
    }
}

impl Drop for Injector {
    fn drop(&mut self) {
        // A test that fails early must not leave the thread hammering a dead server.
        self.stop.store(true, Ordering::SeqCst);
    }
}

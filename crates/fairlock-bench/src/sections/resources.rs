//! Section 7, resources: 10,000 tasks waiting across 100 locks in one process. Counts the
//! subscriber connections, the client's and Redis's memory per waiter and per held lock, and
//! the keys left once everything is released.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use fairlock::{BoxError, LockClient, LockGuard};
use fred::prelude::{ClientLike, MemoryInterface};
use fred::types::{CustomCommand, Value};

use crate::bench::Bench;
use crate::report::{Figure, Section};

const LOCKS: usize = 100;

pub(crate) async fn run(bench: &Bench) -> Result<Section, BoxError> {
    let waiters = bench.scale(10_000, 1_000);
    let names: Vec<String> = (0..LOCKS)
        .map(|i| bench.lock_name(&format!("res-{i}")))
        .collect();
    let name_prefix = bench.lock_name("res-");

    // The baseline comes after the backend's connections are open and its first call has
    // loaded the function library: both grow `used_memory` too, and are not the locks'.
    let client = LockClient::from_arc(bench.backend().await?);
    client
        .fair_lock(&bench.lock_name("warm-res"))?
        .lock()
        .await?
        .unlock()
        .await?;
    let keys_before = scan_keys(bench).await?;
    let subscribers_before = subscriber_connections(bench).await?;
    let used_before = used_memory(bench).await?;

    let mut guards: Vec<LockGuard> = Vec::with_capacity(LOCKS);
    for name in &names {
        guards.push(client.fair_lock(name)?.lock().await?);
    }
    let used_held = used_memory(bench).await?;
    let held_keys = new_keys(bench, &keys_before).await?;
    let held_key_bytes = memory_usage(bench, &held_keys).await?;
    let rss_held = rss_bytes()?;

    // In waves, so that what is measured is what a waiter keeps, not the moment when every
    // waiter's first store call is in flight at once. Such a call holds about 8 KB (the
    // backend's 6 KB call future, 5 KB of it fred's command future, and fred's copy of the
    // command), freed when it returns; but the allocator keeps those pages resident, so with
    // all 10,000 started together (`--waiter-wave 10000`, as before) the burst, not the
    // waiters, was most of the resident memory measured (with a counting allocator: the heap
    // peaked at 10 KB per waiter, and held 2-3 KB per waiter once all were queued).
    let wave = bench.config.waiter_wave.min(waiters);
    let mut tasks = Vec::with_capacity(waiters);
    let queued_since = Instant::now();
    for waiter in 0..waiters {
        let lock = client.fair_lock(&names[waiter % LOCKS])?;
        tasks.push(tokio::spawn(async move {
            lock.lock().await?.unlock().await?;
            Ok::<_, BoxError>(())
        }));
        if (waiter + 1) % wave == 0 || waiter + 1 == waiters {
            wait_until_queued(&client, &name_prefix, waiter + 1, queued_since).await?;
        }
    }
    let queued_after = queued_since.elapsed();
    let rss_waiting = rss_bytes()?;
    let used_waiting = used_memory(bench).await?;
    let waiting_keys = new_keys(bench, &keys_before).await?;
    let waiting_key_bytes = memory_usage(bench, &waiting_keys).await?;
    let subscribers = subscriber_connections(bench).await? - subscribers_before;
    let connections = client_lines(bench).await?.len();

    let scripts_before_drain = bench.script_stats().await?.0;
    let subscribes_before_drain = subscribe_calls(bench).await?;
    let drain_started = Instant::now();
    for guard in guards {
        guard.unlock().await?;
    }
    for task in tasks {
        task.await??;
    }
    let drained = drain_started.elapsed();
    let drain_scripts = bench.script_stats().await?.0 - scripts_before_drain;
    let drain_subscribes = subscribe_calls(bench).await? - subscribes_before_drain;
    drop(client);
    // Releases by dropped guards run in the background: give them a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let left = new_keys(bench, &keys_before).await?;

    let per_backend = client_memory_per_backend(bench).await?;

    let mut section = Section::new("resources", "10,000 waiters across 100 locks");
    // No target: it includes what a process pays once for any fred client (about 2.6 MB).
    section.push(Figure::new(
        "client memory of the first RedisBackend in a fresh process, default pool (RSS delta)",
        per_backend.first as f64,
        "B",
    ));
    section.push(
        Figure::new(
            format!(
                "client memory per further RedisBackend, default pool (RSS delta over {})",
                BackendMemory::FURTHER
            ),
            per_backend.further,
            "B",
        )
        .target("<= 5 MB", per_backend.further <= 5.0 * 1024.0 * 1024.0),
    );
    section.push(
        Figure::new(
            "subscriber connections while waiting",
            subscribers as f64,
            "",
        )
        .target("1", subscribers == 1),
    );
    section.push(Figure::new(
        "connections to Redis while waiting (all clients)",
        connections as f64,
        "",
    ));
    let per_waiter_client = (rss_waiting as f64 - rss_held as f64) / waiters as f64;
    section.push(
        Figure::new(
            format!("client memory per waiter (RSS delta, started {wave} at a time)"),
            per_waiter_client,
            "B",
        )
        .target("< 10 KB", per_waiter_client < 10.0 * 1024.0),
    );
    section.push(Figure::new(
        "Redis memory per held lock (used_memory delta)",
        (used_held as f64 - used_before as f64) / LOCKS as f64,
        "B",
    ));
    section.push(Figure::new(
        "Redis memory per held lock (MEMORY USAGE of its keys)",
        held_key_bytes as f64 / LOCKS as f64,
        "B",
    ));
    section.push(Figure::new(
        "Redis memory per waiter (used_memory delta)",
        (used_waiting as f64 - used_held as f64) / waiters as f64,
        "B",
    ));
    section.push(Figure::new(
        "Redis memory per waiter (MEMORY USAGE of the keys)",
        (waiting_key_bytes as f64 - held_key_bytes as f64) / waiters as f64,
        "B",
    ));
    section.push(Figure::new(
        format!("draining: {waiters} hand-overs took"),
        drained.as_secs_f64(),
        "s",
    ));
    section.push(Figure::new(
        "draining: script calls per hand-over",
        drain_scripts as f64 / waiters as f64,
        "",
    ));
    section.push(
        Figure::new(
            "keys left after everything was released",
            left.len() as f64,
            "",
        )
        .target(
            "0 (fence counters and expiring attempt records excepted)",
            left.iter()
                .all(|key| is_fence_key(key) || is_attempt_records_key(key)),
        ),
    );
    let shown: Vec<&str> = left.iter().take(4).map(String::as_str).collect();
    section.note(format!(
        "{waiters} tasks call `lock()` (default options) on {LOCKS} locks held by 100 guards of \
         the same backend, spawned {wave} at a time (each wave queued before the next); all \
         were queued {:.2} s after the first was spawned; releasing the holders then let \
         all {waiters} acquire and release in {:.2} s ({drain_scripts} script calls and {drain_subscribes} \
         subscribe calls meanwhile; heartbeats every 5 s / 3 included). Keys while held: {}, while waiting: {}; \
         left: {} ({} fence counters, {} spent-attempt records that expire within a minute), \
         e.g. {shown:?}",
        queued_after.as_secs_f64(),
        drained.as_secs_f64(),
        held_keys.len(),
        waiting_keys.len(),
        left.len(),
        left.iter().filter(|key| is_fence_key(key)).count(),
        left.iter().filter(|key| is_attempt_records_key(key)).count(),
    ));
    Ok(section)
}

/// Subscribe commands the server has run: `SSUBSCRIBE` on Redis 7, `SUBSCRIBE` on 6.2 (no
/// sharded pub/sub there).
async fn subscribe_calls(bench: &Bench) -> Result<u64, BoxError> {
    Ok(bench.command_calls("ssubscribe").await? + bench.command_calls("subscribe").await?)
}

/// Waits until `count` waiters are queued on the locks named `prefix`*, for at most 60 s
/// from `since`.
async fn wait_until_queued(
    client: &LockClient,
    prefix: &str,
    count: usize,
    since: Instant,
) -> Result<(), BoxError> {
    loop {
        let queued: usize = client
            .list(prefix)
            .await?
            .iter()
            .map(|lock| lock.waiters)
            .sum();
        if queued >= count {
            return Ok(());
        }
        if since.elapsed() > Duration::from_secs(60) {
            return Err(format!("only {queued} of {count} waiters queued after 60 s").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether `key` is a lock's fence hash (`<prefix>{<name>}:f`: last token, last ticket),
/// which outlives the lock by design so fencing tokens keep increasing.
fn is_fence_key(key: &str) -> bool {
    key.ends_with("}:f")
}

/// Whether `key` is a lock's record of spent attempts (`<prefix>{<name>}:x`), which expires
/// by itself `fairlock::backend::RESEND_HORIZON` after the lock's last grant or release.
fn is_attempt_records_key(key: &str) -> bool {
    key.ends_with("}:x")
}

/// Every key in the database.
async fn scan_keys(bench: &Bench) -> Result<BTreeSet<String>, BoxError> {
    let mut keys = BTreeSet::new();
    let mut cursor = "0".to_string();
    loop {
        let page: Vec<Value> = bench
            .admin
            .custom(
                CustomCommand::new_static("SCAN", None::<u16>, false),
                vec![cursor.as_str(), "COUNT", "1000"],
            )
            .await?;
        let [next, batch] = <[Value; 2]>::try_from(page).map_err(|_| "SCAN: unexpected reply")?;
        let batch: Vec<String> = batch.convert()?;
        keys.extend(batch);
        cursor = next.convert()?;
        if cursor == "0" {
            return Ok(keys);
        }
    }
}

async fn new_keys(bench: &Bench, before: &BTreeSet<String>) -> Result<Vec<String>, BoxError> {
    Ok(scan_keys(bench)
        .await?
        .difference(before)
        .cloned()
        .collect())
}

async fn memory_usage(bench: &Bench, keys: &[String]) -> Result<u64, BoxError> {
    let mut total = 0;
    for key in keys {
        let bytes: Option<u64> = bench.admin.memory_usage(key.as_str(), Some(0)).await?;
        total += bytes.unwrap_or(0);
    }
    Ok(total)
}

async fn used_memory(bench: &Bench) -> Result<u64, BoxError> {
    Ok(bench.info_field("memory", "used_memory").await?.parse()?)
}

/// `CLIENT LIST`, one map of `field=value` per connection.
async fn client_lines(bench: &Bench) -> Result<Vec<Vec<(String, String)>>, BoxError> {
    let text: String = bench
        .admin
        .custom(
            CustomCommand::new_static("CLIENT", None::<u16>, false),
            vec!["LIST"],
        )
        .await?;
    Ok(text
        .lines()
        .map(|line| {
            line.split_whitespace()
                .filter_map(|field| field.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect())
}

/// Connections subscribed to anything (channels, patterns or shard channels).
async fn subscriber_connections(bench: &Bench) -> Result<i64, BoxError> {
    let count = client_lines(bench)
        .await?
        .iter()
        .filter(|fields| {
            fields.iter().any(|(k, v)| {
                (matches!(k.as_str(), "sub" | "psub" | "ssub") && v != "0")
                    || (k == "flags" && v.contains('P'))
            })
        })
        .count();
    Ok(count as i64)
}

/// What a `RedisBackend` with the default pool costs in resident memory, measured in a fresh
/// process (`fairlock-bench backend-memory`), as when a service makes its backends at start:
/// in this process, pages freed by earlier sections are reused, and the figure came out at a
/// quarter of that.
async fn client_memory_per_backend(bench: &Bench) -> Result<BackendMemory, BoxError> {
    let output = tokio::process::Command::new(std::env::current_exe()?)
        .arg("backend-memory")
        .env("LOCKBENCH_REDIS_URL", &bench.url)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "backend-memory exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    BackendMemory::parse(&stdout)
}

/// Resident memory of `RedisBackend`s made one after another in a fresh process.
#[derive(Debug, PartialEq)]
pub(crate) struct BackendMemory {
    /// The first backend, with what the process allocates once for any fred client (about
    /// 2.6 MB for a plain one here).
    pub(crate) first: u64,
    /// Each further backend, averaged over [`Self::FURTHER`].
    pub(crate) further: f64,
}

impl BackendMemory {
    /// How many further backends the average is over.
    pub(crate) const FURTHER: usize = 10;

    fn line(&self) -> String {
        format!(
            "BACKEND-MEMORY first={} further={}",
            self.first, self.further
        )
    }

    fn parse(output: &str) -> Result<Self, BoxError> {
        let line = output
            .lines()
            .find_map(|line| line.strip_prefix("BACKEND-MEMORY "))
            .ok_or_else(|| format!("backend-memory printed no figures: {output:?}"))?;
        let mut first = None;
        let mut further = None;
        for field in line.split_whitespace() {
            match field.split_once('=') {
                Some(("first", value)) => first = Some(value.parse()?),
                Some(("further", value)) => further = Some(value.parse()?),
                _ => return Err(format!("backend-memory: unknown field {field:?}").into()),
            }
        }
        match (first, further) {
            (Some(first), Some(further)) => Ok(Self { first, further }),
            _ => Err(format!("backend-memory: a figure is missing in {line:?}").into()),
        }
    }
}

/// `fairlock-bench backend-memory`: run in a fresh process by section 7; makes backends
/// (default options) on `LOCKBENCH_REDIS_URL` and prints their resident memory on stdout.
pub(crate) async fn backend_memory_child() -> Result<(), BoxError> {
    let url = std::env::var("LOCKBENCH_REDIS_URL")
        .map_err(|_| "backend-memory needs LOCKBENCH_REDIS_URL")?;
    let before = rss_bytes()?;
    let mut backends = Vec::with_capacity(BackendMemory::FURTHER + 1);
    backends.push(crate::connect::backend(&url, crate::connect::Options::default()).await?);
    let first = rss_bytes()?;
    for _ in 0..BackendMemory::FURTHER {
        backends.push(crate::connect::backend(&url, crate::connect::Options::default()).await?);
    }
    let after = rss_bytes()?;
    let memory = BackendMemory {
        first: first.saturating_sub(before),
        further: after.saturating_sub(first) as f64 / BackendMemory::FURTHER as f64,
    };
    println!("{}", memory.line());
    Ok(())
}

/// This process's resident set size.
fn rss_bytes() -> Result<u64, BoxError> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kb = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .ok_or("/proc/self/status has no VmRSS")?;
    Ok(kb.parse::<u64>()? * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_memory_reads_back_what_it_prints() {
        let memory = BackendMemory {
            first: 2_883_584,
            further: 658_227.2,
        };
        assert_eq!(BackendMemory::parse(&memory.line()).unwrap(), memory);
        let noisy = format!("a log line\n{}\n", memory.line());
        assert_eq!(BackendMemory::parse(&noisy).unwrap(), memory);
    }

    #[test]
    fn backend_memory_refuses_partial_or_unknown_output() {
        for output in [
            "",
            "BACKEND-MEMORY first=1",
            "BACKEND-MEMORY further=1.5",
            "BACKEND-MEMORY first=1 further=2 extra=3",
            "BACKEND-MEMORY first=x further=2",
        ] {
            assert!(BackendMemory::parse(output).is_err(), "{output:?}");
        }
    }
}

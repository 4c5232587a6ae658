//! Running the built `fairlock` binary against a private `redis-server` or PostgreSQL on
//! 127.0.0.1.

#![allow(dead_code, unreachable_pub)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use fairlock_testsupport::{PostgresServer, RedisServer, TempDir};
use serde_json::Value;

/// Exit codes documented in `fairlock --help`.
pub const USAGE: i32 = 2;
pub const UNAVAILABLE: i32 = 69;
pub const TEMPFAIL: i32 = 75;
pub const LEASE_LOST: i32 = 76;

/// The store a world's `fairlock` talks to.
pub enum Store {
    Redis(RedisServer),
    Postgres(PostgresServer),
}

impl Store {
    pub fn url(&self) -> String {
        match self {
            Store::Redis(server) => server.url(),
            Store::Postgres(server) => server.url(),
        }
    }
}

/// One test's world: a store of its own and a scratch directory.
pub struct World {
    pub server: Store,
    dir: TempDir,
}

impl World {
    /// A world on Redis.
    pub fn new() -> Self {
        World {
            server: Store::Redis(RedisServer::start().expect("redis-server starts")),
            dir: TempDir::new("cli").expect("a scratch directory"),
        }
    }

    /// A world on PostgreSQL (`--url postgres://...`).
    pub fn postgres() -> Self {
        World {
            server: Store::Postgres(PostgresServer::start().expect("postgres starts")),
            dir: TempDir::new("cli").expect("a scratch directory"),
        }
    }

    /// `fairlock --url <this server> ARGS...`.
    pub fn fairlock(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_fairlock"));
        command
            .env_remove("FAIRLOCK_URL")
            .env_remove("FAIRLOCK_PREFIX")
            .env_remove("FAIRLOCK_LOG")
            .arg("--url")
            .arg(self.server.url())
            .args(args)
            .current_dir(self.dir.path())
            // A group of its own, so a test that ends early can kill the command that
            // `fairlock exec` started too, not only `fairlock`.
            .process_group(0);
        command
    }

    /// Runs `fairlock ARGS...` to completion (at most 20 s).
    pub fn run(&self, args: &[&str]) -> Output {
        let child = self
            .fairlock(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Running(Some(child)).wait_output(Duration::from_secs(20))
    }

    /// Starts `fairlock ARGS...` in the background, output to files in the scratch directory.
    pub fn spawn(&self, args: &[&str]) -> Running {
        Running(Some(
            self.fairlock(args).stdin(Stdio::null()).spawn().unwrap(),
        ))
    }

    /// `status NAME --json`, parsed.
    pub fn status(&self, name: &str) -> Value {
        let output = self.run(&["status", name, "--json"]);
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        serde_json::from_slice(&output.stdout).unwrap()
    }

    /// Starts an `exec` that holds `name` until [`World::open_gate`] and records its token in
    /// `<name>.token`; returns once it holds the lock.
    pub fn hold_until_gate(&self, name: &str, extra: &[&str]) -> Running {
        let script = format!(
            "echo $FAIRLOCK_TOKEN > '{name}.token'; while [ ! -e '{name}.gate' ]; do sleep 0.02; done"
        );
        let mut args = vec!["exec"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[name, "--", "sh", "-c", &script]);
        let holder = self.spawn(&args);
        wait_until(Duration::from_secs(10), || {
            self.path(&format!("{name}.token")).exists()
        });
        holder
    }

    pub fn open_gate(&self, name: &str) {
        std::fs::write(self.path(&format!("{name}.gate")), "").unwrap();
    }

    /// Waits until `name` has `count` live waiters.
    pub fn wait_for_waiters(&self, name: &str, count: usize) {
        wait_until(Duration::from_secs(10), || {
            self.status(name)["waiters"].as_array().unwrap().len() == count
        });
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.path(file)).unwrap_or_default()
    }
}

/// A background `fairlock`, killed if the test ends without waiting for it.
pub struct Running(Option<Child>);

impl Running {
    pub fn pid(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    /// Waits at most `limit` for the exit code; panics if it does not come.
    pub fn wait(mut self, limit: Duration) -> i32 {
        let child = self.0.as_mut().unwrap();
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(
                started.elapsed() < limit,
                "fairlock still runs after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn wait_output(mut self, limit: Duration) -> Output {
        let child = self.0.take().unwrap();
        let pid = child.id();
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || sender.send(child.wait_with_output()));
        match receiver.recv_timeout(limit) {
            Ok(output) => output.unwrap(),
            Err(_) => {
                kill_group(pid);
                panic!("fairlock still runs after {limit:?}");
            }
        }
    }

    /// Sends `signal` (a name such as `TERM`) to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            kill_group(child.id());
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// SIGKILLs the process group led by `pid`: a `fairlock` and the command it runs.
fn kill_group(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .stderr(Stdio::null())
        .status();
}

/// Polls `condition` every 10 ms; panics if it is still false after `limit`.
pub fn wait_until(limit: Duration, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < limit,
            "condition still false after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether process `pid` still exists (a reaped child does not).
pub fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Runs `fairlock --url URL --connect-timeout 2s status job` against a store that is not
/// there; asserts it exits 69 (unavailable) and returns its stderr.
pub fn status_of_unreachable(url: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_fairlock"))
        .args(["--url", url, "--connect-timeout", "2s", "status", "job"])
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(UNAVAILABLE), "{stderr}");
    stderr
}

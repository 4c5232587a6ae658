//! One throwaway PostgreSQL cluster: `initdb` into a temporary directory, `postgres` on a free
//! loopback port, run as an unprivileged user when the tests run as root.

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::fs::chown;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::ports;
use crate::tempdir::TempDir;

/// The environment variable naming the directory of PostgreSQL's server binaries (`initdb`,
/// `postgres`, `psql`), instead of the one found by [`require_postgres`].
pub const PG_BINDIR_ENV: &str = "FAIRLOCK_PG_BINDIR";

/// How long a server may take to accept connections after it was spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How many ports a start tries when it keeps losing port races.
const PORT_ATTEMPTS: usize = 20;
/// How long a shutdown may take before the server's process group is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Once the test process (`$1`) is gone, kills the server's process group (`$2`) and removes
/// its directory (`$3`); exits as soon as the server is gone.
const WATCHDOG: &str = "while kill -0 \"$1\" 2>/dev/null; do \
     kill -0 \"$2\" 2>/dev/null || exit 0; sleep 1; done; \
     kill -s QUIT \"$2\" 2>/dev/null; sleep 1; \
     kill -s KILL -- \"-$2\" 2>/dev/null; kill -s KILL \"$2\" 2>/dev/null; \
     sleep 0.2; rm -rf -- \"$3\"";

/// The directory of PostgreSQL's server binaries: `$FAIRLOCK_PG_BINDIR`, else the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian's layout), else `pg_config --bindir`.
///
/// A PostgreSQL test that cannot find PostgreSQL must fail loudly rather than pass by
/// skipping; [`PostgresServer::start`] calls this first. The check runs once per process.
///
/// # Panics
///
/// When no directory with `initdb`, `postgres` and `psql` is found, with install
/// instructions.
pub fn require_postgres() -> PathBuf {
    static CHECK: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let check = CHECK.get_or_init(|| {
        let complete = |dir: &Path| {
            ["initdb", "postgres", "psql"]
                .iter()
                .all(|program| dir.join(program).is_file())
        };
        if let Some(dir) = std::env::var_os(PG_BINDIR_ENV).filter(|dir| !dir.is_empty()) {
            let dir = PathBuf::from(dir);
            return if complete(&dir) {
                Ok(dir)
            } else {
                Err(format!(
                    "{PG_BINDIR_ENV}={} has no initdb, postgres and psql",
                    dir.display()
                ))
            };
        }
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let version = entry.file_name().to_str()?.parse().ok()?;
                Some((version, entry.path().join("bin")))
            })
            .filter(|(_, dir)| complete(dir))
            .collect();
        versions.sort();
        if let Some((_, dir)) = versions.pop() {
            return Ok(dir);
        }
        let output = Command::new("pg_config")
            .arg("--bindir")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output();
        if let Ok(output) = output {
            let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
            if output.status.success() && complete(&dir) {
                return Ok(dir);
            }
        }
        Err(
            "no initdb, postgres and psql found in /usr/lib/postgresql/*/bin or pg_config --bindir"
                .to_owned(),
        )
    });
    match check {
        Ok(dir) => dir.clone(),
        Err(reason) => panic!(
            "this test needs a real PostgreSQL server, and a skipped PostgreSQL test counts as \
             a failure: {reason}. Install it with `apt-get install -y postgresql` (as root), \
             run `./scripts/install-deps.sh`, or set {PG_BINDIR_ENV} to the directory of \
             initdb and postgres."
        ),
    }
}

/// The user and group the server runs as: `nobody` when we are root (PostgreSQL refuses to
/// run as root), else ourselves (`None`).
fn server_user() -> io::Result<Option<(u32, u32)>> {
    let id = |flag: &str, user: Option<&str>| -> io::Result<u32> {
        let output = Command::new("id")
            .arg(flag)
            .args(user)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()?;
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .map_err(|_| io::Error::other(format!("`id {flag}` printed no number")))
    };
    if id("-u", None)? != 0 {
        return Ok(None);
    }
    Ok(Some((id("-u", Some("nobody"))?, id("-g", Some("nobody"))?)))
}

/// A PostgreSQL cluster on a free port of 127.0.0.1, in its own temporary directory (data,
/// unix socket, log), stopped when dropped.
///
/// Made with `initdb -U postgres -A trust`, and run with `listen_addresses=127.0.0.1`,
/// `fsync=off` (a throwaway cluster), its unix socket in its directory, `max_connections=300`.
/// When the tests run as root, both run as `nobody`, who owns the directory.
#[derive(Debug)]
pub struct PostgresServer {
    bindir: PathBuf,
    port: u16,
    user: Option<(u32, u32)>,
    running: Option<Running>,
    dir: TempDir,
}

#[derive(Debug)]
struct Running {
    child: Child,
    watchdog: Option<Child>,
}

impl Running {
    /// Asks the postmaster to shut down with `signal` (`INT`: fast, `QUIT`: immediate), waits
    /// for it, and kills its process group if it takes too long; reaps both processes.
    fn stop(mut self, signal: &str) {
        let pid = self.child.id().to_string();
        let _ = signal_pid(signal, &pid);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = signal_pid("KILL", &format!("-{pid}"));
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = signal_pid("KILL", &format!("-{}", watchdog.id()));
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal_pid(signal: &str, target: &str) -> io::Result<()> {
    Command::new("kill")
        .args(["-s", signal, "--", target])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(drop)
}

impl PostgresServer {
    /// Makes a new cluster, starts it on a free port and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// When PostgreSQL is not installed (see [`require_postgres`]).
    pub fn start() -> io::Result<PostgresServer> {
        let bindir = require_postgres();
        let user = server_user()?;
        let dir = TempDir::new("testsupport-postgres")?;
        if let Some((uid, gid)) = user {
            chown(dir.path(), Some(uid), Some(gid))?;
        }
        let mut server = PostgresServer {
            bindir,
            port: 0,
            user,
            running: None,
            dir,
        };
        server.initdb()?;
        let mut last_error = None;
        for _ in 0..PORT_ATTEMPTS {
            server.port = ports::reserve_free(false)?;
            match server.launch() {
                Ok(running) => {
                    server.running = Some(running);
                    return Ok(server);
                }
                Err(error) => {
                    ports::release(server.port, false);
                    if !server.log().contains("could not bind") {
                        return Err(error);
                    }
                    last_error = Some(error);
                }
            }
        }
        Err(last_error
            .unwrap_or_else(|| io::Error::new(io::ErrorKind::AddrInUse, "no port available")))
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bindir.join(program));
        command.current_dir(self.dir.path()).stdin(Stdio::null());
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        command
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    fn initdb(&self) -> io::Result<()> {
        let output = self
            .command("initdb")
            .arg("-D")
            .arg(self.data())
            .args(["-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"])
            .args(["--locale=C", "--no-instructions"])
            .output()?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "initdb failed ({}): {}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(())
    }

    fn launch(&self) -> io::Result<Running> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        if let Some((uid, gid)) = self.user {
            chown(self.log_path(), Some(uid), Some(gid))?;
        }
        let mut child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data())
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=300", "-c", "shared_buffers=32MB"])
            .args(["-c", "dynamic_shared_memory_type=mmap"])
            .args(["-c", "log_min_messages=warning"])
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()?;
        let watchdog = Command::new("sh")
            .args(["-c", WATCHDOG, "fairlock-pg-watchdog"])
            .arg(std::process::id().to_string())
            .arg(child.id().to_string())
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .ok();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let running = Running { child, watchdog };
                running.stop("KILL");
                return Err(io::Error::other(format!(
                    "postgres exited ({status}): {}",
                    self.log()
                )));
            }
            if self.is_ready() {
                return Ok(Running { child, watchdog });
            }
            if Instant::now() > deadline {
                Running { child, watchdog }.stop("QUIT");
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "postgres not ready within {READY_TIMEOUT:?}: {}",
                        self.log()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Whether the postmaster says it is ready and its port accepts connections.
    fn is_ready(&self) -> bool {
        let status =
            std::fs::read_to_string(self.data().join("postmaster.pid")).unwrap_or_default();
        status
            .lines()
            .nth(7)
            .is_some_and(|line| line.trim() == "ready")
            && TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_ok()
    }

    /// The TCP port it listens on (kept across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`: the superuser, no password.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The postmaster's process id, or `None` while stopped.
    pub fn pid(&self) -> Option<u32> {
        self.running.as_ref().map(|running| running.child.id())
    }

    /// The server's log so far (empty if none could be read), for diagnostics.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Runs `sql` with `psql` as the superuser and returns its output, unaligned and without
    /// headers (`psql -XAtq`).
    ///
    /// # Errors
    /// When `psql` fails; the error carries its output.
    pub fn psql(&self, sql: &str) -> io::Result<String> {
        let output = Command::new(self.bindir.join("psql"))
            .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "postgres"])
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-c")
            .arg(sql)
            .stdin(Stdio::null())
            .output()?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "psql {sql:?} failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// Shuts the server down at once (immediate shutdown: connections drop, nothing is
    /// checkpointed; the next start recovers from the WAL). Does nothing if stopped.
    pub fn stop(&mut self) {
        if let Some(running) = self.running.take() {
            running.stop("QUIT");
        }
    }

    /// Stops the server (immediately, as [`stop`](Self::stop)) if it runs, and starts it
    /// again on the same port with the same data; waits until it accepts connections.
    /// Committed data survives (crash recovery).
    ///
    /// # Errors
    /// When it does not come back (e.g. another process took the port meanwhile).
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.launch() {
                Ok(running) => {
                    self.running = Some(running);
                    return Ok(());
                }
                Err(error)
                    if Instant::now() < deadline && self.log().contains("could not bind") =>
                {
                    let _ = error;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(error) => return Err(error),
            }
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
        if self.port != 0 {
            ports::release(self.port, false);
        }
    }
}

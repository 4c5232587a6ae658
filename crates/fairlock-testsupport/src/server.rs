//! One `redis-server` child process.

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ports;
use crate::resp::{self, Reply};
use crate::tempdir::TempDir;

/// How long a server may take to answer after it was spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How many ports a start tries when it keeps losing port races.
const PORT_ATTEMPTS: usize = 20;
/// How long a restart keeps retrying its own port while something else holds it.
const RESTART_PORT_WAIT: Duration = Duration::from_secs(5);

/// Once the test process (`$1`) is gone, kills the server's process group (`$2`) and removes
/// its directory (`$3`); exits as soon as the server is gone.
const WATCHDOG: &str = "while kill -0 \"$1\" 2>/dev/null; do \
     kill -0 \"$2\" 2>/dev/null || exit 0; sleep 1; done; \
     kill -s KILL -- \"-$2\" 2>/dev/null; kill -s KILL \"$2\" 2>/dev/null; \
     sleep 0.2; rm -rf -- \"$3\"";

/// A `redis-server` on a free port of 127.0.0.1, with its own temporary directory, killed and
/// reaped (with its process group) when dropped.
///
/// Started with `--bind 127.0.0.1 --protected-mode yes --save '' --appendonly no
/// --enable-debug-command yes` (so `DEBUG SLEEP` works; Redis before 7 has no such option and
/// always allows `DEBUG`), its log in `redis.log` of its directory. Extra arguments from
/// [`start_with`](Self::start_with) come last and win.
///
/// It runs the `redis-server` on `PATH`, or another binary given to
/// [`start_binary`](Self::start_binary) (e.g. [`redis62_server`](crate::redis62_server)).
#[derive(Debug)]
pub struct RedisServer {
    program: Program,
    port: u16,
    extra: Vec<String>,
    cluster: bool,
    /// `sentinel …` configuration lines when this is a Sentinel (`--sentinel`).
    sentinel: Option<Vec<String>>,
    password: Option<String>,
    running: Option<Running>,
    dir: TempDir,
}

/// Which `redis-server` binary to run, and its version.
#[derive(Debug, Clone)]
pub(crate) struct Program {
    path: PathBuf,
    /// The major version (`--enable-debug-command` exists from 7 on).
    major: u32,
}

impl Program {
    /// The `redis-server` on `PATH`.
    pub(crate) fn default_server() -> Program {
        crate::require_redis();
        Program {
            path: PathBuf::from("redis-server"),
            major: 7,
        }
    }

    /// `path`, whose version `--version` tells.
    pub(crate) fn at(path: &Path) -> io::Result<Program> {
        let version = crate::server_version(path)?;
        let major = version
            .split('.')
            .next()
            .and_then(|major| major.parse().ok())
            .ok_or_else(|| {
                io::Error::other(format!(
                    "{}: cannot read the version {version:?}",
                    path.display()
                ))
            })?;
        Ok(Program {
            path: path.to_owned(),
            major,
        })
    }
}

#[derive(Debug)]
struct Running {
    child: Child,
    watchdog: Option<Child>,
}

impl Running {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILLs the watchdog and the server, each with its process group, and reaps both.
    fn kill(mut self) {
        let mut groups = Vec::new();
        if let Some(watchdog) = &self.watchdog {
            groups.push(format!("-{}", watchdog.id()));
        }
        groups.push(format!("-{}", self.child.id()));
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--"])
            .args(&groups)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Why one launch failed.
enum LaunchError {
    /// The port (or the cluster bus port) was taken: try again.
    AddrInUse(io::Error),
    Other(io::Error),
}

impl RedisServer {
    /// Starts a server with the default options on a free port and waits until it answers.
    ///
    /// # Panics
    ///
    /// When Redis is not installed (see [`require_redis`](crate::require_redis)).
    pub fn start() -> io::Result<RedisServer> {
        Self::start_with(&[])
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments appended, e.g.
    /// `&["--requirepass", "secret"]`. A `--requirepass` given here is used by
    /// [`cli`](Self::cli) and by the readiness probe.
    ///
    /// # Panics
    ///
    /// When Redis is not installed (see [`require_redis`](crate::require_redis)).
    pub fn start_with(args: &[&str]) -> io::Result<RedisServer> {
        Self::start_inner(
            Program::default_server(),
            args.iter().map(|a| (*a).to_owned()).collect(),
            false,
        )
    }

    /// Starts a Redis Sentinel (`redis-server <config> --sentinel`) on a free port, whose
    /// configuration file holds `lines` (e.g. `sentinel monitor …`). Sentinel rewrites that
    /// file as it learns the setup; it lives in the server's directory.
    ///
    /// # Panics
    ///
    /// When Redis is not installed (see [`require_redis`](crate::require_redis)).
    pub fn start_sentinel(lines: &[String]) -> io::Result<RedisServer> {
        Self::start_full(
            Program::default_server(),
            Vec::new(),
            false,
            Some(lines.to_vec()),
        )
    }

    /// Like [`start_with`](Self::start_with), running the `redis-server` binary at `binary`
    /// (e.g. [`redis62_server`](crate::redis62_server)) instead of the one on `PATH`.
    /// [`cli`](Self::cli) still uses the `redis-cli` on `PATH`.
    pub fn start_binary(binary: impl AsRef<Path>, args: &[&str]) -> io::Result<RedisServer> {
        crate::require_redis();
        Self::start_inner(
            Program::at(binary.as_ref())?,
            args.iter().map(|a| (*a).to_owned()).collect(),
            false,
        )
    }

    /// Starts a server of `program`, as a cluster node (bus port = port + 10000) when
    /// `cluster`.
    pub(crate) fn start_inner(
        program: Program,
        extra: Vec<String>,
        cluster: bool,
    ) -> io::Result<RedisServer> {
        Self::start_full(program, extra, cluster, None)
    }

    fn start_full(
        program: Program,
        extra: Vec<String>,
        cluster: bool,
        sentinel: Option<Vec<String>>,
    ) -> io::Result<RedisServer> {
        let password = password_of(&extra);
        let mut dir = TempDir::new("testsupport-redis")?;
        let mut last_error = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = ports::reserve_free(cluster)?;
            let mut server = RedisServer {
                program: program.clone(),
                port,
                extra: extra.clone(),
                cluster,
                sentinel: sentinel.clone(),
                password: password.clone(),
                running: None,
                dir,
            };
            match server.launch() {
                Ok(running) => {
                    server.running = Some(running);
                    return Ok(server);
                }
                Err(LaunchError::AddrInUse(err)) => {
                    last_error = Some(err);
                    // Dropping `server` releases the port; reuse its directory.
                    dir = server.take_dir()?;
                }
                Err(LaunchError::Other(err)) => return Err(err),
            }
        }
        Err(last_error
            .unwrap_or_else(|| io::Error::new(io::ErrorKind::AddrInUse, "no port available")))
    }

    /// Swaps in a fresh directory for this (about to be dropped) server, returning its own.
    fn take_dir(&mut self) -> io::Result<TempDir> {
        let fresh = TempDir::new("testsupport-redis")?;
        Ok(std::mem::replace(&mut self.dir, fresh))
    }

    /// The TCP port it listens on (kept across [`stop`](Self::stop) and
    /// [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:port` (without the password, if one was set).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The password given with `--requirepass`, if any.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The process id of the running `redis-server`, or `None` after [`stop`](Self::stop).
    pub fn pid(&self) -> Option<u32> {
        self.running.as_ref().map(Running::pid)
    }

    /// Whether a process was started and not stopped since (it may still be paused).
    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// The server's working directory (its `--dir`), removed when the server is dropped.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    /// The server's log so far (empty if none could be read), for diagnostics.
    pub fn log(&self) -> String {
        read_logs(&self.dir)
    }

    /// Kills the server (SIGKILL, no shutdown save) and reaps it. Its port number stays, so a
    /// test can check that nothing answers there. Does nothing if already stopped.
    pub fn stop(&mut self) {
        if let Some(running) = self.running.take() {
            running.kill();
        }
    }

    /// Kills the server and starts a new one on the same port with the same arguments and
    /// directory, then waits until it answers. All data is lost (nothing is persisted), but a
    /// cluster node keeps its `nodes.conf`, so it comes back as the same node with its slots.
    ///
    /// If another process grabbed the port meanwhile, it retries for a few seconds and then
    /// fails, leaving the server stopped.
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop();
        let deadline = Instant::now() + RESTART_PORT_WAIT;
        loop {
            match self.launch() {
                Ok(running) => {
                    self.running = Some(running);
                    return Ok(());
                }
                Err(LaunchError::AddrInUse(err)) => {
                    if Instant::now() >= deadline {
                        return Err(err);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(LaunchError::Other(err)) => return Err(err),
            }
        }
    }

    /// Like [`restart`](Self::restart), but the server comes back as a replica of the server on
    /// `primary_port` (and stays one across later restarts), so it never answers as an empty
    /// primary in between: how a primary that lost a failover rejoins.
    pub fn restart_as_replica_of(&mut self, primary_port: u16) -> io::Result<()> {
        if let Some(at) = self
            .extra
            .iter()
            .position(|arg| arg.eq_ignore_ascii_case("--replicaof"))
        {
            self.extra.drain(at..(at + 3).min(self.extra.len()));
        }
        self.extra.extend([
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            primary_port.to_string(),
        ]);
        self.restart()
    }

    /// Freezes the server with SIGSTOP: connections stay open but nothing is answered, as with
    /// a hung host. Undo with [`resume_process`](Self::resume_process); dropping also works.
    pub fn pause_process(&self) -> io::Result<()> {
        self.signal("STOP")
    }

    /// Lets a server frozen by [`pause_process`](Self::pause_process) run again (SIGCONT).
    pub fn resume_process(&self) -> io::Result<()> {
        self.signal("CONT")
    }

    fn signal(&self, signal: &str) -> io::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "server is stopped"))?;
        let status = Command::new("kill")
            .args(["-s", signal, &pid.to_string()])
            .stdin(Stdio::null())
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "kill -s {signal} {pid}: {status}"
            )))
        }
    }

    /// Runs `redis-cli -h 127.0.0.1 -p PORT [-a PASSWORD] ARGS...` and returns its standard
    /// output, trimmed. Replies are printed raw (no tty), e.g. `PONG`, `OK`, or an empty string
    /// for nil. Fails if `redis-cli` exits unsuccessfully (e.g. nothing listens).
    pub fn cli(&self, args: &[&str]) -> io::Result<String> {
        run_cli(self.port, self.password.as_deref(), args)
    }

    /// Sends one command over a raw connection (internal: probes and cluster setup).
    pub(crate) fn request(&self, args: &[&str], timeout: Duration) -> io::Result<Reply> {
        resp::request(self.port, self.password.as_deref(), args, timeout)
    }

    /// Sends many commands at once over a raw connection and reads their replies (internal:
    /// cluster setup).
    pub(crate) fn pipeline(
        &self,
        commands: &[Vec<&str>],
        timeout: Duration,
    ) -> io::Result<Vec<Reply>> {
        resp::pipeline(self.port, self.password.as_deref(), commands, timeout)
    }

    /// Spawns `redis-server` on `self.port` and waits until it answers.
    fn launch(&self) -> Result<Running, LaunchError> {
        let dir = self.dir.path();
        for name in ["redis.log", "stderr.log"] {
            let _ = std::fs::remove_file(dir.join(name));
        }
        let mut command = Command::new(&self.program.path);
        if let Some(lines) = &self.sentinel {
            // Sentinel needs a configuration file it can rewrite, named first.
            let config = dir.join("sentinel.conf");
            std::fs::write(&config, lines.join("\n") + "\n").map_err(LaunchError::Other)?;
            command.arg(&config).arg("--sentinel");
        }
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--daemonize", "no", "--protected-mode", "yes"]);
        if self.sentinel.is_none() {
            command.args(["--save", "", "--appendonly", "no"]);
            if self.program.major >= 7 {
                command.args(["--enable-debug-command", "yes"]);
            }
        }
        command
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"));
        if self.cluster {
            command
                .args(["--cluster-enabled", "yes", "--cluster-config-file"])
                .arg(dir.join("nodes.conf"))
                .args(["--cluster-node-timeout", "2000"])
                .args(["--cluster-announce-ip", "127.0.0.1"]);
        }
        let stderr = File::create(dir.join("stderr.log")).map_err(LaunchError::Other)?;
        command
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .process_group(0);
        let child = command.spawn().map_err(|err| {
            LaunchError::Other(io::Error::new(
                err.kind(),
                format!("could not run {}: {err}", self.program.path.display()),
            ))
        })?;
        let watchdog = Command::new("sh")
            .args(["-c", WATCHDOG, "fairlock-redis-watchdog"])
            .arg(std::process::id().to_string())
            .arg(child.id().to_string())
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .ok();
        let mut running = Running { child, watchdog };
        match self.wait_ready(&mut running) {
            Ok(()) => Ok(running),
            Err(err) => {
                running.kill();
                Err(err)
            }
        }
    }

    fn wait_ready(&self, running: &mut Running) -> Result<(), LaunchError> {
        let started = Instant::now();
        let pid = running.pid();
        loop {
            if let Some(status) = running.child.try_wait().map_err(LaunchError::Other)? {
                let log = read_logs(&self.dir);
                let message = format!(
                    "redis-server on port {} exited during startup ({status}); its log:\n{log}",
                    self.port
                );
                return Err(if log.contains("Address already in use") {
                    LaunchError::AddrInUse(io::Error::new(io::ErrorKind::AddrInUse, message))
                } else {
                    LaunchError::Other(io::Error::other(message))
                });
            }
            if self.answers_as(pid) {
                return Ok(());
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(LaunchError::Other(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "redis-server on port {} did not answer within {READY_TIMEOUT:?}; its \
                         log:\n{}",
                        self.port,
                        read_logs(&self.dir)
                    ),
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether our process (not some other one that took the port) answers PING.
    fn answers_as(&self, pid: u32) -> bool {
        let timeout = Duration::from_millis(500);
        match self.request(&["PING"], timeout) {
            Ok(Reply::Simple(pong)) if pong == "PONG" => {}
            _ => return false,
        }
        match self.request(&["INFO", "server"], timeout) {
            Ok(Reply::Bulk(Some(info))) => String::from_utf8_lossy(&info)
                .lines()
                .any(|line| line.trim() == format!("process_id:{pid}")),
            _ => false,
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        ports::release(self.port, self.cluster);
    }
}

/// The value of the last `--requirepass` in `args`.
fn password_of(args: &[String]) -> Option<String> {
    args.windows(2)
        .rev()
        .find(|pair| pair[0].eq_ignore_ascii_case("--requirepass"))
        .map(|pair| pair[1].clone())
        .filter(|password| !password.is_empty())
}

/// The server's log file and anything it wrote to stderr before opening it.
fn read_logs(dir: &TempDir) -> String {
    let mut text = String::new();
    for name in ["stderr.log", "redis.log"] {
        if let Ok(content) = std::fs::read_to_string(dir.path().join(name)) {
            text.push_str(&content);
        }
    }
    text
}

/// `redis-cli` against `127.0.0.1:port`, stdout trimmed.
pub(crate) fn run_cli(port: u16, password: Option<&str>, args: &[&str]) -> io::Result<String> {
    let mut command = Command::new("redis-cli");
    command.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(password) = password {
        command.args(["-a", password, "--no-auth-warning"]);
    }
    let output = command.args(args).stdin(Stdio::null()).output()?;
    if !output.status.success() {
        return Err(io::Error::other(format!(
            "redis-cli -p {port} {args:?} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim(),
            String::from_utf8_lossy(&output.stdout).trim(),
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

//! Spawning `contender` processes and reading their events, for the multi-process tests.
//!
//! Each [`Contender`] runs in a process group of its own (so that `faketime`, which forks the
//! real program, is killed with it) and is SIGKILLed and reaped when dropped, also while a test
//! panics. Its standard input stays open for as long as the handle lives: the contender exits
//! by itself once it closes, so none outlives a test process that was killed outright.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::protocol::{epoch_ns, Event};

/// How to run one contender. Unset durations keep fairlock's defaults.
#[derive(Clone, Debug, Default)]
pub struct Spec {
    /// The store's URL (a loopback test server): Redis, or `postgres://` for PostgreSQL.
    pub url: String,
    /// The lock name.
    pub name: String,
    /// `Some(k)`: k acquisitions incrementing `counter`; `None`: one hold.
    pub loop_count: Option<u64>,
    /// The counter key of loop mode.
    pub counter: Option<String>,
    /// A fixed lease instead of the watchdog.
    pub lease: Option<Duration>,
    /// The watchdog's lease.
    pub watchdog_lease: Option<Duration>,
    /// The waiter liveness TTL.
    pub waiter_ttl: Option<Duration>,
    /// In hold mode: release after this long, instead of on [`Contender::release`].
    pub hold: Option<Duration>,
    /// Run under `faketime`, with the wall clock off by this many seconds (ahead if
    /// positive).
    pub clock_offset_secs: Option<i64>,
}

impl Spec {
    /// A contender for lock `name` on `url`, with every other setting at its default.
    pub fn on(url: impl Into<String>, name: &str) -> Spec {
        Spec {
            url: url.into(),
            name: name.into(),
            ..Spec::default()
        }
    }
}

/// One event and when this process read it.
#[derive(Clone, Debug)]
pub struct Line {
    /// When the test process read the line (after the contender printed it).
    pub at: Instant,
    /// What the contender reported.
    pub event: Event,
}

/// A running contender process; killed and reaped on drop.
#[derive(Debug)]
pub struct Contender {
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<Line>,
    stderr: Arc<Mutex<String>>,
    history: Vec<Line>,
    clock_offset_ns: i128,
    /// Started under the `faketime` wrapper, which is then the child.
    under_faketime: bool,
    /// When [`kill`](Contender::kill) had reaped it (real wall clock, ns).
    killed_ns: Option<u128>,
    reaped: bool,
}

/// Panics unless `faketime` can be run: a clock-skew test that cannot skew a clock must fail,
/// not pass by skipping.
pub fn require_faketime() {
    match Command::new("faketime")
        .args(["-f", "+1h", "true"])
        .stdin(Stdio::null())
        .output()
    {
        Ok(output) if output.status.success() => {}
        Ok(output) => panic!(
            "`faketime -f +1h true` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(error) => panic!(
            "this test needs `faketime` (Debian package `faketime`) on PATH ({error}), and a \
             skipped test counts as a failure: install it with `apt-get install -y faketime` \
             (as root), or run `./scripts/test.sh`, which installs what is missing"
        ),
    }
}

/// The shared-memory files the `faketime` wrapper with process id `pid` makes at its start and
/// removes when it exits. A wrapper killed with SIGKILL leaves them behind, and a later
/// wrapper given the same process id (ids wrap at 32,768 here) then fails to start.
pub fn faketime_files(pid: u32) -> [PathBuf; 2] {
    [
        PathBuf::from(format!("/dev/shm/faketime_shm_{pid}")),
        PathBuf::from(format!("/dev/shm/sem.faketime_sem_{pid}")),
    ]
}

impl Contender {
    /// Starts a contender; `label` names it in failure messages. `program` is the binary,
    /// `env!("CARGO_BIN_EXE_contender")` in a test (Cargo sets that for tests only).
    ///
    /// # Panics
    /// If the process cannot be started.
    pub fn spawn(program: &str, label: impl Into<String>, spec: &Spec) -> Contender {
        let label = label.into();
        let program = Path::new(program);
        let mut command = match spec.clock_offset_secs {
            Some(offset) => {
                let mut command = Command::new("faketime");
                command.args(["-f", &format!("{offset:+}")]).arg(program);
                // Only the wall clock is skewed, as on a machine whose clock is off. Monotonic
                // clocks have no common origin to be wrong about, and shifting one back by an
                // hour on a host booted less than an hour ago would make it negative.
                command.env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
                command
            }
            None => Command::new(program),
        };
        command.args(["--url", &spec.url, "--name", &spec.name]);
        if let Some(count) = spec.loop_count {
            command.args(["--mode", "loop", "--count", &count.to_string()]);
        }
        if let Some(counter) = &spec.counter {
            command.args(["--counter", counter]);
        }
        let millis = [
            ("--lease-ms", spec.lease),
            ("--watchdog-ms", spec.watchdog_lease),
            ("--ttl-ms", spec.waiter_ttl),
            ("--hold-ms", spec.hold),
        ];
        for (flag, value) in millis {
            if let Some(value) = value {
                command.args([flag, &value.as_millis().to_string()]);
            }
        }
        let mut child = command
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{label}: cannot start {}: {e}", program.display()));

        let (send, lines) = mpsc::unbounded_channel();
        let stdout = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for text in BufReader::new(stdout).lines() {
                let Ok(text) = text else { break };
                let at = Instant::now();
                let event = Event::parse(&text)
                    .unwrap_or_else(|| Event::Fail(format!("unparsable line {text:?}")));
                if send.send(Line { at, event }).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let pipe = child.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            for text in BufReader::new(pipe).lines() {
                let Ok(text) = text else { break };
                let mut sink = sink.lock().unwrap_or_else(|e| e.into_inner());
                sink.push_str(&text);
                sink.push('\n');
            }
        });
        Contender {
            label,
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
            history: Vec::new(),
            clock_offset_ns: i128::from(spec.clock_offset_secs.unwrap_or(0)) * 1_000_000_000,
            under_faketime: spec.clock_offset_secs.is_some(),
            killed_ns: None,
            reaped: false,
        }
    }

    /// Its process id (of the `faketime` wrapper, when its clock is skewed).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Every event read so far, in order.
    pub fn history(&self) -> &[Line] {
        &self.history
    }

    /// Waits until `deadline` for the next event that `want` picks, and returns it; events
    /// passed over stay in [`history`](Self::history).
    ///
    /// # Panics
    /// At the deadline, on a `FAIL` line, or if the process ends first.
    pub async fn wait_for(
        &mut self,
        what: &str,
        deadline: Instant,
        want: impl Fn(&Event) -> bool,
    ) -> Line {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match tokio::time::timeout(left, self.lines.recv()).await {
                Ok(Some(line)) => line,
                Ok(None) => self.fail(&format!("exited while waiting for {what}")),
                Err(_) => self.fail(&format!("no {what} by the deadline")),
            };
            self.history.push(line.clone());
            if let Event::Fail(message) = &line.event {
                self.fail(&format!("reported FAIL {message} while waiting for {what}"));
            }
            if want(&line.event) {
                return line;
            }
        }
    }

    /// Waits for `READY` and returns the owner id it locks as.
    pub async fn ready(&mut self, deadline: Instant) -> String {
        let line = self
            .wait_for("READY", deadline, |e| matches!(e, Event::Ready { .. }))
            .await;
        match line.event {
            Event::Ready { owner, .. } => owner,
            _ => unreachable!("wait_for returned another event"),
        }
    }

    /// Waits for the `ACQ` of acquisition `seq`.
    pub async fn acquired(&mut self, seq: u64, deadline: Instant) -> Line {
        self.wait_for(
            &format!("ACQ {seq}"),
            deadline,
            |e| matches!(e, Event::Acq { seq: s, .. } if *s == seq),
        )
        .await
    }

    /// Waits for `DONE` (everything acquired and released).
    pub async fn done(&mut self, deadline: Instant) -> Line {
        self.wait_for("DONE", deadline, |e| matches!(e, Event::Done))
            .await
    }

    /// Its holds so far, `[ACQ, REL]` with times converted to the real wall clock (its
    /// `faketime` offset taken off), in the order it made them. A hold it never released ends
    /// when [`kill`](Self::kill) had reaped it (a dead process runs no critical section), or
    /// at `u128::MAX` while it lives.
    pub fn holds(&mut self) -> Vec<Hold> {
        self.drain();
        let real = |fake: u128| {
            u128::try_from(i128::try_from(fake).expect("epoch fits") - self.clock_offset_ns)
                .expect("after 1970")
        };
        let mut holds: Vec<Hold> = Vec::new();
        for line in &self.history {
            match line.event {
                Event::Acq {
                    seq,
                    token,
                    epoch_ns,
                } => holds.push(Hold {
                    who: self.label.clone(),
                    seq,
                    token,
                    start_ns: real(epoch_ns),
                    end_ns: self.killed_ns.unwrap_or(u128::MAX),
                }),
                Event::Rel { seq, epoch_ns } => {
                    let hold = holds.iter_mut().rev().find(|h| h.seq == seq);
                    let hold =
                        hold.unwrap_or_else(|| panic!("{}: REL {seq} without ACQ", self.label));
                    hold.end_ns = real(epoch_ns);
                }
                _ => {}
            }
        }
        holds
    }

    /// Events that arrived without waiting, added to the history; returns the history.
    pub fn drain(&mut self) -> &[Line] {
        while let Ok(line) = self.lines.try_recv() {
            self.history.push(line);
        }
        &self.history
    }

    /// Tells a hold-mode contender to release.
    pub fn release(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin is open until drop");
        if let Err(e) = stdin.write_all(b"release\n").and_then(|()| stdin.flush()) {
            let message = format!("cannot tell it to release: {e}");
            self.fail(&message);
        }
    }

    /// SIGKILLs the process (and its group) and reaps it; returns when the kill was sent.
    pub fn kill(&mut self) -> Instant {
        let at = Instant::now();
        self.kill_and_reap();
        self.killed_ns = Some(epoch_ns());
        at
    }

    fn kill_and_reap(&mut self) {
        if self.reaped {
            return;
        }
        self.reaped = true;
        // The whole group: under faketime the contender is a child of the faketime process.
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", self.child.id())])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        if self.under_faketime {
            // The wrapper died without removing its files. Removed before it is reaped, while
            // its process id cannot be given to another wrapper yet.
            for file in faketime_files(self.child.id()) {
                let _ = std::fs::remove_file(file);
            }
        }
        let _ = self.child.wait();
    }

    fn fail(&mut self, message: &str) -> ! {
        self.drain();
        let events: Vec<String> = self.history.iter().map(|l| l.event.to_string()).collect();
        let stderr = self
            .stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        panic!(
            "contender {}: {message}\nevents: {events:?}\nstderr:\n{stderr}",
            self.label
        );
    }
}

impl Drop for Contender {
    fn drop(&mut self) {
        self.kill_and_reap();
    }
}

/// One hold a contender reported, on the real wall clock (shared by all processes of this
/// machine, so holds of different processes can be compared).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// The contender's label.
    pub who: String,
    /// Its acquisition number.
    pub seq: u64,
    /// Its fencing token.
    pub token: u64,
    /// When `lock()` had returned, ns since the epoch.
    pub start_ns: u128,
    /// When the release was about to be sent, ns since the epoch.
    pub end_ns: u128,
}

/// Sorts `holds` by start and checks that none overlaps the next and that fencing tokens
/// strictly increase in that order; returns them sorted.
///
/// The recorded `[ACQ, REL]` lies inside the hold the store granted, so an overlap here
/// means two processes ran their critical sections at once.
///
/// # Panics
/// On an overlap or a token that does not increase.
pub fn assert_exclusive(mut holds: Vec<Hold>) -> Vec<Hold> {
    holds.sort_by_key(|hold| hold.start_ns);
    crate::holds::check_exclusive(&holds, |hold| (hold.start_ns, hold.end_ns, hold.token));
    holds
}

//! Black-box tests: the built `fairlock` binary against a real `redis-server` on 127.0.0.1.

mod common;

use std::time::{Duration, Instant};

use common::{alive, status_of_unreachable, text, wait_until, World, LEASE_LOST, TEMPFAIL, USAGE};

const LIMIT: Duration = Duration::from_secs(10);

#[test]
fn the_commands_exit_code_passes_through() {
    let world = World::new();
    let output = world.run(&["exec", "job", "--", "sh", "-c", "exit 7"]);
    assert_eq!(output.status.code(), Some(7), "{}", text(&output.stderr));
    let output = world.run(&["exec", "job", "--", "sh", "-c", "exit 0"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    // Killed by a signal: 128 + N, as a shell reports it.
    let output = world.run(&["exec", "job", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(
        output.status.code(),
        Some(128 + 9),
        "{}",
        text(&output.stderr)
    );
    let output = world.run(&["exec", "job", "--", "no-such-command-fairlock"]);
    assert_eq!(output.status.code(), Some(127));
    assert_eq!(
        text(&output.stderr).lines().count(),
        1,
        "{}",
        text(&output.stderr)
    );
    // Whatever happened, the lock was released each time.
    assert_eq!(world.status("job")["held"], false);
}

#[test]
fn the_command_sees_the_lock_name_and_a_growing_fencing_token() {
    let world = World::new();
    let token_of_a_run = || {
        let output = world.run(&[
            "exec",
            "reports",
            "--",
            "sh",
            "-c",
            "echo \"$FAIRLOCK_NAME $FAIRLOCK_TOKEN\"",
        ]);
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        let stdout = text(&output.stdout);
        let (name, token) = stdout.trim().split_once(' ').unwrap();
        assert_eq!(name, "reports");
        token.parse::<u64>().unwrap()
    };
    let first = token_of_a_run();
    let second = token_of_a_run();
    assert!(first > 0 && second > first, "{first} then {second}");
}

#[test]
fn concurrent_execs_run_one_at_a_time_in_the_order_they_queued() {
    let world = World::new();
    let gate = world.hold_until_gate("fifo", &[]);
    let script =
        "echo \"start $0 $(date +%s%N)\" >> log; sleep 0.1; echo \"end $0 $(date +%s%N)\" >> log";
    let mut waiters = Vec::new();
    for index in 1..=4 {
        let label = index.to_string();
        waiters.push(world.spawn(&["exec", "fifo", "--", "sh", "-c", script, &label]));
        // Queue them in a known order: each starts only after the previous one is queued.
        world.wait_for_waiters("fifo", index);
    }
    world.open_gate("fifo");
    assert_eq!(gate.wait(LIMIT), 0);
    for waiter in waiters {
        assert_eq!(waiter.wait(LIMIT), 0);
    }

    let log = world.read("log");
    let lines: Vec<(&str, &str, u128)> = log
        .lines()
        .map(|line| {
            let mut parts = line.split(' ');
            let (what, who, at) = (
                parts.next().unwrap(),
                parts.next().unwrap(),
                parts.next().unwrap(),
            );
            (what, who, at.parse().unwrap())
        })
        .collect();
    let expected: Vec<(&str, String)> = (1..=4)
        .flat_map(|index| [("start", index.to_string()), ("end", index.to_string())])
        .collect();
    let seen: Vec<(&str, String)> = lines
        .iter()
        .map(|(what, who, _)| (*what, who.to_string()))
        .collect();
    assert_eq!(seen, expected, "log:\n{log}");
    // The clock agrees: every command started after the previous one ended.
    assert!(
        lines.windows(2).all(|pair| pair[0].2 <= pair[1].2),
        "log:\n{log}"
    );
    assert_eq!(world.status("fifo")["held"], false);
}

#[test]
fn a_wait_that_times_out_exits_75_and_leaves_no_waiter() {
    let world = World::new();
    let gate = world.hold_until_gate("busy", &[]);
    let started = Instant::now();
    let output = world.run(&["exec", "--wait", "300ms", "busy", "--", "touch", "ran"]);
    assert_eq!(
        output.status.code(),
        Some(TEMPFAIL),
        "{}",
        text(&output.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        text(&output.stderr).starts_with("fairlock: "),
        "{}",
        text(&output.stderr)
    );
    assert!(!world.path("ran").exists());
    let status = world.status("busy");
    assert_eq!(status["held"], true);
    assert_eq!(status["waiters"], serde_json::json!([]));
    world.open_gate("busy");
    assert_eq!(gate.wait(LIMIT), 0);
}

#[test]
fn wait_zero_on_a_held_lock_exits_75_at_once_without_queueing() {
    let world = World::new();
    let gate = world.hold_until_gate("busy", &[]);
    let started = Instant::now();
    let output = world.run(&["exec", "--wait", "0", "busy", "--", "touch", "ran"]);
    assert_eq!(
        output.status.code(),
        Some(TEMPFAIL),
        "{}",
        text(&output.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(!world.path("ran").exists());
    assert_eq!(world.status("busy")["waiters"], serde_json::json!([]));
    world.open_gate("busy");
    assert_eq!(gate.wait(LIMIT), 0);
    // Free now: `--wait 0` takes it.
    let output = world.run(&["exec", "--wait", "0", "busy", "--", "touch", "ran"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(world.path("ran").exists());
}

#[test]
fn a_fixed_lease_that_runs_out_stops_the_command_with_76() {
    let world = World::new();
    let started = Instant::now();
    let exec = world.spawn(&[
        "exec",
        "--lease",
        "1s",
        "--kill-after",
        "500ms",
        "short",
        "--",
        "sh",
        "-c",
        "echo $$ > pid; exec sleep 30",
    ]);
    wait_until(LIMIT, || !world.read("pid").is_empty());
    let pid: u32 = world.read("pid").trim().parse().unwrap();
    // Lease 1 s, then SIGTERM ends `sleep`; generous slack for a loaded machine.
    assert_eq!(exec.wait(Duration::from_secs(6)), LEASE_LOST);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(!alive(pid), "the command survived its lost lease");
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_after_kill_after() {
    let world = World::new();
    let started = Instant::now();
    let exec = world.spawn(&[
        "exec",
        "--lease",
        "500ms",
        "--kill-after",
        "500ms",
        "stubborn",
        "--",
        "sh",
        "-c",
        "trap '' TERM; echo $$ > pid; exec sleep 30",
    ]);
    wait_until(LIMIT, || !world.read("pid").is_empty());
    let pid: u32 = world.read("pid").trim().parse().unwrap();
    assert_eq!(exec.wait(Duration::from_secs(6)), LEASE_LOST);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "SIGKILL came early: {:?}",
        started.elapsed()
    );
    assert!(!alive(pid));
}

#[test]
fn force_unlock_stops_the_holder_and_wakes_the_waiter() {
    let world = World::new();
    // A short watchdog lease, so the holder's renewal (every 300 ms) notices promptly.
    let holder = world.hold_until_gate("stuck", &["--watchdog-lease", "900ms"]);
    let waiter = world.spawn(&[
        "exec",
        "stuck",
        "--",
        "sh",
        "-c",
        "echo $FAIRLOCK_TOKEN > waiter.token",
    ]);
    world.wait_for_waiters("stuck", 1);

    let output = world.run(&["force-unlock", "stuck"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).contains("was held"),
        "{}",
        text(&output.stdout)
    );

    assert_eq!(waiter.wait(Duration::from_secs(5)), 0);
    let first: u64 = world.read("stuck.token").trim().parse().unwrap();
    let second: u64 = world.read("waiter.token").trim().parse().unwrap();
    assert!(second > first);
    assert_eq!(holder.wait(Duration::from_secs(5)), LEASE_LOST);

    let output = world.run(&["force-unlock", "stuck"]);
    assert_eq!(output.status.code(), Some(0));
    assert!(
        text(&output.stdout).contains("was not held"),
        "{}",
        text(&output.stdout)
    );
}

/// The same with a fixed lease, which is never renewed: the holder asks the store every second
/// whether it still holds. Before, it ran on until its lease ended (10 minutes here), beside
/// the next holder.
#[test]
fn force_unlock_stops_a_holder_with_a_fixed_lease_within_seconds() {
    let world = World::new();
    let holder = world.hold_until_gate("fixed", &["--lease", "10m"]);
    let output = world.run(&["force-unlock", "fixed"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(holder.wait(Duration::from_secs(5)), LEASE_LOST);
}

/// A PostgreSQL connection string in key=value form goes to the PostgreSQL backend, and its
/// password never reaches a message. Before, it went to the Redis backend, whose "not a
/// redis:// URL" message printed it whole.
#[test]
fn a_key_value_connection_string_is_postgres_and_its_password_stays_secret() {
    let port = fairlock_testsupport::free_port().unwrap();
    let url = format!("host=127.0.0.1 port={port} user=app password=s3cret dbname=app");
    let stderr = status_of_unreachable(&url);
    assert!(!stderr.contains("s3cret"), "{stderr}");
    assert!(stderr.contains("postgres"), "{stderr}");
}

/// `--help` shows where `--url` can come from, but not the value of `FAIRLOCK_URL`, which may
/// hold a password (clap shows it unless told not to).
#[test]
fn help_does_not_show_the_url_from_the_environment() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_fairlock"))
        .env("FAIRLOCK_URL", "redis://:s3cret@127.0.0.1:1")
        .args(["status", "--help"])
        .output()
        .unwrap();
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(stdout.contains("FAIRLOCK_URL"), "{stdout}");
    assert!(!stdout.contains("s3cret"), "{stdout}");
}

#[test]
fn sigterm_while_waiting_leaves_the_queue() {
    let world = World::new();
    let gate = world.hold_until_gate("queue", &[]);
    let waiter = world.spawn(&["exec", "queue", "--", "touch", "ran"]);
    world.wait_for_waiters("queue", 1);
    waiter.signal("TERM");
    assert_eq!(waiter.wait(Duration::from_secs(5)), 128 + 15);
    // Gone at once, not after its liveness TTL.
    assert_eq!(world.status("queue")["waiters"], serde_json::json!([]));
    world.open_gate("queue");
    assert_eq!(gate.wait(LIMIT), 0);
    assert!(!world.path("ran").exists());
}

#[test]
fn a_signal_while_holding_goes_to_the_command_and_the_lock_is_released() {
    let world = World::new();
    let exec = world.spawn(&[
        "exec",
        "held",
        "--",
        "sh",
        "-c",
        "trap 'echo got > term; exit 3' TERM; touch ready; sleep 30 & wait",
    ]);
    wait_until(LIMIT, || world.path("ready").exists());
    exec.signal("TERM");
    assert_eq!(exec.wait(Duration::from_secs(5)), 3);
    assert_eq!(world.read("term").trim(), "got");
    assert_eq!(world.status("held")["held"], false);
}

#[test]
fn status_reports_holder_and_waiters_as_json() {
    let world = World::new();
    let holder = world.hold_until_gate("app-deploy", &[]);
    let waiter = world.spawn(&["exec", "app-deploy", "--", "true"]);
    world.wait_for_waiters("app-deploy", 1);

    let status = world.status("app-deploy");
    assert_eq!(status["name"], "app-deploy");
    assert_eq!(status["held"], true);
    let holder_json = &status["holder"];
    let token: u64 = world.read("app-deploy.token").trim().parse().unwrap();
    assert_eq!(holder_json["fencing_token"], token);
    assert_eq!(holder_json["hold_count"], 1);
    assert_eq!(holder_json["confirmed"], true);
    let lease = holder_json["lease_remaining_ms"].as_u64().unwrap();
    assert!(lease > 0 && lease <= 30_000, "{lease}");
    let waiters = status["waiters"].as_array().unwrap();
    assert_eq!(waiters.len(), 1);
    assert_eq!(waiters[0]["position"], 1);
    let deadline = waiters[0]["deadline_in_ms"].as_u64().unwrap();
    assert!(deadline <= 5_000, "{deadline}");
    assert_ne!(waiters[0]["owner"], holder_json["owner"]);

    let output = world.run(&["status", "app-deploy"]);
    assert!(
        text(&output.stdout).contains(&format!("fencing token {token}")),
        "{}",
        text(&output.stdout)
    );

    world.open_gate("app-deploy");
    assert_eq!(holder.wait(LIMIT), 0);
    assert_eq!(waiter.wait(LIMIT), 0);
    assert_eq!(world.status("app-deploy")["held"], false);
}

#[test]
fn list_reports_held_and_waited_locks_as_json() {
    let world = World::new();
    let holder = world.hold_until_gate("app-deploy", &[]);
    let waiter = world.spawn(&["exec", "app-deploy", "--", "true"]);
    world.wait_for_waiters("app-deploy", 1);
    let holder_json = world.status("app-deploy")["holder"].clone();

    let output = world.run(&["list", "app-", "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let list: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        list,
        serde_json::json!([{
            "name": "app-deploy",
            "held": true,
            "holder": holder_json["owner"],
            "waiters": 1
        }])
    );
    let output = world.run(&["list", "other-", "--json"]);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap(),
        serde_json::json!([])
    );
    let output = world.run(&["list"]);
    assert!(
        text(&output.stdout).contains("app-deploy"),
        "{}",
        text(&output.stdout)
    );

    world.open_gate("app-deploy");
    assert_eq!(holder.wait(LIMIT), 0);
    assert_eq!(waiter.wait(LIMIT), 0);
    let output = world.run(&["list", "--json"]);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap(),
        serde_json::json!([])
    );
}

#[test]
fn the_prefix_option_keeps_locks_apart() {
    let world = World::new();
    let gate = world.hold_until_gate("shared", &["--prefix", "team-a:"]);
    let output = world.run(&[
        "--prefix", "team-b:", "exec", "--wait", "0", "shared", "--", "true",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let output = world.run(&[
        "--prefix", "team-a:", "exec", "--wait", "0", "shared", "--", "true",
    ]);
    assert_eq!(
        output.status.code(),
        Some(TEMPFAIL),
        "{}",
        text(&output.stderr)
    );
    world.open_gate("shared");
    assert_eq!(gate.wait(LIMIT), 0);
}

#[test]
fn bad_arguments_exit_2_with_a_usage_message() {
    let world = World::new();
    let cases: [&[&str]; 8] = [
        &["exec", "--wait", "banana", "job", "--", "true"],
        // Durations a clock cannot add (they made a panic, exit 101, on first use).
        &["--connect-timeout", "100000years", "status", "job"],
        &["exec", "--kill-after", "100000years", "job", "--", "true"],
        &["exec", "", "--", "true"],
        &["exec", "job"],
        &["exec", "--lease", "0s", "job", "--", "true"],
        &[
            "exec",
            "--lease",
            "1s",
            "--watchdog-lease",
            "1s",
            "job",
            "--",
            "true",
        ],
        &["status"],
    ];
    for args in cases {
        let output = world.run(args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(USAGE), "{args:?}: {stderr}");
        assert!(
            stderr.contains("Usage") || stderr.contains("--help"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn an_unreachable_store_exits_69_naming_the_endpoint() {
    // A free port nobody listens on.
    let port = fairlock_testsupport::free_port().unwrap();
    let url = format!("redis://127.0.0.1:{port}");
    let started = Instant::now();
    let stderr = status_of_unreachable(&url);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("fairlock: ") && stderr.contains(&format!("127.0.0.1:{port}")),
        "{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn force_unlock_json_says_whether_the_lock_was_held() {
    let world = World::new();
    let holder = world.hold_until_gate("stuck", &[]);
    let output = world.run(&["force-unlock", "stuck", "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap(),
        serde_json::json!({ "name": "stuck", "was_held": true })
    );
    assert_eq!(world.status("stuck")["held"], false);

    let output = world.run(&["force-unlock", "stuck", "--json"]);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap(),
        serde_json::json!({ "name": "stuck", "was_held": false })
    );
    world.open_gate("stuck");
    assert_eq!(holder.wait(LIMIT), LEASE_LOST);
}

#[test]
fn completions_are_printed_without_reaching_a_store() {
    // Nobody listens on this port: the command must not even try it.
    let port = fairlock_testsupport::free_port().unwrap();
    let completions = |shell: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_fairlock"))
            .args(["--url", &format!("redis://127.0.0.1:{port}")])
            .args(["completions", shell])
            .output()
            .unwrap()
    };
    let scratch = fairlock_testsupport::TempDir::new("completions").unwrap();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let output = completions(shell);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{shell}: {}",
            text(&output.stderr)
        );
        assert!(
            text(&output.stdout).contains("force-unlock"),
            "{shell}: {}",
            text(&output.stdout)
        );
        if shell == "bash" {
            // The script loads in bash and completes the subcommands.
            let script = scratch.path().join("fairlock.bash");
            std::fs::write(&script, &output.stdout).unwrap();
            let words = std::process::Command::new("bash")
                .arg("-c")
                .arg(
                    "source \"$1\"; COMP_WORDS=(fairlock st); COMP_CWORD=1; COMP_LINE='fairlock st'; \
                     COMP_POINT=${#COMP_LINE}; _fairlock fairlock st fairlock; printf '%s\\n' \"${COMPREPLY[@]}\"",
                )
                .arg("bash")
                .arg(&script)
                .output()
                .unwrap();
            assert_eq!(
                text(&words.stdout).trim(),
                "status",
                "{}",
                text(&words.stderr)
            );
        }
    }
    let output = completions("tcsh");
    assert_eq!(output.status.code(), Some(USAGE));
}

//! Black-box tests: the built `fairlock` binary against a real PostgreSQL on 127.0.0.1
//! (`--url postgres://...`): `exec`, `status`, `list` and `force-unlock` work as on Redis.

mod common;

use std::time::{Duration, Instant};

use common::{status_of_unreachable, text, World, LEASE_LOST, TEMPFAIL};

const LIMIT: Duration = Duration::from_secs(10);

#[test]
fn exec_runs_under_the_lock_with_a_growing_token_and_in_queue_order() {
    let world = World::postgres();
    let token_of_a_run = || {
        let output = world.run(&["exec", "reports", "--", "sh", "-c", "echo $FAIRLOCK_TOKEN"]);
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        text(&output.stdout).trim().parse::<u64>().unwrap()
    };
    let first = token_of_a_run();
    let second = token_of_a_run();
    assert!(first > 0 && second > first, "{first} then {second}");
    let output = world.run(&["exec", "job", "--", "sh", "-c", "exit 7"]);
    assert_eq!(output.status.code(), Some(7), "{}", text(&output.stderr));

    let gate = world.hold_until_gate("fifo", &[]);
    let mut waiters = Vec::new();
    for index in 1..=3 {
        let label = index.to_string();
        waiters.push(world.spawn(&["exec", "fifo", "--", "sh", "-c", "echo $0 >> log", &label]));
        world.wait_for_waiters("fifo", index);
    }
    let output = world.run(&["exec", "--wait", "0", "fifo", "--", "true"]);
    assert_eq!(
        output.status.code(),
        Some(TEMPFAIL),
        "{}",
        text(&output.stderr)
    );
    world.open_gate("fifo");
    assert_eq!(gate.wait(LIMIT), 0);
    for waiter in waiters {
        assert_eq!(waiter.wait(LIMIT), 0);
    }
    assert_eq!(world.read("log"), "1\n2\n3\n");
    assert_eq!(world.status("fifo")["held"], false);
}

#[test]
fn status_list_and_force_unlock() {
    let world = World::postgres();
    let holder = world.hold_until_gate("app-stuck", &["--watchdog-lease", "900ms"]);
    let waiter = world.spawn(&[
        "exec",
        "app-stuck",
        "--",
        "sh",
        "-c",
        "echo $FAIRLOCK_TOKEN > waiter.token",
    ]);
    world.wait_for_waiters("app-stuck", 1);

    let status = world.status("app-stuck");
    assert_eq!(status["held"], true);
    let token: u64 = world.read("app-stuck.token").trim().parse().unwrap();
    assert_eq!(status["holder"]["fencing_token"], token);
    assert_eq!(status["holder"]["confirmed"], true);
    assert_eq!(status["waiters"].as_array().unwrap().len(), 1);

    let output = world.run(&["list", "app-", "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let list: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        list,
        serde_json::json!([{
            "name": "app-stuck",
            "held": true,
            "holder": status["holder"]["owner"],
            "waiters": 1
        }])
    );

    let output = world.run(&["force-unlock", "app-stuck"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).contains("was held"),
        "{}",
        text(&output.stdout)
    );
    assert_eq!(waiter.wait(Duration::from_secs(5)), 0);
    let second: u64 = world.read("waiter.token").trim().parse().unwrap();
    assert!(second > token);
    assert_eq!(holder.wait(Duration::from_secs(5)), LEASE_LOST);
    let output = world.run(&["list", "--json"]);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap(),
        serde_json::json!([])
    );
}

#[test]
fn the_prefix_option_is_the_schema() {
    let world = World::postgres();
    let gate = world.hold_until_gate("shared", &["--prefix", "team_a"]);
    let output = world.run(&[
        "--prefix", "team_b", "exec", "--wait", "0", "shared", "--", "true",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let output = world.run(&[
        "--prefix", "team_a", "exec", "--wait", "0", "shared", "--", "true",
    ]);
    assert_eq!(
        output.status.code(),
        Some(TEMPFAIL),
        "{}",
        text(&output.stderr)
    );
    world.open_gate("shared");
    assert_eq!(gate.wait(LIMIT), 0);
    // Not a schema name: refused before anything reaches the server.
    let output = world.run(&["--prefix", "team-a:", "status", "shared"]);
    assert_ne!(output.status.code(), Some(0));
    assert!(
        text(&output.stderr).contains("schema"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn an_unreachable_postgres_exits_69_naming_the_endpoint() {
    let port = fairlock_testsupport::free_port().unwrap();
    let url = format!("postgres://app:s3cret@127.0.0.1:{port}/app");
    let started = Instant::now();
    let stderr = status_of_unreachable(&url);
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
    assert!(!stderr.contains("s3cret"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

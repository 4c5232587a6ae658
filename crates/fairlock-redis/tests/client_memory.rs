//! Client memory per `RedisBackend` with the default pool: at most 5 MB. fred preallocates
//! several broadcast channels per client, so giving every pooled client the subscriber's large
//! wake-up buffer cost about 48 MB per backend.

mod common;

use common::Server;

/// Resident memory of this process, in bytes (Linux).
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .expect("VmRSS");
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("a number");
    kb * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_costs_at_most_five_megabytes() {
    const BACKENDS: u64 = 10;
    let server = Server::start();
    // One first, so that what every process pays once (runtime, TLS of fred, ...) is not
    // counted per backend.
    let warm = server.backend().await;
    let before = rss();
    let mut backends = Vec::new();
    for _ in 0..BACKENDS {
        backends.push(server.backend().await);
    }
    let per_backend = rss().saturating_sub(before) / BACKENDS;
    eprintln!(
        "resident memory per RedisBackend: {} KiB",
        per_backend / 1024
    );
    assert!(
        per_backend <= 5 * 1024 * 1024,
        "a RedisBackend costs {} KiB of resident memory",
        per_backend / 1024
    );
    drop((warm, backends));
}

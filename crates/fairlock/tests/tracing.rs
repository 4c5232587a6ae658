//! What the core logs, read through `tracing_subscriber::fmt` with the filters a user would
//! write (docs/observability.md): nothing at INFO for operations that go well, the lock, owner
//! and token on every WARN even with spans filtered out, and a per-lock filter that works.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fairlock::{LockClient, MemoryBackend};
use tokio::time::sleep;
use tracing_subscriber::EnvFilter;

/// Everything the subscriber printed.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// Tests take turns: `tracing` caches whether each call site is enabled across all the
/// subscribers that exist at once, and a subscriber set up on another thread while a call site
/// is first hit can leave that cache stale for this one.
static SERIAL: Mutex<()> = Mutex::new(());

/// Logs with `filter` on this thread (the tests' runtimes are single-threaded). Hold the
/// returned guards for the whole test.
fn capture(
    filter: &str,
) -> (
    Captured,
    // The subscriber is unset before the next test may start.
    (
        tracing::subscriber::DefaultGuard,
        std::sync::MutexGuard<'static, ()>,
    ),
) {
    let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (out, (tracing::subscriber::set_default(subscriber), serial))
}

#[tokio::test(start_paused = true)]
async fn operations_that_go_well_log_nothing_at_info() {
    let (out, _guard) = capture("info");
    let client = LockClient::new(MemoryBackend::new());
    let lock = client.fair_lock("quiet").unwrap();
    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    let waiter = client.fair_lock("quiet").unwrap();
    let waiting = tokio::spawn(async move { waiter.lock().await.unwrap().unlock().await });
    sleep(Duration::from_secs(40)).await; // renewals
    drop(inner);
    outer.unlock().await.unwrap();
    waiting.await.unwrap().unwrap();
    lock.run(|_| async {}).await.unwrap();
    assert_eq!(out.text(), "", "nothing at INFO or above");
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_warns_with_lock_owner_and_token_without_spans() {
    let (out, _guard) = capture("warn");
    let client = LockClient::new(MemoryBackend::new());
    let lock = client.fair_lock("forced").unwrap();
    let guard = lock.lock().await.unwrap();
    client.force_unlock("forced").await.unwrap();
    sleep(Duration::from_secs(11)).await; // the next renewal finds it gone
    assert!(guard.is_lease_lost());
    let text = out.text();
    let line = text
        .lines()
        .find(|l| l.contains("fairlock lease lost"))
        .unwrap_or_else(|| panic!("no warning in {text:?}"));
    assert!(line.contains(" WARN "), "{line}");
    for field in [
        "lock=forced".to_owned(),
        format!("owner={}", lock.owner()),
        format!("token={}", guard.fencing_token()),
        "reason=revoked".to_owned(),
    ] {
        assert!(line.contains(&field), "{field} missing from {line}");
    }
    assert_eq!(text.lines().count(), 1, "{text}");
}

#[tokio::test(start_paused = true)]
async fn a_filter_on_one_lock_shows_its_debug_events_only() {
    let (out, _guard) = capture("warn,fairlock[{lock=nightly-report}]=debug");
    let client = LockClient::new(MemoryBackend::new());
    for name in ["nightly-report", "other"] {
        client
            .fair_lock(name)
            .unwrap()
            .lock()
            .await
            .unwrap()
            .unlock()
            .await
            .unwrap();
    }
    let text = out.text();
    let acquired: Vec<&str> = text.lines().filter(|l| l.contains("acquired")).collect();
    assert_eq!(acquired.len(), 1, "{text}");
    assert!(acquired[0].contains("lock=nightly-report"), "{text}");
    assert!(text.contains("released"), "{text}");
    assert!(!text.contains("lock=other"), "{text}");
}

//! A server whose `maxmemory-policy` may evict keys gets a warning at connect: a held lock's
//! keys could be evicted and the lock freed while its holder works.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::Server;

/// Collects what the fmt subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn warnings_at_connect(server: &Server) -> String {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let backend = server.backend().await;
    drop(backend);
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    text
}

#[tokio::test(flavor = "current_thread")]
async fn an_evicting_policy_is_warned_about_and_noeviction_is_not() {
    let server = Server::start();
    server.cli(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    let warned = warnings_at_connect(&server).await;
    assert!(
        warned.contains("maxmemory-policy is allkeys-lru"),
        "no warning for allkeys-lru: {warned:?}"
    );
    server.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let quiet = warnings_at_connect(&server).await;
    assert!(!quiet.contains("maxmemory-policy"), "{quiet:?}");
}

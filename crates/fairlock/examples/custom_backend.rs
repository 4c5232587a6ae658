//! A custom backend that wraps another: every call the core makes to the store, printed with
//! how long it took. Run with `cargo run -p fairlock --example custom_backend`.
//!
//! A wrapper implements the eight required methods of `LockBackend` by forwarding them, and
//! forwards the two provided ones (`capabilities`, `name`) too, so that the conformance margins
//! and the metrics' `backend` label stay those of the store underneath. The same shape adds
//! retries, fault injection for tests, or a tenant's name prefix (see the `backend` module's
//! documentation). The output shows the protocol at work: one `acquire` for an uncontended lock,
//! a `watch` and queued `acquire`s for a waiter, a hand-over on `release`.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use fairlock::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, Capabilities, HolderState, LockBackend, LockState,
    LockSummary, ReleaseOutcome, Watch,
};
use fairlock::{LockClient, LockName, MemoryBackend, Owner, Result};
use tokio::time::{sleep, Instant};

/// Prints every call to `inner` and its outcome.
#[derive(Debug)]
struct Traced<B> {
    inner: B,
}

impl<B> Traced<B> {
    async fn call<T: std::fmt::Debug>(
        &self,
        what: String,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let started = Instant::now();
        let outcome = call.await;
        println!("  {what} -> {outcome:?} in {:?}", started.elapsed());
        outcome
    }
}

fn short(owner: &Owner) -> &str {
    &owner.as_str()[..6]
}

#[async_trait]
impl<B: LockBackend> LockBackend for Traced<B> {
    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
        let what = format!(
            "acquire({}, owner {}, queue: {})",
            request.name,
            short(&request.owner),
            request.queue
        );
        self.call(what, self.inner.acquire(request)).await
    }

    async fn release(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        attempt: AttemptId,
    ) -> Result<ReleaseOutcome> {
        let what = format!("release({name}, owner {}, token {token})", short(owner));
        self.call(what, self.inner.release(name, owner, token, attempt))
            .await
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> Result<bool> {
        let what = format!("extend({name}, token {token}, {lease:?})");
        self.call(what, self.inner.extend(name, owner, token, lease))
            .await
    }

    async fn abandon(&self, name: &LockName, owner: &Owner, attempt: AttemptId) -> Result<()> {
        let what = format!("abandon({name}, owner {})", short(owner));
        self.call(what, self.inner.abandon(name, owner, attempt))
            .await
    }

    async fn force_release(&self, name: &LockName, token: u64) -> Result<bool> {
        let what = format!("force_release({name}, token {token})");
        self.call(what, self.inner.force_release(name, token)).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        self.inner.inspect(name).await // reads are not printed
    }

    // Forwarded, so the inner store's own (cheaper) answer is kept.
    async fn holder(&self, name: &LockName) -> Result<Option<HolderState>> {
        self.inner.holder(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>> {
        self.inner.list(prefix).await
    }

    async fn watch(&self, name: &LockName, owner: &Owner) -> Result<Watch> {
        let what = format!("watch({name}, owner {})", short(owner));
        self.call(what, self.inner.watch(name, owner)).await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let client = LockClient::new(Traced {
        inner: MemoryBackend::new(),
    });

    println!("an uncontended lock: one round trip to take it, one to give it back");
    let first = client.fair_lock("report")?;
    let guard = first.lock().await?;

    println!("a second owner waits: it registers for wake-ups, then queues");
    let second = client.fair_lock("report")?;
    let waiter = tokio::spawn(async move {
        let guard = second.lock().await?;
        sleep(Duration::from_millis(10)).await; // the confirmation goes out meanwhile
        guard.unlock().await
    });
    sleep(Duration::from_millis(20)).await;

    println!("the holder lets go: the lock is handed to the waiter, which confirms it, then");
    println!("the waiter lets go");
    guard.unlock().await?;
    waiter.await.expect("waiter task")?;
    Ok(())
}

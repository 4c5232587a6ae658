//! The `metrics` feature: a scripted run on `MemoryBackend` under paused time, read back from
//! `metrics-util`'s debugging recorder, with every figure exact. The recorder is installed
//! for the test's thread only (the tests' runtimes are single-threaded, so every task the
//! core spawns records there too), so tests running at once do not mix their figures.
#![cfg(feature = "metrics")]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fairlock::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, LockBackend, LockState, LockSummary, ReleaseOutcome,
    Watch,
};
use fairlock::{Error, LockClient, LockName, LockOptions, MemoryBackend, Owner, Result};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use tokio::time::{sleep, timeout};

/// Every figure recorded so far, summed over snapshots (the debugging recorder resets
/// counters and gauges, and drains histograms, at each snapshot). Keyed by
/// `name{label=value,...}` with the labels in alphabetical order.
#[derive(Default)]
struct Figures {
    counters: BTreeMap<String, u64>,
    gauges: BTreeMap<String, f64>,
    histograms: BTreeMap<String, Vec<f64>>,
}

impl Figures {
    fn take(&mut self, snapshotter: &Snapshotter) {
        for (key, _unit, _description, value) in snapshotter.snapshot().into_vec() {
            let mut labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let id = format!("{}{{{}}}", key.key().name(), labels.join(","));
            match (key.kind(), value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => {
                    *self.counters.entry(id).or_default() += n
                }
                (MetricKind::Gauge, DebugValue::Gauge(v)) => {
                    *self.gauges.entry(id).or_default() += v.into_inner()
                }
                (MetricKind::Histogram, DebugValue::Histogram(vs)) => self
                    .histograms
                    .entry(id)
                    .or_default()
                    .extend(vs.into_iter().map(|v| v.into_inner())),
                other => panic!("{id}: unexpected {other:?}"),
            }
        }
    }

    fn counter(&self, id: &str) -> u64 {
        self.counters.get(id).copied().unwrap_or(0)
    }

    fn gauge(&self, id: &str) -> f64 {
        self.gauges.get(id).copied().unwrap_or(0.0)
    }

    fn histogram(&self, id: &str) -> Vec<f64> {
        self.histograms.get(id).cloned().unwrap_or_default()
    }

    fn ids(&self) -> impl Iterator<Item = &String> {
        self.counters
            .keys()
            .chain(self.gauges.keys())
            .chain(self.histograms.keys())
    }
}

fn options() -> LockOptions {
    LockOptions::default()
        .with_watchdog_lease(Duration::from_secs(3))
        .with_waiter_ttl(Duration::from_secs(1))
}

/// Lets spawned tasks run until `ready` holds, without time passing.
async fn until<F: std::future::Future<Output = bool>>(mut ready: impl FnMut() -> F) {
    for _ in 0..1000 {
        if ready().await {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never happened");
}

/// `MemoryBackend` under another name (the trait's default, `custom`) whose next `inspect`
/// and next `extend` fail as if the store were unreachable.
#[derive(Debug, Default, Clone)]
struct Flaky {
    inner: MemoryBackend,
    fail_inspect: Arc<AtomicBool>,
    fail_extend: Arc<AtomicBool>,
    /// Every `acquire` finds foreign data at the lock's keys.
    conflict: Arc<AtomicBool>,
}

fn down() -> Error {
    Error::Unavailable {
        backend: "flaky",
        endpoint: "test".into(),
        source: "link down".into(),
    }
}

#[async_trait]
impl LockBackend for Flaky {
    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
        if self.conflict.load(SeqCst) {
            return Err(Error::Conflict {
                backend: "flaky",
                name: request.name.to_string(),
                detail: "a string where a hash should be".into(),
            });
        }
        self.inner.acquire(request).await
    }
    async fn release(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        attempt: AttemptId,
    ) -> Result<ReleaseOutcome> {
        self.inner.release(name, owner, token, attempt).await
    }
    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> Result<bool> {
        if self.fail_extend.swap(false, SeqCst) {
            return Err(down());
        }
        self.inner.extend(name, owner, token, lease).await
    }
    async fn abandon(&self, name: &LockName, owner: &Owner, attempt: AttemptId) -> Result<()> {
        self.inner.abandon(name, owner, attempt).await
    }
    async fn force_release(&self, name: &LockName, token: u64) -> Result<bool> {
        self.inner.force_release(name, token).await
    }
    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        if self.fail_inspect.swap(false, SeqCst) {
            return Err(down());
        }
        self.inner.inspect(name).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>> {
        self.inner.list(prefix).await
    }
    async fn watch(&self, name: &LockName, owner: &Owner) -> Result<Watch> {
        self.inner.watch(name, owner).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_scripted_run_records_exact_figures() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _installed = metrics::set_default_local_recorder(&recorder);
    let mut figures = Figures::default();

    let memory = MemoryBackend::new();
    let client = LockClient::new(memory.clone())
        .with_options(options())
        .unwrap();
    let secs = Duration::from_secs_f64;

    // t = 0: A takes the lock and re-enters it.
    let a = client.fair_lock("m").unwrap();
    let a1 = a.lock().await.unwrap();
    let a2 = a.lock().await.unwrap();
    // B is refused without waiting, then waits 2 s in vain.
    let b = client.fair_lock("m").unwrap();
    assert!(matches!(b.try_lock().await, Err(Error::WouldBlock { .. })));
    assert!(matches!(
        b.try_lock_for(secs(2.0)).await,
        Err(Error::Timeout { .. })
    ));
    // t = 2: C queues.
    let c = client.fair_lock("m").unwrap();
    let c_task = tokio::spawn(async move { c.lock().await.unwrap() });
    let queued = || {
        let client = &client;
        async move { !client.state("m").await.unwrap().waiters.is_empty() }
    };
    until(queued).await;
    figures.take(&snapshotter);
    assert_eq!(figures.gauge("fairlock_guards{backend=memory}"), 2.0);
    assert_eq!(figures.gauge("fairlock_waiting{backend=memory}"), 1.0);

    // t = 3.5: A lets go; the lock is handed to C, which learns it from its wake-up.
    sleep(secs(1.5)).await;
    drop(a2);
    a1.unlock().await.unwrap();
    let c1 = c_task.await.unwrap();
    // t = 4: C lets go.
    sleep(secs(0.5)).await;
    c1.unlock().await.unwrap();

    // A waiter given up by its caller.
    let d1 = a.lock().await.unwrap();
    let d = client.fair_lock("m").unwrap();
    assert!(timeout(secs(0.25), d.lock()).await.is_err());
    // Its place is given up in the background; let that land first, or d1's release (sent
    // from the caller's task) may hand the lock to the dead attempt, then to E by a wake-up.
    let no_waiters = || {
        let client = &client;
        async move { client.state("m").await.unwrap().waiters.is_empty() }
    };
    until(no_waiters).await;
    d1.unlock().await.unwrap();

    // A fixed lease that runs out while held.
    let e = client
        .fair_lock("m")
        .unwrap()
        .with_lease(secs(1.0))
        .unwrap();
    let e1 = e.lock().await.unwrap();
    sleep(secs(2.0)).await;
    assert!(matches!(e1.unlock().await, Err(Error::LeaseLost { .. })));

    // A hold freed by an operator: the next renewal is refused.
    let f1 = client.fair_lock("m").unwrap().lock().await.unwrap();
    assert!(client.force_unlock("m").await.unwrap());
    sleep(secs(1.25)).await; // past the renewal at 1 s
    assert!(f1.is_lease_lost());
    assert!(matches!(f1.unlock().await, Err(Error::LeaseLost { .. })));

    // A store that fails one renewal and one read: counted under the backend's name.
    let flaky = Flaky::default();
    let flaky_client = LockClient::new(flaky.clone())
        .with_options(options())
        .unwrap();
    let g1 = flaky_client.fair_lock("m").unwrap().lock().await.unwrap();
    flaky.fail_extend.store(true, SeqCst);
    sleep(secs(1.5)).await; // fails at 1 s, retried 300 ms later
    assert!(!g1.is_lease_lost());
    flaky.fail_inspect.store(true, SeqCst);
    assert!(flaky_client.state("m").await.is_err());
    g1.unlock().await.unwrap();

    until(|| std::future::ready(memory.lock_count() == 0)).await;
    figures.take(&snapshotter);
    let m = "backend=memory";
    let acquisitions = |outcome: &str| {
        figures.counter(&format!(
            "fairlock_acquisitions_total{{{m},outcome={outcome}}}"
        ))
    };
    // a1, c1, d1, e1, f1 | a2 | b | b | d.
    assert_eq!(acquisitions("granted"), 5);
    assert_eq!(acquisitions("reentered"), 1);
    assert_eq!(acquisitions("would_block"), 1);
    assert_eq!(acquisitions("timed_out"), 1);
    assert_eq!(acquisitions("cancelled"), 1);
    assert_eq!(acquisitions("error"), 0);
    let waits = |outcome: &str| {
        figures.histogram(&format!("fairlock_wait_seconds{{{m},outcome={outcome}}}"))
    };
    assert_eq!(waits("granted"), [0.0, 1.5, 0.0, 0.0, 0.0]);
    assert_eq!(waits("reentered"), [0.0]);
    assert_eq!(waits("would_block"), [0.0]);
    assert_eq!(waits("timed_out"), [2.0]);
    assert_eq!(waits("cancelled"), [0.25]);
    // One hold per owner: A 3.5 s (from its first guard to its last), C 0.5 s, D 0.25 s;
    // E and F until their guards were released, after their leases were lost.
    assert_eq!(
        figures.histogram(&format!("fairlock_hold_seconds{{{m}}}")),
        [3.5, 0.5, 0.25, 2.0, 1.25]
    );
    assert_eq!(
        figures.counter(&format!("fairlock_handovers_total{{{m},via=wakeup}}")),
        1
    );
    assert_eq!(
        figures.counter(&format!("fairlock_handovers_total{{{m},via=recheck}}")),
        0
    );
    let lost = |reason: &str| {
        figures.counter(&format!(
            "fairlock_leases_lost_total{{{m},reason={reason}}}"
        ))
    };
    assert_eq!(lost("expired"), 1);
    assert_eq!(lost("revoked"), 1);
    // A renewed at 1, 2 and 3 s; nothing else held past a renewal but F, refused.
    let renewals = |backend: &str, outcome: &str| {
        figures.counter(&format!(
            "fairlock_renewals_total{{backend={backend},outcome={outcome}}}"
        ))
    };
    assert_eq!(renewals("memory", "renewed"), 3);
    assert_eq!(renewals("memory", "refused"), 1);
    assert_eq!(renewals("custom", "failed"), 1);
    assert_eq!(renewals("custom", "renewed"), 1);
    let errors = |op: &str| {
        figures.counter(&format!(
            "fairlock_backend_errors_total{{backend=custom,kind=unavailable,op={op}}}"
        ))
    };
    assert_eq!(errors("extend"), 1);
    assert_eq!(errors("inspect"), 1);
    assert_eq!(
        figures
            .counters
            .keys()
            .filter(|id| id.starts_with("fairlock_backend_errors_total"))
            .count(),
        2,
        "{:?}",
        figures.counters
    );
    for backend in ["memory", "custom"] {
        assert_eq!(
            figures.gauge(&format!("fairlock_guards{{backend={backend}}}")),
            0.0
        );
        assert_eq!(
            figures.gauge(&format!("fairlock_waiting{{backend={backend}}}")),
            0.0
        );
    }
    // Lock names are unbounded: no series carries one unless asked.
    for id in figures.ids() {
        assert!(id.starts_with("fairlock_") && !id.contains("lock="), "{id}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_acquisition_is_an_error_and_a_backend_error() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _installed = metrics::set_default_local_recorder(&recorder);
    let mut figures = Figures::default();

    let flaky = Flaky::default();
    flaky.conflict.store(true, SeqCst);
    let client = LockClient::new(flaky.clone());
    let lock = client.fair_lock("taken").unwrap();
    assert!(matches!(lock.lock().await, Err(Error::Conflict { .. })));
    assert!(matches!(
        lock.try_run(|_| async {}).await,
        Err(Error::Conflict { .. })
    ));
    figures.take(&snapshotter);
    assert_eq!(
        figures.counter("fairlock_acquisitions_total{backend=custom,outcome=error}"),
        2
    );
    assert_eq!(
        figures.counter("fairlock_backend_errors_total{backend=custom,kind=conflict,op=acquire}"),
        2
    );
    assert_eq!(figures.gauge("fairlock_guards{backend=custom}"), 0.0);
}

#[tokio::test(start_paused = true)]
async fn lock_names_label_the_metrics_only_when_asked() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _installed = metrics::set_default_local_recorder(&recorder);
    let mut figures = Figures::default();

    let memory = MemoryBackend::new();
    let client = LockClient::new(memory.clone()).with_lock_name_in_metrics(true);
    let guard = client.fair_lock("billing").unwrap().lock().await.unwrap();
    guard.unlock().await.unwrap();
    figures.take(&snapshotter);
    assert_eq!(
        figures.counter("fairlock_acquisitions_total{backend=memory,lock=billing,outcome=granted}"),
        1
    );
    assert_eq!(
        figures.histogram("fairlock_hold_seconds{backend=memory,lock=billing}"),
        [0.0]
    );
}

#[test]
fn every_metric_is_described_with_its_unit() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        fairlock::describe_metrics();
        // Only metrics with a value show in a snapshot.
        metrics::histogram!("fairlock_wait_seconds").record(1.0);
        metrics::counter!("fairlock_acquisitions_total").increment(1);
    });
    let described: BTreeMap<String, Option<metrics::Unit>> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, unit, description, _)| {
            assert!(description.is_some_and(|d| !d.is_empty()));
            (key.key().name().to_owned(), unit)
        })
        .collect();
    assert_eq!(
        described["fairlock_wait_seconds"],
        Some(metrics::Unit::Seconds)
    );
    assert_eq!(
        described["fairlock_acquisitions_total"],
        Some(metrics::Unit::Count)
    );
}

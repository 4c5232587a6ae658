//! Metrics through the `metrics` facade (feature `metrics`). Every metric is recorded through
//! a [`Meter`], which carries the labels of one lock handle (or one client); without the
//! feature it is empty and every call compiles to nothing.
//!
//! The names, units and labels are listed in `docs/observability.md`; keep the two in step.

use crate::error::Error;

/// Why a lease was found lost: the text for the log and the `reason` label.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LostReason {
    /// The local deadline passed with no successful renewal (or extension).
    Expired,
    /// A renewal was still unanswered when the lease ended.
    RenewalTimedOut,
    /// The store answered that this owner no longer holds the lock under this token
    /// (expired there, or force-unlocked).
    Revoked,
    /// A hand-over this guard was made from lapsed before it was confirmed.
    HandoverLapsed,
}

impl LostReason {
    pub(crate) fn label(self) -> &'static str {
        match self {
            LostReason::Expired => "expired",
            LostReason::RenewalTimedOut => "renewal_timed_out",
            LostReason::Revoked => "revoked",
            LostReason::HandoverLapsed => "handover_lapsed",
        }
    }

    pub(crate) fn text(self) -> &'static str {
        match self {
            LostReason::Expired => "the lease ran out before it was renewed",
            LostReason::RenewalTimedOut => "renewal did not complete before the lease ended",
            LostReason::Revoked => "the store no longer lists this hold",
            LostReason::HandoverLapsed => "the hand-over lapsed before it was confirmed",
        }
    }
}

/// How an acquisition (one `lock` / `try_lock*` call) ended: the `outcome` label.
pub(crate) fn acquire_outcome<T>(
    result: &Result<T, Error>,
    hold_count: Option<u32>,
) -> &'static str {
    match (result, hold_count) {
        (Ok(_), Some(1) | None) => "granted",
        (Ok(_), Some(_)) => "reentered",
        (Err(Error::Timeout { .. }), _) => "timed_out",
        (Err(Error::WouldBlock { .. }), _) => "would_block",
        (Err(_), _) => "error",
    }
}

/// The `kind` label of a backend error.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) fn error_kind(err: &Error) -> &'static str {
    match err {
        Error::Unavailable { .. } => "unavailable",
        Error::Conflict { .. } => "conflict",
        Error::Backend { .. } => "backend",
        Error::InvalidArgument { .. } => "invalid_argument",
        _ => "other",
    }
}

#[cfg(feature = "metrics")]
mod imp {
    use std::sync::Arc;
    use std::time::Duration;

    use metrics::{counter, gauge, histogram, Label};

    /// The labels every metric of one lock handle carries.
    #[derive(Clone, Debug, Default)]
    pub(crate) struct Meter {
        labels: Arc<[Label]>,
    }

    impl Meter {
        pub(crate) fn new(backend: &'static str, lock: Option<&str>) -> Self {
            let mut labels = vec![Label::new("backend", backend)];
            if let Some(lock) = lock {
                labels.push(Label::new("lock", lock.to_owned()));
            }
            Meter {
                labels: labels.into(),
            }
        }

        fn with(&self, key: &'static str, value: &'static str) -> Vec<Label> {
            let mut labels = self.labels.to_vec();
            labels.push(Label::new(key, value));
            labels
        }

        fn with2(
            &self,
            (k1, v1): (&'static str, &'static str),
            (k2, v2): (&'static str, &'static str),
        ) -> Vec<Label> {
            let mut labels = self.with(k1, v1);
            labels.push(Label::new(k2, v2));
            labels
        }

        pub(crate) fn acquisition(&self, outcome: &'static str, waited: Duration) {
            let labels = self.with("outcome", outcome);
            counter!("fairlock_acquisitions_total", labels.iter()).increment(1);
            histogram!("fairlock_wait_seconds", labels).record(waited.as_secs_f64());
        }

        pub(crate) fn handover(&self, via: &'static str) {
            counter!("fairlock_handovers_total", self.with("via", via)).increment(1);
        }

        pub(crate) fn held(&self, held: Duration) {
            histogram!("fairlock_hold_seconds", self.labels.iter()).record(held.as_secs_f64());
        }

        pub(crate) fn lease_lost(&self, reason: &'static str) {
            counter!("fairlock_leases_lost_total", self.with("reason", reason)).increment(1);
        }

        pub(crate) fn renewal(&self, outcome: &'static str) {
            counter!("fairlock_renewals_total", self.with("outcome", outcome)).increment(1);
        }

        pub(crate) fn backend_error(&self, op: &'static str, kind: &'static str) {
            let labels = self.with2(("op", op), ("kind", kind));
            counter!("fairlock_backend_errors_total", labels).increment(1);
        }

        pub(crate) fn guards(&self, delta: f64) {
            gauge!("fairlock_guards", self.labels.iter()).increment(delta);
        }

        pub(crate) fn waiting(&self, delta: f64) {
            gauge!("fairlock_waiting", self.labels.iter()).increment(delta);
        }
    }
}

/// Describes every fairlock metric (its unit and a line of help) to the installed `metrics`
/// recorder, so exporters can show them (Prometheus `# HELP` lines, for example). Call it
/// once, after installing the recorder; the metrics work without it.
///
/// ```
/// // With a recorder installed, e.g. `metrics_exporter_prometheus::PrometheusBuilder`:
/// fairlock::describe_metrics();
/// ```
#[cfg(feature = "metrics")]
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "fairlock_acquisitions_total",
        Unit::Count,
        "Calls of lock/try_lock/try_lock_for (and run) by how they ended: granted, reentered, timed_out, would_block, error, cancelled."
    );
    describe_histogram!(
        "fairlock_wait_seconds",
        Unit::Seconds,
        "Time from the call of an acquisition to its outcome, by outcome."
    );
    describe_histogram!(
        "fairlock_hold_seconds",
        Unit::Seconds,
        "Time a hold lasted in this process, from its first guard to the release of its last."
    );
    describe_counter!(
        "fairlock_handovers_total",
        Unit::Count,
        "Acquisitions that waited in the queue and were handed the lock, by how the waiter learnt it: wakeup or recheck."
    );
    describe_counter!(
        "fairlock_leases_lost_total",
        Unit::Count,
        "Leases found lost while held, by reason: expired, renewal_timed_out, revoked, handover_lapsed."
    );
    describe_counter!(
        "fairlock_renewals_total",
        Unit::Count,
        "Watchdog lease renewals by outcome: renewed, refused, failed, timed_out."
    );
    describe_counter!(
        "fairlock_backend_errors_total",
        Unit::Count,
        "Errors returned by the backend, by operation and kind."
    );
    describe_gauge!(
        "fairlock_guards",
        Unit::Count,
        "Live lock guards (levels held) in this process."
    );
    describe_gauge!(
        "fairlock_waiting",
        Unit::Count,
        "Acquisitions waiting in a queue in this process."
    );
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use std::time::Duration;

    /// Without the `metrics` feature: nothing to carry, nothing to record.
    #[derive(Clone, Debug, Default)]
    pub(crate) struct Meter;

    #[allow(clippy::unused_self)]
    impl Meter {
        pub(crate) fn new(_backend: &'static str, _lock: Option<&str>) -> Self {
            Meter
        }
        #[inline]
        pub(crate) fn acquisition(&self, _outcome: &'static str, _waited: Duration) {}
        #[inline]
        pub(crate) fn handover(&self, _via: &'static str) {}
        #[inline]
        pub(crate) fn held(&self, _held: Duration) {}
        #[inline]
        pub(crate) fn lease_lost(&self, _reason: &'static str) {}
        #[inline]
        pub(crate) fn renewal(&self, _outcome: &'static str) {}
        #[inline]
        pub(crate) fn guards(&self, _delta: f64) {}
        #[inline]
        pub(crate) fn waiting(&self, _delta: f64) {}
    }
}

pub(crate) use imp::Meter;

/// Counts one waiting attempt in `fairlock_waiting` for as long as it lives.
#[derive(Debug)]
pub(crate) struct Waiting(Meter);

impl Waiting {
    pub(crate) fn start(meter: &Meter) -> Self {
        meter.waiting(1.0);
        Waiting(meter.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting(-1.0);
    }
}

/// Records an acquisition that is dropped before it ends as `cancelled`, unless disarmed.
#[derive(Debug)]
pub(crate) struct Acquiring {
    meter: Meter,
    started: tokio::time::Instant,
    armed: bool,
}

impl Acquiring {
    pub(crate) fn start(meter: &Meter, started: tokio::time::Instant) -> Self {
        Acquiring {
            meter: meter.clone(),
            started,
            armed: true,
        }
    }

    pub(crate) fn finish(mut self, outcome: &'static str) {
        self.armed = false;
        self.meter.acquisition(outcome, self.started.elapsed());
    }
}

impl Drop for Acquiring {
    fn drop(&mut self) {
        if self.armed {
            self.meter.acquisition("cancelled", self.started.elapsed());
        }
    }
}

/// A backend whose errors are counted in `fairlock_backend_errors_total`, by operation and
/// kind. The core calls the store through it when the `metrics` feature is on.
#[cfg(feature = "metrics")]
#[derive(Debug)]
pub(crate) struct Metered {
    pub(crate) inner: std::sync::Arc<dyn LockBackend>,
    /// Label the errors of operations on one lock with its name.
    pub(crate) by_lock: bool,
}

#[cfg(feature = "metrics")]
use crate::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, LockBackend, LockState, LockSummary, ReleaseOutcome,
    Watch,
};
#[cfg(feature = "metrics")]
use crate::name::{LockName, Owner};
#[cfg(feature = "metrics")]
use std::time::Duration;

#[cfg(feature = "metrics")]
impl Metered {
    fn count<T>(
        &self,
        op: &'static str,
        lock: Option<&LockName>,
        result: crate::Result<T>,
    ) -> crate::Result<T> {
        if let Err(err) = &result {
            let lock = lock.filter(|_| self.by_lock).map(LockName::as_str);
            Meter::new(self.inner.name(), lock).backend_error(op, error_kind(err));
        }
        result
    }
}

#[cfg(feature = "metrics")]
#[async_trait::async_trait]
impl LockBackend for Metered {
    async fn acquire(&self, request: &AcquireRequest) -> crate::Result<AcquireOutcome> {
        let result = self.inner.acquire(request).await;
        self.count("acquire", Some(&request.name), result)
    }

    async fn release(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        attempt: AttemptId,
    ) -> crate::Result<ReleaseOutcome> {
        let result = self.inner.release(name, owner, token, attempt).await;
        self.count("release", Some(name), result)
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> crate::Result<bool> {
        let result = self.inner.extend(name, owner, token, lease).await;
        self.count("extend", Some(name), result)
    }

    async fn abandon(
        &self,
        name: &LockName,
        owner: &Owner,
        attempt: AttemptId,
    ) -> crate::Result<()> {
        let result = self.inner.abandon(name, owner, attempt).await;
        self.count("abandon", Some(name), result)
    }

    async fn force_release(&self, name: &LockName, token: u64) -> crate::Result<bool> {
        let result = self.inner.force_release(name, token).await;
        self.count("force_release", Some(name), result)
    }

    async fn inspect(&self, name: &LockName) -> crate::Result<LockState> {
        let result = self.inner.inspect(name).await;
        self.count("inspect", Some(name), result)
    }

    async fn holder(&self, name: &LockName) -> crate::Result<Option<crate::backend::HolderState>> {
        let result = self.inner.holder(name).await;
        self.count("holder", Some(name), result)
    }

    async fn list(&self, prefix: &str) -> crate::Result<Vec<LockSummary>> {
        let result = self.inner.list(prefix).await;
        self.count("list", None, result)
    }

    async fn watch(&self, name: &LockName, owner: &Owner) -> crate::Result<Watch> {
        let result = self.inner.watch(name, owner).await;
        self.count("watch", Some(name), result)
    }

    fn capabilities(&self) -> crate::backend::Capabilities {
        self.inner.capabilities()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

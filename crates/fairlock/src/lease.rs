//! One hold's lease, shared by every guard of that hold in this process: the watchdog that
//! renews it, and the lost-lease signal.
//!
//! The store keeps one lease per hold (all levels share it, and it only ever gets longer), so
//! the core keeps one [`Hold`] per hold too: guards of the same lock, owner and token (nested
//! locking, tasks sharing a handle) join it, and one keeper task serves them all.
//!
//! The keeper is not spawned with the hold but when it first has something to do: the first
//! renewal (a third of the watchdog lease after the grant) or, with a fixed lease, watching
//! the last moments before the deadline (see [`crate::deferred`]). Most holds end before
//! either and never spawn it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};
use tracing::{debug, warn, Instrument};

use crate::deferred::{Deferred, DeferredTask};
use crate::lock::LockShared;
use crate::name::{LockName, Owner};
use crate::telemetry::{LostReason, Meter};

/// The holds this client's guards are part of, by lock, owner and token.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    map: Mutex<HoldMap>,
    /// Starts keepers (and hand-over confirmations) when they are due.
    pub(crate) deferred: Arc<Deferred>,
}

/// A hold's key: lock, owner, fencing token.
type HoldKey = (LockName, Owner, u64);

/// The holds of live guards, and the last holds a force release through this client freed:
/// a grant of one read after that (made before it: tokens are never reused) joins it lost.
/// One lock for both, taken once by every grant.
#[derive(Debug, Default)]
struct HoldMap {
    live: HashMap<HoldKey, Weak<Hold>>,
    revoked: VecDeque<HoldKey>,
}

/// How many force-released holds [`Holds`] remembers (a grant read after its release is
/// rare, and comes within a round trip of it).
const REVOKED_KEPT: usize = 16;

/// One hold as this process sees it.
#[derive(Debug)]
pub(crate) struct Hold {
    holds: Weak<Holds>,
    key: HoldKey,
    /// `true` once the lease is known (or must be assumed) lost. Never goes back.
    lost: watch::Sender<bool>,
    /// The local instant by which the store's lease has surely not ended yet: the moment the
    /// last successful grant or extension was *sent*, plus its lease. The store started its
    /// lease later than that and never shortens it, so as long as the two clocks run at the
    /// same rate this is on the safe side, and no timestamp crosses between them.
    deadline: watch::Sender<Instant>,
    /// How many live guards of this hold want the watchdog, and at what pace.
    watchdogs: watch::Sender<Watchdogs>,
    keeper: Mutex<Option<DeferredTask>>,
    /// When this process first held it, for `fairlock_hold_seconds`.
    since: Instant,
    meter: Meter,
}

/// The live guards of a hold that want the watchdog, by the watchdog lease each asked for:
/// guards of one owner may come from handles with other options than the one that made the
/// hold. The hold is renewed with the shortest of the live guards' leases, at a third of it.
#[derive(Clone, Debug, Default)]
struct Watchdogs(std::collections::BTreeMap<Duration, usize>);

impl Watchdogs {
    fn joined(&mut self, lease: Duration) {
        *self.0.entry(lease).or_default() += 1;
    }

    fn left(&mut self, lease: Duration) {
        if let Some(count) = self.0.get_mut(&lease) {
            *count -= 1;
            if *count == 0 {
                self.0.remove(&lease);
            }
        }
    }

    /// The lease to renew with, while any guard wants the watchdog.
    fn lease(&self) -> Option<Duration> {
        self.0.keys().next().copied()
    }
}

impl Holds {
    /// A force release through this client freed the hold `token` of `owner`: its guards here
    /// learn it now rather than at their next renewal.
    pub(crate) fn revoke(&self, name: &LockName, owner: &str, token: u64) {
        let Ok(owner) = Owner::new(owner) else {
            return;
        };
        let key = (name.clone(), owner, token);
        let hold = {
            let mut map = self.lock_map();
            if map.revoked.len() == REVOKED_KEPT {
                map.revoked.pop_front();
            }
            let hold = map.live.get(&key).and_then(Weak::upgrade);
            map.revoked.push_back(key);
            hold
        };
        if let Some(hold) = hold {
            hold.mark_lost(LostReason::Revoked);
        }
    }

    fn lock_map(&self) -> std::sync::MutexGuard<'_, HoldMap> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The hold of `token` with one more guard: the existing one if a live guard of it is in
    /// this process, else a new one with its keeper. `until`: the lease surely lasts until
    /// then.
    pub(crate) fn join(
        self: &Arc<Self>,
        shared: &Arc<LockShared>,
        token: u64,
        until: Instant,
        runtime: &Handle,
    ) -> Arc<Hold> {
        let watchdog = shared.options.lease.is_none();
        let key = (shared.name.clone(), shared.owner.clone(), token);
        // Declared before the map's guard, so it is dropped after it: dropping the last `Arc`
        // of a hold runs `Hold::drop`, which takes the map's lock.
        let mut stale = None;
        let mut map = self.lock_map();
        let revoked = map.revoked.contains(&key);
        if let Some(hold) = map.live.get(&key).and_then(Weak::upgrade) {
            // A hold already lost stays lost; a new grant of the same token means the store
            // still has it, so that guard starts a fresh record instead.
            if *hold.lost.borrow() || !hold.raise_deadline(until) {
                stale = Some(hold);
            } else {
                if watchdog {
                    let mut first = false;
                    hold.watchdogs.send_modify(|w| {
                        first = w.lease().is_none();
                        w.joined(shared.options.watchdog_lease);
                    });
                    if first {
                        // Renewals start now: a keeper not started yet must be by the first.
                        let renewal = Instant::now() + shared.options.watchdog_lease / 3;
                        if let Some(keeper) =
                            &*hold.keeper.lock().unwrap_or_else(|p| p.into_inner())
                        {
                            keeper.start_by(renewal);
                        }
                    }
                }
                return hold;
            }
        }
        let hold = Arc::new(Hold {
            holds: Arc::downgrade(self),
            key: key.clone(),
            lost: watch::Sender::new(revoked),
            deadline: watch::Sender::new(until),
            watchdogs: watch::Sender::new({
                let mut watchdogs = Watchdogs::default();
                if watchdog {
                    watchdogs.joined(shared.options.watchdog_lease);
                }
                watchdogs
            }),
            keeper: Mutex::new(None),
            since: Instant::now(),
            meter: shared.meter.clone(),
        });
        let span = tracing::info_span!(
            "fairlock.lease",
            lock = %shared.name,
            owner = %shared.owner,
            token
        );
        // The keeper's first work: the first renewal, or watching the deadline. It starts a
        // little before the deadline, so that its own timer flags a lapse on time and not a
        // scheduling step late.
        let now = Instant::now();
        let first_renewal = now + shared.options.watchdog_lease / 3;
        let head_start = (until.saturating_duration_since(now) / 10).min(KEEPER_HEAD_START);
        let start = if watchdog {
            first_renewal.min(until - head_start)
        } else {
            until - head_start
        };
        // A hold known freed has nothing to keep.
        if !revoked {
            let keeper = self.deferred.spawn_at(
                runtime,
                start,
                keep(shared.clone(), token, Arc::downgrade(&hold), first_renewal).instrument(span),
            );
            *hold.keeper.lock().unwrap_or_else(|p| p.into_inner()) = Some(keeper);
        }
        map.live.insert(key, Arc::downgrade(&hold));
        drop(map);
        drop(stale);
        hold
    }
}

impl Hold {
    /// Lost when flagged, or once the deadline has passed even if the keeper task has not
    /// run yet to flag it.
    pub(crate) fn is_lost(&self) -> bool {
        // The clock is read under the deadline's lock, as `raise_deadline` reads it: once this
        // has said true, no raise that started later can make it false.
        *self.lost.borrow() || {
            let deadline = self.deadline.borrow();
            Instant::now() >= *deadline
        }
    }

    /// Moves the deadline to `until` if that is later, unless it has passed already: a lease
    /// counted lost from its deadline on never comes back, even when the store's answer that
    /// renewed it in time is read only after. Whether the deadline had not passed.
    fn raise_deadline(&self, until: Instant) -> bool {
        let mut live = false;
        self.deadline.send_if_modified(|deadline| {
            live = Instant::now() < *deadline;
            if live && until > *deadline {
                *deadline = until;
                return true;
            }
            false
        });
        live
    }

    pub(crate) fn mark_lost(&self, why: LostReason) {
        if !self.lost.send_replace(true) {
            let (name, owner, token) = &self.key;
            warn!(
                lock = %name,
                owner = %owner,
                token,
                reason = %why.label(),
                "fairlock lease lost: {}",
                why.text()
            );
            self.meter.lease_lost(why.label());
        }
    }

    /// The local instant by which the store's lease has surely not ended yet.
    pub(crate) fn deadline(&self) -> Instant {
        *self.deadline.borrow()
    }

    /// Records a successful extension sent at `sent` for `lease`: the store's lease now ends
    /// no earlier than that. If the local deadline had passed by then, the hold has been
    /// reported lost since, and stays so: it is marked lost (`late`) and this returns `false`.
    #[must_use]
    pub(crate) fn extended(&self, sent: Instant, lease: Duration, late: LostReason) -> bool {
        let live = self.raise_deadline(sent + lease);
        if !live {
            self.mark_lost(late);
        }
        live
    }

    pub(crate) fn lost_receiver(&self) -> watch::Receiver<bool> {
        self.lost.subscribe()
    }

    /// A guard with the watchdog (of this watchdog lease) is gone.
    pub(crate) fn watchdog_left(&self, lease: Duration) {
        self.watchdogs.send_modify(|w| w.left(lease));
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.meter.held(self.since.elapsed());
        if let Some(keeper) = self
            .keeper
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            keeper.abort();
        }
        if let Some(holds) = self.holds.upgrade() {
            let mut map = holds.lock_map();
            // Only our own entry: a newer hold with the same key may have replaced it.
            if map
                .live
                .get(&self.key)
                .is_some_and(|w| w.strong_count() == 0)
            {
                map.live.remove(&self.key);
            }
        }
    }
}

/// How a renewal ended, waited for by [`renew_before_deadline`].
enum Renewal<T> {
    Answered(T),
    /// The hold's deadline passed first.
    TimedOut,
    /// The hold is gone.
    HoldGone,
}

/// Waits for `renewal` until the hold's deadline, following the deadline while it waits: a
/// re-entry may raise it, and the renewal is then given until the raised one.
async fn renew_before_deadline<T>(
    renewal: impl std::future::Future<Output = T>,
    deadline_rx: &mut watch::Receiver<Instant>,
) -> Renewal<T> {
    let mut renewal = std::pin::pin!(renewal);
    loop {
        let deadline = *deadline_rx.borrow_and_update();
        tokio::select! {
            biased;
            renewed = &mut renewal => return Renewal::Answered(renewed),
            changed = deadline_rx.changed() => {
                if changed.is_err() {
                    return Renewal::HoldGone;
                }
            }
            _ = sleep_until(deadline) => if passed(deadline_rx) {
                return Renewal::TimedOut;
            },
        }
    }
}

/// Whether the hold's deadline, as it is now, has passed. The clock is read under the
/// deadline's lock, as `Hold::raise_deadline` reads it, so a raise that this misses can no
/// longer succeed.
fn passed(deadline_rx: &watch::Receiver<Instant>) -> bool {
    let deadline = deadline_rx.borrow();
    Instant::now() >= *deadline
}

/// How long before a hold's deadline its keeper starts at the latest (if the hold got no
/// renewal or earlier start by then).
const KEEPER_HEAD_START: Duration = Duration::from_millis(100);

/// The keeper task of one hold. While any guard wants the watchdog it renews every third of
/// the watchdog lease, and it flags the lease lost when the deadline passes unrenewed or the
/// store says the hold is gone. Aborted with the hold.
///
/// It starts when it first has work (see [`Holds::join`]): if a guard wants the watchdog by
/// then, it renews at `first_renewal`, at once if that has passed.
async fn keep(shared: Arc<LockShared>, token: u64, hold: Weak<Hold>, first_renewal: Instant) {
    let Some(strong) = hold.upgrade() else { return };
    let mut deadline_rx = strong.deadline.subscribe();
    let mut watchdogs_rx = strong.watchdogs.subscribe();
    drop(strong);
    let mut next_renewal: Option<Instant> = None;
    let mut renewing = false;
    let mut first_pass = true;
    loop {
        let deadline = *deadline_rx.borrow_and_update();
        let lease = watchdogs_rx.borrow_and_update().lease();
        let wanted = lease.is_some();
        // Unused while nobody wants the watchdog.
        let watchdog_lease = lease.unwrap_or(shared.options.watchdog_lease);
        if wanted && !renewing {
            // At first, the renewal planned with the hold (sooner if a guard joined since
            // with a shorter watchdog lease); later, a guard wanting the watchdog joined a hold
            // whose guards had none, and renewals start from now.
            let from_now = Instant::now() + watchdog_lease / 3;
            let at = if first_pass {
                first_renewal.min(from_now)
            } else {
                from_now
            };
            next_renewal = Some(next_renewal.map_or(at, |n| n.min(at)));
        } else if !wanted && renewing {
            next_renewal = None;
        }
        renewing = wanted;
        first_pass = false;
        tokio::select! {
            biased;
            _ = sleep_until(deadline) => {
                // An extension may have raised the deadline just before it passed, the
                // keeper polled only after: the deadline as it is now decides.
                if !passed(&deadline_rx) {
                    continue;
                }
                if let Some(hold) = hold.upgrade() {
                    hold.mark_lost(LostReason::Expired);
                }
                return;
            }
            _ = deadline_rx.changed() => {}
            _ = watchdogs_rx.changed() => {}
            _ = sleep_until(next_renewal.unwrap_or(deadline)), if next_renewal.is_some() => {
                let lease = watchdog_lease;
                let sent = Instant::now();
                let renewal = shared.backend.extend(&shared.name, &shared.owner, token, lease);
                let renewed = renew_before_deadline(renewal, &mut deadline_rx).await;
                let Some(hold) = hold.upgrade() else { return };
                match renewed {
                    Renewal::HoldGone => return,
                    Renewal::Answered(Ok(true)) => {
                        debug!(lock = %shared.name, owner = %shared.owner, token, "fairlock lease renewed");
                        shared.meter.renewal("renewed");
                        // Renewed in time by the store, but maybe read past the local deadline.
                        if !hold.extended(sent, lease, LostReason::RenewalTimedOut) {
                            return;
                        }
                        next_renewal = renewing.then(|| sent + watchdog_lease / 3);
                    }
                    Renewal::Answered(Ok(false)) => {
                        shared.meter.renewal("refused");
                        hold.mark_lost(LostReason::Revoked);
                        return;
                    }
                    Renewal::Answered(Err(err)) => {
                        shared.meter.renewal("failed");
                        warn!(lock = %shared.name, owner = %shared.owner, token, error = %err, "fairlock lease renewal failed; retrying");
                        // Retry well before the deadline, but do not hammer a failing store.
                        let pause = (lease / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
                        next_renewal = Some(Instant::now() + pause);
                    }
                    Renewal::TimedOut => {
                        shared.meter.renewal("timed_out");
                        hold.mark_lost(LostReason::RenewalTimedOut);
                        return;
                    }
                }
            }
        }
    }
}

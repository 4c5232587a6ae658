//! [`MemoryBackend`]: the whole lock state machine, in process.
//!
//! This module is the reference reading of the [`LockBackend`] contract: every operation is
//! one function over [`LockEntry`] under one mutex. The Redis scripts in `lua/` implement the
//! same transitions.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, Grant, HolderState, LockBackend, LockState,
    LockSummary, ReleaseOutcome, WaiterState, Wake, WakeSender, Watch, RESEND_HORIZON,
};
use crate::error::Result;
use crate::name::{LockName, Owner};
use crate::options::check_max;

/// A lock store inside this process: for tests, and for programs whose contenders all live
/// in one process.
///
/// It keeps the full [`LockBackend`] contract, measuring leases and waiter deadlines with
/// Tokio's clock, so tests can run it under paused time (`#[tokio::test(start_paused =
/// true)]`). Cloning gives another handle to the same locks. Fencing tokens come from one
/// counter per backend, so they strictly increase per lock name (and across names).
///
/// ```
/// use fairlock::{LockClient, MemoryBackend};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fairlock::Result<()> {
/// let client = LockClient::new(MemoryBackend::new());
/// let guard = client.fair_lock("reports")?.lock().await?;
/// guard.unlock().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct MemoryBackend {
    shared: Arc<Mutex<Store>>,
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let store = self.store();
        f.debug_struct("MemoryBackend")
            .field("locks", &store.locks.len())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Store {
    locks: HashMap<LockName, LockEntry>,
    last_token: u64,
    watchers: Watchers,
    /// Spent attempts (granted a level at some point, or ended): a spent attempt is never
    /// granted again. The value: a release removed its level, so a re-sent release answers
    /// `Released` even once the hold is gone, as the first did.
    spent: Remembered<(LockName, AttemptId), bool>,
    /// Holds (lock, token) a force release freed: that force release sent again answers
    /// `true` as it did.
    forced: Remembered<(LockName, u64), ()>,
}

/// Each owner's watches of each lock.
type Watchers = HashMap<(LockName, Owner), Vec<WakeSender>>;

/// Records kept for [`RESEND_HORIZON`] from their last write (or from the later time a write
/// names), forgotten in order of expiry.
struct Remembered<K, V> {
    records: HashMap<K, (Instant, V)>,
    by_expiry: BTreeSet<(Instant, K)>,
}

impl<K, V> Default for Remembered<K, V> {
    fn default() -> Self {
        Remembered {
            records: HashMap::new(),
            by_expiry: BTreeSet::new(),
        }
    }
}

impl<K: Clone + Eq + Ord + std::hash::Hash, V> Remembered<K, V> {
    fn get(&self, key: &K) -> Option<&V> {
        self.records.get(key).map(|(_, value)| value)
    }

    fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.records.get_mut(key).map(|(_, value)| value)
    }

    /// Records `value` for `key` until a horizon from `from` (or later, if an earlier record
    /// lasts longer); returns the record it replaces.
    fn insert(&mut self, key: K, value: V, from: Instant) -> Option<V> {
        let before = self.records.get(&key).map(|(until, _)| *until);
        let fresh = from + RESEND_HORIZON;
        let until = before.map_or(fresh, |before| before.max(fresh));
        if before != Some(until) {
            if let Some(before) = before {
                self.by_expiry.remove(&(before, key.clone()));
            }
            self.by_expiry.insert((until, key.clone()));
        }
        self.records
            .insert(key, (until, value))
            .map(|(_, before)| before)
    }

    /// Forgets the records whose horizon has passed.
    fn forget(&mut self, now: Instant) {
        while let Some((until, _)) = self.by_expiry.first() {
            if *until > now {
                break;
            }
            if let Some((_, key)) = self.by_expiry.pop_first() {
                self.records.remove(&key);
            }
        }
    }
}

#[derive(Default)]
struct LockEntry {
    holder: Option<Holder>,
    /// The FIFO queue: enqueue sequence number -> waiter.
    queue: BTreeMap<u64, Waiter>,
    /// Attempt -> its sequence number, so an attempt is queued once and found in O(log n).
    seq_of: HashMap<AttemptId, u64>,
    /// (liveness deadline, sequence number): expired waiters are evicted from the front.
    deadlines: BTreeSet<(Instant, u64)>,
    next_seq: u64,
}

struct Holder {
    owner: Owner,
    token: u64,
    /// The confirmed levels: one per attempt that holds.
    levels: BTreeSet<AttemptId>,
    /// The level granted by a hand-over and not confirmed yet, and when it lapses.
    pending: Option<(AttemptId, Instant)>,
    /// The hold's one lease.
    expires: Instant,
}

impl Holder {
    fn count(&self) -> u32 {
        let count = self.levels.len() + usize::from(self.pending.is_some());
        u32::try_from(count).unwrap_or(u32::MAX)
    }

    fn grant(&self) -> Grant {
        Grant {
            token: self.token,
            hold_count: self.count(),
        }
    }

    /// The lease never gets shorter: another level may rely on it.
    fn lengthen(&mut self, lease: Duration, now: Instant) {
        self.expires = self.expires.max(now + lease);
    }

    /// When the hold ends if nothing changes: its lease, or sooner when its only level is a
    /// pending one that lapses first.
    fn ends(&self) -> Instant {
        match self.pending {
            Some((_, until)) if self.levels.is_empty() => until.min(self.expires),
            _ => self.expires,
        }
    }

    /// Turns a pending level into a confirmed one.
    fn confirm(&mut self) {
        if let Some((attempt, _)) = self.pending.take() {
            self.levels.insert(attempt);
        }
    }

    /// Removes the level of `attempt`; whether it had one.
    fn remove(&mut self, attempt: AttemptId) -> bool {
        if self.pending.is_some_and(|(pending, _)| pending == attempt) {
            self.pending = None;
            return true;
        }
        self.levels.remove(&attempt)
    }
}

struct Waiter {
    owner: Owner,
    attempt: AttemptId,
    deadline: Instant,
    ttl: Duration,
}

impl LockEntry {
    /// Applies the passage of time: a lapsed pending level ends, an expired lease (or a hold
    /// left with no level) frees the lock, expired waiters leave.
    fn expire(&mut self, now: Instant) {
        if let Some(holder) = self.holder.as_mut() {
            if holder.pending.is_some_and(|(_, until)| until <= now) {
                holder.pending = None;
            }
            if holder.expires <= now || holder.count() == 0 {
                self.holder = None;
            }
        }
        while let Some(&(deadline, seq)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(waiter) = self.queue.remove(&seq) {
                self.seq_of.remove(&waiter.attempt);
            }
        }
    }

    fn is_idle(&self) -> bool {
        self.holder.is_none() && self.queue.is_empty()
    }

    fn head(&self) -> Option<&Waiter> {
        self.queue.first_key_value().map(|(_, w)| w)
    }

    fn dequeue(&mut self, attempt: AttemptId) -> Option<Waiter> {
        let seq = self.seq_of.remove(&attempt)?;
        let waiter = self.queue.remove(&seq)?;
        self.deadlines.remove(&(waiter.deadline, seq));
        Some(waiter)
    }

    fn enqueue_or_refresh(&mut self, req: &AcquireRequest, now: Instant) {
        let deadline = now + req.waiter_ttl;
        if let Some(&seq) = self.seq_of.get(&req.attempt) {
            if let Some(waiter) = self.queue.get_mut(&seq) {
                self.deadlines.remove(&(waiter.deadline, seq));
                waiter.deadline = deadline;
                waiter.ttl = req.waiter_ttl;
                self.deadlines.insert((deadline, seq));
                return;
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.seq_of.insert(req.attempt, seq);
        self.queue.insert(
            seq,
            Waiter {
                owner: req.owner.clone(),
                attempt: req.attempt,
                deadline,
                ttl: req.waiter_ttl,
            },
        );
        self.deadlines.insert((deadline, seq));
    }
}

impl Store {
    /// The lock's entry, with what has expired by `now` gone. When that clears dead waiters
    /// in front of a free lock, the new head is told to look again.
    fn entry(&mut self, name: &LockName, now: Instant) -> &mut LockEntry {
        let Store {
            locks, watchers, ..
        } = self;
        let entry = locks.entry(name.clone()).or_default();
        let head_before = entry.head().map(|w| w.attempt);
        entry.expire(now);
        if entry.holder.is_none() && head_before.is_some() {
            if let Some(head) = entry.head().filter(|w| Some(w.attempt) != head_before) {
                wake(watchers, name, &head.owner, Wake::Recheck);
            }
        }
        entry
    }

    /// Drops the entry if nothing is left in it: nothing is left behind.
    fn tidy(&mut self, name: &LockName) {
        if self.locks.get(name).is_some_and(LockEntry::is_idle) {
            self.locks.remove(name);
        }
    }

    /// Forgets spent attempts and force-released tokens whose horizon has passed.
    fn forget_spent(&mut self, now: Instant) {
        self.forced.forget(now);
        self.spent.forget(now);
    }

    fn is_spent(&self, name: &LockName, attempt: AttemptId) -> bool {
        self.spent.get(&(name.clone(), attempt)).is_some()
    }

    /// Records that `attempt` is spent until a horizon from `from` (keeping whether it was
    /// released); returns whether it was released, if it was spent before.
    fn spend(&mut self, name: &LockName, attempt: AttemptId, from: Instant) -> Option<bool> {
        let key = (name.clone(), attempt);
        let released = self.spent.get(&key).copied().unwrap_or(false);
        self.spent.insert(key, released, from)
    }

    /// The lock has just become free: hand it to the head waiter as a pending grant.
    fn hand_over(&mut self, name: &LockName, now: Instant) {
        let token = self.last_token + 1;
        let entry = self.entry(name, now);
        let Some(attempt) = entry.head().map(|w| w.attempt) else {
            return;
        };
        let Some(waiter) = entry.dequeue(attempt) else {
            return;
        };
        let until = now + waiter.ttl;
        // Spent until a horizon after the pending level lapses: the waiter may send its
        // acquire until then, and that request may arrive a horizon later.
        self.spend(name, attempt, until);
        let entry = self.entry(name, now);
        entry.holder = Some(Holder {
            owner: waiter.owner.clone(),
            token,
            levels: BTreeSet::new(),
            pending: Some((attempt, until)),
            expires: until,
        });
        self.last_token = token;
        let grant = Grant {
            token,
            hold_count: 1,
        };
        self.wake(name, &waiter.owner, Wake::Granted { attempt, grant });
    }

    fn wake(&mut self, name: &LockName, owner: &Owner, message: Wake) {
        wake(&mut self.watchers, name, owner, message);
    }

    fn acquire(&mut self, req: &AcquireRequest, now: Instant) -> AcquireOutcome {
        self.forget_spent(now);
        let spent = self.is_spent(&req.name, req.attempt);
        let token = self.last_token + 1;
        let entry = self.entry(&req.name, now);
        if let Some(holder) = entry.holder.as_mut() {
            if holder.levels.contains(&req.attempt) {
                // Applied before (a re-sent request, or a reply that was lost): the same grant.
                return AcquireOutcome::Granted(holder.grant());
            }
            if holder.pending.is_some_and(|(p, _)| p == req.attempt) {
                holder.confirm();
                holder.lengthen(req.lease, now);
                return AcquireOutcome::Granted(holder.grant());
            }
        }
        if spent {
            // Ended, or its hold ended: a request of it that comes late changes nothing.
            self.tidy(&req.name);
            return AcquireOutcome::Busy;
        }
        if let Some(holder) = entry.holder.as_mut().filter(|h| h.owner == req.owner) {
            // Re-entry: one more level, for this attempt.
            holder.levels.insert(req.attempt);
            holder.lengthen(req.lease, now);
            let grant = holder.grant();
            entry.dequeue(req.attempt);
            self.spend(&req.name, req.attempt, now);
            return AcquireOutcome::Granted(grant);
        }
        let is_head = entry.head().is_none_or(|w| w.attempt == req.attempt);
        if entry.holder.is_none() && is_head {
            entry.dequeue(req.attempt);
            entry.holder = Some(Holder {
                owner: req.owner.clone(),
                token,
                levels: BTreeSet::from([req.attempt]),
                pending: None,
                expires: now + req.lease,
            });
            self.last_token = token;
            self.spend(&req.name, req.attempt, now);
            return AcquireOutcome::Granted(Grant {
                token,
                hold_count: 1,
            });
        }
        if !req.queue {
            self.tidy(&req.name);
            return AcquireOutcome::Busy;
        }
        entry.enqueue_or_refresh(req, now);
        let retry_after = match (&entry.holder, entry.head()) {
            (Some(holder), Some(head)) if head.attempt == req.attempt => {
                Some(holder.ends().saturating_duration_since(now))
            }
            _ => None,
        };
        AcquireOutcome::Queued {
            retry_after,
            last_token: self.last_token,
        }
    }

    fn release(
        &mut self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        attempt: AttemptId,
        now: Instant,
    ) -> ReleaseOutcome {
        self.forget_spent(now);
        // A release of it removed its level before: this is that release again, and answers
        // as it did (the levels left, 0 once the hold is gone), not as a lost lease.
        let released = self.spend(name, attempt, now) == Some(true);
        let entry = self.entry(name, now);
        let Some(holder) = entry
            .holder
            .as_mut()
            .filter(|h| h.owner == *owner && h.token == token)
        else {
            self.tidy(name);
            return if released {
                ReleaseOutcome::Released { remaining: 0 }
            } else {
                ReleaseOutcome::NotHeld
            };
        };
        if !holder.remove(attempt) {
            return if released {
                ReleaseOutcome::Released {
                    remaining: holder.count(),
                }
            } else {
                ReleaseOutcome::NotHeld
            };
        }
        let remaining = holder.count();
        if remaining == 0 {
            entry.holder = None;
        }
        if let Some(released) = self.spent.get_mut(&(name.clone(), attempt)) {
            *released = true;
        }
        if remaining == 0 {
            self.hand_over(name, now);
            self.tidy(name);
        }
        ReleaseOutcome::Released { remaining }
    }

    fn extend(
        &mut self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
        now: Instant,
    ) -> bool {
        let entry = self.entry(name, now);
        let extended = match entry.holder.as_mut() {
            Some(holder) if holder.owner == *owner && holder.token == token => {
                // A pending level is confirmed by its own attempt only: another level's
                // renewal must not keep a dead grantee's level alive.
                holder.lengthen(lease, now);
                true
            }
            _ => false,
        };
        self.tidy(name);
        extended
    }

    fn abandon(&mut self, name: &LockName, owner: &Owner, attempt: AttemptId, now: Instant) {
        self.forget_spent(now);
        self.spend(name, attempt, now);
        let entry = self.entry(name, now);
        let was_head = entry.head().is_some_and(|w| w.attempt == attempt);
        entry.dequeue(attempt);
        let mut freed = false;
        if let Some(holder) = entry.holder.as_mut() {
            if holder.owner == *owner && holder.remove(attempt) && holder.count() == 0 {
                entry.holder = None;
                freed = true;
            }
        }
        if freed {
            self.hand_over(name, now);
        } else if was_head && entry.holder.is_none() {
            // The lock is free: the new head may take it now rather than at its heartbeat.
            if let Some(head) = entry.head().map(|w| w.owner.clone()) {
                self.wake(name, &head, Wake::Recheck);
            }
        }
        self.tidy(name);
    }

    fn force_release(&mut self, name: &LockName, token: u64, now: Instant) -> bool {
        self.forget_spent(now);
        let entry = self.entry(name, now);
        let held = entry.holder.as_ref().is_some_and(|h| h.token == token);
        if held {
            entry.holder = None;
            self.forced.insert((name.clone(), token), (), now);
            self.hand_over(name, now);
        }
        self.tidy(name);
        // Freed before, by this request's first copy: answered as it was.
        held || self.forced.get(&(name.clone(), token)).is_some()
    }

    /// The holder, without walking the queue.
    fn holder_state(&mut self, name: &LockName, now: Instant) -> Option<HolderState> {
        self.entry(name, now).holder.as_ref().map(|h| HolderState {
            owner: h.owner.to_string(),
            hold_count: h.count(),
            token: h.token,
            lease_remaining: h.expires.saturating_duration_since(now),
            confirmed: h.pending.is_none(),
        })
    }

    fn inspect(&mut self, name: &LockName, now: Instant) -> LockState {
        let holder = self.holder_state(name, now);
        let entry = self.entry(name, now);
        let state = LockState {
            name: name.to_string(),
            holder,
            waiters: entry
                .queue
                .values()
                .map(|w| WaiterState {
                    owner: w.owner.to_string(),
                    attempt: w.attempt,
                    deadline_in: w.deadline.saturating_duration_since(now),
                })
                .collect(),
        };
        self.tidy(name);
        state
    }
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        // A panic while holding this mutex can only come from a bug in this module; the data
        // is still consistent per operation, so keep going rather than poison every caller.
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Sends `message` to every watch of `owner` on the lock, forgetting the closed ones.
fn wake(watchers: &mut Watchers, name: &LockName, owner: &Owner, message: Wake) {
    let key = (name.clone(), owner.clone());
    if let Some(senders) = watchers.get_mut(&key) {
        senders.retain(|s| s.send(message));
        if senders.is_empty() {
            watchers.remove(&key);
        }
    }
}

/// Unregisters a watch when it is dropped.
struct Registration {
    shared: Weak<Mutex<Store>>,
    key: (LockName, Owner),
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            let mut store = shared.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(senders) = store.watchers.get_mut(&self.key) {
                senders.retain(|s| !s.is_closed());
                if senders.is_empty() {
                    store.watchers.remove(&self.key);
                }
            }
        }
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
        // The core never sends a duration past the limit; a direct caller gets an error before
        // anything changes (the store's instants could not hold the end).
        check_max("lease", request.lease)?;
        check_max("waiter TTL", request.waiter_ttl)?;
        Ok(self.store().acquire(request, Instant::now()))
    }

    async fn release(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        attempt: AttemptId,
    ) -> Result<ReleaseOutcome> {
        Ok(self
            .store()
            .release(name, owner, token, attempt, Instant::now()))
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> Result<bool> {
        check_max("lease", lease)?;
        Ok(self
            .store()
            .extend(name, owner, token, lease, Instant::now()))
    }

    async fn abandon(&self, name: &LockName, owner: &Owner, attempt: AttemptId) -> Result<()> {
        self.store().abandon(name, owner, attempt, Instant::now());
        Ok(())
    }

    async fn force_release(&self, name: &LockName, token: u64) -> Result<bool> {
        Ok(self.store().force_release(name, token, Instant::now()))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        Ok(self.store().inspect(name, Instant::now()))
    }

    async fn holder(&self, name: &LockName) -> Result<Option<HolderState>> {
        let now = Instant::now();
        let mut store = self.store();
        let holder = store.holder_state(name, now);
        store.tidy(name);
        Ok(holder)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>> {
        let now = Instant::now();
        let mut store = self.store();
        let names: Vec<LockName> = store
            .locks
            .keys()
            .filter(|n| n.as_str().starts_with(prefix))
            .cloned()
            .collect();
        let mut out = Vec::new();
        for name in names {
            let entry = store.entry(&name, now);
            if !entry.is_idle() {
                out.push(LockSummary {
                    name: name.to_string(),
                    holder: entry.holder.as_ref().map(|h| h.owner.to_string()),
                    waiters: entry.queue.len(),
                });
            }
            store.tidy(&name);
        }
        Ok(out)
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    async fn watch(&self, name: &LockName, owner: &Owner) -> Result<Watch> {
        let (sender, watch) = Watch::channel();
        let key = (name.clone(), owner.clone());
        self.store()
            .watchers
            .entry(key.clone())
            .or_default()
            .push(sender);
        Ok(watch.with_registration(Registration {
            shared: Arc::downgrade(&self.shared),
            key,
        }))
    }
}

impl MemoryBackend {
    /// How many locks are held or have live waiters, once what has expired is cleared (the
    /// entries of the others go then). Lets tests check that nothing is left behind.
    pub fn lock_count(&self) -> usize {
        let now = Instant::now();
        let mut store = self.store();
        store.locks.retain(|_, entry| {
            entry.expire(now);
            !entry.is_idle()
        });
        store.locks.len()
    }
}

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
    AcquireOutcome, AcquireRequest, Grant, HolderState, LockBackend, LockState, LockSummary,
    ReleaseOutcome, WaiterState, Wake, WakeSender, Watch,
};
use crate::error::Result;
use crate::name::{LockName, Owner};

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
    watchers: HashMap<(LockName, Owner), Vec<WakeSender>>,
}

#[derive(Default)]
struct LockEntry {
    holder: Option<Holder>,
    /// The FIFO queue: enqueue sequence number -> waiter.
    queue: BTreeMap<u64, Waiter>,
    /// Owner -> its sequence number, so an owner is queued once and found in O(log n).
    seq_of: HashMap<Owner, u64>,
    /// (liveness deadline, sequence number): expired waiters are evicted from the front.
    deadlines: BTreeSet<(Instant, u64)>,
    next_seq: u64,
}

struct Holder {
    owner: Owner,
    count: u32,
    token: u64,
    expires: Instant,
    /// `Some(lease)` while this is an unconfirmed hand-over: `lease` is what the waiter asked for.
    pending: Option<Duration>,
}

struct Waiter {
    owner: Owner,
    deadline: Instant,
    ttl: Duration,
}

impl LockEntry {
    /// Applies the passage of time: an expired lease frees the lock, expired waiters leave.
    fn expire(&mut self, now: Instant) {
        if self.holder.as_ref().is_some_and(|h| h.expires <= now) {
            self.holder = None;
        }
        while let Some(&(deadline, seq)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(waiter) = self.queue.remove(&seq) {
                self.seq_of.remove(&waiter.owner);
            }
        }
    }

    fn is_idle(&self) -> bool {
        self.holder.is_none() && self.queue.is_empty()
    }

    fn head(&self) -> Option<&Waiter> {
        self.queue.first_key_value().map(|(_, w)| w)
    }

    fn dequeue(&mut self, owner: &Owner) -> Option<Waiter> {
        let seq = self.seq_of.remove(owner)?;
        let waiter = self.queue.remove(&seq)?;
        self.deadlines.remove(&(waiter.deadline, seq));
        Some(waiter)
    }

    fn enqueue_or_refresh(&mut self, owner: &Owner, ttl: Duration, now: Instant) {
        let deadline = now + ttl;
        if let Some(&seq) = self.seq_of.get(owner) {
            let waiter = self.queue.get_mut(&seq).expect("seq_of and queue agree");
            self.deadlines.remove(&(waiter.deadline, seq));
            waiter.deadline = deadline;
            waiter.ttl = ttl;
            self.deadlines.insert((deadline, seq));
        } else {
            let seq = self.next_seq;
            self.next_seq += 1;
            self.seq_of.insert(owner.clone(), seq);
            self.queue.insert(
                seq,
                Waiter {
                    owner: owner.clone(),
                    deadline,
                    ttl,
                },
            );
            self.deadlines.insert((deadline, seq));
        }
    }
}

impl Store {
    fn entry(&mut self, name: &LockName, now: Instant) -> &mut LockEntry {
        let entry = self.locks.entry(name.clone()).or_default();
        entry.expire(now);
        entry
    }

    /// Drops the entry if nothing is left in it: nothing is left behind.
    fn tidy(&mut self, name: &LockName) {
        if self.locks.get(name).is_some_and(LockEntry::is_idle) {
            self.locks.remove(name);
        }
    }

    /// The lock has just become free: hand it to the head waiter as a pending grant.
    fn hand_over(&mut self, name: &LockName, now: Instant) {
        let token = self.last_token + 1;
        let entry = self.entry(name, now);
        let Some(head) = entry.head().map(|w| w.owner.clone()) else {
            return;
        };
        let waiter = entry.dequeue(&head).expect("head is queued");
        entry.holder = Some(Holder {
            owner: waiter.owner.clone(),
            count: 1,
            token,
            expires: now + waiter.ttl,
            pending: Some(waiter.ttl),
        });
        self.last_token = token;
        self.wake(
            name,
            &waiter.owner,
            Wake::Granted(Grant {
                token,
                hold_count: 1,
            }),
        );
    }

    fn wake(&mut self, name: &LockName, owner: &Owner, wake: Wake) {
        let key = (name.clone(), owner.clone());
        if let Some(senders) = self.watchers.get_mut(&key) {
            senders.retain(|s| s.send(wake));
            if senders.is_empty() {
                self.watchers.remove(&key);
            }
        }
    }

    fn acquire(&mut self, req: &AcquireRequest, now: Instant) -> AcquireOutcome {
        let token = self.last_token + 1;
        let entry = self.entry(&req.name, now);
        if let Some(holder) = entry.holder.as_mut() {
            if holder.owner == req.owner {
                if holder.pending.take().is_none() {
                    holder.count += 1;
                }
                holder.expires = now + req.lease;
                let grant = Grant {
                    token: holder.token,
                    hold_count: holder.count,
                };
                // A waiter that was queued while also holding (shared owner) keeps no place.
                entry.dequeue(&req.owner);
                return AcquireOutcome::Granted(grant);
            }
        }
        let is_head = entry.head().is_none_or(|w| w.owner == req.owner);
        if entry.holder.is_none() && is_head {
            entry.dequeue(&req.owner);
            entry.holder = Some(Holder {
                owner: req.owner.clone(),
                count: 1,
                token,
                expires: now + req.lease,
                pending: None,
            });
            self.last_token = token;
            return AcquireOutcome::Granted(Grant {
                token,
                hold_count: 1,
            });
        }
        if !req.queue {
            self.tidy(&req.name);
            return AcquireOutcome::Busy;
        }
        entry.enqueue_or_refresh(&req.owner, req.waiter_ttl, now);
        let retry_after = match (&entry.holder, entry.head()) {
            (Some(holder), Some(head)) if head.owner == req.owner => {
                Some(holder.expires.saturating_duration_since(now))
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
        now: Instant,
    ) -> ReleaseOutcome {
        let entry = self.entry(name, now);
        let Some(holder) = entry
            .holder
            .as_mut()
            .filter(|h| h.owner == *owner && h.token == token)
        else {
            self.tidy(name);
            return ReleaseOutcome::NotHeld;
        };
        holder.count -= 1;
        let remaining = holder.count;
        if remaining == 0 {
            entry.holder = None;
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
                holder.pending = None;
                holder.expires = now + lease;
                true
            }
            _ => false,
        };
        self.tidy(name);
        extended
    }

    fn leave_queue(&mut self, name: &LockName, owner: &Owner, now: Instant) {
        let entry = self.entry(name, now);
        entry.dequeue(owner);
        let pending_for_owner = entry
            .holder
            .as_ref()
            .is_some_and(|h| h.owner == *owner && h.pending.is_some());
        if pending_for_owner {
            entry.holder = None;
            self.hand_over(name, now);
        }
        self.tidy(name);
    }

    fn force_release(&mut self, name: &LockName, now: Instant) -> bool {
        let entry = self.entry(name, now);
        let was_held = entry.holder.take().is_some();
        if was_held {
            self.hand_over(name, now);
        }
        self.tidy(name);
        was_held
    }

    fn inspect(&mut self, name: &LockName, now: Instant) -> LockState {
        let entry = self.entry(name, now);
        let state = LockState {
            name: name.to_string(),
            holder: entry.holder.as_ref().map(|h| HolderState {
                owner: h.owner.to_string(),
                hold_count: h.count,
                token: h.token,
                lease_remaining: h.expires.saturating_duration_since(now),
                confirmed: h.pending.is_none(),
            }),
            waiters: entry
                .queue
                .values()
                .map(|w| WaiterState {
                    owner: w.owner.to_string(),
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
        Ok(self.store().acquire(request, Instant::now()))
    }

    async fn release(&self, name: &LockName, owner: &Owner, token: u64) -> Result<ReleaseOutcome> {
        Ok(self.store().release(name, owner, token, Instant::now()))
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> Result<bool> {
        Ok(self
            .store()
            .extend(name, owner, token, lease, Instant::now()))
    }

    async fn leave_queue(&self, name: &LockName, owner: &Owner) -> Result<()> {
        self.store().leave_queue(name, owner, Instant::now());
        Ok(())
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        Ok(self.store().force_release(name, Instant::now()))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        Ok(self.store().inspect(name, Instant::now()))
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
    /// How many locks currently occupy memory (held, or with waiters not yet evicted).
    /// Lets tests check that nothing is left behind.
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

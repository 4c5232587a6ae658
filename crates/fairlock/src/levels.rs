//! What a handle knows of its owner's levels in the store, so that a level the store kept
//! but the handle gave up (a release a failover lost, or one that failed past the outage
//! budget) is never re-entered.
//!
//! Re-entering such a stale level would reuse its old fencing token (a resource that saw a
//! later one refuses the holder), and since every re-entry renews the lease, a stale level
//! of an owner that keeps locking would keep every other owner waiting without bound.
//!
//! A handle from [`LockClient::fair_lock`](crate::LockClient::fair_lock) has an owner of its
//! own, so every level of that owner in the store belongs to one of its attempts: a live
//! guard, an attempt in progress, or the release or abandon of one, still on its way. Each of
//! those holds a [`LevelTicket`] until it is done with the store. A grant whose hold count is
//! larger than the number of tickets therefore includes a level nobody will release. When
//! the attempt that found it is the handle's only one, it frees the hold
//! (`force_release` of that token: the lock goes to the owner waiting first) and queues
//! anew. The token is remembered: a grant of it is not used (it is freed once more), so a
//! call that re-entered the hold meanwhile, or a `force_release` that arrives late, cannot
//! cost a guard of this handle its level.
//! Owners shared through [`fair_lock_as`](crate::LockClient::fair_lock_as) may hold levels
//! in other handles and processes: their grants are not checked, and neither are those of a
//! handle whose owner was handed out (`owner()` of the handle or a guard), since it may be
//! shared that way. Such a handle's grants of a hold it set out to free are used too (another
//! handle may have re-entered that hold, which a failed force release left in place), but
//! never freed again (that would take the other handle's level), and used only once none of
//! its force releases can still reach the store, as far as the contract's horizon goes: while
//! one is under way, and for [`RESEND_HORIZON`] after one ended without an answer (it failed,
//! timed out or was dropped, and the client may send it again), such a grant is neither used
//! nor freed; the call gives its level up and asks again after a pause of about a second
//! (within its deadline; `try_lock` asks twice without the pause, then reports
//! `WouldBlock`). A handle sharing the owner through `fair_lock_as` has no such record: a
//! force release of this handle can free a hold it re-entered meanwhile. Its guards of that
//! hold learn it at once when the force release answers (as after `force_unlock` through the
//! same client), else at their next renewal.
//!
//! A release or abandon still on its way holds its ticket, and its level may still be in the
//! hold: a grant that finds one waits (briefly) for them to finish before freeing, so that a
//! guard dropped just before the next `lock()` does not hide a stale level. A ticket dropped
//! after the grant's call was sent (a release or abandon that finished) may have taken its
//! level away after the store counted it: that grant is counted again too, a few times. If
//! tickets keep being dropped around every count, a count they may explain is neither used
//! nor freed: the attempt gives its level up and starts over.
//!
//! Every wait for releases on their way is bounded (a second, and the caller's deadline):
//! a release slower than that is judged as if it had not happened, so its level counts as
//! live while its ticket does.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::RESEND_HORIZON;

/// How many freed tokens a handle remembers: a `force_release` that may still be on its way
/// must not meet a level this handle added to that hold since. Tokens only grow, so a hold
/// freed long ago does not come back.
const DOOMED_TOKENS: usize = 16;

/// The levels a handle (and the handles `with_options` made from it) may have in the store.
#[derive(Debug)]
pub(crate) struct OwnLevels {
    /// The owner is this handle's alone (`fair_lock`, never handed out), so its grants can
    /// be checked.
    exclusive: AtomicBool,
    state: Mutex<State>,
    /// How many releases and abandons are on their way to the store.
    finishing: watch::Sender<usize>,
}

#[derive(Debug, Default)]
struct State {
    /// Live tickets.
    outstanding: usize,
    /// Tickets dropped, ever: every level the handle took away from the store (a release, an
    /// abandon) was taken before its ticket was dropped, in the same step as `outstanding`.
    dropped: u64,
    /// Tokens of holds this handle freed, or set out to free: not re-entered while any
    /// grant is checked, or while a force release may still land (below).
    doomed: VecDeque<u64>,
    /// Force releases of this handle under way (see [`Freeing`]).
    freeing: usize,
    /// Until when a force release of this handle that ended without an answer may still
    /// reach the store.
    may_land_until: Option<Instant>,
}

impl OwnLevels {
    pub(crate) fn new(exclusive: bool) -> Arc<OwnLevels> {
        Arc::new(OwnLevels {
            exclusive: AtomicBool::new(exclusive),
            state: Mutex::new(State::default()),
            finishing: watch::Sender::new(0),
        })
    }

    /// The owner was handed out: another handle may act as it, so grants are no longer
    /// checked.
    pub(crate) fn shared_out(&self) {
        self.exclusive.store(false, Ordering::Relaxed);
    }

    /// Marks a release or abandon on its way to the store, until the marker is dropped.
    pub(crate) fn finishing(self: &Arc<Self>) -> Finishing {
        self.finishing.send_modify(|n| *n += 1);
        Finishing(self.clone())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A ticket for a new attempt: counted until the attempt and everything it sends are done.
    pub(crate) fn register(self: &Arc<Self>) -> LevelTicket {
        self.state().outstanding += 1;
        LevelTicket {
            _counted: Arc::new(TicketInner(self.clone())),
        }
    }

    /// Whether a grant of hold `token` with `hold_count` levels, to an attempt holding one of
    /// this handle's tickets, includes a level nobody will release (or is a hold this handle
    /// set out to free); and if so, and that attempt is the handle's only one, the go-ahead
    /// to free the hold, whose token is not accepted again (see the module docs for a
    /// handed-out owner). (Releases on their way were
    /// waited for by [`recount`](Self::recount) first.)
    ///
    /// `dropped_before`: [`dropped`](Self::dropped) when the grant's call was sent. A ticket
    /// dropped since may have taken its level away after the store counted it: then the
    /// grant is to be counted again (`Recount`, if `may_recount`), or neither used nor freed.
    /// Decided on one reading of the tickets, so a release that ends meanwhile is seen whole.
    pub(crate) fn check(
        self: &Arc<Self>,
        token: u64,
        hold_count: u32,
        dropped_before: u64,
        may_recount: bool,
    ) -> Stale {
        let mut state = self.state();
        let exclusive = self.exclusive.load(Ordering::Relaxed);
        let doomed = state.doomed.contains(&token);
        if doomed && !exclusive {
            // The owner was handed out: another handle may hold a level of this hold, which
            // freeing it would take. While a force release of this handle may still reach the
            // store (and free it under a guard), the grant is not used either.
            let may_land = state.freeing > 0
                || state
                    .may_land_until
                    .is_some_and(|until| Instant::now() < until);
            return if may_land { Stale::Wait } else { Stale::No };
        }
        let extra = exclusive && hold_count as usize > state.outstanding;
        if !doomed && !extra {
            return Stale::No;
        }
        let dropped_since = state.dropped.saturating_sub(dropped_before);
        // Only when it would be freed: with other calls under way the grant is used anyway.
        if !doomed && dropped_since > 0 && state.outstanding <= 1 {
            if may_recount {
                return Stale::Recount;
            }
            let explained = state
                .outstanding
                .saturating_add(usize::try_from(dropped_since).unwrap_or(usize::MAX));
            if hold_count as usize <= explained {
                // The levels of those tickets may have been taken away after the store
                // counted them, or may never have been in this count: neither use nor free.
                return Stale::Unsure;
            }
        }
        if !doomed && state.outstanding > 1 {
            // Other calls of this handle may hold a level of this hold: freeing it would take
            // theirs too.
            return Stale::Kept;
        }
        if !doomed {
            if state.doomed.len() == DOOMED_TOKENS {
                state.doomed.pop_front();
            }
            state.doomed.push_back(token);
        }
        state.freeing += 1;
        Stale::Free(Freeing {
            levels: Arc::clone(self),
            answered: false,
        })
    }

    /// How many tickets have been dropped: read before a call is sent, and given to
    /// [`check`](Self::check) with its grant.
    pub(crate) fn dropped(&self) -> u64 {
        self.state().dropped
    }

    /// Whether a re-entry (`hold_count` above 1) must be counted again before it is used:
    /// a release or abandon of this handle is on its way, and the level it is taking away
    /// may be the one the store will keep (a lost release). Waits (at most `patience`) for
    /// them to finish; the caller then asks the store for the hold's count again.
    pub(crate) async fn recount(&self, hold_count: u32, patience: Duration) -> bool {
        let mut finishing = self.finishing.subscribe();
        {
            let state = self.state();
            let in_flight = *finishing.borrow_and_update();
            if !self.exclusive.load(Ordering::Relaxed)
                || hold_count <= 1
                || in_flight == 0
                || state.outstanding > in_flight + 1
            {
                return false;
            }
        }
        let drained = finishing.wait_for(|n| *n == 0);
        let done = tokio::time::timeout(patience, drained).await.is_ok();
        done
    }
}

/// The outcome of [`OwnLevels::check`].
#[derive(Debug)]
pub(crate) enum Stale {
    /// Every level of the hold is accounted for.
    No,
    /// A stale level is there, but other calls of the handle are under way: the grant is used.
    Kept,
    /// Not to be used: free the hold, then queue anew. Keep the marker until the force
    /// release has returned (or was dropped).
    Free(Freeing),
    /// A ticket was dropped since the grant's call was sent: ask for the grant again.
    Recount,
    /// Tickets dropped around the grant's call (counted again as often as allowed) may
    /// account for its extra levels, or not: neither used nor freed; the caller starts over.
    Unsure,
    /// A hold this handle set out to free, its owner since handed out, while a force release
    /// of the handle may still reach the store: neither used nor freed; the caller gives its
    /// level up and asks again a little later.
    Wait,
}

/// One attempt's claim on a level: held by the attempt, then by its guard, then by the
/// guard's release, until the store has been told (or given up on).
#[derive(Clone, Debug)]
pub(crate) struct LevelTicket {
    /// Held for its `Drop`: the last clone uncounts the attempt.
    _counted: Arc<TicketInner>,
}

#[derive(Debug)]
struct TicketInner(Arc<OwnLevels>);

impl Drop for TicketInner {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.outstanding = state.outstanding.saturating_sub(1);
        state.dropped += 1;
    }
}

/// A force release of this handle on its way to the store, from [`Stale::Free`]: while one
/// may reach the store, a handed-out owner's grants of the holds the handle set out to free
/// are neither used nor freed ([`Stale::Wait`]). Dropped without [`answered`](Self::answered)
/// (a failure, a time-out, a dropped call), the force release may still land for
/// [`RESEND_HORIZON`].
#[derive(Debug)]
pub(crate) struct Freeing {
    levels: Arc<OwnLevels>,
    answered: bool,
}

impl Freeing {
    /// The store answered the force release: the hold is gone, and nothing of it will land
    /// later that could free a hold granted since (tokens are never granted twice).
    pub(crate) fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Freeing {
    fn drop(&mut self) {
        let mut state = self.levels.state();
        state.freeing = state.freeing.saturating_sub(1);
        if !self.answered {
            let until = Instant::now() + RESEND_HORIZON;
            state.may_land_until = Some(state.may_land_until.map_or(until, |t| t.max(until)));
        }
    }
}

/// A release or abandon on its way to the store (see [`OwnLevels::finishing`]).
#[derive(Debug)]
pub(crate) struct Finishing(Arc<OwnLevels>);

impl Drop for Finishing {
    fn drop(&mut self) {
        self.0.finishing.send_modify(|n| *n = n.saturating_sub(1));
    }
}

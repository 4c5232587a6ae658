//! A record of who held a lock when, checked for overlaps and for token order.
//!
//! Times are taken on this process's monotonic clock, on the safe side: a hold starts when
//! `lock()` returned and ends when `unlock()` was called, so the hold the store knew about
//! contains the recorded one, and recorded holds that overlap prove that two owners believed
//! they held the lock at once.

use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// One recorded hold.
#[derive(Clone, Debug)]
pub struct Hold {
    /// Which contender held it.
    pub who: usize,
    /// Its fencing token.
    pub token: u64,
    /// When `lock()` returned.
    pub start: Instant,
    /// When the holder called `unlock()` (or dropped the guard).
    pub end: Instant,
}

/// Holds of one lock, shared by its contenders.
#[derive(Clone, Debug, Default)]
pub struct Holds(Arc<Mutex<Vec<Hold>>>);

impl Holds {
    /// An empty record.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one hold.
    pub fn push(&self, hold: Hold) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(hold);
    }

    /// The holds so far, by start.
    pub fn sorted(&self) -> Vec<Hold> {
        let mut holds = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        holds.sort_by_key(|hold| hold.start);
        holds
    }

    /// Checks that no two holds overlap and that tokens strictly increase in the order the
    /// holds happened; returns the holds by start.
    ///
    /// # Panics
    /// On an overlap or a token that does not increase.
    pub fn assert_exclusive(&self) -> Vec<Hold> {
        let holds = self.sorted();
        check_exclusive(&holds, |hold| (hold.start, hold.end, hold.token));
        holds
    }

    /// The gaps between one hold's end and the next one's start, in order.
    pub fn gaps(&self) -> Vec<Duration> {
        self.sorted()
            .windows(2)
            .map(|pair| pair[1].start.saturating_duration_since(pair[0].end))
            .collect()
    }
}

/// The one overlap and token check behind both kinds of record (this module's, on the
/// monotonic clock, and the contender processes', on the wall clock). `holds` are sorted by
/// start; `of` gives a hold's start, end and fencing token.
///
/// # Panics
/// On a hold that starts before the previous one ended, or a token that does not increase.
pub fn check_exclusive<H: Debug, T: Ord + Copy>(holds: &[H], of: impl Fn(&H) -> (T, T, u64)) {
    for pair in holds.windows(2) {
        let ((_, a_end, a_token), (b_start, _, b_token)) = (of(&pair[0]), of(&pair[1]));
        assert!(
            b_start >= a_end,
            "two holders at once: {:?} started before {:?} ended",
            pair[1],
            pair[0]
        );
        assert!(
            b_token > a_token,
            "tokens must grow: {:?} after {:?}",
            pair[1],
            pair[0]
        );
    }
}

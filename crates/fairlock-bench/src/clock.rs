//! Unix-epoch nanoseconds that never go backwards within one process.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Reads the wall clock once and then advances it by the monotonic clock, so every timestamp a
/// process prints is consistent with the others even if the wall clock is stepped meanwhile.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EpochClock {
    origin: Instant,
    origin_epoch_ns: u128,
}

impl EpochClock {
    pub(crate) fn new() -> Self {
        let origin_epoch_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|since| since.as_nanos())
            .unwrap_or(0);
        EpochClock {
            origin: Instant::now(),
            origin_epoch_ns,
        }
    }

    /// Now, in Unix-epoch nanoseconds.
    pub(crate) fn now_ns(self) -> u128 {
        self.epoch_ns_at(Instant::now())
    }

    pub(crate) fn epoch_ns_at(self, at: Instant) -> u128 {
        self.origin_epoch_ns + at.saturating_duration_since(self.origin).as_nanos()
    }

    /// The monotonic instant of epoch time `epoch_ns` (now or later; earlier times map to the
    /// clock's origin).
    pub(crate) fn instant_of(self, epoch_ns: u128) -> Instant {
        let offset = epoch_ns.saturating_sub(self.origin_epoch_ns);
        self.origin + std::time::Duration::from_nanos(u64::try_from(offset).unwrap_or(u64::MAX))
    }
}

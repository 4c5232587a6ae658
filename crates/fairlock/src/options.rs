//! Lock settings, with serde support (feature `serde`) for configuration files.

use std::time::Duration;

use crate::error::{Error, Result};

/// Longest lease, wait or TTL accepted: 365 days. Longer is almost surely a unit mistake,
/// and keeps millisecond arithmetic far from overflow in every store.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// Shortest waiter liveness TTL: heartbeats go out every third of it.
pub const MIN_WAITER_TTL: Duration = Duration::from_millis(30);

/// How locks behave. With the `serde` feature (on by default), durations deserialize from
/// human-readable strings (`"30s"`, `"500ms"`).
///
/// New settings will be added in minor releases, so the struct cannot be built with a
/// literal outside this crate: start from [`LockOptions::default()`] and change what you need
/// with the `with_*` methods (or by assigning the public fields).
///
/// ```
/// # use std::time::Duration;
/// # use fairlock::LockOptions;
/// let options = LockOptions::default()
///     .with_lease(Duration::from_secs(10))
///     .with_waiter_ttl(Duration::from_secs(3));
/// assert_eq!(options.lease, Some(Duration::from_secs(10)));
/// assert_eq!(options.watchdog_lease, Duration::from_secs(30)); // the default
/// ```
///
/// ```
/// # #[cfg(feature = "serde")] {
/// # use fairlock::LockOptions;
/// let options: LockOptions = serde_json::from_str(r#"{ "lease": "10s", "waiter_ttl": "3s" }"#)?;
/// assert_eq!(options.lease, Some(std::time::Duration::from_secs(10)));
/// # }
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
#[non_exhaustive]
pub struct LockOptions {
    /// A fixed lease: the lock expires this long after it is acquired unless extended with
    /// [`LockGuard::extend`](crate::LockGuard::extend). `None` (the default): a watchdog
    /// renews [`watchdog_lease`](Self::watchdog_lease) for as long as the guard lives.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub lease: Option<Duration>,
    /// The lease the watchdog keeps renewing, every third of it. Default 30 s; at least
    /// 30 ms.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub watchdog_lease: Duration,
    /// How long a waiter keeps its place in the queue without a heartbeat; waiters heartbeat
    /// every third of it, so a crashed waiter blocks nobody for longer. Default 5 s.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub waiter_ttl: Duration,
    /// How long `lock()` rides out a store that fails transiently (a dropped connection, a
    /// failover): it retries with a capped back-off as the same attempt, keeping its place in
    /// the queue if the store is back within the waiter TTL, and returns
    /// [`Error::Unavailable`](crate::Error::Unavailable) only once the store has failed for
    /// this long without a success. Default 30 s; zero gives up at the first failure.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub outage_budget: Duration,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            lease: None,
            watchdog_lease: Duration::from_secs(30),
            waiter_ttl: Duration::from_secs(5),
            outage_budget: Duration::from_secs(30),
        }
    }
}

impl LockOptions {
    /// A fixed lease of `lease`, not renewed (see [`lease`](Self::lease)); checked when the
    /// options are used.
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The lease the watchdog renews (see [`watchdog_lease`](Self::watchdog_lease)).
    #[must_use]
    pub fn with_watchdog_lease(mut self, watchdog_lease: Duration) -> Self {
        self.watchdog_lease = watchdog_lease;
        self
    }

    /// A waiter's liveness TTL (see [`waiter_ttl`](Self::waiter_ttl)).
    #[must_use]
    pub fn with_waiter_ttl(mut self, waiter_ttl: Duration) -> Self {
        self.waiter_ttl = waiter_ttl;
        self
    }

    /// How long `lock()` rides out a failing store (see
    /// [`outage_budget`](Self::outage_budget)).
    #[must_use]
    pub fn with_outage_budget(mut self, outage_budget: Duration) -> Self {
        self.outage_budget = outage_budget;
        self
    }

    /// Checks every duration.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming a bad field (the first one checked).
    pub fn validate(&self) -> Result<()> {
        if let Some(lease) = self.lease {
            check_lease("lease", lease)?;
        }
        check_lease("watchdog_lease", self.watchdog_lease)?;
        check_max("outage_budget", self.outage_budget)?;
        if self.watchdog_lease < Duration::from_millis(30) {
            return Err(Error::invalid("watchdog_lease", "must be at least 30ms"));
        }
        check_lease("waiter_ttl", self.waiter_ttl)?;
        if self.waiter_ttl < MIN_WAITER_TTL {
            return Err(Error::invalid(
                "waiter_ttl",
                format!("must be at least {MIN_WAITER_TTL:?}"),
            ));
        }
        Ok(())
    }

    /// The lease each acquisition asks for.
    pub(crate) fn effective_lease(&self) -> Duration {
        self.lease.unwrap_or(self.watchdog_lease)
    }
}

/// A lease or TTL: at least 1 ms, at most [`MAX_DURATION`].
pub(crate) fn check_lease(what: &'static str, value: Duration) -> Result<()> {
    if value < Duration::from_millis(1) {
        return Err(Error::invalid(what, format!("{value:?} is below 1ms")));
    }
    check_max(what, value)
}

/// A wait: zero is allowed (try once), at most [`MAX_DURATION`].
pub(crate) fn check_max(what: &'static str, value: Duration) -> Result<()> {
    if value > MAX_DURATION {
        return Err(Error::invalid(
            what,
            format!("{value:?} is above the limit of 365 days"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        LockOptions::default().validate().unwrap();
    }

    #[test]
    fn bad_durations_are_rejected() {
        let cases = [
            LockOptions {
                lease: Some(Duration::ZERO),
                ..Default::default()
            },
            LockOptions {
                lease: Some(Duration::from_micros(999)),
                ..Default::default()
            },
            LockOptions {
                lease: Some(Duration::MAX),
                ..Default::default()
            },
            LockOptions {
                watchdog_lease: Duration::ZERO,
                ..Default::default()
            },
            LockOptions {
                waiter_ttl: Duration::from_millis(1),
                ..Default::default()
            },
            LockOptions {
                waiter_ttl: MAX_DURATION + Duration::from_secs(1),
                ..Default::default()
            },
        ];
        for options in cases {
            let err = options.validate().unwrap_err();
            assert!(
                matches!(err, Error::InvalidArgument { .. }),
                "{options:?}: {err}"
            );
        }
    }

    #[test]
    fn each_setter_changes_its_own_field_only() {
        let second = Duration::from_secs(1);
        let default = LockOptions::default();
        let cases = [
            (default.clone().with_lease(second), "lease"),
            (
                default.clone().with_watchdog_lease(second),
                "watchdog_lease",
            ),
            (default.clone().with_waiter_ttl(second), "waiter_ttl"),
            (default.clone().with_outage_budget(second), "outage_budget"),
        ];
        for (options, field) in cases {
            let changed = [
                ("lease", options.lease != default.lease),
                (
                    "watchdog_lease",
                    options.watchdog_lease != default.watchdog_lease,
                ),
                ("waiter_ttl", options.waiter_ttl != default.waiter_ttl),
                (
                    "outage_budget",
                    options.outage_budget != default.outage_budget,
                ),
            ];
            for (name, differs) in changed {
                assert_eq!(
                    differs,
                    name == field,
                    "with_{field} and {name}: {options:?}"
                );
            }
            options.validate().unwrap();
        }
    }

    #[test]
    #[cfg(feature = "serde")]
    fn deserializes_human_durations() {
        let o: LockOptions = serde_json::from_str(
            r#"{"lease":"1m 30s","watchdog_lease":"10s","waiter_ttl":"500ms"}"#,
        )
        .unwrap();
        assert_eq!(o.lease, Some(Duration::from_secs(90)));
        assert_eq!(o.watchdog_lease, Duration::from_secs(10));
        assert_eq!(o.waiter_ttl, Duration::from_millis(500));
        assert!(serde_json::from_str::<LockOptions>(r#"{"leese":"1s"}"#).is_err());
    }
}

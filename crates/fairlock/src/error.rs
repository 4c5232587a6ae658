//! The one error type of fairlock.

use std::time::Duration;

/// A boxed error from a backend's own library (a Redis client error, an I/O error, ...).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong with a fair lock.
///
/// Backends map their private errors into [`Error::Backend`], [`Error::Unavailable`] or
/// [`Error::Conflict`]; the core produces the rest. Match on the variant, not on the message:
///
/// ```
/// # use fairlock::{Error, LockClient, MemoryBackend};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let client = LockClient::new(MemoryBackend::new());
/// let err = client.fair_lock("").unwrap_err();
/// assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was rejected before anything reached the store (empty name, zero or
    /// overflowing duration, ...).
    #[error("invalid {what}: {reason}")]
    InvalidArgument {
        /// Which argument: `lock name`, `owner`, `lease`, ...
        what: &'static str,
        /// Why it was rejected.
        reason: String,
    },

    /// `try_lock` found the lock held by another owner, or other owners waiting for it.
    #[error("lock {name:?} is held or has waiters")]
    WouldBlock {
        /// The lock's name.
        name: String,
    },

    /// A bounded wait (`try_lock_for`) ran out; the caller has left the queue.
    #[error("timed out after {waited:?} waiting for lock {name:?}")]
    Timeout {
        /// The lock's name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The lease of a held lock ended (it expired, was force-released, or the store lost it)
    /// before the guard released it. Another owner may hold the lock now. Returned by
    /// [`LockGuard::unlock`](crate::LockGuard::unlock) and
    /// [`LockGuard::extend`](crate::LockGuard::extend) when the store no longer has the guard's
    /// level. (There is no "not held" error: only a guard can release or extend, and
    /// `unlock` consumes it, so a second release or a release by a non-owner cannot be
    /// written; at the [`LockBackend`](crate::LockBackend) level that answer is
    /// `ReleaseOutcome::NotHeld`.)
    #[error("lease on lock {name:?} was lost")]
    LeaseLost {
        /// The lock's name.
        name: String,
    },

    /// fairlock was called outside a Tokio runtime. Its waiting, renewal and background release
    /// run on Tokio (timers and spawned tasks), so calls must be made from inside one.
    #[error("fairlock needs a Tokio runtime (with timers enabled); none is current")]
    NoRuntime,

    /// The store could not be reached. `endpoint` names what was tried.
    #[error("{backend} backend cannot reach {endpoint}: {source}")]
    Unavailable {
        /// The backend's name, e.g. `redis`.
        backend: &'static str,
        /// The address or URL that could not be reached (without credentials).
        endpoint: String,
        /// The underlying error.
        #[source]
        source: BoxError,
    },

    /// The store holds data at one of the lock's keys that fairlock did not write
    /// (e.g. a Redis key of another type with the same name).
    #[error("{backend} backend: lock {name:?} collides with foreign data: {detail}")]
    Conflict {
        /// The backend's name.
        backend: &'static str,
        /// The lock's name.
        name: String,
        /// What was found.
        detail: String,
    },

    /// Any other failure of the store.
    #[error("{backend} backend error: {source}")]
    Backend {
        /// The backend's name.
        backend: &'static str,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            what,
            reason: reason.into(),
        }
    }

    /// Whether retrying the same call later may succeed (the store was unreachable or failed
    /// transiently), as opposed to errors that describe the lock's state or a bad argument.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::Backend { .. })
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

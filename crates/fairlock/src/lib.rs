//! Fair (FIFO), reentrant, leased locks with fencing tokens, over a pluggable store.
//!
//! - [`LockClient`] holds a backend and default [`LockOptions`]; [`LockClient::fair_lock`]
//!   gives a [`FairLock`] handle for one lock name and one [`Owner`].
//! - [`FairLock::lock`] waits its FIFO turn, [`FairLock::try_lock`] never waits and never
//!   barges past waiters, [`FairLock::try_lock_for`] waits at most a given time.
//! - A [`LockGuard`] carries the hold's fencing token, renews the lease (watchdog) or watches a
//!   fixed one, signals [`LockGuard::lease_lost`], and releases one level when dropped.
//! - [`FairLock::run`] runs a future under the lock, drops it if the lease is lost, and
//!   releases in every case; the future gets a [`Lease`] with the fencing token.
//! - [`LockBackend`] is the contract a store keeps; [`MemoryBackend`] keeps it in process, the
//!   `fairlock-redis` crate on Redis, `fairlock-postgres` on PostgreSQL, and the
//!   `conformance` suite (feature `conformance`) checks any implementation.
//!
//! Everything runs on Tokio: calls must be made inside a Tokio runtime with timers enabled.
//!
//! # Features
//!
//! - `serde` (on by default): `Serialize` and `Deserialize` for [`LockOptions`], durations
//!   written as `"30s"`; `Serialize` for the snapshots [`LockState`] and [`LockSummary`].
//! - `metrics` (off): counters, histograms and gauges through the `metrics` facade; tracing
//!   spans and events are always there. `docs/observability.md` in the repository lists them
//!   all.
//! - `conformance` (off): the `conformance` module, the suite that checks a backend.
//!
//! ```
//! use fairlock::{LockClient, MemoryBackend};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> fairlock::Result<()> {
//! let client = LockClient::new(MemoryBackend::new());
//! let lock = client.fair_lock("nightly-report")?;
//! let guard = lock.lock().await?;
//! let again = lock.lock().await?; // the same owner re-enters
//! assert_eq!(again.hold_count(), 2);
//! drop(again);
//! guard.unlock().await?;
//! # Ok(())
//! # }
//! ```
//!
//! See `docs/design.md` in the repository for the state machine and the reasons behind it.

pub mod backend;
#[cfg(feature = "conformance")]
pub mod conformance;
mod deferred;
mod error;
mod guard;
mod lease;
mod levels;
mod lock;
mod memory;
mod name;
mod options;
mod telemetry;
mod waiting;
mod wake_queue;

pub use backend::{
    AttemptId, Capabilities, HolderState, LockBackend, LockState, LockSummary, WaiterState,
};
pub use error::{BoxError, Error, Result};
pub use guard::{Lease, LockGuard};
pub use lock::{FairLock, LockClient};
pub use memory::MemoryBackend;
pub use name::{LockName, Owner, MAX_NAME_LEN, MAX_OWNER_LEN};
pub use options::{LockOptions, MAX_DURATION, MIN_WAITER_TTL};
#[cfg(feature = "metrics")]
pub use telemetry::describe_metrics;

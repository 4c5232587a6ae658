#![doc = include_str!("../../../README.md")]

pub mod backend;
#[cfg(feature = "conformance")]
pub mod conformance;
mod error;
mod guard;
mod lease;
mod lock;
mod memory;
mod name;
mod options;
mod waiting;

pub use backend::{LockBackend, LockState, LockSummary};
pub use error::{BoxError, Error, Result};
pub use guard::LockGuard;
pub use lock::{FairLock, LockClient};
pub use memory::MemoryBackend;
pub use name::{LockName, Owner, MAX_NAME_LEN, MAX_OWNER_LEN};
pub use options::{LockOptions, MAX_DURATION, MIN_WAITER_TTL};

#![doc = include_str!("../../../README.md")]

pub mod backend;
mod error;
mod name;
mod options;

pub use backend::{LockBackend, LockState};
pub use error::{BoxError, Error, Result};
pub use name::{LockName, Owner, MAX_NAME_LEN, MAX_OWNER_LEN};
pub use options::{LockOptions, MAX_DURATION, MIN_WAITER_TTL};

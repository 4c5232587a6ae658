//! Shared helpers of fairlock's fault suite (the tests are in `tests/tests/`).
//!
//! Every test starts its own `redis-server` on a free loopback port through
//! `fairlock-testsupport` and stops it when done; nothing reaches any other address.

pub mod contender;
pub mod holds;
pub mod protocol;
pub mod redis_env;
pub mod store_view;

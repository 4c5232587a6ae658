//! Shared helpers of fairlock's fault suite (the tests are in `tests/tests/`).
//!
//! Every test starts its own `redis-server` on a free loopback port through
//! `fairlock-testsupport` and stops it when done; nothing reaches any other address.

// The README's and the guides' Rust examples, compiled (and, unless marked `no_run`, run) as
// doctests of this crate, which depends on every backend: an example that stops compiling
// fails `cargo test`. docs/performance.md holds no Rust examples.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct Readme;
#[cfg(doctest)]
#[doc = include_str!("../../docs/observability.md")]
struct Observability;
#[cfg(doctest)]
#[doc = include_str!("../../docs/redis.md")]
struct RedisGuide;
#[cfg(doctest)]
#[doc = include_str!("../../docs/postgres.md")]
struct PostgresGuide;
#[cfg(doctest)]
#[doc = include_str!("../../docs/backends.md")]
struct BackendsGuide;

pub mod contender;
pub mod holds;
pub mod protocol;
pub mod redis_env;
pub mod store_view;

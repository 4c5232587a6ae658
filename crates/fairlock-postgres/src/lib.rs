//! The PostgreSQL backend of [fairlock]: fair (FIFO), reentrant, leased and fenced locks
//! whose state machine runs as SQL functions inside PostgreSQL.
//!
//! [`PostgresBackend`] implements [`fairlock::LockBackend`]; hand it to
//! [`fairlock::LockClient::new`]. Each operation is one call of a PL/pgSQL function, so one
//! statement and one transaction, with every lease and deadline measured by the server's
//! `clock_timestamp()`. The functions (in `sql/` in this crate) and their tables are created
//! on first use in a schema of their own (`fairlock` unless configured). Waiters are woken
//! through `LISTEN`/`NOTIFY` on one listening connection per backend.
//!
//! PostgreSQL 11 or later is needed (tested on 15).
//!
//! ```no_run
//! use fairlock::LockClient;
//! use fairlock_postgres::PostgresBackend;
//!
//! # async fn example() -> fairlock::Result<()> {
//! let backend = PostgresBackend::connect("postgres://app@127.0.0.1:5432/app").await?;
//! let client = LockClient::new(backend);
//! let guard = client.fair_lock("nightly-report")?.lock().await?;
//! // ... only one holder at a time, in the order they asked ...
//! guard.unlock().await?;
//! # Ok(())
//! # }
//! ```
//!
//! See `docs/postgres.md` in the repository for the schema, each operation's SQL and why it
//! is correct, the row-locking order, and what a failover or a restart can lose.

mod backend;
mod connect;
mod error;
mod schema;
mod wake;

pub use connect::PostgresBackendBuilder;
/// The pool this crate is built on, re-exported so versions always match.
pub use deadpool_postgres;
pub use schema::{DEFAULT_SCHEMA, MAX_SCHEMA_LEN};
/// The PostgreSQL client this crate is built on, re-exported so versions always match.
pub use tokio_postgres;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::schema::Sql;
use crate::wake::Dispatcher;

/// A [`fairlock::LockBackend`] on PostgreSQL.
///
/// It holds a pool of connections that run the lock functions and one listening connection
/// for wake-ups, whatever the number of locks and waiters. Cloning gives another handle to
/// the same connections. Its `Debug` output never shows credentials.
///
/// # Cancel safety
/// Each [`LockBackend`](fairlock::LockBackend) method is one SQL statement (one
/// transaction): dropping its future at any point leaves the operation applied whole or not
/// at all, and the connection usable (its reply is discarded). The core ends every attempt
/// its caller abandoned, so no waiter and no hold outlives its TTL or lease.
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pool: deadpool_postgres::Pool,
    dispatcher: Arc<Dispatcher>,
    sql: Sql,
    /// `host:port/db`, without credentials, for errors.
    endpoint: String,
    /// How long an idle lock's row (its last fencing token) is kept.
    fence_margin: Duration,
    /// The bound on waiting for a pooled connection (a pool given to `from_pool` may have
    /// none of its own).
    connect_timeout: Duration,
}

impl PostgresBackend {
    /// Connects to `url` (`postgres://user:password@host:port/database`, or any connection
    /// string `tokio-postgres` accepts) with the default settings, creating the schema if it
    /// is missing. See [`PostgresBackend::builder`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves nothing behind but connections that close.
    ///
    /// # Errors
    /// [`fairlock::Error::InvalidArgument`] for a malformed URL;
    /// [`fairlock::Error::Unavailable`] if the server cannot be reached within the connect
    /// timeout (5 s); [`fairlock::Error::Backend`] if the schema cannot be created (e.g.
    /// permission denied); [`fairlock::Error::Conflict`] if the schema holds tables that are
    /// not fairlock's.
    pub async fn connect(url: &str) -> fairlock::Result<PostgresBackend> {
        Self::builder(url).connect().await
    }

    /// Settings for a backend connecting to `url`: schema, pool size, timeouts.
    ///
    /// ```no_run
    /// # async fn example() -> fairlock::Result<()> {
    /// use std::time::Duration;
    /// let backend = fairlock_postgres::PostgresBackend::builder("postgres://app@db/app")
    ///     .schema("app_locks")
    ///     .pool_size(8)
    ///     .connect_timeout(Duration::from_secs(2))
    ///     .connect()
    ///     .await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(url: impl Into<String>) -> PostgresBackendBuilder {
        PostgresBackendBuilder::new(url.into())
    }

    /// A backend on a pool you built yourself (your own credentials, hooks, TLS for the
    /// pool). `listen` configures the one extra connection that listens for wake-ups (a
    /// pooled connection cannot: the pool does not hand out its notifications); it must reach
    /// the same database, and is made without TLS (see `docs/postgres.md`), with the
    /// keepalives `listen` sets. The schema is created if missing.
    ///
    /// ```no_run
    /// # async fn example() -> fairlock::Result<()> {
    /// use fairlock_postgres::{deadpool_postgres, tokio_postgres, PostgresBackend};
    ///
    /// let config: tokio_postgres::Config = "postgres://app@db/app".parse().unwrap();
    /// let manager = deadpool_postgres::Manager::new(config.clone(), tokio_postgres::NoTls);
    /// let pool = deadpool_postgres::Pool::builder(manager).max_size(4).build().unwrap();
    /// let backend = PostgresBackend::from_pool(pool, config, "fairlock").await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves nothing behind but a connection that closes.
    ///
    /// # Errors
    /// [`fairlock::Error::InvalidArgument`] for an invalid `schema` (see
    /// [`PostgresBackendBuilder::schema`]), and as [`PostgresBackend::connect`].
    pub async fn from_pool(
        pool: deadpool_postgres::Pool,
        listen: tokio_postgres::Config,
        schema: &str,
    ) -> fairlock::Result<PostgresBackend> {
        connect::from_pool(pool, listen, schema).await
    }

    /// The schema that holds this backend's tables and functions.
    pub fn schema(&self) -> &str {
        &self.inner.sql.schema
    }

    /// The channel wake-ups are sent on (`<schema>_wake`).
    pub fn channel(&self) -> &str {
        &self.inner.sql.channel
    }

    /// The pool of connections that run the lock functions.
    pub fn pool(&self) -> &deadpool_postgres::Pool {
        &self.inner.pool
    }

    /// Whether the wake-up connection is listening now (it is made again after it breaks;
    /// meanwhile waiters rely on their heartbeats).
    pub fn is_listening(&self) -> bool {
        self.inner.dispatcher.is_listening()
    }

    /// Waits until the wake-up connection is listening, at most `limit`; whether it is.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn wait_listening(&self, limit: Duration) -> bool {
        self.inner.dispatcher.wait_listening(limit).await
    }

    /// How many watches (waiting attempts) of this process are registered for wake-ups.
    pub fn watch_count(&self) -> usize {
        self.inner.dispatcher.watch_count()
    }
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("endpoint", &self.inner.endpoint)
            .field("schema", &self.inner.sql.schema)
            .field("pool_size", &self.inner.pool.status().max_size)
            .finish_non_exhaustive()
    }
}

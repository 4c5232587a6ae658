//! Building a [`PostgresBackend`]: from a URL, or from a pool.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::config::Host;
use tokio_postgres::NoTls;

use crate::backend::pooled;
use crate::error::{self, Context};
use crate::schema::{self, Sql, DEFAULT_SCHEMA};
use crate::wake::Dispatcher;
use crate::{Inner, PostgresBackend};

/// The default connection pool size.
const DEFAULT_POOL_SIZE: usize = 8;
/// The default limit on making a connection.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an idle lock's row is kept by default (see [`PostgresBackendBuilder::fence_margin`]).
const DEFAULT_FENCE_MARGIN: Duration = Duration::from_secs(600);

/// Settings for a [`PostgresBackend`]; made by [`PostgresBackend::builder`].
#[derive(Clone)]
pub struct PostgresBackendBuilder {
    url: String,
    schema: String,
    pool_size: usize,
    connect_timeout: Duration,
    fence_margin: Duration,
}

impl std::fmt::Debug for PostgresBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password: never shown.
        f.debug_struct("PostgresBackendBuilder")
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("fence_margin", &self.fence_margin)
            .finish_non_exhaustive()
    }
}

impl PostgresBackendBuilder {
    pub(crate) fn new(url: String) -> Self {
        PostgresBackendBuilder {
            url,
            schema: DEFAULT_SCHEMA.to_owned(),
            pool_size: DEFAULT_POOL_SIZE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            fence_margin: DEFAULT_FENCE_MARGIN,
        }
    }

    /// The schema for fairlock's tables and functions (default `fairlock`): 1 to
    /// [`MAX_SCHEMA_LEN`](crate::MAX_SCHEMA_LEN) bytes of `a-z`, `0-9` and `_`, not starting
    /// with a digit. Backends with different schemas share nothing. Checked by
    /// [`connect`](Self::connect).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// How many connections run lock operations at once (default 8, at least 1). The
    /// listening connection comes on top.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// The limit on making one connection, and on waiting for a free one in the pool
    /// (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long the row of an idle lock, which keeps its last fencing token, outlives
    /// everything else of the lock (default 10 minutes). Fencing tokens also never fall
    /// below the server's clock in microseconds, so they keep increasing after the row is
    /// gone unless the server's clock steps back by more than this (see `docs/postgres.md`).
    pub fn fence_margin(mut self, margin: Duration) -> Self {
        self.fence_margin = margin.max(Duration::from_secs(1));
        self
    }

    /// Connects, creates the schema if it is missing, and starts listening for wake-ups.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves nothing behind but connections that close.
    ///
    /// # Errors
    /// As [`PostgresBackend::connect`], and [`fairlock::Error::InvalidArgument`] for an
    /// invalid schema, or a `connect_timeout` or `fence_margin` longer than
    /// [`fairlock::MAX_DURATION`].
    pub async fn connect(self) -> fairlock::Result<PostgresBackend> {
        schema::validate(&self.schema)?;
        for (what, value) in [
            ("connect_timeout", self.connect_timeout),
            ("fence_margin", self.fence_margin),
        ] {
            if value > fairlock::MAX_DURATION {
                return Err(fairlock::Error::InvalidArgument {
                    what,
                    reason: format!("{value:?} is longer than {:?}", fairlock::MAX_DURATION),
                });
            }
        }
        let mut config: tokio_postgres::Config =
            self.url
                .parse()
                .map_err(|error| fairlock::Error::InvalidArgument {
                    what: "postgres url",
                    reason: format!("{error}"),
                })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(self.connect_timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("fairlock");
        }
        dead_peer_limits(&mut config);
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(self.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(self.connect_timeout))
            .create_timeout(Some(self.connect_timeout))
            // The functions need READ COMMITTED (see `_lock_row`): the pool's sessions run it
            // whatever the database's default. A SET rather than a startup option, which
            // poolers such as PgBouncer refuse unless told to ignore it.
            .post_create(Hook::async_fn(|client, _| {
                Box::pin(async move {
                    client
                        .batch_execute("SET default_transaction_isolation = 'read committed'")
                        .await
                        .map_err(HookError::Backend)
                })
            }))
            .build()
            .map_err(|error| error::unavailable(&endpoint(&config), error.to_string()))?;
        build(
            pool,
            config,
            &self.schema,
            self.fence_margin,
            self.connect_timeout,
        )
        .await
    }
}

pub(crate) async fn from_pool(
    pool: Pool,
    listen: tokio_postgres::Config,
    schema: &str,
) -> fairlock::Result<PostgresBackend> {
    schema::validate(schema)?;
    build(
        pool,
        listen,
        schema,
        DEFAULT_FENCE_MARGIN,
        DEFAULT_CONNECT_TIMEOUT,
    )
    .await
}

async fn build(
    pool: Pool,
    listen: tokio_postgres::Config,
    schema: &str,
    fence_margin: Duration,
    connect_timeout: Duration,
) -> fairlock::Result<PostgresBackend> {
    let endpoint = endpoint(&listen);
    let sql = Sql::new(schema);
    let context = Context {
        endpoint: &endpoint,
        lock: None,
    };
    {
        // Given up (timed out, or this future dropped), the install may still run on its
        // connection: that one leaves the pool (a pool of the caller's) instead of making
        // the next user wait behind it.
        let mut in_flight = pooled(&pool, connect_timeout, context).await?;
        let installed =
            tokio::time::timeout(connect_timeout * 4, sql.install(in_flight.client(), false))
                .await
                .map_err(|_| error::unavailable(&endpoint, "creating the schema timed out"))?;
        in_flight.done();
        installed.map_err(|error| error::map(error, context))?;
    }
    let dispatcher = Dispatcher::start(listen, sql.listen());
    // Normally up at once; if not, waiters rely on their heartbeats until it is.
    if !dispatcher.wait_listening(connect_timeout).await {
        tracing::warn!(endpoint, "fairlock-postgres: the wake-up connection is not listening yet; waiters rely on heartbeats until it is");
    }
    Ok(PostgresBackend {
        inner: Arc::new(Inner {
            pool,
            dispatcher,
            sql,
            endpoint,
            fence_margin,
            connect_timeout,
        }),
    })
}

/// How long a connection may stay quiet before keepalive probes start, and then between
/// them: with [`KEEPALIVE_RETRIES`], a half-open connection (the server's host gone) is
/// noticed within about a minute.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_RETRIES: u32 = 3;
/// How long sent data may go unacknowledged before the connection is given up (Linux):
/// keepalive does not probe while data waits, so without it a connection that lost its peer
/// while sending would be noticed only at the system's retransmission limit (about 15
/// minutes). The Redis backend does the same.
const USER_TIMEOUT: Duration = Duration::from_secs(30 + 90);

/// Keepalive and the user timeout, for the pool's and the listening connection of a backend
/// built from a URL.
fn dead_peer_limits(config: &mut tokio_postgres::Config) {
    config.keepalives(true);
    config.keepalives_idle(KEEPALIVE_IDLE);
    config.keepalives_interval(KEEPALIVE_INTERVAL);
    config.keepalives_retries(KEEPALIVE_RETRIES);
    config.tcp_user_timeout(USER_TIMEOUT);
}

/// `host:port/database` of a config, without user or password.
fn endpoint(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or("");
    format!("{host}:{port}/{db}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_give_up_a_dead_peer_within_minutes() {
        let mut config: tokio_postgres::Config = "postgres://u@127.0.0.1/db".parse().unwrap();
        dead_peer_limits(&mut config);
        assert!(config.get_keepalives());
        let noticed = config.get_keepalives_idle()
            + config.get_keepalives_interval().unwrap() * config.get_keepalives_retries().unwrap();
        assert!(noticed <= Duration::from_secs(60), "{noticed:?}");
        assert_eq!(
            config.get_tcp_user_timeout(),
            Some(&Duration::from_secs(120))
        );
    }
}

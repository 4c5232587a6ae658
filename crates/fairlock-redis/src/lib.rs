//! The Redis backend of [fairlock]: fair (FIFO), reentrant, leased locks whose
//! state machine runs as Lua scripts inside Redis, standalone or Cluster.
//!
//! [`RedisBackend`] implements [`fairlock::LockBackend`]; hand it to
//! [`fairlock::LockClient::new`]. Each operation is one script (see `lua/` in the
//! repository), run as a function of fairlock's Function library (`FCALL`) on Redis 7 and by
//! SHA (`EVALSHA`) elsewhere, with every deadline taken from the server's clock. Waiters are
//! woken through one pub/sub connection per backend (or one that backends made with
//! [`RedisBackend::from_clients`] share).
//!
//! Redis 6.2 or later is needed, or Valkey. Wake-ups use sharded pub/sub
//! (`SPUBLISH`/`SSUBSCRIBE`) where the server has it (Redis 7.0+, Valkey) and classic pub/sub
//! (`PUBLISH`/`SUBSCRIBE`) where it does not (Redis 6.2), detected once per backend when it
//! connects; see [`PubsubMode`] and [`RedisBackend::pubsub_mode`].
//!
//! ```no_run
//! use fairlock::LockClient;
//! use fairlock_redis::RedisBackend;
//!
//! # async fn example() -> fairlock::Result<()> {
//! let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
//! let client = LockClient::new(backend);
//! let guard = client.fair_lock("nightly-report")?.lock().await?;
//! // ... only one holder at a time, in the order they asked ...
//! guard.unlock().await?;
//! # Ok(())
//! # }
//! ```
//!
//! URLs: `redis://[user:password@]host:port[/db]`, `rediss://...` (TLS, with the `tls`
//! feature), `redis-cluster://host:port?node=host:port&node=...` for Cluster, and
//! `redis-sentinel://sentinel:port?sentinelServiceName=NAME&node=sentinel:port&...` for a
//! primary behind Redis Sentinel (followed across failovers). See
//! `docs/redis.md` in the repository for the key layout, the scripts' protocol and what a
//! failover or a restart can lose.

mod backend;
mod connect;
mod error;
mod keys;
mod pubsub;
mod scripts;
mod wake;

use std::fmt;
use std::sync::Arc;

pub use connect::{hide_password_values, RedisBackendBuilder, DEFAULT_PREFIX};
/// The Redis client this crate is built on, re-exported so versions always match.
pub use fred;
pub use pubsub::PubsubMode;

use fred::clients::{Pool, SubscriberClient};
use fred::interfaces::ClientLike;

use crate::error::Context;
use crate::pubsub::Detection;
use crate::scripts::Scripts;
use crate::wake::Dispatcher;

/// A [`fairlock::LockBackend`] on Redis (standalone or Cluster).
///
/// It holds a pool of connections that run the lock scripts and one subscriber connection
/// for wake-ups (its own, or one shared with other backends made with
/// [`from_clients`](Self::from_clients)), whatever the number of locks and waiters. Cloning
/// gives another handle to the same connections. Its `Debug` output never shows credentials.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    dispatcher: Arc<Dispatcher>,
    /// The server's pub/sub mode, which picks the scripts and the subscribe commands.
    pubsub: Arc<Detection>,
    sharded_scripts: Scripts,
    classic_scripts: Scripts,
    prefix: String,
    endpoint: String,
    /// How long the fence hash outlives everything else of an idle lock.
    fence_margin: std::time::Duration,
    /// Replicas that must acknowledge a change a holder relies on, if any.
    replica_acks: Option<connect::ReplicaAcks>,
    /// Whether the connections were made here (and so are closed here).
    owns_clients: bool,
}

impl RedisBackend {
    /// Connects to `url` with the default settings (see [`RedisBackend::builder`]).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`RedisBackendBuilder::connect`].
    ///
    /// # Errors
    /// [`fairlock::Error::InvalidArgument`] for a malformed URL;
    /// [`fairlock::Error::Unavailable`] if the server cannot be reached within 5 s.
    pub async fn connect(url: &str) -> fairlock::Result<RedisBackend> {
        Self::builder(url).connect().await
    }

    /// Settings for a backend connecting to `url`: key prefix, pool size, timeouts.
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder::new(url)
    }

    /// A backend on clients you built and connected yourself (for your own TLS, credential
    /// or reconnect settings): `pool` runs the scripts, `subscriber` receives wake-ups and
    /// must be used for nothing else (fairlock's backends may share it, at once or one after
    /// another: a lock's channel stays subscribed while any of them watches the lock). Both
    /// must point at the same deployment. They are not closed when the backend is dropped: it
    /// then unsubscribes its channels from `subscriber` in the background, and its tasks end.
    /// Do not call fred's `manage_subscriptions` or `resubscribe_all` on it: the backend
    /// subscribes its channels again itself after a reconnect.
    ///
    /// Give the subscriber a large `broadcast_channel_capacity` in its
    /// [`PerformanceConfig`](fred::types::config::PerformanceConfig) (the builder uses 4096):
    /// with fred's default of 32 a burst of hand-overs overflows it and every local waiter
    /// is sent to check its lock.
    ///
    /// Give the clients a [`ReconnectPolicy`](fred::types::config::ReconnectPolicy), or a
    /// lost connection stays lost.
    ///
    /// Call it inside a Tokio runtime: the backend starts its wake-up dispatcher and server
    /// detection as tasks on the current one, which must outlive the backend and keep running
    /// (a watch waits there for its channel's subscribe).
    ///
    /// # Errors
    /// [`fairlock::Error::InvalidArgument`] if `prefix` contains `{` or `}`;
    /// [`fairlock::Error::NoRuntime`] when called outside a Tokio runtime.
    pub fn from_clients(
        pool: Pool,
        subscriber: SubscriberClient,
        prefix: impl Into<String>,
    ) -> fairlock::Result<RedisBackend> {
        connect::from_clients(pool, subscriber, prefix.into())
    }

    fn assemble(
        pool: Pool,
        subscriber: SubscriberClient,
        settings: connect::Settings,
    ) -> RedisBackend {
        let pubsub = Detection::start(pool.clone());
        // With acknowledgement, a hand-over's message is only a cue to confirm by a call that
        // waits for the replicas.
        let trust_grants = settings.replica_acks.is_none();
        let dispatcher = Dispatcher::start(
            subscriber,
            settings.linger,
            pubsub.clone(),
            trust_grants,
            settings.owns_clients,
        );
        if pool.next().is_clustered() {
            dispatcher.follow_topology(pool.clients());
        }
        RedisBackend {
            inner: Arc::new(Inner {
                pool,
                dispatcher,
                pubsub,
                sharded_scripts: Scripts::new(PubsubMode::Sharded),
                classic_scripts: Scripts::new(PubsubMode::Classic),
                prefix: settings.prefix,
                endpoint: settings.endpoint,
                fence_margin: settings.fence_margin,
                replica_acks: settings.replica_acks,
                owns_clients: settings.owns_clients,
            }),
        }
    }

    /// The prefix of every key and channel this backend uses.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The connection pool that runs the scripts.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Which pub/sub carries wake-ups: [`PubsubMode::Sharded`] if the server knows
    /// `SPUBLISH` and `SSUBSCRIBE` (Redis 7.0+, Valkey), else [`PubsubMode::Classic`] (Redis
    /// 6.2). Detected once per backend, in the background from the time it connects, and kept
    /// (see `docs/redis.md`); this waits for the detection if it has not finished.
    ///
    /// # Errors
    /// [`fairlock::Error::Unavailable`] if the server could not be asked.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads the server. Dropped while it waits for a detection, or
    /// while detecting, it leaves the mode to the next caller (or the background detection).
    pub async fn pubsub_mode(&self) -> fairlock::Result<PubsubMode> {
        self.inner.pubsub.mode().await.map_err(|error| {
            error::map(
                error,
                Context {
                    endpoint: &self.inner.endpoint,
                    lock: None,
                },
            )
        })
    }

    /// The scripts for the server's pub/sub mode.
    async fn scripts(&self) -> fairlock::Result<&Scripts> {
        Ok(match self.pubsub_mode().await? {
            PubsubMode::Sharded => &self.inner.sharded_scripts,
            PubsubMode::Classic => &self.inner.classic_scripts,
        })
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("endpoint", &self.inner.endpoint)
            .field("prefix", &self.inner.prefix)
            .field("pool_size", &self.inner.pool.size())
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.owns_clients {
            return;
        }
        // On the runtime the backend was made on.
        connect::quit_later(
            self.dispatcher.runtime(),
            self.pool.clone(),
            self.dispatcher.subscriber().clone(),
        );
    }
}

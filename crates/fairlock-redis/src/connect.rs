//! Building a [`RedisBackend`]: from a URL with [`RedisBackendBuilder`], or from clients.

use std::fmt;
use std::time::Duration;

use fairlock::{Error, Result};
use fred::clients::{Pool, SubscriberClient};
use fred::interfaces::{ClientInterface, ClientLike};
use fred::types::config::{Config, ReconnectPolicy, ServerConfig, TcpConfig};
use fred::types::Builder;

use crate::error::{unavailable, BACKEND};
use crate::wake::DEFAULT_LINGER;
use crate::RedisBackend;

/// How long the fence hash of an idle lock stays (see [`RedisBackendBuilder::fence_margin`]).
pub(crate) const DEFAULT_FENCE_MARGIN: Duration = Duration::from_secs(600);

/// How many published wake-ups may wait for the dispatcher before some are dropped (then every
/// local waiter rechecks, at most twice a second). fred gives each of the subscriber's
/// broadcast channels this capacity, so it is also what a backend's memory grows with:
/// 16,384 cost about 10 MB, 4,096 about 2.5 MB.
const WAKE_BUFFER: usize = 4_096;

/// How long a connection may be idle before TCP keepalive probes it, unless configured: well
/// under the idle timeouts of common NATs and load balancers (4 to 10 minutes).
const DEFAULT_TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// The key prefix used unless [`RedisBackendBuilder::prefix`] sets another.
pub const DEFAULT_PREFIX: &str = "fairlock:";

/// Settings for [`RedisBackend`], made by [`RedisBackend::builder`].
///
/// ```no_run
/// # async fn example() -> fairlock::Result<()> {
/// use std::time::Duration;
/// use fairlock_redis::RedisBackend;
///
/// let backend = RedisBackend::builder("redis://127.0.0.1:6379")
///     .prefix("billing:locks:")
///     .pool_size(8)
///     .connect_timeout(Duration::from_secs(2))
///     .connect()
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisBackendBuilder {
    url: String,
    prefix: String,
    pool_size: usize,
    connect_timeout: Duration,
    command_timeout: Duration,
    subscription_linger: Duration,
    fence_margin: Duration,
    replica_acks: Option<ReplicaAcks>,
    tcp_keepalive: Option<Duration>,
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("url", &redact(&self.url))
            .field("prefix", &self.prefix)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("subscription_linger", &self.subscription_linger)
            .field("fence_margin", &self.fence_margin)
            .field("replica_acks", &self.replica_acks)
            .field("tcp_keepalive", &self.tcp_keepalive)
            .finish()
    }
}

impl RedisBackendBuilder {
    pub(crate) fn new(url: impl Into<String>) -> Self {
        RedisBackendBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            pool_size: 4,
            connect_timeout: Duration::from_secs(5),
            command_timeout: Duration::from_secs(10),
            subscription_linger: DEFAULT_LINGER,
            fence_margin: DEFAULT_FENCE_MARGIN,
            replica_acks: None,
            tcp_keepalive: Some(DEFAULT_TCP_KEEPALIVE),
        }
    }

    /// The prefix of every key and channel (default [`DEFAULT_PREFIX`]). It must not
    /// contain `{` or `}`: the lock's hash tag follows it.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How many connections run scripts (default 4, at least 1). Calls are pipelined: each
    /// connection carries many at once, and the server runs them one at a time anyway.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How long to wait for a connection before giving up with
    /// [`Error::Unavailable`] (default 5 s); also bounds each reconnection attempt. Above zero
    /// and at most [`fairlock::MAX_DURATION`], or [`connect`](Self::connect) refuses it.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long each command may wait for its reply, reconnections included, before it
    /// fails with [`Error::Unavailable`] (default 10 s). An operation usually sends one
    /// command, but may send a few in a row (loading the function library where it is
    /// missing, `WAIT` with [`replicas_acked`](Self::replicas_acked)), each with this bound.
    /// Above zero (fred would read zero as no bound) and at most [`fairlock::MAX_DURATION`],
    /// or [`connect`](Self::connect) refuses it.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// How long a lock's fence hash (`:f`, the last fencing token) outlives everything else of
    /// the lock once it is idle (default 10 minutes); then the lock leaves no key behind.
    ///
    /// Fencing tokens keep increasing after the hash is gone, since a token is never below the
    /// server's clock in microseconds, unless the server's clock steps back by more than this
    /// margin while the lock is idle: then the next token could be below the last one issued.
    /// A longer margin guards against larger clock steps and keeps a key per idle lock longer.
    /// At most [`fairlock::MAX_DURATION`], or [`connect`](Self::connect) refuses it.
    pub fn fence_margin(mut self, margin: Duration) -> Self {
        self.fence_margin = margin;
        self
    }

    /// Waits, after every change a holder relies on, until `replicas` replicas of the primary
    /// have acknowledged it, for at most `timeout` (Redis `WAIT`), so that a failover (a
    /// replica promoted by Sentinel or by the Cluster) cannot lose it. Off by default; `0`
    /// replicas turns it off.
    ///
    /// What is waited for, and what happens when the replicas do not acknowledge in time:
    /// - a grant (`lock()`, a re-entry, the confirmation of a hand-over): not handed out; the
    ///   attempt is abandoned (its level released) and the call fails with
    ///   [`Error::Unavailable`], which `lock()` rides out within its outage budget;
    /// - a lease renewal: fails with [`Error::Unavailable`], so the watchdog tries again and
    ///   reports a lost lease if the lease passes first;
    /// - a release or an abandoned wait: done on the primary, logged as a warning (a failover
    ///   that loses it makes the lock look held until that lease ends, which delays others but
    ///   never lets two hold it).
    ///
    /// Hand-overs are not trusted from their wake-up message alone: the grantee confirms with
    /// a call that waits for the acknowledgement. Joining the queue and heart-beating are not
    /// waited for (a failover may reorder waiters, never grant twice). An acknowledgement
    /// only counts if it came on the connection the change was made on: if that connection
    /// breaks in between (and the `WAIT` goes to a new one, perhaps a new primary), the change
    /// is treated as not acknowledged. The connections are told apart by their `CLIENT ID`,
    /// so the user needs that command: [`connect`](Self::connect) fails with
    /// [`Error::InvalidArgument`] if the server refuses it. Each acknowledged change costs
    /// one more round trip plus the replication delay.
    pub fn replicas_acked(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_acks = (replicas > 0).then_some(ReplicaAcks {
            replicas,
            timeout: timeout.max(Duration::from_millis(1)),
        });
        self
    }

    /// How long a connection may be idle before TCP keepalive probes it (default 60 s; `None`
    /// turns keepalive off). Probes follow every 10 s (where the system lets a socket set it:
    /// Linux, macOS, Windows and most BSDs; elsewhere its default); when as many as the system
    /// allows (`tcp_keepalive_probes`, 9 on Linux) go unanswered, the connection ends and is
    /// made again.
    ///
    /// The subscriber connection that receives wake-ups sends nothing while it waits. If a
    /// NAT or firewall dropped it in silence, nothing would fail, and waiters would hear of
    /// their hand-overs only at their heartbeats. Keepalive keeps such a connection from
    /// going idle, and finds it broken if it was dropped anyway, unless something was sent on
    /// it since (a subscription, a command): the system then probes no more and retries the
    /// sending for its own limit (about 15 minutes on Linux). So on Linux a connection also
    /// ends when data sent on it stays unacknowledged for `idle` and 90 s (`TCP_USER_TIMEOUT`),
    /// the time keepalive takes to give up with Linux's defaults (the user timeout then stands
    /// for the probe count: a host tuned to fewer probes finds a dead connection at that time
    /// too). `idle` is counted in whole seconds, from 1 s to 32,767 s (Linux's bounds), or
    /// [`connect`](Self::connect) refuses it.
    pub fn tcp_keepalive(mut self, idle: Option<Duration>) -> Self {
        self.tcp_keepalive = idle;
        self
    }

    /// How long a lock's wake-up channel stays subscribed after its last local waiter is
    /// gone (default 2 s), so a process that locks the same lock again and again does not
    /// subscribe and unsubscribe each time. A linger too long to count from now (such as
    /// `Duration::MAX`) keeps channels subscribed.
    pub fn subscription_linger(mut self, linger: Duration) -> Self {
        self.subscription_linger = linger;
        self
    }

    /// Refuses the durations no store arithmetic should meet (the fence margin is added to
    /// the server's clock in milliseconds inside the scripts, where a huge one would wrap), the
    /// timeouts fred would read as none, and keepalive idle times the system refuses (every
    /// connection would then fail, reported as the server being unreachable).
    fn check_durations(&self) -> Result<()> {
        let acks = self.replica_acks.as_ref().map(|acks| acks.timeout);
        let one_ms = Duration::from_millis(1);
        let longest = fairlock::MAX_DURATION;
        for (what, value, least, most) in [
            (
                "connect_timeout",
                Some(self.connect_timeout),
                one_ms,
                longest,
            ),
            (
                "command_timeout",
                Some(self.command_timeout),
                one_ms,
                longest,
            ),
            (
                "fence_margin",
                Some(self.fence_margin),
                Duration::ZERO,
                longest,
            ),
            ("replicas_acked timeout", acks, Duration::ZERO, longest),
            (
                "tcp_keepalive",
                self.tcp_keepalive,
                Duration::from_secs(1),
                MAX_KEEPALIVE_IDLE,
            ),
        ] {
            if let Some(value) = value.filter(|value| *value < least || *value > most) {
                return Err(Error::InvalidArgument {
                    what,
                    reason: format!("{value:?} is not within {least:?} ..= {most:?}"),
                });
            }
        }
        Ok(())
    }

    /// Connects the pool and the subscriber connection.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future closes whatever connections it had opened (in the
    /// background), so nothing keeps reconnecting.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a malformed URL or prefix, or a duration out of its
    /// setter's range (a `connect_timeout`, `command_timeout`, `fence_margin` or
    /// `replicas_acked` timeout longer than [`fairlock::MAX_DURATION`], a zero timeout, a
    /// `tcp_keepalive` outside 1 s ..= 32,767 s); [`Error::Unavailable`]
    /// (naming the servers, never the password) if no connection is made within the
    /// connect timeout.
    pub async fn connect(self) -> Result<RedisBackend> {
        check_prefix(&self.prefix)?;
        self.check_durations()?;
        if !self.url.starts_with("redis") {
            return Err(Error::InvalidArgument {
                what: "redis url",
                reason: format!(
                    "{} is not a redis://, rediss://, redis-cluster:// or redis-sentinel:// URL",
                    redact(&self.url)
                ),
            });
        }
        if cfg!(not(feature = "tls")) && self.url.starts_with("rediss") {
            // fred would otherwise ignore the `s` and talk plain text to a TLS port.
            return Err(Error::InvalidArgument {
                what: "redis url",
                reason: format!(
                    "{} asks for TLS; enable the `tls` feature of fairlock-redis",
                    redact(&self.url)
                ),
            });
        }
        let config = Config::from_url(&self.url).map_err(|error| Error::InvalidArgument {
            what: "redis url",
            reason: format!("{}: {}", redact(&self.url), error.details()),
        })?;
        let endpoint = endpoint_of(&config);
        let mut builder = Builder::from_config(config);
        builder
            .with_connection_config(|connection| {
                connection.connection_timeout = self.connect_timeout;
                connection.internal_command_timeout = self.connect_timeout;
                connection.tcp = tcp_config(self.tcp_keepalive);
            })
            .with_performance_config(|performance| {
                performance.default_command_timeout = self.command_timeout;
            })
            // Keep reconnecting (no attempt limit), backing off from 50 ms to 2 s.
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2));
        let build_error = |error: fred::error::Error| Error::Backend {
            backend: BACKEND,
            source: Box::new(error),
        };
        // The pool with fred's default broadcast buffers: its clients receive no messages, and
        // fred preallocates several buffers per client (a large one on every pooled client
        // cost about 48 MB per backend).
        let pool = builder.build_pool(self.pool_size).map_err(build_error)?;
        // Only the subscriber gets a large one: wake-ups of many locks can arrive in bursts,
        // and a short buffer overflows and turns each burst into a recheck by every waiter.
        builder.with_performance_config(|performance| {
            performance.broadcast_channel_capacity = WAKE_BUFFER;
        });
        let subscriber = builder.build_subscriber_client().map_err(build_error)?;

        let limit = self.connect_timeout + Duration::from_millis(500);
        // fred's connection tasks outlive their handles and reconnect forever: whatever
        // ends this call early (an error, a timeout, the caller dropping it) must quit them.
        let mut cleanup = QuitOnDrop {
            clients: Some((pool.clone(), subscriber.clone())),
            runtime: tokio::runtime::Handle::try_current().ok(),
        };
        let connected = async {
            pool.init().await?;
            subscriber.init().await?;
            Ok::<_, fred::error::Error>(())
        };
        match tokio::time::timeout(limit, connected).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(unavailable(&endpoint, error)),
            Err(_) => {
                return Err(unavailable(
                    &endpoint,
                    format!("no connection within {limit:?}"),
                ))
            }
        }
        // An acknowledgement is only trusted on the connection its change was made on, told
        // by its `CLIENT ID` (see `RedisBackend::acknowledged`): without it none would count.
        if self.replica_acks.is_some()
            && pool
                .clients()
                .iter()
                .any(|client| client.connection_ids().is_empty())
        {
            return Err(Error::InvalidArgument {
                what: "replicas_acked",
                reason: format!(
                    "{}: the server did not give the connections' ids (`CLIENT ID`, refused by \
                     an ACL?), which acknowledgement needs to know a `WAIT` came on the \
                     connection its change was made on",
                    redact(&self.url)
                ),
            });
        }
        // Still under the clean-up guard: a caller that drops connect() here leaves nothing.
        warn_if_locks_may_be_evicted(&pool, &endpoint).await;
        cleanup.clients = None;
        Ok(RedisBackend::assemble(
            pool,
            subscriber,
            Settings {
                prefix: self.prefix,
                endpoint,
                owns_clients: true,
                linger: self.subscription_linger,
                fence_margin: self.fence_margin,
                replica_acks: self.replica_acks,
            },
        ))
    }
}

/// The socket options of the builder's connections: keepalive after `idle` (see
/// [`RedisBackendBuilder::tcp_keepalive`]), and no Nagle delay, since commands share a
/// connection and a small one must not wait for the reply to the one before.
/// The longest keepalive idle time Linux accepts (`TCP_KEEPIDLE`, in seconds).
const MAX_KEEPALIVE_IDLE: Duration = Duration::from_secs(32_767);

fn tcp_config(idle: Option<Duration>) -> TcpConfig {
    use fred::socket2::TcpKeepalive;
    // Sent data unacknowledged for as long as keepalive takes to give up (9 probes 10 s
    // apart) ends the connection too: probes stop while data waits for its acknowledgement.
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    let user_timeout = idle.map(|idle| idle.saturating_add(KEEPALIVE_GIVES_UP_AFTER));
    let keepalive = idle.map(|idle| {
        let keepalive = TcpKeepalive::new().with_time(idle);
        // Where the system lets a socket set it (socket2's list); elsewhere its default.
        #[cfg(any(
            target_os = "android",
            target_os = "dragonfly",
            target_os = "freebsd",
            target_os = "fuchsia",
            target_os = "illumos",
            target_os = "ios",
            target_os = "linux",
            target_os = "macos",
            target_os = "netbsd",
            target_os = "windows",
        ))]
        let keepalive = keepalive.with_interval(Duration::from_secs(10));
        keepalive
    });
    TcpConfig {
        nodelay: Some(true),
        keepalive,
        #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
        user_timeout,
        ..TcpConfig::default()
    }
}

/// How long keepalive probes go unanswered before the system ends the connection: Linux's
/// default 9 probes, 10 s apart.
const KEEPALIVE_GIVES_UP_AFTER: Duration = Duration::from_secs(90);

/// Reads the server's `maxmemory-policy` and warns if it may evict lock keys. Best effort: a
/// server that refuses `CONFIG` (managed services often do) is not asked again.
async fn warn_if_locks_may_be_evicted(pool: &Pool, endpoint: &str) {
    use fred::interfaces::ConfigInterface;
    let reply: Result<fred::types::Value, _> = tokio::time::timeout(
        Duration::from_secs(1),
        pool.next().config_get("maxmemory-policy"),
    )
    .await
    .unwrap_or_else(|_| Ok(fred::types::Value::Null));
    let policy = match reply {
        Ok(fred::types::Value::Array(items)) => items.get(1).and_then(|v| v.as_string()),
        Ok(fred::types::Value::Map(map)) => map.inner().values().next().and_then(|v| v.as_string()),
        _ => None,
    };
    if let Some(warning) = policy.as_deref().and_then(eviction_warning) {
        tracing::warn!(
            endpoint,
            policy = policy.as_deref(),
            "fairlock-redis: {warning}"
        );
    }
}

/// Why a `maxmemory-policy` is a danger to locks, if it is. `allkeys-*` policies may evict any
/// key when memory is short, a held lock's included: the lock is then free while its holder
/// works (its renewal fails and `lease_lost` fires, but only at the next renewal). `volatile-*`
/// policies may evict keys with a TTL, which a held lock's keys all have.
pub(crate) fn eviction_warning(policy: &str) -> Option<String> {
    let may = policy.starts_with("allkeys-") || policy.starts_with("volatile-");
    may.then(|| {
        format!(
            "maxmemory-policy is {policy}: when memory runs short Redis may evict a held lock's \
             keys and free it while its holder works; use noeviction for a lock store"
        )
    })
}

/// What a backend is made with besides its clients.
pub(crate) struct Settings {
    pub(crate) prefix: String,
    /// The servers, without credentials, for messages.
    pub(crate) endpoint: String,
    /// Whether the connections were made here (and so are closed here).
    pub(crate) owns_clients: bool,
    pub(crate) linger: Duration,
    pub(crate) fence_margin: Duration,
    pub(crate) replica_acks: Option<ReplicaAcks>,
}

/// How many replicas must acknowledge a change, and how long to wait for them; see
/// [`RedisBackendBuilder::replicas_acked`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReplicaAcks {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// Quits the connections it holds when dropped, unless emptied first.
struct QuitOnDrop {
    clients: Option<(Pool, SubscriberClient)>,
    /// The runtime `connect` runs on, which runs the connections: its future may be dropped
    /// outside any runtime.
    runtime: Option<tokio::runtime::Handle>,
}

impl Drop for QuitOnDrop {
    fn drop(&mut self) {
        if let (Some((pool, subscriber)), Some(runtime)) = (self.clients.take(), &self.runtime) {
            quit_later(runtime, pool, subscriber);
        }
    }
}

/// Quits `pool` and `subscriber` in a task on `runtime`, the one that runs their connections
/// (a drop may happen outside any runtime, or on another).
pub(crate) fn quit_later(
    runtime: &tokio::runtime::Handle,
    pool: Pool,
    subscriber: SubscriberClient,
) {
    runtime.spawn(async move {
        let _ = subscriber.quit().await;
        let _ = pool.quit().await;
    });
}

pub(crate) fn check_prefix(prefix: &str) -> Result<()> {
    if prefix.contains(['{', '}']) {
        return Err(Error::InvalidArgument {
            what: "key prefix",
            reason: format!("{prefix:?} contains a brace; the lock's hash tag must be the first"),
        });
    }
    Ok(())
}

/// The servers a config points at, as `host:port[,host:port...]` (no credentials).
pub(crate) fn endpoint_of(config: &Config) -> String {
    match &config.server {
        ServerConfig::Centralized { server } => format!("{}:{}", server.host, server.port),
        ServerConfig::Clustered { hosts, .. } => hosts
            .iter()
            .map(|server| format!("{}:{}", server.host, server.port))
            .collect::<Vec<_>>()
            .join(","),
        ServerConfig::Sentinel {
            hosts,
            service_name,
            ..
        } => format!(
            "{service_name} via sentinels {}",
            hosts
                .iter()
                .map(|server| format!("{}:{}", server.host, server.port))
                .collect::<Vec<_>>()
                .join(",")
        ),
        #[allow(unreachable_patterns)] // fred adds variants under features (unix sockets).
        other => format!("{other:?}"),
    }
}

/// `url` with any `user:password@` removed, and the value of any `password=` parameter (in a
/// query, or in whatever else was passed for a URL) hidden.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return hide_password_values(url);
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    hide_password_values(&match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    })
}

/// `text` with the value of every `password` parameter replaced by `***`: of a URL's query
/// (`password=…`, `sentinelPassword=…`, up to the next `&` or `#`), or of a `key=value`
/// connection string (spaces allowed around `=`; the value quoted, or up to the next space).
/// For messages that show a connection string; not part of the stable API.
#[doc(hidden)]
pub fn hide_password_values(text: &str) -> String {
    const KEY: &str = "password";
    let in_url = text.contains("://");
    // ASCII lowercase keeps every byte where it was.
    let lower = text.to_ascii_lowercase();
    let skip_spaces = |mut at: usize| {
        if !in_url {
            while text[at..].starts_with(' ') {
                at += 1;
            }
        }
        at
    };
    let mut shown = String::with_capacity(text.len());
    let (mut copied, mut at) = (0, 0);
    while let Some(found) = lower[at..].find(KEY) {
        at += found + KEY.len();
        let equals = skip_spaces(at);
        if !text[equals..].starts_with('=') {
            continue;
        }
        let start = skip_spaces(equals + 1);
        let rest = &text[start..];
        let len = if in_url {
            rest.find(['&', '#']).unwrap_or(rest.len())
        } else if let Some(quoted) = rest.strip_prefix('\'') {
            // Up to the closing quote; a backslash escapes the next character.
            let mut escaped = false;
            quoted
                .char_indices()
                .find(|&(_, c)| {
                    let closes = !escaped && c == '\'';
                    escaped = !escaped && c == '\\';
                    closes
                })
                .map_or(rest.len(), |(end, _)| end + 2)
        } else {
            rest.find(char::is_whitespace).unwrap_or(rest.len())
        };
        shown.push_str(&text[copied..start]);
        shown.push_str("***");
        copied = start + len;
        at = copied;
    }
    shown.push_str(&text[copied..]);
    shown
}

/// Connects clients made elsewhere; see [`RedisBackend::from_clients`].
pub(crate) fn from_clients(
    pool: Pool,
    subscriber: SubscriberClient,
    prefix: String,
) -> Result<RedisBackend> {
    check_prefix(&prefix)?;
    // The backend spawns its dispatcher: without a runtime that would panic.
    tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
    let endpoint = endpoint_of(&pool.client_config());
    Ok(RedisBackend::assemble(
        pool,
        subscriber,
        Settings {
            prefix,
            endpoint,
            owns_clients: false,
            linger: DEFAULT_LINGER,
            fence_margin: DEFAULT_FENCE_MARGIN,
            replica_acks: None,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keepalive stops probing while sent data waits for its acknowledgement, so a silently
    /// dropped connection with a subscription or command on its way would stand for the
    /// system's retransmission limit (about 15 minutes): the user timeout ends it as soon as
    /// keepalive would have.
    #[test]
    #[cfg(target_os = "linux")]
    fn unacknowledged_data_ends_a_connection_when_keepalive_would() {
        let config = tcp_config(Some(Duration::from_secs(60)));
        assert_eq!(config.user_timeout, Some(Duration::from_secs(150)));
        assert!(config.keepalive.is_some());
        assert_eq!(tcp_config(None).user_timeout, None);
        assert_eq!(
            tcp_config(Some(Duration::MAX)).user_timeout,
            Some(Duration::MAX)
        );
    }

    #[test]
    fn credentials_never_show() {
        assert_eq!(
            redact("redis://user:secret@127.0.0.1:6379/0"),
            "redis://***@127.0.0.1:6379/0"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        // Not a URL at all (a PostgreSQL connection string), and a password in a query.
        assert_eq!(
            redact("host=db user=app password=s3cret dbname=app"),
            "host=db user=app password=*** dbname=app"
        );
        assert_eq!(
            redact("redis-sentinel://h:1?sentinelServiceName=m&sentinelPassword=s3cret&node=h:2"),
            "redis-sentinel://h:1?sentinelServiceName=m&sentinelPassword=***&node=h:2"
        );
        // Spaces around `=`, quoted values, `&` and `#` inside a key=value string's value.
        for (given, shown) in [
            ("host=db password = s3cret", "host=db password = ***"),
            ("password='a b\\' c' host=db", "password=*** host=db"),
            ("PASSWORD=p&ss#x host=db", "PASSWORD=*** host=db"),
            ("passwords are fine", "passwords are fine"),
        ] {
            assert_eq!(redact(given), shown, "{given}");
        }
        let builder = RedisBackendBuilder::new("rediss://:hunter2@example:6380");
        assert!(!format!("{builder:?}").contains("hunter2"));
    }

    #[cfg(not(feature = "tls"))]
    #[tokio::test]
    async fn tls_urls_need_the_tls_feature() {
        let err = RedisBackendBuilder::new("rediss://127.0.0.1:1")
            .connect()
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    }

    #[tokio::test]
    async fn malformed_urls_are_invalid_arguments() {
        for url in ["not a url", "http://127.0.0.1:6379", "redis://:pw@"] {
            let err = RedisBackendBuilder::new(url).connect().await.unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { .. }), "{url}: {err}");
            assert!(!err.to_string().contains(":pw@"), "{err}");
        }
    }

    #[tokio::test]
    async fn durations_out_of_range_are_invalid_arguments() {
        let over = fairlock::MAX_DURATION + Duration::from_millis(1);
        let builder = || RedisBackendBuilder::new("redis://127.0.0.1:1");
        let builders = [
            ("connect_timeout", builder().connect_timeout(Duration::MAX)),
            ("connect_timeout", builder().connect_timeout(Duration::ZERO)),
            ("command_timeout", builder().command_timeout(over)),
            ("command_timeout", builder().command_timeout(Duration::ZERO)),
            ("fence_margin", builder().fence_margin(Duration::MAX)),
            ("replicas_acked timeout", builder().replicas_acked(1, over)),
            (
                "tcp_keepalive",
                builder().tcp_keepalive(Some(Duration::from_millis(500))),
            ),
            (
                "tcp_keepalive",
                builder().tcp_keepalive(Some(MAX_KEEPALIVE_IDLE + Duration::from_secs(1))),
            ),
        ];
        for (what, builder) in builders {
            let outcome = tokio::time::timeout(Duration::from_secs(1), builder.connect()).await;
            assert!(
                matches!(outcome, Ok(Err(Error::InvalidArgument { what: named, .. })) if named == what),
                "{what}: expected InvalidArgument at once, got {outcome:?}"
            );
        }
    }

    #[test]
    fn clients_given_outside_a_runtime_are_refused_not_a_panic() {
        let builder = Builder::from_config(Config::from_url("redis://127.0.0.1:1").unwrap());
        let pool = builder.build_pool(1).unwrap();
        let subscriber = builder.build_subscriber_client().unwrap();
        let err = from_clients(pool, subscriber, "p:".into()).unwrap_err();
        assert!(matches!(err, Error::NoRuntime), "{err}");
    }

    #[test]
    fn prefixes_with_braces_are_rejected() {
        assert!(check_prefix("fairlock:").is_ok());
        assert!(matches!(
            check_prefix("a{b}:"),
            Err(Error::InvalidArgument { .. })
        ));
    }

    #[test]
    fn sentinel_endpoints_name_the_service_and_the_sentinels() {
        let config = Config::from_url(
            "redis-sentinel://127.0.0.1:26379?sentinelServiceName=locks&node=127.0.0.1:26380",
        )
        .unwrap();
        let endpoint = endpoint_of(&config);
        assert!(endpoint.starts_with("locks via sentinels "), "{endpoint}");
        assert!(endpoint.contains("127.0.0.1:26379") && endpoint.contains("127.0.0.1:26380"));
    }

    #[test]
    fn endpoints_list_every_seed_node() {
        let config =
            Config::from_url("redis-cluster://127.0.0.1:7000?node=127.0.0.1:7001").unwrap();
        let endpoint = endpoint_of(&config);
        assert!(endpoint.contains("127.0.0.1:7000") && endpoint.contains("127.0.0.1:7001"));
    }
}

#[cfg(test)]
mod eviction_tests {
    use super::eviction_warning;

    #[test]
    fn policies_that_may_evict_lock_keys_are_warned_about() {
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-ttl",
        ] {
            assert!(eviction_warning(policy).is_some(), "{policy}");
        }
        assert_eq!(eviction_warning("noeviction"), None);
    }
}

//! A primary with replicas behind Redis Sentinel, all on free loopback ports.

use std::io;
use std::time::{Duration, Instant};

use crate::server::RedisServer;

/// The service name the sentinels monitor.
pub const SENTINEL_SERVICE: &str = "fairlock";

/// How long [`RedisSentinels::start`] waits for replication and the sentinels to settle.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A primary, its replicas and the sentinels that watch them (quorum: a majority), each a
/// [`RedisServer`] killed when dropped. The sentinels declare the primary down after 3 s
/// without an answer and then promote a replica.
#[derive(Debug)]
pub struct RedisSentinels {
    /// The data nodes: index 0 is the first primary, then the replicas.
    nodes: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
}

impl RedisSentinels {
    /// Starts a primary, `replicas` replicas of it and `sentinels` sentinels, and waits until
    /// the replicas are in sync and every sentinel knows every replica and every other
    /// sentinel.
    ///
    /// # Panics
    ///
    /// When Redis is not installed (see [`require_redis`](crate::require_redis)).
    pub fn start(replicas: usize, sentinels: usize) -> io::Result<RedisSentinels> {
        // A full synchronisation starts at once rather than after Redis's default 5 s wait
        // for more replicas, here and when a node rejoins as a replica.
        let no_sync_delay = ["--repl-diskless-sync-delay", "0"];
        let primary = RedisServer::start_with(&no_sync_delay)?;
        let port = primary.port().to_string();
        let mut nodes = vec![primary];
        for _ in 0..replicas {
            nodes.push(RedisServer::start_with(&[
                no_sync_delay[0],
                no_sync_delay[1],
                "--replicaof",
                "127.0.0.1",
                &port,
            ])?);
        }
        let quorum = sentinels / 2 + 1;
        let lines = vec![
            format!("sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {port} {quorum}"),
            // Not 1 s: Sentinel pings once a second, so with 1 s one late reply from a freshly
            // promoted primary was enough to fail it over again a second after the first
            // failover (seen in 1 test run of 15, on an idle machine).
            format!("sentinel down-after-milliseconds {SENTINEL_SERVICE} 3000"),
            format!("sentinel failover-timeout {SENTINEL_SERVICE} 5000"),
            format!("sentinel parallel-syncs {SENTINEL_SERVICE} {replicas}"),
        ];
        let sentinels = (0..sentinels)
            .map(|_| RedisServer::start_sentinel(&lines))
            .collect::<io::Result<Vec<_>>>()?;
        let set = RedisSentinels { nodes, sentinels };
        set.wait_until_settled(replicas)?;
        Ok(set)
    }

    fn wait_until_settled(&self, replicas: usize) -> io::Result<()> {
        poll(SETTLE_TIMEOUT, Duration::from_millis(100), || {
            Ok(match self.unsettled(replicas) {
                None => Ok(()),
                Some(reason) => Err(format!("the sentinel setup did not settle: {reason}")),
            })
        })
    }

    fn unsettled(&self, replicas: usize) -> Option<String> {
        let online = online_replicas(&self.nodes[0]).ok()?;
        if online < replicas {
            return Some(format!("{online} of {replicas} replicas online"));
        }
        for sentinel in &self.sentinels {
            let text = sentinel
                .cli(&["SENTINEL", "MASTER", SENTINEL_SERVICE])
                .unwrap_or_default();
            let field = |name: &str| {
                let mut lines = text.lines();
                while let Some(line) = lines.next() {
                    if line == name {
                        return lines.next().and_then(|v| v.parse::<usize>().ok());
                    }
                }
                None
            };
            if field("num-slaves") != Some(replicas)
                || field("num-other-sentinels") != Some(self.sentinels.len() - 1)
            {
                return Some(format!(
                    "sentinel {} does not know the whole setup yet",
                    sentinel.port()
                ));
            }
        }
        None
    }

    /// `redis-sentinel://127.0.0.1:S1?sentinelServiceName=fairlock&node=127.0.0.1:S2&…`, fred's
    /// form of a Sentinel URL naming every sentinel.
    pub fn url(&self) -> String {
        let mut url = format!(
            "redis-sentinel://127.0.0.1:{}?sentinelServiceName={SENTINEL_SERVICE}",
            self.sentinels[0].port()
        );
        for sentinel in &self.sentinels[1..] {
            url.push_str(&format!("&node=127.0.0.1:{}", sentinel.port()));
        }
        url
    }

    /// The port of the current primary, as the first sentinel that answers tells it.
    pub fn primary_port(&self) -> io::Result<u16> {
        for sentinel in &self.sentinels {
            let Ok(reply) =
                sentinel.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_SERVICE])
            else {
                continue;
            };
            if let Some(port) = reply.lines().nth(1).and_then(|p| p.parse().ok()) {
                return Ok(port);
            }
        }
        Err(io::Error::other("no sentinel names a primary"))
    }

    /// The data node (primary or replica) on `port`.
    pub fn node_on(&mut self, port: u16) -> Option<&mut RedisServer> {
        self.nodes.iter_mut().find(|node| node.port() == port)
    }

    /// The data nodes, the first primary first.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The sentinels, e.g. to read their [`log`](RedisServer::log) after a failover.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// Kills the current primary with SIGKILL and returns its port.
    pub fn kill_primary(&mut self) -> io::Result<u16> {
        let port = self.primary_port()?;
        self.node_on(port)
            .ok_or_else(|| io::Error::other(format!("no node on port {port}")))?
            .stop();
        Ok(port)
    }

    /// Waits (up to `timeout`) until the primary on `port` has `replicas` replicas online, e.g.
    /// after a failover, once the surviving replicas were re-pointed and a restarted node
    /// rejoined as a replica.
    pub fn wait_for_replicas(
        &self,
        port: u16,
        replicas: usize,
        timeout: Duration,
    ) -> io::Result<()> {
        let node = self
            .nodes
            .iter()
            .find(|node| node.port() == port)
            .ok_or_else(|| io::Error::other(format!("no node on port {port}")))?;
        poll(timeout, Duration::from_millis(50), || {
            let online = online_replicas(node).unwrap_or(0);
            Ok(if online >= replicas {
                Ok(())
            } else {
                Err(format!("{online} of {replicas} replicas of {port} online"))
            })
        })
    }

    /// Makes the sentinels fail the current primary over although it is alive (`SENTINEL
    /// FAILOVER`), as they do by themselves when it answers their pings late: the primary is
    /// demoted and one of its replicas promoted. Asks again (up to `timeout`) while a failover
    /// is still in progress or no replica qualifies yet. Returns the demoted primary's port.
    pub fn force_failover(&self, timeout: Duration) -> io::Result<u16> {
        let port = self.primary_port()?;
        poll(timeout, Duration::from_millis(50), || {
            let reply = self.sentinels[0].cli(&["SENTINEL", "FAILOVER", SENTINEL_SERVICE])?;
            Ok(if reply == "OK" {
                Ok(port)
            } else {
                Err(format!("SENTINEL FAILOVER still refused: {reply}"))
            })
        })
    }

    /// Waits (up to `timeout`) until the sentinels name a primary other than `old_port`, and it
    /// answers as a primary.
    pub fn wait_for_new_primary(&self, old_port: u16, timeout: Duration) -> io::Result<u16> {
        poll(timeout, Duration::from_millis(50), || {
            let promoted = self.primary_port().ok().filter(|port| {
                *port != old_port
                    && self
                        .nodes
                        .iter()
                        .find(|node| node.port() == *port)
                        .and_then(|node| node.cli(&["ROLE"]).ok())
                        .is_some_and(|role| role.starts_with("master"))
            });
            Ok(promoted.ok_or_else(|| "no new primary".to_owned()))
        })
    }
}

/// Calls `check` every `pause` until it gives a value, for at most `timeout`; then fails as
/// `TimedOut` with the last reason it gave for not being ready. An error of `check` ends it.
fn poll<T>(
    timeout: Duration,
    pause: Duration,
    mut check: impl FnMut() -> io::Result<Result<T, String>>,
) -> io::Result<T> {
    let started = Instant::now();
    loop {
        let reason = match check()? {
            Ok(value) => return Ok(value),
            Err(reason) => reason,
        };
        if started.elapsed() > timeout {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{reason} after {timeout:?}"),
            ));
        }
        std::thread::sleep(pause);
    }
}

/// How many replicas `node`, a primary, reports online (`INFO replication`).
fn online_replicas(node: &RedisServer) -> io::Result<usize> {
    let info = node.cli(&["INFO", "replication"])?;
    Ok(info
        .lines()
        .filter(|line| line.starts_with("slave") && line.contains("state=online"))
        .count())
}

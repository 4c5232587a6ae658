//! [`LockBackend`] for [`RedisBackend`]: each method runs one script and reads its reply.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use fairlock::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, Grant, HolderState, LockBackend, LockState,
    LockSummary, ReleaseOutcome, WaiterState, Watch, RESEND_HORIZON,
};
use fairlock::{Error, LockName, Owner, Result};
use fred::clients::Client;
use fred::interfaces::{ClientInterface, ClientLike, ClusterInterface};
use fred::types::config::{Options, Server};
use fred::types::{ClusterHash, CustomCommand, Value};
use futures::TryStreamExt;

use crate::error::{self, Context, BACKEND};
use crate::keys::{LockKeys, DEADLINES_SUFFIX, HOLDER_SUFFIX};
use crate::scripts::Script;
use crate::RedisBackend;

/// A duration in whole milliseconds, rounded up (a lease never ends before the guard's
/// deadline, which counts the exact duration), at least 1.
fn millis(duration: Duration) -> String {
    duration
        .as_nanos()
        .div_ceil(1_000_000)
        .clamp(1, u128::from(u64::MAX))
        .to_string()
}

fn bad_reply(script: &str, reply: impl std::fmt::Debug) -> Error {
    Error::Backend {
        backend: BACKEND,
        source: format!("unexpected reply from the {script} script: {reply:?}").into(),
    }
}

/// Where a script was sent: the pooled client, the lock's slot, and (only when replicas must
/// acknowledge) the client's route just before.
struct Sent {
    client: Client,
    slot: u16,
    before: Option<Route>,
}

/// Which connections a client has (server -> `CLIENT ID`), and which node serves a slot in a
/// Cluster: what must not change between a script and its `WAIT`. In a Cluster only the
/// connection to that node counts (a reconnection to another node changes nothing for it).
#[derive(Debug, PartialEq)]
struct Route {
    connections: HashMap<Server, i64>,
    owner: Option<Server>,
}

impl Route {
    fn of(client: &Client, slot: u16) -> Route {
        let mut connections = client.connection_ids();
        let owner = client
            .cached_cluster_state()
            .and_then(|state| state.get_server(slot).cloned());
        if let Some(owner) = &owner {
            connections.retain(|server, _| server == owner);
        }
        Route { connections, owner }
    }
}

impl RedisBackend {
    fn keys(&self, name: &str) -> LockKeys {
        LockKeys::new(&self.inner.prefix, name)
    }

    async fn run(
        &self,
        script: &Script,
        keys: &LockKeys,
        lock: &str,
        args: Vec<String>,
    ) -> Result<Value> {
        Ok(self.run_on(script, keys, lock, args).await?.0)
    }

    /// Runs `script` on the next pooled connection; its reply and where it was sent.
    async fn run_on(
        &self,
        script: &Script,
        keys: &LockKeys,
        lock: &str,
        args: Vec<String>,
    ) -> Result<(Value, Sent)> {
        let client = self.inner.pool.next();
        let slot = keys.slot();
        // Taken before the script is sent: a reconnection after this point changes it.
        let before = self.inner.replica_acks.map(|_| Route::of(client, slot));
        let reply = script
            .run(client, keys.as_vec(), args)
            .await
            .map_err(|e| self.map_error(e, Some(lock)))?;
        Ok((
            reply,
            Sent {
                client: client.clone(),
                slot,
                before,
            },
        ))
    }

    fn map_error(&self, error: fred::error::Error, lock: Option<&str>) -> Error {
        error::map(
            error,
            Context {
                endpoint: &self.inner.endpoint,
                lock,
            },
        )
    }

    /// With [`replicas_acked`](crate::RedisBackendBuilder::replicas_acked): waits until the
    /// configured number of replicas acknowledged every write made so far on the connection
    /// the script was `sent` on (`WAIT`, sent after the script on the same connection), and
    /// fails with `Unavailable` if they do not in time. Without it, does nothing.
    ///
    /// `WAIT` only speaks for writes made on its own connection, so it must not go anywhere
    /// else. fred would send it again on a new connection when the old one breaks (perhaps
    /// to a new primary), and in a Cluster would route it to any node while the slot's is
    /// unreachable: so it is sent once, to the node the slot had before the script, without
    /// waiting for a reconnection; and its answer only counts if that node and the client's
    /// connections (their `CLIENT ID`s, which a new connection changes) are still the ones
    /// taken before the script was sent.
    async fn acknowledged(&self, sent: &Sent, name: &str, what: &str) -> Result<()> {
        let (Some(acks), Some(before)) = (self.inner.replica_acks, sent.before.as_ref()) else {
            return Ok(());
        };
        let unknown = |why: &str| {
            error::unavailable(
                &self.inner.endpoint,
                format!("{what} on lock {name:?} not known to be acknowledged: {why}"),
            )
        };
        if before.connections.is_empty() {
            return Err(unknown(
                "the connection's `CLIENT ID` is unknown (not connected, or `CLIENT ID` \
                 refused, e.g. by an ACL)",
            ));
        }
        let command = CustomCommand::new_static("WAIT", ClusterHash::Custom(sent.slot), false);
        let options = Options {
            max_attempts: Some(1),
            fail_fast: true,
            cluster_node: before.owner.clone(),
            ..Options::default()
        };
        let timeout = acks.timeout.as_millis().max(1).to_string();
        let acked: i64 = sent
            .client
            .with_options(&options)
            .custom(command, vec![acks.replicas.to_string(), timeout])
            .await
            .map_err(|e| self.map_error(e, Some(name)))?;
        if Route::of(&sent.client, sent.slot) != *before {
            return Err(unknown(
                "the connection changed between the change and its `WAIT` (a reconnection, \
                 perhaps to another server)",
            ));
        }
        if acked >= i64::from(acks.replicas) {
            return Ok(());
        }
        Err(error::unavailable(
            &self.inner.endpoint,
            format!(
                "{what} on lock {name:?} acknowledged by {acked} of the {} replicas required \
                 within {:?}",
                acks.replicas, acks.timeout
            ),
        ))
    }

    /// The ARGV every mutating script ends with: the lock's wake-up channel, then the fence
    /// margin in ms (see `lua/prelude.lua`).
    fn trailer(&self, name: &str) -> [String; 2] {
        [self.keys(name).channel, millis(self.inner.fence_margin)]
    }

    async fn run_for_text(&self, script: &Script, name: &str, args: Vec<String>) -> Result<String> {
        Ok(self.run_for_text_on(script, name, args).await?.0)
    }

    /// Like `run_for_text`, also giving the connection the script ran on.
    async fn run_for_text_on(
        &self,
        script: &Script,
        name: &str,
        args: Vec<String>,
    ) -> Result<(String, Sent)> {
        let (reply, sent) = self.run_on(script, &self.keys(name), name, args).await?;
        match reply.as_string() {
            Some(text) => Ok((text, sent)),
            None => Err(bad_reply(script.name, reply)),
        }
    }

    /// [`acknowledged`](Self::acknowledged) for a change nobody relies on being kept: a
    /// failover that loses it only delays others (a lost release looks like a hold until its
    /// lease ends), so a missing acknowledgement is logged, not returned.
    async fn warn_unless_acknowledged(&self, sent: &Sent, name: &str, what: &str) {
        if let Err(error) = self.acknowledged(sent, name, what).await {
            tracing::warn!(lock = name, %error, "fairlock-redis: change not acknowledged by the replicas");
        }
    }

    /// Runs `inspect` on the lock with these keys: (stored name, state). With `holder_only`,
    /// the script does not walk the queue, and the state lists no waiters.
    async fn snapshot(
        &self,
        keys: &LockKeys,
        lock: &str,
        holder_only: bool,
    ) -> Result<(String, LockState)> {
        let script = &self.scripts().await?.inspect;
        let args = if holder_only {
            vec!["h".to_owned()]
        } else {
            Vec::new()
        };
        let reply = self.run(script, keys, lock, args).await?;
        let Value::Array(items) = &reply else {
            return Err(bad_reply(script.name, reply));
        };
        let fields: Option<Vec<String>> = items.iter().map(Value::as_string).collect();
        let fields = fields.ok_or_else(|| bad_reply(script.name, &reply))?;
        if fields.len() < 6 || (fields.len() - 6) % 3 != 0 || (holder_only && fields.len() > 6) {
            return Err(bad_reply(script.name, &reply));
        }
        let number = |text: &str| -> Result<u64> {
            text.parse().map_err(|_| bad_reply(script.name, &reply))
        };
        let holder = if fields[1].is_empty() {
            None
        } else {
            Some(HolderState::new(
                fields[1].clone(),
                u32::try_from(number(&fields[2])?).map_err(|_| bad_reply(script.name, &reply))?,
                number(&fields[3])?,
                Duration::from_millis(number(&fields[4])?),
                fields[5] == "1",
            ))
        };
        let waiters = fields[6..]
            .chunks(3)
            .map(|waiter| {
                Ok(WaiterState::new(
                    waiter[0].clone(),
                    waiter[1]
                        .parse()
                        .map_err(|_| bad_reply(script.name, &reply))?,
                    Duration::from_millis(number(&waiter[2])?),
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let state = LockState::new(fields[0].clone(), holder, waiters);
        Ok((fields[0].clone(), state))
    }

    /// Every tag with a holder hash or a waiter set under this prefix, by `SCAN`.
    async fn scan_tags(&self) -> Result<BTreeSet<String>> {
        let prefix = &self.inner.prefix;
        let client = self.inner.pool.next();
        let clustered = client.is_clustered();
        let context = Context {
            endpoint: &self.inner.endpoint,
            lock: None,
        };
        let mut tags = BTreeSet::new();
        for suffix in [HOLDER_SUFFIX, DEADLINES_SUFFIX] {
            let pattern = format!("{}{{*}}{suffix}", glob_escape(prefix));
            let keys: Vec<fred::types::Key> = if clustered {
                client
                    .scan_cluster_buffered(pattern, Some(200), None)
                    .try_collect()
                    .await
            } else {
                client
                    .scan_buffered(pattern, Some(200), None)
                    .try_collect()
                    .await
            }
            .map_err(|e| error::map(e, context))?;
            for key in keys {
                let Some(key) = key.as_str() else { continue };
                if let Some(tag) = LockKeys::tag_of_key(prefix, key) {
                    tags.insert(tag.to_owned());
                }
            }
        }
        Ok(tags)
    }
}

/// `text` as a literal in a Redis glob pattern.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

fn parse_acquire(reply: &str) -> Option<AcquireOutcome> {
    let mut parts = reply.split(' ');
    let outcome = match parts.next()? {
        "G" => AcquireOutcome::Granted(Grant {
            token: parts.next()?.parse().ok()?,
            hold_count: parts.next()?.parse().ok()?,
        }),
        "Q" => {
            let ms: i64 = parts.next()?.parse().ok()?;
            AcquireOutcome::Queued {
                retry_after: u64::try_from(ms).ok().map(Duration::from_millis),
                last_token: parts.next()?.parse().ok()?,
            }
        }
        "B" => AcquireOutcome::Busy,
        _ => return None,
    };
    parts.next().is_none().then_some(outcome)
}

fn parse_release(reply: &str) -> Option<ReleaseOutcome> {
    match reply.split_once(' ') {
        Some(("R", remaining)) => Some(ReleaseOutcome::Released {
            remaining: remaining.parse().ok()?,
        }),
        None if reply == "N" => Some(ReleaseOutcome::NotHeld),
        _ => None,
    }
}

#[async_trait]
impl LockBackend for RedisBackend {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
        let script = &self.scripts().await?.acquire;
        let name = request.name.as_str();
        let mut args = vec![
            request.owner.as_str().to_owned(),
            request.attempt.to_string(),
            millis(request.lease),
            millis(request.waiter_ttl),
            if request.queue { "1" } else { "0" }.to_owned(),
            name.to_owned(),
            millis(RESEND_HORIZON),
            // Where the scripts tell this attempt's owner: this process alone when the owner
            // acts through this backend only, else the lock's channel, which every process
            // watching the lock hears (an owner with attempts in several processes).
            if request.owner.is_unique() {
                self.inner.dispatcher.waker().to_owned()
            } else {
                String::new()
            },
        ];
        args.extend(self.trailer(name));
        let (reply, sent) = self.run_for_text_on(script, name, args).await?;
        let outcome = parse_acquire(&reply).ok_or_else(|| bad_reply(script.name, reply))?;
        if matches!(outcome, AcquireOutcome::Granted(_)) {
            if let Err(error) = self.acknowledged(&sent, name, "a grant").await {
                // Not handed out unacknowledged: a failover could give the lock to another
                // while this caller believed it held. Best effort; the lease bounds it else.
                let _ = self
                    .abandon(&request.name, &request.owner, request.attempt)
                    .await;
                return Err(error);
            }
        }
        Ok(outcome)
    }

    async fn release(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        attempt: AttemptId,
    ) -> Result<ReleaseOutcome> {
        let script = &self.scripts().await?.release;
        let mut args = vec![
            owner.as_str().to_owned(),
            token.to_string(),
            attempt.to_string(),
            millis(RESEND_HORIZON),
        ];
        args.extend(self.trailer(name.as_str()));
        let (reply, sent) = self.run_for_text_on(script, name.as_str(), args).await?;
        let outcome = parse_release(&reply).ok_or_else(|| bad_reply(script.name, reply))?;
        self.warn_unless_acknowledged(&sent, name.as_str(), "a release")
            .await;
        Ok(outcome)
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> Result<bool> {
        let script = &self.scripts().await?.extend;
        let mut args = vec![owner.as_str().to_owned(), token.to_string(), millis(lease)];
        args.extend(self.trailer(name.as_str()));
        let (reply, sent) = self.run_for_text_on(script, name.as_str(), args).await?;
        match reply.as_str() {
            "1" => {
                self.acknowledged(&sent, name.as_str(), "a renewal").await?;
                Ok(true)
            }
            "0" => Ok(false),
            other => Err(bad_reply(script.name, other)),
        }
    }

    async fn abandon(&self, name: &LockName, owner: &Owner, attempt: AttemptId) -> Result<()> {
        let script = &self.scripts().await?.abandon;
        let mut args = vec![
            owner.as_str().to_owned(),
            attempt.to_string(),
            millis(RESEND_HORIZON),
        ];
        args.extend(self.trailer(name.as_str()));
        let (reply, sent) = self.run_for_text_on(script, name.as_str(), args).await?;
        match reply.as_str() {
            "OK" => {
                self.warn_unless_acknowledged(&sent, name.as_str(), "an abandoned attempt")
                    .await;
                Ok(())
            }
            other => Err(bad_reply(script.name, other)),
        }
    }

    async fn force_release(&self, name: &LockName, token: u64) -> Result<bool> {
        let script = &self.scripts().await?.force_release;
        match self
            .run_for_text(
                script,
                name.as_str(),
                [token.to_string(), millis(RESEND_HORIZON)]
                    .into_iter()
                    .chain(self.trailer(name.as_str()))
                    .collect(),
            )
            .await?
            .as_str()
        {
            "1" => Ok(true),
            "0" => Ok(false),
            other => Err(bad_reply(script.name, other)),
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        let (_, mut state) = self
            .snapshot(&self.keys(name.as_str()), name.as_str(), false)
            .await?;
        state.name = name.as_str().to_owned();
        Ok(state)
    }

    async fn holder(&self, name: &LockName) -> Result<Option<HolderState>> {
        let (_, state) = self
            .snapshot(&self.keys(name.as_str()), name.as_str(), true)
            .await?;
        Ok(state.holder)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>> {
        let mut summaries = Vec::new();
        for tag in self.scan_tags().await? {
            let keys = LockKeys::from_tag(&self.inner.prefix, &tag);
            let (name, state) = match self.snapshot(&keys, &tag, false).await {
                Ok(found) => found,
                // Someone else's key that happens to match the pattern: not a lock of ours.
                Err(Error::Conflict { .. }) => continue,
                Err(error) => return Err(error),
            };
            if name.is_empty() || !name.starts_with(prefix) {
                continue;
            }
            if state.holder.is_none() && state.waiters.is_empty() {
                continue;
            }
            summaries.push(LockSummary::new(
                name,
                state.holder.map(|holder| holder.owner),
                state.waiters.len(),
            ));
        }
        Ok(summaries)
    }

    async fn watch(&self, name: &LockName, owner: &Owner) -> Result<Watch> {
        let keys = self.keys(name.as_str());
        self.inner
            .dispatcher
            .watch(&keys.channel, owner.as_str())
            .await
            .map_err(|e| {
                error::map(
                    e,
                    Context {
                        endpoint: &self.inner.endpoint,
                        lock: Some(name.as_str()),
                    },
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_up_to_milliseconds() {
        // A lease or TTL of 1.9 ms sent as 1 would end before the guard's own deadline.
        assert_eq!(millis(Duration::from_micros(1_900)), "2");
        assert_eq!(millis(Duration::from_nanos(1_000_001)), "2");
        assert_eq!(millis(Duration::from_millis(5)), "5");
        assert_eq!(millis(Duration::from_nanos(1)), "1");
        assert_eq!(millis(Duration::ZERO), "1");
        assert_eq!(millis(Duration::MAX), u64::MAX.to_string());
    }

    #[test]
    fn replies_parse() {
        assert_eq!(
            parse_acquire("G 12 3"),
            Some(AcquireOutcome::Granted(Grant {
                token: 12,
                hold_count: 3
            }))
        );
        assert_eq!(
            parse_acquire("Q 250 7"),
            Some(AcquireOutcome::Queued {
                retry_after: Some(Duration::from_millis(250)),
                last_token: 7,
            })
        );
        assert_eq!(
            parse_acquire("Q -1 0"),
            Some(AcquireOutcome::Queued {
                retry_after: None,
                last_token: 0
            })
        );
        assert_eq!(parse_acquire("B"), Some(AcquireOutcome::Busy));
        assert_eq!(parse_acquire("G 1"), None);
        assert_eq!(
            parse_release("R 0"),
            Some(ReleaseOutcome::Released { remaining: 0 })
        );
        assert_eq!(parse_release("N"), Some(ReleaseOutcome::NotHeld));
        assert_eq!(parse_release("X"), None);
    }

    #[test]
    fn prefixes_are_escaped_for_scan() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}

//! Which pub/sub carries wake-ups: sharded (`SSUBSCRIBE`/`SPUBLISH`, Redis 7.0+, Valkey) where
//! the server has it, classic (`SUBSCRIBE`/`PUBLISH`) on Redis 6.2. Detected once per backend,
//! from the first connection that answers, and kept.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use fred::clients::Pool;
use fred::error::Error as RedisError;
use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, InfoKind, Value};

use crate::error::is_unreachable;

/// Which pub/sub a [`RedisBackend`](crate::RedisBackend) uses for wake-ups; see
/// [`RedisBackend::pubsub_mode`](crate::RedisBackend::pubsub_mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PubsubMode {
    /// Sharded pub/sub (`SPUBLISH`/`SSUBSCRIBE`): Redis 7.0 or later, Valkey. In a Cluster a
    /// wake-up stays on the lock's shard.
    Sharded,
    /// Classic pub/sub (`PUBLISH`/`SUBSCRIBE`), for servers without sharded pub/sub (Redis
    /// 6.2). In a Cluster every wake-up is broadcast to every node.
    Classic,
}

/// The pub/sub mode of one backend's server, detected at most once. A failed detection
/// (e.g. while the server is unreachable) fails the callers that waited for it, and is tried
/// again by the next caller that comes after.
#[derive(Debug)]
pub(crate) struct Detection {
    pool: Pool,
    mode: OnceLock<PubsubMode>,
    /// One detection at a time; holds the last failure, which the callers that waited for
    /// that detection share: if each asked again in turn while the server is away, the k-th
    /// would wait k command timeouts.
    detecting: tokio::sync::Mutex<Option<RedisError>>,
    /// How many detections failed so far.
    failures: AtomicU64,
}

impl Detection {
    /// Starts detecting in the background, so the first lock operation seldom waits for it.
    pub(crate) fn start(pool: Pool) -> Arc<Detection> {
        let detection = Arc::new(Detection {
            pool,
            mode: OnceLock::new(),
            detecting: tokio::sync::Mutex::new(None),
            failures: AtomicU64::new(0),
        });
        let early = detection.clone();
        tokio::spawn(async move {
            let _ = early.mode().await;
        });
        detection
    }

    /// The server's mode, detecting it first if no one has yet. A caller that waited for a
    /// detection that failed gets its error.
    pub(crate) async fn mode(&self) -> Result<PubsubMode, RedisError> {
        if let Some(mode) = self.known() {
            return Ok(mode);
        }
        let failures = self.failures.load(Ordering::Acquire);
        let mut last_failure = self.detecting.lock().await;
        if let Some(mode) = self.known() {
            return Ok(mode);
        }
        if self.failures.load(Ordering::Acquire) != failures {
            if let Some(error) = last_failure.as_ref() {
                return Err(error.clone());
            }
        }
        match detect(self.pool.next()).await {
            Ok(mode) => {
                tracing::debug!(?mode, "fairlock-redis: pub/sub mode for wake-ups");
                Ok(*self.mode.get_or_init(|| mode))
            }
            Err(error) => {
                *last_failure = Some(error.clone());
                self.failures.fetch_add(1, Ordering::Release);
                Err(error)
            }
        }
    }

    /// The mode if it is known already.
    pub(crate) fn known(&self) -> Option<PubsubMode> {
        self.mode.get().copied()
    }
}

/// Sharded if the server knows both `SPUBLISH` and `SSUBSCRIBE` (`COMMAND INFO`); if it
/// refuses `COMMAND` (ACLs, renamed commands), sharded if `INFO server` shows Redis 7 or
/// later or Valkey; classic otherwise (it works on every server, only less efficiently in a
/// Cluster). Fails only when the server cannot be reached.
async fn detect(client: &fred::clients::Client) -> Result<PubsubMode, RedisError> {
    let command = CustomCommand::new_static("COMMAND", ClusterHash::Random, false);
    let known = client
        .custom::<Value, _>(command, vec!["INFO", "SPUBLISH", "SSUBSCRIBE"])
        .await;
    let refused = match known {
        Ok(reply) => return Ok(from_command_info(&reply)),
        Err(error) if is_unreachable(&error) => return Err(error),
        Err(error) => error,
    };
    match client.info::<String>(Some(InfoKind::Server)).await {
        Ok(info) => Ok(from_info(&info)),
        Err(error) if is_unreachable(&error) => Err(error),
        Err(error) => {
            tracing::warn!(
                command_info = %refused,
                info = %error,
                "fairlock-redis: cannot tell whether the server has sharded pub/sub; using classic pub/sub for wake-ups"
            );
            Ok(PubsubMode::Classic)
        }
    }
}

/// From the reply to `COMMAND INFO SPUBLISH SSUBSCRIBE`: one entry per command, nil for a
/// command the server does not know.
fn from_command_info(reply: &Value) -> PubsubMode {
    match reply {
        Value::Array(entries)
            if entries.len() == 2
                && entries
                    .iter()
                    .all(|entry| matches!(entry, Value::Array(fields) if !fields.is_empty())) =>
        {
            PubsubMode::Sharded
        }
        _ => PubsubMode::Classic,
    }
}

/// From `INFO server`: Valkey (`valkey_version`, every release has sharded pub/sub) or
/// `redis_version` 7 or later.
fn from_info(info: &str) -> PubsubMode {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
    };
    let major =
        field("redis_version").and_then(|version| version.split('.').next()?.parse::<u32>().ok());
    if field("valkey_version").is_some() || major.is_some_and(|major| major >= 7) {
        PubsubMode::Sharded
    } else {
        PubsubMode::Classic
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_info_tells_whether_sharded_pubsub_exists() {
        let known = || Value::Array(vec![Value::from("spublish"), Value::from(3)]);
        assert_eq!(
            from_command_info(&Value::Array(vec![known(), known()])),
            PubsubMode::Sharded
        );
        assert_eq!(
            from_command_info(&Value::Array(vec![Value::Null, Value::Null])),
            PubsubMode::Classic
        );
        assert_eq!(
            from_command_info(&Value::Array(vec![known(), Value::Null])),
            PubsubMode::Classic
        );
        assert_eq!(from_command_info(&Value::Null), PubsubMode::Classic);
    }

    #[test]
    fn versions_tell_whether_sharded_pubsub_exists() {
        let info = |lines: &str| format!("# Server\r\n{lines}\r\nredis_mode:standalone\r\n");
        for (lines, mode) in [
            ("redis_version:6.2.14", PubsubMode::Classic),
            ("redis_version:6.0.9", PubsubMode::Classic),
            ("redis_version:7.0.15", PubsubMode::Sharded),
            ("redis_version:7.4.1", PubsubMode::Sharded),
            ("redis_version:10.0.0", PubsubMode::Sharded),
            // Valkey 8 still says 7.2.4 as its Redis version, and adds its own.
            (
                "redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1",
                PubsubMode::Sharded,
            ),
            ("redis_version:garbage", PubsubMode::Classic),
            ("", PubsubMode::Classic),
        ] {
            assert_eq!(from_info(&info(lines)), mode, "{lines}");
        }
    }
}

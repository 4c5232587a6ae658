//! The Lua scripts of `lua/`, embedded at compile time and run by SHA.
//!
//! Each script is one line naming the publishing command, the shared prelude, then the
//! operation. There are two compiled variants of every script, one per [`PubsubMode`]: the
//! line is `local PUBLISH = 'SPUBLISH'` (sharded pub/sub) or `local PUBLISH = 'PUBLISH'`
//! (classic, for Redis 6.2), and the prelude's `publish()` calls it.

use std::collections::HashMap;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::{ClusterHash, CustomCommand, Value};

use crate::pubsub::PubsubMode;

/// How long a script refused with `TRYAGAIN` (a Cluster slot migration in progress) is tried
/// again before the error goes up.
pub(crate) const TRYAGAIN_PATIENCE: Duration = Duration::from_secs(2);

/// One operation's script: the publishing line, the shared prelude, then the operation.
#[derive(Debug)]
pub(crate) struct Script {
    pub(crate) name: &'static str,
    body: &'static str,
    sha: String,
}

// `lua` in this crate is a link to the workspace's `lua/`, so that `cargo package` copies the
// scripts into the published crate; a path leaving the crate would not build from crates.io.
macro_rules! script {
    ($publish:literal, $name:literal) => {
        Script::new(
            $name,
            concat!(
                "local PUBLISH = '",
                $publish,
                "'\n",
                include_str!("../lua/prelude.lua"),
                "\n",
                include_str!(concat!("../lua/", $name, ".lua"))
            ),
        )
    };
}

/// A script that changes the lock: its body runs as a function whose reply goes through the
/// prelude's `finish`, which keeps the fence hash for as long as the lock is in use plus the
/// fence margin (the script's last ARGV).
macro_rules! mutating_script {
    ($publish:literal, $name:literal) => {
        Script::new(
            $name,
            concat!(
                "local PUBLISH = '",
                $publish,
                "'\n",
                include_str!("../lua/prelude.lua"),
                "\nlocal function operation()\n",
                include_str!(concat!("../lua/", $name, ".lua")),
                "\nend\nreturn finish(operation())\n"
            ),
        )
    };
}

macro_rules! scripts {
    ($publish:literal) => {
        Scripts {
            acquire: mutating_script!($publish, "acquire"),
            release: mutating_script!($publish, "release"),
            extend: mutating_script!($publish, "extend"),
            abandon: mutating_script!($publish, "abandon"),
            force_release: mutating_script!($publish, "force_release"),
            inspect: script!($publish, "inspect"),
        }
    };
}

/// Every script, in the variant for one pub/sub mode.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) release: Script,
    pub(crate) extend: Script,
    pub(crate) abandon: Script,
    pub(crate) force_release: Script,
    pub(crate) inspect: Script,
}

impl Scripts {
    pub(crate) fn new(mode: PubsubMode) -> Self {
        match mode {
            PubsubMode::Sharded => scripts!("SPUBLISH"),
            PubsubMode::Classic => scripts!("PUBLISH"),
        }
    }
}

impl Script {
    fn new(name: &'static str, body: &'static str) -> Self {
        Script {
            name,
            body,
            sha: fred::util::sha1_hash(body),
        }
    }

    /// Runs the script by SHA on the node that serves the lock's slot, and again while the
    /// cluster moves that slot.
    ///
    /// The keys go in `ARGV` ahead of the arguments and no key is declared: during a slot
    /// migration Redis answers a script whose declared keys are all missing on the old node
    /// with an `ASK` redirection, and fred 10.1 sends the redirected command back to the old
    /// node until its attempts run out, then tears down the client's connections. Undeclared,
    /// the script goes where fred's slot map says (`ClusterHash::Custom`), and its first
    /// command refuses with `TRYAGAIN` on a node that does not hold the slot (see
    /// `lua/prelude.lua`): the slot moved, or is moving. That reply means nothing ran, so the
    /// slot map is refreshed and the call retried with a short, growing pause for up to
    /// [`TRYAGAIN_PATIENCE`]; after that the error goes up as `Unavailable`, which the core
    /// rides out like any outage.
    pub(crate) async fn run(
        &self,
        client: &Client,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Value, fred::error::Error> {
        let slot = fred::util::redis_keyslot(keys[0].as_bytes());
        let mut argv = keys;
        argv.extend(args);
        let started = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            match self.run_once(client, slot, &argv).await {
                Err(error)
                    if error.details().starts_with("TRYAGAIN")
                        && started.elapsed() + pause < TRYAGAIN_PATIENCE =>
                {
                    tracing::debug!(script = self.name, %error, "slot moving; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(100));
                    if client.is_clustered() {
                        refresh_slot_map(client).await;
                    }
                }
                other => return other,
            }
        }
    }

    /// Runs the script by SHA once. When the server does not know it (a `SCRIPT FLUSH`, a
    /// restart, a failover to a node that never saw it) the `NOSCRIPT` error means it did not
    /// run, so running the body with `EVAL` is safe, and caches it for the next `EVALSHA`.
    async fn run_once(
        &self,
        client: &Client,
        slot: u16,
        argv: &[String],
    ) -> Result<Value, fred::error::Error> {
        let call = |command: &'static str, script: &str| {
            let mut words = Vec::with_capacity(argv.len() + 2);
            words.push(script.to_owned());
            words.push("0".to_owned());
            words.extend(argv.iter().cloned());
            client.custom::<Value, String>(
                CustomCommand::new_static(command, ClusterHash::Custom(slot), false),
                words,
            )
        };
        match call("EVALSHA", &self.sha).await {
            Err(error) if error.details().starts_with("NOSCRIPT") => {
                tracing::debug!(
                    script = self.name,
                    "script not cached on the server; sending it"
                );
                call("EVAL", self.body).await
            }
            other => other,
        }
    }
}

/// How often one client re-reads the slot map while its scripts meet `TRYAGAIN`: fred 10.1
/// opens a new connection for every re-read, and a migration can make every waiter retry.
const SLOT_MAP_REFRESH_INTERVAL: Duration = Duration::from_millis(250);

/// When each client last re-read the slot map (by fred client id).
static LAST_REFRESH: std::sync::Mutex<Option<HashMap<String, tokio::time::Instant>>> =
    std::sync::Mutex::new(None);

/// Re-reads `client`'s slot map, unless it did less than [`SLOT_MAP_REFRESH_INTERVAL`] ago
/// (then the retry uses the map it has). Concurrent callers on one client refresh once.
async fn refresh_slot_map(client: &Client) {
    let now = tokio::time::Instant::now();
    {
        let mut last = LAST_REFRESH.lock().unwrap_or_else(|e| e.into_inner());
        let last = last.get_or_insert_with(HashMap::new);
        // Forget clients that have not refreshed for a while, so the map stays small.
        last.retain(|_, at| now.duration_since(*at) < Duration::from_secs(60));
        let id = client.id().to_owned();
        if last
            .get(&id)
            .is_some_and(|at| now.duration_since(*at) < SLOT_MAP_REFRESH_INTERVAL)
        {
            return;
        }
        last.insert(id, now);
    }
    // Failing to refresh leaves the old map: the next retry says again.
    let _ = client.sync_cluster().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_publishes_with_its_own_command_only() {
        for (mode, publish) in [
            (PubsubMode::Sharded, "SPUBLISH"),
            (PubsubMode::Classic, "PUBLISH"),
        ] {
            let scripts = Scripts::new(mode);
            for script in [
                &scripts.acquire,
                &scripts.release,
                &scripts.extend,
                &scripts.abandon,
                &scripts.force_release,
                &scripts.inspect,
            ] {
                let first = script.body.lines().next().unwrap();
                assert_eq!(
                    first,
                    format!("local PUBLISH = '{publish}'"),
                    "{}",
                    script.name
                );
                // Nothing publishes but through the prelude's publish().
                assert!(
                    !script.body.contains("'SPUBLISH',") && !script.body.contains("'PUBLISH',"),
                    "{} calls a publishing command directly",
                    script.name
                );
            }
        }
        assert_ne!(
            Scripts::new(PubsubMode::Sharded).acquire.sha,
            Scripts::new(PubsubMode::Classic).acquire.sha
        );
    }
}

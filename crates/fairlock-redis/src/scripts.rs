//! The Lua scripts of `lua/`, embedded at compile time and run by SHA.
//!
//! Each script is one line naming the publishing command, the shared prelude, then the
//! operation. There are two compiled variants of every script, one per [`PubsubMode`]: the
//! line is `local PUBLISH = 'SPUBLISH'` (sharded pub/sub) or `local PUBLISH = 'PUBLISH'`
//! (classic, for Redis 6.2), and the prelude's `publish()` calls it.

use fred::clients::Client;
use fred::interfaces::LuaInterface;
use fred::types::Value;

use crate::pubsub::PubsubMode;

/// One operation's script: the publishing line, the shared prelude, then the operation.
#[derive(Debug)]
pub(crate) struct Script {
    pub(crate) name: &'static str,
    body: &'static str,
    sha: String,
}

macro_rules! script {
    ($publish:literal, $name:literal) => {
        Script::new(
            $name,
            concat!(
                "local PUBLISH = '",
                $publish,
                "'\n",
                include_str!("../../../lua/prelude.lua"),
                "\n",
                include_str!(concat!("../../../lua/", $name, ".lua"))
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
                include_str!("../../../lua/prelude.lua"),
                "\nlocal function operation()\n",
                include_str!(concat!("../../../lua/", $name, ".lua")),
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

    /// Runs the script by SHA. When the server does not know it (a `SCRIPT FLUSH`, a restart,
    /// a failover to a node that never saw it) the `NOSCRIPT` error means it did not run, so
    /// running the body with `EVAL` is safe, and caches it for the next `EVALSHA`.
    pub(crate) async fn run(
        &self,
        client: &Client,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Value, fred::error::Error> {
        match client.evalsha(&self.sha, keys.clone(), args.clone()).await {
            Err(error) if error.details().starts_with("NOSCRIPT") => {
                tracing::debug!(
                    script = self.name,
                    "script not cached on the server; sending it"
                );
                client.eval(self.body, keys, args).await
            }
            other => other,
        }
    }
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

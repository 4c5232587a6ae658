//! The Lua scripts of `lua/`, embedded at compile time and run by SHA.

use fred::clients::Client;
use fred::interfaces::LuaInterface;
use fred::types::Value;

/// One operation's script: the shared prelude followed by the operation.
#[derive(Debug)]
pub(crate) struct Script {
    pub(crate) name: &'static str,
    body: &'static str,
    sha: String,
}

macro_rules! script {
    ($name:literal) => {
        Script::new(
            $name,
            concat!(
                include_str!("../../../lua/prelude.lua"),
                "\n",
                include_str!(concat!("../../../lua/", $name, ".lua"))
            ),
        )
    };
}

/// Every script, built once per backend.
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
    pub(crate) fn new() -> Self {
        Scripts {
            acquire: script!("acquire"),
            release: script!("release"),
            extend: script!("extend"),
            abandon: script!("abandon"),
            force_release: script!("force_release"),
            inspect: script!("inspect"),
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

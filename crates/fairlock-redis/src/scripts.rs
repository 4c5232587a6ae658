//! The Lua scripts of `lua/`, embedded at compile time, and how they are run: as Redis Functions
//! on Redis 7 (`FCALL`), else by SHA (`EVALSHA`).
//!
//! Each script is one line naming the publishing command, the shared prelude, then the
//! operation. There are two compiled variants of every script, one per [`PubsubMode`]: the
//! line is `local PUBLISH = 'SPUBLISH'` (sharded pub/sub) or `local PUBLISH = 'PUBLISH'`
//! (classic, for Redis 6.2), and the prelude's `publish()` calls it.
//!
//! The sharded variants are also packaged as one Function library (Redis 7.0+, where sharded
//! pub/sub is): the prelude and every operation, each registered as a function. An `EVALSHA`
//! script runs the whole prelude on every call, building its ~45 helper functions anew (about
//! 10 µs of server time per call, measured); a library builds them once, when it is loaded.
//! The library's name and its functions' names carry a digest of its text, so two versions of
//! fairlock can share a server. It is loaded on demand, node by node: a call that finds no
//! such function (a new server, a restart without persistence, `FUNCTION FLUSH`, a Cluster
//! node that never had it) did not run, so the library is loaded there and the call made
//! again. Where loading is refused (an ACL without `FUNCTION LOAD`), the backend goes on with
//! `EVALSHA`, which needs no loading.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::{ClusterHash, CustomCommand, Value};

use crate::pubsub::PubsubMode;

/// How many times one call loads the library on finding its function missing before it goes
/// by SHA: more than once only if the library is flushed again in between.
const LOAD_TRIES: usize = 3;

/// How long a script refused with `TRYAGAIN` (a Cluster slot migration in progress) is tried
/// again before the error goes up.
pub(crate) const TRYAGAIN_PATIENCE: Duration = Duration::from_secs(2);

/// One operation's script: the publishing line, the shared prelude, then the operation; and,
/// in the sharded variant, the function of the library that runs the same operation.
#[derive(Debug)]
pub(crate) struct Script {
    pub(crate) name: &'static str,
    body: &'static str,
    sha: &'static str,
    function: Option<Function>,
}

/// An operation's function in the library.
#[derive(Debug)]
struct Function {
    name: &'static str,
    library: Arc<Library>,
}

/// The Function library of the sharded variants, as one backend uses it.
#[derive(Debug)]
pub(crate) struct Library {
    code: &'static str,
    /// False once a server refused it for good (no permission, no such command): every call
    /// then goes by `EVALSHA`.
    usable: AtomicBool,
    /// One load at a time: after a `FUNCTION FLUSH`, every waiter's next call finds the
    /// function missing, and one load serves them all.
    loading: tokio::sync::Mutex<()>,
    /// How many loads were tried, failed ones included (see `call_function`).
    loads_tried: AtomicU64,
}

// `lua` in this crate is a link to the workspace's `lua/`, so that `cargo package` copies the
// scripts into the published crate; a path leaving the crate would not build from crates.io.
macro_rules! lua {
    ($name:literal) => {
        include_str!(concat!("../lua/", $name, ".lua"))
    };
}

/// The prelude's text.
const PRELUDE: &str = lua!("prelude");

/// The operations, with whether each changes the lock (its reply then goes through the
/// prelude's `finish`, which keeps the fence hash for as long as the lock is in use plus the
/// fence margin, the script's last ARGV).
const OPERATIONS: [(&str, &str, bool); 6] = [
    ("acquire", lua!("acquire"), true),
    ("release", lua!("release"), true),
    ("extend", lua!("extend"), true),
    ("abandon", lua!("abandon"), true),
    ("force_release", lua!("force_release"), true),
    ("inspect", lua!("inspect"), false),
];

/// The texts of one pub/sub mode, built once per process: each operation's `EVAL` text and
/// its SHA, in [`OPERATIONS`] order; in sharded mode, the library and its function names.
struct Texts {
    scripts: Vec<(String, String)>,
    library: Option<(String, Vec<String>)>,
}

/// The `EVAL` text of `operation`: the script's arguments are kept (`INPUT`) before the
/// prelude's locals hide them, and handed to its `begin`.
fn eval_text(publish: &str, operation: &str, mutating: bool) -> String {
    let reply = if mutating {
        "finish(operation())"
    } else {
        "operation()"
    };
    format!(
        "local PUBLISH = '{publish}'\nlocal INPUT = ARGV\n{PRELUDE}\nlocal function operation()\n\
         {operation}\nend\nbegin(INPUT)\nreturn {reply}\n"
    )
}

/// Where the library's text names its version, until the version (a digest of that text) is
/// known.
const VERSION: &str = "@@fairlock-version@@";

/// The library of the sharded variants (Redis 7), and each operation's function name in it.
fn library_text() -> (String, Vec<String>) {
    let mut body = String::from("local PUBLISH = 'SPUBLISH'\n");
    body.push_str(PRELUDE);
    body.push('\n');
    for (name, text, mutating) in OPERATIONS {
        let reply = if mutating {
            format!("finish(op_{name}())")
        } else {
            format!("op_{name}()")
        };
        // Out of memory (`maxmemory` with `noeviction`), an `EVAL` script is refused at its
        // first write that needs memory, unless it wrote something before. So acquire, whose
        // first write of a new hold or waiter adds, was refused before writing, and is here
        // (no flag: refused before it runs); the others, which end levels and free keys,
        // went on and still do (`allow-oom`). `inspect` writes nothing.
        let flags = match name {
            "acquire" => "",
            "inspect" => "'no-writes'",
            _ => "'allow-oom'",
        };
        body.push_str(&format!(
            "local function op_{name}()\n{text}\nend\n\
             redis.register_function{{function_name = 'fairlock_{name}_{VERSION}', \
             callback = function(_, input) begin(input) return {reply} end, \
             flags = {{ {flags} }}}}\n"
        ));
    }
    let version = fred::util::sha1_hash(&body)[..16].to_owned();
    let code = format!(
        "#!lua name=fairlock_{version}\n{}",
        body.replace(VERSION, &version)
    );
    let names = OPERATIONS
        .iter()
        .map(|(name, _, _)| format!("fairlock_{name}_{version}"))
        .collect();
    (code, names)
}

fn texts(mode: PubsubMode) -> &'static Texts {
    static SHARDED: OnceLock<Texts> = OnceLock::new();
    static CLASSIC: OnceLock<Texts> = OnceLock::new();
    let (cell, publish) = match mode {
        PubsubMode::Sharded => (&SHARDED, "SPUBLISH"),
        PubsubMode::Classic => (&CLASSIC, "PUBLISH"),
    };
    cell.get_or_init(|| Texts {
        scripts: OPERATIONS
            .iter()
            .map(|(_, text, mutating)| {
                let body = eval_text(publish, text, *mutating);
                let sha = fred::util::sha1_hash(&body);
                (body, sha)
            })
            .collect(),
        library: (mode == PubsubMode::Sharded).then(library_text),
    })
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
    /// The scripts of `mode`; the sharded ones also as functions of a library (Redis 7).
    pub(crate) fn new(mode: PubsubMode) -> Self {
        let texts = texts(mode);
        let library = texts.library.as_ref().map(|(code, names)| {
            let library = Arc::new(Library {
                code: code.as_str(),
                usable: AtomicBool::new(true),
                loading: tokio::sync::Mutex::new(()),
                loads_tried: AtomicU64::new(0),
            });
            (library, names)
        });
        let mut scripts = OPERATIONS.iter().zip(&texts.scripts).enumerate().map(
            |(index, ((name, _, _), (body, sha)))| Script {
                name,
                body: body.as_str(),
                sha: sha.as_str(),
                function: library.as_ref().map(|(library, names)| Function {
                    name: names[index].as_str(),
                    library: Arc::clone(library),
                }),
            },
        );
        let mut next = || scripts.next().expect("one script per operation");
        Scripts {
            acquire: next(),
            release: next(),
            extend: next(),
            abandon: next(),
            force_release: next(),
            inspect: next(),
        }
    }
}

impl Script {
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

    /// Runs the operation once: as its function where the library is usable, else by SHA.
    async fn run_once(
        &self,
        client: &Client,
        slot: u16,
        argv: &[String],
    ) -> Result<Value, fred::error::Error> {
        if let Some(function) = self.function.as_ref() {
            if function.library.usable.load(Ordering::Relaxed) {
                if let Some(reply) = self.call_function(function, client, slot, argv).await {
                    return reply;
                }
            }
        }
        self.run_by_sha(client, slot, argv).await
    }

    /// Calls the operation's function; `None` when the call should go by SHA instead (it has
    /// not run).
    ///
    /// A node without the function (new, restarted without persistence, flushed, or a Cluster
    /// node that never had it) answers that the function is not found, which means the call
    /// did not run: the library is loaded there and the call made again. The library's name
    /// names its version, so a library of that name is this one. Every refusal below comes
    /// before anything ran, so going by SHA instead is safe:
    /// - `FCALL` or `FUNCTION LOAD` not permitted (an ACL): this call and every later one of
    ///   the backend;
    /// - no such command (a 6.2 node in a Cluster being upgraded), a load the server refuses
    ///   for now (out of memory, busy), or a library lost again and again (`FUNCTION FLUSH`
    ///   in a loop): this call.
    async fn call_function(
        &self,
        function: &Function,
        client: &Client,
        slot: u16,
        argv: &[String],
    ) -> Option<Result<Value, fred::error::Error>> {
        let library = &function.library;
        let call = || {
            let mut words = Vec::with_capacity(argv.len() + 2);
            words.push(function.name.to_owned());
            words.push("0".to_owned());
            words.extend(argv.iter().cloned());
            client.custom::<Value, String>(
                CustomCommand::new_static("FCALL", ClusterHash::Custom(slot), false),
                words,
            )
        };
        // Loads tried by any call of the backend so far: a load that ends after this call
        // was sent may have come too late for it, and it calls again rather than load too.
        let mut tried = library.loads_tried.load(Ordering::Acquire);
        let mut reply = call().await;
        let mut loads = 0;
        // Each turn either loads or calls again after another call's load: bounded both ways.
        for _ in 0..2 * LOAD_TRIES {
            match &reply {
                Err(error) if is_missing(error) => {}
                Err(error) if refuses_functions(error) => {
                    self.give_up_functions_if_denied(library, error);
                    return None;
                }
                _ => return Some(reply),
            }
            let loaded_since = |seen| library.loads_tried.load(Ordering::Acquire) != seen;
            if !loaded_since(tried) {
                // One load at a time; the lock is held for the load alone, so calls queued
                // behind a load that fails (the server away) do not each wait for every call
                // before them.
                let one_load = library.loading.lock().await;
                if !loaded_since(tried) {
                    if loads == LOAD_TRIES {
                        break;
                    }
                    loads += 1;
                    let loaded = self.load(library, client, slot).await;
                    library.loads_tried.fetch_add(1, Ordering::AcqRel);
                    drop(one_load);
                    if let Err(end) = loaded {
                        return end;
                    }
                }
            }
            tried = library.loads_tried.load(Ordering::Acquire);
            reply = call().await;
        }
        match reply {
            Err(error) if is_missing(&error) => None,
            Err(error) if refuses_functions(&error) => {
                self.give_up_functions_if_denied(library, &error);
                None
            }
            other => Some(other),
        }
    }

    /// Loads the library on the node of `slot`: `Ok` when it is there now (loaded, or by
    /// another backend meanwhile); otherwise what `call_function` returns: the error if the
    /// server is away (nothing ran), `None` (go by SHA) if it refuses the load.
    async fn load(
        &self,
        library: &Library,
        client: &Client,
        slot: u16,
    ) -> Result<(), Option<Result<Value, fred::error::Error>>> {
        tracing::debug!(
            script = self.name,
            "fairlock's function library not loaded on the server; loading it"
        );
        let load = CustomCommand::new_static("FUNCTION", ClusterHash::Custom(slot), false);
        match client
            .custom::<Value, &str>(load, vec!["LOAD", library.code])
            .await
        {
            Ok(_) => Ok(()),
            // Loaded meanwhile by another backend.
            Err(error) if error.details().contains("already exists") => Ok(()),
            // The server is away: the call fails as any other would (nothing ran).
            Err(error) if is_connection(&error) => Err(Some(Err(error))),
            Err(error) => {
                if refuses_functions(&error) {
                    self.give_up_functions_if_denied(library, &error);
                } else {
                    tracing::debug!(%error, "fairlock-redis: loading the function library failed; this call goes by SHA");
                }
                Err(None)
            }
        }
    }

    /// After `error` refused functions: if it is a permission (the ACL will not change by
    /// itself), every later call of the backend goes by SHA.
    fn give_up_functions_if_denied(&self, library: &Library, error: &fred::error::Error) {
        if !error.details().starts_with("NOPERM") {
            return;
        }
        if library.usable.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                %error,
                script = self.name,
                "fairlock-redis: the server does not permit fairlock's function library; \
                 running its scripts by SHA (EVALSHA) from now on"
            );
        }
    }

    /// Runs the script by SHA once. When the server does not know it (a `SCRIPT FLUSH`, a
    /// restart, a failover to a node that never saw it) the `NOSCRIPT` error means it did not
    /// run, so running the body with `EVAL` is safe, and caches it for the next `EVALSHA`.
    async fn run_by_sha(
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
        match call("EVALSHA", self.sha).await {
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

/// Whether `error` says the function called is not on that server (so the call did not run).
fn is_missing(error: &fred::error::Error) -> bool {
    error.details().starts_with("ERR Function not found")
}

/// Whether `error` says this server will not run functions for us: no permission for `FCALL`
/// or `FUNCTION LOAD` (an ACL; a permission error inside a function reads otherwise), or no
/// such command (renamed, or a node without functions).
fn refuses_functions(error: &fred::error::Error) -> bool {
    let details = error.details().to_ascii_lowercase();
    (details.starts_with("noperm")
        && (details.contains("'fcall'") || details.contains("'function")))
        || details.contains("unknown command")
        || details.contains("unknown subcommand")
}

/// Whether `error` is the connection's (no reply from the server), not a server's refusal.
fn is_connection(error: &fred::error::Error) -> bool {
    use fred::error::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::IO | ErrorKind::Timeout | ErrorKind::Canceled | ErrorKind::Backpressure
    )
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

    impl Scripts {
        fn all(&self) -> [&Script; 6] {
            [
                &self.acquire,
                &self.release,
                &self.extend,
                &self.abandon,
                &self.force_release,
                &self.inspect,
            ]
        }
    }

    /// The library registers every operation under a name that carries its version, which is
    /// also the library's name: a change to any script makes a new library, never a new text
    /// under an old name (`FUNCTION LOAD` would refuse it as existing, and a server would
    /// keep running the old functions).
    #[test]
    fn the_library_names_its_version_everywhere() {
        let scripts = Scripts::new(PubsubMode::Sharded);
        let all = scripts.all();
        let code = all[0].function.as_ref().unwrap().library.code;
        let first = code.lines().next().unwrap();
        let version = first.strip_prefix("#!lua name=fairlock_").unwrap();
        assert_eq!(version.len(), 16);
        for script in all {
            let function = script.function.as_ref().expect("sharded: a function");
            assert_eq!(function.name, format!("fairlock_{}_{version}", script.name));
            assert!(code.contains(&format!("function_name = '{}'", function.name)));
        }
        assert!(!code.contains(VERSION));
        assert!(Scripts::new(PubsubMode::Classic).acquire.function.is_none());
    }

    #[test]
    fn each_mode_publishes_with_its_own_command_only() {
        for (mode, publish) in [
            (PubsubMode::Sharded, "SPUBLISH"),
            (PubsubMode::Classic, "PUBLISH"),
        ] {
            let scripts = Scripts::new(mode);
            for script in scripts.all() {
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

//! The command line: subcommands, options and the checks clap runs on their values.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use fairlock::{LockName, LockOptions, MAX_DURATION};

const EXAMPLES: &str = "\
Examples:
  # Run a nightly job, one host at a time, in the order they asked:
  fairlock exec nightly-report -- ./report.sh --full

  # Give up after 30 seconds in the queue (exit 75), or at once if the lock is busy:
  fairlock exec --wait 30s deploy -- make deploy
  fairlock exec --wait 0 deploy -- make deploy

  # Fixed 5-minute lease, no renewal; the command is stopped if it overruns:
  fairlock exec --lease 5m --kill-after 20s backup -- ./backup.sh

  # Who holds a lock, who waits, and everything under a prefix:
  fairlock status deploy
  fairlock status deploy --json | jq .holder.fencing_token
  fairlock list deploy- --json

  # Free a lock whose holder is stuck (the next waiter gets it):
  fairlock force-unlock deploy

  # Tab completion for bash (zsh, fish, elvish and powershell work the same way):
  fairlock completions bash > ~/.local/share/bash-completion/completions/fairlock

Exit codes:
  0        success (exec: the command's own exit code passes through)
  2        bad arguments
  69       cannot reach the store
  70       store or internal error
  75       timed out waiting, or --wait 0 found the lock busy
  76       the lease was lost while the command ran (the command was stopped)
  126/127  the command could not be run / was not found
  128+N    the command was killed by signal N, or fairlock was stopped by signal N while waiting

Environment:
  FAIRLOCK_URL, FAIRLOCK_PREFIX, FAIRLOCK_CONNECT_TIMEOUT stand in for the options of the same
  name; FAIRLOCK_LOG sets a tracing filter for diagnostics (e.g. FAIRLOCK_LOG=debug).
  The command run by `exec` gets FAIRLOCK_NAME (the lock) and FAIRLOCK_TOKEN (the fencing token).";

/// `fairlock`: fair (FIFO), reentrant, distributed locks on Redis or PostgreSQL, from the shell.
#[derive(Debug, Parser)]
#[command(name = "fairlock", version, after_help = EXAMPLES)]
pub(crate) struct Cli {
    /// Where the locks live.
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Options that say which store to use; accepted before or after the subcommand.
#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// Store URL: redis://host:port or redis://user:pass@host:port/db; rediss:// for TLS,
    /// redis-cluster:// for a cluster; postgres://user:pass@host:port/db or a key=value
    /// connection string for PostgreSQL.
    #[arg(
        long,
        env = "FAIRLOCK_URL",
        // `--help` would show the variable's value, password included.
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379",
        value_name = "URL",
        global = true
    )]
    pub(crate) url: String,
    /// Prefix of every key fairlock writes [default: the backend's, `fairlock:`]; on
    /// PostgreSQL, the schema of fairlock's tables [default: `fairlock`].
    #[arg(long, env = "FAIRLOCK_PREFIX", global = true)]
    pub(crate) prefix: Option<String>,
    /// How long to try reaching the store before giving up (exit 69).
    #[arg(
        long,
        env = "FAIRLOCK_CONNECT_TIMEOUT",
        default_value = "5s",
        value_name = "DUR",
        value_parser = parse_bounded,
        global = true
    )]
    pub(crate) connect_timeout: Duration,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Wait for the lock in FIFO order, run a command while holding it, release it when the
    /// command ends, and exit with the command's exit code.
    #[command(override_usage = "fairlock exec [OPTIONS] <NAME> -- <COMMAND>...")]
    Exec(ExecArgs),
    /// Show a lock's holder (hold count, fencing token, lease left) and its waiters in order.
    Status(StatusArgs),
    /// Free a lock whoever holds it; the first waiter gets it next.
    ForceUnlock(ForceUnlockArgs),
    /// List the locks that are held or waited on.
    List(ListArgs),
    /// Print a shell completion script for `fairlock` on stdout; needs no store.
    Completions(CompletionsArgs),
}

/// `fairlock exec`.
#[derive(Debug, Args)]
pub(crate) struct ExecArgs {
    /// How long to wait in the queue: `0` tries once without queueing; absent: wait forever.
    #[arg(long, value_name = "DUR", value_parser = parse_bounded)]
    pub(crate) wait: Option<Duration>,
    /// A fixed lease, not renewed: the lock ends this long after it was acquired, and the
    /// command is stopped if it still runs (exit 76). Absent: a watchdog renews the lease for
    /// as long as the command runs.
    #[arg(long, value_name = "DUR", value_parser = parse_lease, conflicts_with = "watchdog_lease")]
    pub(crate) lease: Option<Duration>,
    /// The lease the watchdog renews every third of: how long the lock outlives a crashed
    /// `fairlock`.
    #[arg(long, value_name = "DUR", value_parser = parse_watchdog_lease, default_value = "30s")]
    pub(crate) watchdog_lease: Duration,
    /// After the lease is lost, how long the command gets between SIGTERM and SIGKILL.
    #[arg(long, value_name = "DUR", value_parser = parse_bounded, default_value = "10s")]
    pub(crate) kill_after: Duration,
    /// The lock's name.
    #[arg(value_parser = parse_name)]
    pub(crate) name: String,
    /// The command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, value_name = "COMMAND")]
    pub(crate) command: Vec<OsString>,
}

/// `fairlock status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// The lock's name.
    #[arg(value_parser = parse_name)]
    pub(crate) name: String,
    /// Print JSON (see docs/cli.md for the fields).
    #[arg(long)]
    pub(crate) json: bool,
}

/// `fairlock force-unlock`.
#[derive(Debug, Args)]
pub(crate) struct ForceUnlockArgs {
    /// The lock's name.
    #[arg(value_parser = parse_name)]
    pub(crate) name: String,
    /// Print JSON (see docs/cli.md for the fields).
    #[arg(long)]
    pub(crate) json: bool,
}

/// `fairlock completions`.
#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub(crate) shell: clap_complete::Shell,
}

/// `fairlock list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only locks whose names start with this.
    // Its own id: clap would otherwise merge it with the global `--prefix` (the key prefix)
    // and every `list` would scan for keys under the wrong prefix.
    #[arg(id = "name_prefix", value_name = "PREFIX", default_value = "")]
    pub(crate) prefix: String,
    /// Print JSON (see docs/cli.md for the fields).
    #[arg(long)]
    pub(crate) json: bool,
}

/// A lock name, checked by fairlock's own rules.
fn parse_name(value: &str) -> Result<String, String> {
    LockName::new(value)
        .map(|name| name.as_str().to_owned())
        .map_err(|err| err.to_string())
}

/// A human duration: `30s`, `500ms`, `2m`, `1h 30m`; a bare `0` is zero.
fn parse_duration(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value.trim())
        .map_err(|err| format!("{err} (expected a duration such as 30s, 500ms or 2m)"))
}

/// A duration up to [`MAX_DURATION`]: beyond, deadlines would not fit a clock.
fn parse_bounded(value: &str) -> Result<Duration, String> {
    let duration = parse_duration(value)?;
    if duration > MAX_DURATION {
        return Err(format!("{value} is above the limit of 365 days"));
    }
    Ok(duration)
}

fn parse_lease(value: &str) -> Result<Duration, String> {
    let lease = parse_duration(value)?;
    let options = LockOptions::default().with_lease(lease);
    options.validate().map_err(|err| err.to_string())?;
    Ok(lease)
}

fn parse_watchdog_lease(value: &str) -> Result<Duration, String> {
    let watchdog_lease = parse_duration(value)?;
    let options = LockOptions::default().with_watchdog_lease(watchdog_lease);
    options.validate().map_err(|err| err.to_string())?;
    Ok(watchdog_lease)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_parse_in_human_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_bounded("0"), Ok(Duration::ZERO));
        assert!(parse_duration("banana").is_err());
        assert!(parse_lease("0s").is_err());
        assert!(parse_bounded("400days").is_err());
        assert!(parse_watchdog_lease("10ms").is_err());
    }

    #[test]
    fn names_follow_fairlock_rules() {
        assert!(parse_name("").is_err());
        assert!(parse_name("a\0b").is_err());
        assert_eq!(parse_name("deploy").as_deref(), Ok("deploy"));
    }

    #[test]
    fn the_command_may_follow_a_double_dash() {
        let cli = Cli::try_parse_from([
            "fairlock", "exec", "--wait", "1s", "job", "--", "sh", "-c", "exit 7",
        ])
        .unwrap();
        let Command::Exec(exec) = cli.command else {
            panic!("not exec")
        };
        assert_eq!(exec.name, "job");
        assert_eq!(exec.command, ["sh", "-c", "exit 7"]);
        assert_eq!(exec.wait, Some(Duration::from_secs(1)));
    }

    #[test]
    fn a_misspelt_option_is_not_taken_for_the_command() {
        assert!(
            Cli::try_parse_from(["fairlock", "exec", "job", "--wiat", "1s", "--", "true"]).is_err()
        );
    }

    #[test]
    fn completions_name_a_known_shell() {
        let cli = Cli::try_parse_from(["fairlock", "completions", "zsh"]).unwrap();
        let Command::Completions(args) = cli.command else {
            panic!("not completions")
        };
        assert_eq!(args.shell, clap_complete::Shell::Zsh);
        let err = Cli::try_parse_from(["fairlock", "completions", "tcsh"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
    }

    #[test]
    fn the_key_prefix_and_the_list_filter_stay_apart() {
        let cli = Cli::try_parse_from(["fairlock", "list", "app-"]).unwrap();
        assert_eq!(cli.store.prefix, None);
        let Command::List(list) = cli.command else {
            panic!("not list")
        };
        assert_eq!(list.prefix, "app-");

        let cli = Cli::try_parse_from(["fairlock", "--prefix", "k:", "list"]).unwrap();
        assert_eq!(cli.store.prefix.as_deref(), Some("k:"));
        let Command::List(list) = cli.command else {
            panic!("not list")
        };
        assert_eq!(list.prefix, "");
    }
}

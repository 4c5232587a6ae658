//! `fairlock`: run a command under a fair (FIFO) distributed lock, and inspect or free locks.
//! See `fairlock --help` and docs/cli.md.

mod args;
mod completions;
mod connect;
mod exec;
mod exit;
mod inspect;
mod signals;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::args::{Cli, Command};
use crate::exit::{Failure, INTERNAL};

fn main() -> ExitCode {
    // clap prints usage errors itself and exits with 2.
    let cli = Cli::parse();
    init_tracing();
    let code = match run_on_tokio(cli) {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("{failure}");
            failure.code
        }
    };
    ExitCode::from(code)
}

fn run_on_tokio(cli: Cli) -> Result<u8, Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|err| Failure::new(INTERNAL, format!("cannot start the Tokio runtime: {err}")))?;
    let result = runtime.block_on(run(cli));
    // Everything that must reach the store was awaited; what is left (lease keepers) can go.
    runtime.shutdown_timeout(Duration::from_millis(100));
    result
}

async fn run(cli: Cli) -> Result<u8, Failure> {
    let client = || connect::connect(&cli.store);
    match &cli.command {
        Command::Exec(args) => exec::exec(&client().await?, args).await,
        Command::Status(args) => inspect::status(&client().await?, args).await,
        Command::ForceUnlock(args) => inspect::force_unlock(&client().await?, args).await,
        Command::List(args) => inspect::list(&client().await?, args).await,
        // Completions describe the command line only: no store, so they work anywhere.
        Command::Completions(args) => completions::print(args.shell),
    }
}

/// Diagnostics on stderr, off unless `FAIRLOCK_LOG` sets a filter (e.g. `debug`), so that a
/// failure is one line by default.
fn init_tracing() {
    let Ok(filter) = std::env::var("FAIRLOCK_LOG") else {
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .try_init();
}

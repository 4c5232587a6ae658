//! `fairlock-bench`: measures fairlock on Redis against the round trip it is built from, and
//! hosts the lock benchmark protocol worker (`fairlock-bench worker ...`).

mod bench;
mod clock;
mod connect;
mod report;
mod sections;
mod stages;
mod stats;
mod worker;

use clap::{Parser, Subcommand};

use crate::sections::SectionKey;

/// Benchmarks fairlock's Redis backend on a private redis-server and reports each figure
/// next to its target (markdown on stdout, JSON under `<target dir>/bench/`).
#[derive(Debug, Parser)]
#[command(version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// A short run: fewer samples, smaller queues, shorter durations.
    #[arg(long)]
    quick: bool,
    /// Run only this section (repeatable); the round-trip limit is always measured.
    #[arg(long, value_enum)]
    only: Vec<SectionKey>,
    /// Connections in each backend's command pool, and in the raw-fred pool compared with it.
    #[arg(long, default_value_t = bench::DEFAULT_POOL_SIZE)]
    pool_size: usize,
    /// Where to write the JSON report (default: `<target dir>/bench`).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Section 7 (resources) starts its waiters this many at a time, each wave queued before
    /// the next; 10000 starts them all at once, as before (the client's memory per waiter then
    /// includes what the allocator keeps from 10,000 store calls in flight together).
    #[arg(long, default_value_t = 1000)]
    waiter_wave: usize,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The lock benchmark protocol worker (see bench-protocol.md).
    Worker(worker::WorkerArgs),
    /// Section 7's measurement of one backend's memory, in a fresh process of its own.
    #[command(hide = true)]
    BackendMemory,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("cannot start the Tokio runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Some(Command::Worker(args)) => runtime.block_on(worker::run(args)),
        Some(Command::BackendMemory) => runtime
            .block_on(sections::resources::backend_memory_child())
            .map_err(|err| err.to_string()),
        None => {
            let config = bench::Config {
                quick: cli.quick,
                only: cli.only,
                pool_size: cli.pool_size.max(1),
                out: cli.out,
                waiter_wave: cli.waiter_wave.max(1),
            };
            runtime
                .block_on(bench::run(config))
                .map_err(|err| err.to_string())
        }
    };
    // Background tasks (lease keepers, releases) must not keep the process alive.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("fairlock-bench: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

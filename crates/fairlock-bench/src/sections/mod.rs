//! The benchmark's sections, one file each.

use fairlock::BoxError;

use crate::bench::Bench;
use crate::report::Section;

pub(crate) mod churn;
pub(crate) mod fairness;
pub(crate) mod handoff;
pub(crate) mod limit;
pub(crate) mod many_locks;
pub(crate) mod processes;
pub(crate) mod queue;
pub(crate) mod replication;
pub(crate) mod resources;
pub(crate) mod scripts;
mod support;
pub(crate) mod uncontended;

/// A section that `--only` can select.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SectionKey {
    /// Round trips of PING and of a trivial EVALSHA (always measured).
    Limit,
    /// One task acquiring and releasing.
    Uncontended,
    /// 8 contenders: the gap between a release and the next holder's acquisition.
    Handoff,
    /// FIFO order and Jain's index under contention.
    Fairness,
    /// Cost of queue operations with long queues.
    Queue,
    /// Throughput over many locks from one backend.
    ManyLocks,
    /// Connections, memory and keys with 10,000 waiters.
    Resources,
    /// The slowest script call under queue churn; keys of idle locks.
    Churn,
    /// What waiting for a replica's acknowledgement costs.
    Replication,
    /// Server time of each path through the lock scripts.
    Scripts,
    /// Hand-over between separate worker processes (2 and 8).
    Processes,
}

impl SectionKey {
    /// The sections run after the limit, in order. Resources goes first: it measures the
    /// client's memory growth per waiter, which memory freed by the queue section's 10,000
    /// waiters would otherwise hide (the allocator reuses it, so RSS does not grow).
    pub(crate) const ALL_MEASURED: [SectionKey; 10] = [
        SectionKey::Resources,
        SectionKey::Uncontended,
        SectionKey::Handoff,
        SectionKey::Processes,
        SectionKey::Scripts,
        SectionKey::Fairness,
        SectionKey::Queue,
        SectionKey::ManyLocks,
        SectionKey::Churn,
        SectionKey::Replication,
    ];
}

pub(crate) async fn run(key: SectionKey, bench: &Bench) -> Result<Section, BoxError> {
    match key {
        // Measured first, always, by `bench::run`; asked for again, it is measured again.
        SectionKey::Limit => Ok(limit::run(bench).await?.1),
        SectionKey::Uncontended => uncontended::run(bench).await,
        SectionKey::Handoff => handoff::run(bench).await,
        SectionKey::Fairness => fairness::run(bench).await,
        SectionKey::Queue => queue::run(bench).await,
        SectionKey::ManyLocks => many_locks::run(bench).await,
        SectionKey::Resources => resources::run(bench).await,
        SectionKey::Churn => churn::run(bench).await,
        SectionKey::Replication => replication::run(bench).await,
        SectionKey::Scripts => scripts::run(bench).await,
        SectionKey::Processes => processes::run(bench).await,
    }
}

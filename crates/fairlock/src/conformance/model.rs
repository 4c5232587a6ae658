//! Model-based checking: a plain reference model of one lock, and seeded random schedules
//! that drive a backend and the model side by side and compare every reply and state.
//!
//! A schedule mixes several owners, several attempts per owner (queued and not), heartbeats,
//! releases, abandons (cancellations and timeouts), extensions, force releases, lease and
//! waiter-TTL expiry, and re-sends of earlier requests at random later points, as a client
//! re-sends after a reconnect. After every step the backend must agree with the model, and:
//! at most one owner holds, the hold count is the number of levels of attempts that have not
//! ended (no phantom level), every live guard's level is there, tokens strictly increase,
//! waiters are in FIFO order, and at the end nothing is left.
//!
//! **Time.** The model counts time in *units*. Every lease and TTL in a schedule lasts a whole
//! number of units plus a half, and time only moves in whole units, so a deadline is never
//! within half a unit of a check: a backend on real time (a networked store) agrees with the
//! model as long as the steps between two advances take less than half a unit.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, Grant, LockBackend, LockState, ReleaseOutcome,
    RESEND_HORIZON,
};
use crate::name::{LockName, Owner};

/// How a schedule's time passes on the backend.
#[derive(Clone, Copy, Debug)]
pub enum ModelClock {
    /// Tokio's clock is paused (`start_paused = true`) and the backend measures time with it
    /// (like [`MemoryBackend`](crate::MemoryBackend)): time moves exactly with
    /// `tokio::time::advance`.
    Paused {
        /// The length of one unit.
        unit: Duration,
    },
    /// The backend has its own clock (a store's): the schedule sleeps. The steps between two
    /// advances must take less than half a `unit`, or the run reports the stall.
    Real {
        /// The length of one unit.
        unit: Duration,
    },
}

impl ModelClock {
    fn unit(self) -> Duration {
        match self {
            ModelClock::Paused { unit } | ModelClock::Real { unit } => unit,
        }
    }
}

/// What a schedule looks like. Built with [`ModelConfig::new`], so that settings added later
/// (with defaults) do not break backends' tests.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct ModelConfig {
    /// The clock.
    pub clock: ModelClock,
    /// Steps per schedule.
    pub steps: usize,
    /// Owners contending.
    pub owners: usize,
}

impl ModelConfig {
    /// Schedules of `steps` steps, by `owners` owners contending, on `clock`.
    pub fn new(clock: ModelClock, steps: usize, owners: usize) -> Self {
        ModelConfig {
            clock,
            steps,
            owners,
        }
    }
}

/// The seeds to run: `FAIRLOCK_MODEL_SEED=s` runs seed `s` alone,
/// `FAIRLOCK_MODEL_SCHEDULES=n` runs `n` seeds from a random start (printed), otherwise the
/// `fixed` ones.
///
/// # Panics
/// If either variable is set but is not a number, or asks for no schedules at all, or `fixed`
/// is empty: a check that runs nothing must not pass.
pub fn seeds_from_env(fixed: &[u64]) -> Vec<u64> {
    let number = |variable: &str| {
        std::env::var(variable).ok().map(|value| {
            value
                .trim()
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{variable}={value:?} is not a number"))
        })
    };
    if let Some(seed) = number("FAIRLOCK_MODEL_SEED") {
        return vec![seed];
    }
    let seeds = match number("FAIRLOCK_MODEL_SCHEDULES") {
        Some(count) => {
            let start: u64 = rand::random::<u32>().into();
            eprintln!(
                "fairlock model check: {count} schedules, seeds {start}..{}",
                start + count
            );
            (start..start + count).collect()
        }
        None => fixed.to_vec(),
    };
    assert!(!seeds.is_empty(), "the model check has no schedule to run");
    seeds
}

/// Runs the schedule of each seed against `backend` (each on a fresh lock name) and panics at
/// the first disagreement, naming the seed, the step and the history of requests.
///
/// On a real clock a schedule that the machine stalled under (a step took longer than half a
/// unit) proves nothing either way, so it is run again on a fresh lock name, up to three
/// times in all, before the stall is reported as the failure.
pub async fn check_against_model(
    backend: Arc<dyn LockBackend>,
    config: ModelConfig,
    seeds: &[u64],
) {
    for &seed in seeds {
        for attempt in 1..=STALL_ATTEMPTS {
            let schedule = Schedule::new(backend.clone(), config, seed);
            let Err(payload) = AssertUnwindSafe(schedule.run()).catch_unwind().await else {
                break;
            };
            match payload.downcast::<Stalled>() {
                Ok(stalled) if attempt < STALL_ATTEMPTS => {
                    eprintln!("{} (attempt {attempt}); running it again", stalled.0);
                }
                Ok(stalled) => panic!("{} ({STALL_ATTEMPTS} attempts)", stalled.0),
                Err(payload) => std::panic::resume_unwind(payload),
            }
        }
    }
}

/// How many times [`check_against_model`] runs a schedule that the machine stalled under.
const STALL_ATTEMPTS: u32 = 3;

/// The panic payload of a schedule whose timing the machine broke: inconclusive, not failed.
struct Stalled(String);

/// A duration in half units: `2k + 1` for `k` units and a half (leases and TTLs).
type Span = u64;
/// Model time in half units (always even at a step: time moves in whole units).
type Time = u64;

const LONG: Span = 2 * 100_000 + 1;

/// A request as the model and the backend see it. Tokens are grant numbers (1, 2, ...),
/// mapped to the backend's tokens as they appear.
#[derive(Clone, Debug)]
enum Request {
    Acquire {
        owner: usize,
        attempt: AttemptId,
        lease: Span,
        ttl: Span,
        queue: bool,
    },
    Release {
        owner: usize,
        grant: u64,
        attempt: AttemptId,
    },
    Extend {
        owner: usize,
        grant: u64,
        lease: Span,
    },
    Abandon {
        owner: usize,
        attempt: AttemptId,
    },
    ForceRelease {
        grant: u64,
    },
}

/// A reply, with grant numbers for tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reply {
    Granted { grant: u64, count: u32 },
    Queued { hinted: bool, last_grant: u64 },
    Busy,
    Released { remaining: u32 },
    NotHeld,
    Bool(bool),
    Done,
}

// ---------------------------------------------------------------------------------------
// The reference model: one lock, written for clarity, not speed.
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct ModelHold {
    owner: usize,
    grant: u64,
    levels: Vec<AttemptId>,
    pending: Option<(AttemptId, Time)>,
    lease_end: Time,
}

impl ModelHold {
    fn count(&self) -> u32 {
        (self.levels.len() + usize::from(self.pending.is_some())) as u32
    }
}

#[derive(Clone, Debug)]
struct ModelEntry {
    owner: usize,
    attempt: AttemptId,
    ttl: Span,
    deadline: Time,
}

#[derive(Clone, Debug)]
struct Model {
    now: Time,
    hold: Option<ModelHold>,
    queue: Vec<ModelEntry>,
    /// Attempts granted a level at some point, or ended: never granted again while
    /// remembered. When that was last recorded, and whether a release removed its level.
    spent: HashMap<AttemptId, (Time, bool)>,
    /// Holds (by grant) that a force release freed, and when: that request sent again answers
    /// `true` as it did while remembered.
    forced: HashMap<u64, Time>,
    /// How long spent attempts are remembered ([`RESEND_HORIZON`]), in half units.
    horizon: Time,
    grants: u64,
}

impl Model {
    /// The passage of time: lapsed pending levels, expired leases and waiters go.
    fn expire(&mut self) {
        let now = self.now;
        let horizon = self.horizon;
        self.spent.retain(|_, (at, _)| *at + horizon > now);
        self.forced.retain(|_, at| *at + horizon > now);
        if let Some(hold) = &mut self.hold {
            if hold.pending.is_some_and(|(_, until)| until <= now) {
                hold.pending = None;
            }
            if hold.lease_end <= now || hold.count() == 0 {
                self.hold = None;
            }
        }
        self.queue.retain(|e| e.deadline > now);
    }

    /// Records `attempt` as spent now, keeping whether it was released; returns that.
    fn spend(&mut self, attempt: AttemptId) -> bool {
        self.spend_from(attempt, self.now)
    }

    /// Records `attempt` as spent for a horizon from `from` (or longer, if recorded so
    /// already), keeping whether it was released; returns that.
    fn spend_from(&mut self, attempt: AttemptId, from: Time) -> bool {
        let record = self.spent.entry(attempt).or_insert((from, false));
        record.0 = record.0.max(from);
        record.1
    }

    fn dequeue(&mut self, attempt: AttemptId) -> Option<ModelEntry> {
        let at = self.queue.iter().position(|e| e.attempt == attempt)?;
        Some(self.queue.remove(at))
    }

    fn hand_over(&mut self) {
        if self.queue.is_empty() {
            return;
        }
        let head = self.queue.remove(0);
        let until = self.now + head.ttl;
        // Until a horizon after the pending level lapses: the waiter's acquire may be sent
        // until then.
        self.spend_from(head.attempt, until);
        self.grants += 1;
        self.hold = Some(ModelHold {
            owner: head.owner,
            grant: self.grants,
            levels: Vec::new(),
            pending: Some((head.attempt, until)),
            lease_end: until,
        });
    }

    fn apply(&mut self, request: &Request) -> Reply {
        self.expire();
        let now = self.now;
        match *request {
            Request::Acquire {
                owner,
                attempt,
                lease,
                ttl,
                queue,
            } => {
                if let Some(hold) = &mut self.hold {
                    if hold.levels.contains(&attempt) {
                        return Reply::Granted {
                            grant: hold.grant,
                            count: hold.count(),
                        };
                    }
                    if hold.pending.is_some_and(|(p, _)| p == attempt) {
                        hold.pending = None;
                        hold.levels.push(attempt);
                        hold.lease_end = hold.lease_end.max(now + lease);
                        return Reply::Granted {
                            grant: hold.grant,
                            count: hold.count(),
                        };
                    }
                }
                if self.spent.contains_key(&attempt) {
                    return Reply::Busy;
                }
                if let Some(hold) = self.hold.as_mut().filter(|h| h.owner == owner) {
                    hold.levels.push(attempt);
                    hold.lease_end = hold.lease_end.max(now + lease);
                    let reply = Reply::Granted {
                        grant: hold.grant,
                        count: hold.count(),
                    };
                    self.spend(attempt);
                    self.dequeue(attempt);
                    return reply;
                }
                let is_head = self.queue.first().is_none_or(|e| e.attempt == attempt);
                if self.hold.is_none() && is_head {
                    self.dequeue(attempt);
                    self.spend(attempt);
                    self.grants += 1;
                    self.hold = Some(ModelHold {
                        owner,
                        grant: self.grants,
                        levels: vec![attempt],
                        pending: None,
                        lease_end: now + lease,
                    });
                    return Reply::Granted {
                        grant: self.grants,
                        count: 1,
                    };
                }
                if !queue {
                    return Reply::Busy;
                }
                match self.queue.iter_mut().find(|e| e.attempt == attempt) {
                    Some(entry) => {
                        entry.ttl = ttl;
                        entry.deadline = now + ttl;
                    }
                    None => self.queue.push(ModelEntry {
                        owner,
                        attempt,
                        ttl,
                        deadline: now + ttl,
                    }),
                }
                let head = self.queue.first().is_some_and(|e| e.attempt == attempt);
                Reply::Queued {
                    hinted: head && self.hold.is_some(),
                    last_grant: self.grants,
                }
            }
            Request::Release {
                owner,
                grant,
                attempt,
            } => {
                // Released before: this is that release again, answered as it was.
                let released = self.spend(attempt);
                let Some(hold) = self
                    .hold
                    .as_mut()
                    .filter(|h| h.owner == owner && h.grant == grant)
                else {
                    return if released {
                        Reply::Released { remaining: 0 }
                    } else {
                        Reply::NotHeld
                    };
                };
                let removed = if hold.pending.is_some_and(|(p, _)| p == attempt) {
                    hold.pending = None;
                    true
                } else if let Some(at) = hold.levels.iter().position(|a| *a == attempt) {
                    hold.levels.remove(at);
                    true
                } else {
                    false
                };
                let remaining = hold.count();
                if !removed {
                    return if released {
                        Reply::Released { remaining }
                    } else {
                        Reply::NotHeld
                    };
                }
                // Spent above: now also released.
                self.spent
                    .entry(attempt)
                    .and_modify(|(_, released)| *released = true);
                if remaining == 0 {
                    self.hold = None;
                    self.hand_over();
                }
                Reply::Released { remaining }
            }
            Request::Extend {
                owner,
                grant,
                lease,
            } => match &mut self.hold {
                Some(hold) if hold.owner == owner && hold.grant == grant => {
                    hold.lease_end = hold.lease_end.max(now + lease);
                    Reply::Bool(true)
                }
                _ => Reply::Bool(false),
            },
            Request::Abandon { owner, attempt } => {
                self.spend(attempt);
                self.dequeue(attempt);
                let mut freed = false;
                if let Some(hold) = self.hold.as_mut().filter(|h| h.owner == owner) {
                    if hold.pending.is_some_and(|(p, _)| p == attempt) {
                        hold.pending = None;
                    } else {
                        hold.levels.retain(|a| *a != attempt);
                    }
                    freed = hold.count() == 0;
                }
                if freed {
                    self.hold = None;
                    self.hand_over();
                }
                Reply::Done
            }
            Request::ForceRelease { grant } => {
                let held = self.hold.as_ref().is_some_and(|h| h.grant == grant);
                if held {
                    self.hold = None;
                    self.forced.insert(grant, now);
                    self.hand_over();
                }
                Reply::Bool(held || self.forced.contains_key(&grant))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The driver: one seeded schedule against one backend.
// ---------------------------------------------------------------------------------------

/// What the client side of an attempt knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Known {
    /// Sent `acquire` with `queue`; not granted yet as far as it knows.
    Waiting { ttl: Span },
    /// Holds a guard of this grant.
    Guard { grant: u64 },
}

struct Schedule {
    backend: Arc<dyn LockBackend>,
    config: ModelConfig,
    seed: u64,
    rng: StdRng,
    name: LockName,
    owners: Vec<Owner>,
    model: Model,
    attempts: BTreeMap<AttemptId, (usize, Known)>,
    /// Backend tokens by grant number.
    tokens: BTreeMap<u64, u64>,
    /// Each `Queued` reply's `last_token`, with the number of grants the model had made
    /// then: it must be at least the token of that grant and below every later one.
    reported: Vec<(u64, u64)>,
    /// Every request sent, with when.
    history: Vec<(Time, Request)>,
    /// Attempts the client side ended (released or abandoned).
    ended: HashSet<AttemptId>,
    log: Vec<String>,
    started: Instant,
}

impl Schedule {
    fn new(backend: Arc<dyn LockBackend>, config: ModelConfig, seed: u64) -> Self {
        let name = LockName::new(format!(
            "fairlock-conformance/model/{seed}-{:08x}",
            rand::random::<u32>()
        ))
        .expect("a valid name");
        Schedule {
            backend,
            config,
            seed,
            rng: StdRng::seed_from_u64(seed),
            name,
            owners: (0..config.owners).map(|_| Owner::unique()).collect(),
            model: Model {
                now: 0,
                hold: None,
                queue: Vec::new(),
                spent: HashMap::new(),
                forced: HashMap::new(),
                horizon: (2 * RESEND_HORIZON.as_nanos() / config.clock.unit().as_nanos().max(1))
                    as Time,
                grants: 0,
            },
            attempts: BTreeMap::new(),
            tokens: BTreeMap::new(),
            reported: Vec::new(),
            history: Vec::new(),
            ended: HashSet::new(),
            log: Vec::new(),
            started: Instant::now(),
        }
    }

    /// Abandons the schedule as inconclusive (see [`check_against_model`]).
    fn stalled(&self, what: impl fmt::Display) -> ! {
        std::panic::panic_any(Stalled(format!(
            "fairlock model check: the machine stalled under seed {} (lock {}): {what}",
            self.seed, self.name
        )))
    }

    fn fail(&self, what: impl fmt::Display) -> ! {
        let tail: Vec<&String> = self.log.iter().rev().take(40).rev().collect();
        panic!(
            "fairlock model check failed (seed {seed}, lock {name}): {what}\nlast steps:\n  {steps}\n\
             rerun this schedule with its seed (it becomes a regression test)",
            seed = self.seed,
            name = self.name,
            steps = tail
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n  "),
        )
    }

    fn span(&mut self) -> Span {
        match self.rng.gen_range(0..10) {
            0..=1 => 1,
            2 => 3,
            3 => 5,
            _ => LONG,
        }
    }

    fn duration(&self, span: Span) -> Duration {
        // Half units; LONG stays well inside MAX_DURATION for any sane unit.
        self.config.clock.unit() * u32::try_from(span).unwrap_or(u32::MAX) / 2
    }

    /// The backend token of grant `grant`, learning it from `token` the first time.
    fn learn(&mut self, grant: u64, token: u64) {
        match self.tokens.get(&grant) {
            Some(&known) if known != token => self.fail(format!(
                "grant #{grant} has token {token}, but it had {known} before"
            )),
            Some(_) => {}
            None => {
                let before = self.tokens.range(..grant).next_back().map(|(_, &t)| t);
                let after = self.tokens.range(grant + 1..).next().map(|(_, &t)| t);
                if before.is_some_and(|b| b >= token) || after.is_some_and(|a| a <= token) {
                    self.fail(format!(
                        "tokens must strictly increase: grant #{grant} has {token}, neighbours {before:?} / {after:?}"
                    ));
                }
                self.tokens.insert(grant, token);
                for &(after, reported) in &self.reported {
                    self.within_report(after, reported, grant, token);
                }
            }
        }
    }

    /// Records a `Queued` reply's `last_token`, made when the lock's last grant was number
    /// `after` (0: none yet). The contract allows any token from that grant's up to, not
    /// including, the next grant's (a store may count tokens across all its locks).
    fn report(&mut self, after: u64, reported: u64) {
        for (&grant, &token) in &self.tokens {
            self.within_report(after, reported, grant, token);
        }
        self.reported.push((after, reported));
    }

    fn within_report(&self, after: u64, reported: u64, grant: u64, token: u64) {
        if grant <= after && token > reported {
            self.fail(format!(
                "Queued reported last token {reported} after grant #{after}, below grant #{grant}'s token {token}"
            ));
        }
        if grant > after && token <= reported {
            self.fail(format!(
                "Queued reported last token {reported} after grant #{after}, not below the later grant #{grant}'s token {token}"
            ));
        }
    }

    /// The backend token of a grant the schedule names: a known one, or one never revealed
    /// (a stale or future token that no hold has).
    fn token_of(&self, grant: u64) -> u64 {
        match self.tokens.get(&grant) {
            Some(&token) => token,
            // Never issued by the backend as far as we know: above every token seen.
            None => self.tokens.values().max().copied().unwrap_or(0) + 1_000_000 + grant,
        }
    }

    async fn send(&mut self, request: &Request) -> Reply {
        let backend = self.backend.clone();
        let result = match request {
            Request::Acquire {
                owner,
                attempt,
                lease,
                ttl,
                queue,
            } => {
                let request = AcquireRequest {
                    name: self.name.clone(),
                    owner: self.owners[*owner].clone(),
                    attempt: *attempt,
                    lease: self.duration(*lease),
                    waiter_ttl: self.duration(*ttl),
                    queue: *queue,
                };
                backend
                    .acquire(&request)
                    .await
                    .map(|outcome| match outcome {
                        AcquireOutcome::Granted(Grant { token, hold_count }) => (
                            Some(token),
                            Reply::Granted {
                                grant: 0,
                                count: hold_count,
                            },
                        ),
                        AcquireOutcome::Queued {
                            retry_after,
                            last_token,
                        } => (
                            Some(last_token),
                            Reply::Queued {
                                hinted: retry_after.is_some(),
                                last_grant: 0,
                            },
                        ),
                        AcquireOutcome::Busy => (None, Reply::Busy),
                    })
            }
            Request::Release {
                owner,
                grant,
                attempt,
            } => backend
                .release(
                    &self.name,
                    &self.owners[*owner],
                    self.token_of(*grant),
                    *attempt,
                )
                .await
                .map(|outcome| match outcome {
                    ReleaseOutcome::Released { remaining } => (None, Reply::Released { remaining }),
                    ReleaseOutcome::NotHeld => (None, Reply::NotHeld),
                }),
            Request::Extend {
                owner,
                grant,
                lease,
            } => backend
                .extend(
                    &self.name,
                    &self.owners[*owner],
                    self.token_of(*grant),
                    self.duration(*lease),
                )
                .await
                .map(|ok| (None, Reply::Bool(ok))),
            Request::Abandon { owner, attempt } => backend
                .abandon(&self.name, &self.owners[*owner], *attempt)
                .await
                .map(|()| (None, Reply::Done)),
            Request::ForceRelease { grant } => backend
                .force_release(&self.name, self.token_of(*grant))
                .await
                .map(|ok| (None, Reply::Bool(ok))),
        };
        let (token, mut reply) = match result {
            Ok(found) => found,
            Err(err) => self.fail(format!("{request:?} failed: {err}")),
        };
        // Translate tokens into grant numbers, with the model's expectation as the guide.
        let expected = self.model.apply(request);
        match (&mut reply, &expected, token) {
            (Reply::Granted { grant, .. }, Reply::Granted { grant: want, .. }, Some(token)) => {
                self.learn(*want, token);
                *grant = *want;
            }
            (
                Reply::Queued { last_grant, hinted },
                Reply::Queued {
                    last_grant: want,
                    hinted: want_hint,
                },
                Some(token),
            ) => {
                self.report(*want, token);
                *last_grant = *want;
                // `retry_after` is a SHOULD of the contract: not held against a backend.
                *hinted = *want_hint;
            }
            _ => {}
        }
        if reply != expected {
            self.fail(format!(
                "{request:?}: the backend replied {reply:?}, the model {expected:?}"
            ));
        }
        reply
    }

    /// Compares the backend's state with the model's and checks the invariants.
    async fn compare(&mut self) {
        let state: LockState = match self.backend.inspect(&self.name).await {
            Ok(state) => state,
            Err(err) => self.fail(format!("inspect failed: {err}")),
        };
        let model = self.model.clone();
        let mut model_now = model.clone();
        model_now.expire();
        match (&state.holder, &model_now.hold) {
            (None, None) => {}
            (Some(real), Some(hold)) => {
                self.learn(hold.grant, real.token);
                let owner = self.owners[hold.owner].as_str();
                if real.owner != owner
                    || real.hold_count != hold.count()
                    || real.confirmed != hold.pending.is_none()
                {
                    self.fail(format!(
                        "holder differs: backend {real:?}, model {hold:?} (owner {owner})"
                    ));
                }
            }
            (real, hold) => self.fail(format!("holder differs: backend {real:?}, model {hold:?}")),
        }
        let real: Vec<AttemptId> = state.waiters.iter().map(|w| w.attempt).collect();
        let want: Vec<AttemptId> = model_now.queue.iter().map(|e| e.attempt).collect();
        if real != want {
            self.fail(format!(
                "queue differs (FIFO): backend {real:?}, model {want:?}"
            ));
        }
        for (waiter, entry) in state.waiters.iter().zip(&model_now.queue) {
            if waiter.owner != self.owners[entry.owner].as_str() {
                self.fail(format!("waiter {} has the wrong owner", waiter.attempt));
            }
        }
        if let Some(hold) = &model_now.hold {
            // No phantom levels: every level belongs to an attempt that has not ended.
            let levels = hold
                .levels
                .iter()
                .chain(hold.pending.iter().map(|(a, _)| a));
            for level in levels {
                if self.ended.contains(level) {
                    self.fail(format!("attempt {level} ended but still holds a level"));
                }
            }
            // Every guard of this hold still has its level.
            for (attempt, (_, known)) in &self.attempts {
                if *known == (Known::Guard { grant: hold.grant })
                    && !hold.levels.contains(attempt)
                    && hold.pending.is_none_or(|(p, _)| p != *attempt)
                {
                    self.fail(format!("the live guard of {attempt} lost its level"));
                }
            }
        }
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        if items.is_empty() {
            None
        } else {
            Some(items[self.rng.gen_range(0..items.len())])
        }
    }

    fn live(&self, filter: impl Fn(&Known) -> bool) -> Vec<AttemptId> {
        self.attempts
            .iter()
            .filter(|(_, (_, k))| filter(k))
            .map(|(a, _)| *a)
            .collect()
    }

    /// Moves time on by `units`, on the backend and in the model.
    async fn advance(&mut self, units: u64) {
        self.model.now += 2 * units;
        let unit = self.config.clock.unit();
        match self.config.clock {
            ModelClock::Paused { .. } => {
                tokio::time::advance(unit * u32::try_from(units).unwrap_or(u32::MAX)).await;
            }
            ModelClock::Real { .. } => {
                let at =
                    self.started + unit * u32::try_from(self.model.now / 2).unwrap_or(u32::MAX);
                if Instant::now() > at {
                    self.stalled("steps took longer than the schedule's unit");
                }
                tokio::time::sleep_until(at).await;
            }
        }
        self.log.push(format!("advance {units} unit(s)"));
    }

    /// The steps since the last advance must fit in half a unit on a real clock.
    fn check_pace(&self) {
        if let ModelClock::Real { unit } = self.config.clock {
            let now_at =
                self.started + unit * u32::try_from(self.model.now / 2).unwrap_or(u32::MAX);
            if Instant::now() > now_at + unit / 2 {
                self.stalled(format!(
                    "a step ended more than half a unit ({:?}) after its time",
                    unit / 2
                ));
            }
        }
    }

    async fn step(&mut self, request: Request) -> Reply {
        if let Request::Release { attempt, .. } | Request::Abandon { attempt, .. } = request {
            self.ended.insert(attempt);
        }
        self.history.push((self.model.now, request.clone()));
        self.deliver(request).await
    }

    /// Delivers `request` (new, or a re-send of an earlier one) and checks everything.
    async fn deliver(&mut self, request: Request) -> Reply {
        self.log.push(format!("{request:?}"));
        let reply = self.send(&request).await;
        self.log.push(format!("  -> {reply:?}"));
        // A step the machine stalled could see deadlines pass that the model has not: judge
        // the pace before the replies.
        self.check_pace();
        self.compare().await;
        self.check_pace();
        reply
    }

    async fn run(mut self) {
        // Line up the schedule's time with the backend's.
        self.started = Instant::now();
        for _ in 0..self.config.steps {
            self.random_step().await;
        }
        self.finish().await;
    }

    async fn random_step(&mut self) {
        let owners = self.owners.len();
        match self.rng.gen_range(0..100) {
            // A new attempt (a `lock()` or `try_lock()` call), maybe by the holder.
            0..=21 => {
                let owner = self.rng.gen_range(0..owners);
                // From the seed, so that a seed replays exactly.
                let attempt = AttemptId::from_u128(self.rng.gen());
                let queue = self.rng.gen_bool(0.75);
                let (lease, ttl) = (self.span(), self.span());
                let reply = self
                    .step(Request::Acquire {
                        owner,
                        attempt,
                        lease,
                        ttl,
                        queue,
                    })
                    .await;
                self.learn_reply(attempt, owner, ttl, &reply, queue).await;
            }
            // A heartbeat of a waiting attempt (or its confirmation of a hand-over).
            22..=41 => {
                let waiting = self.live(|k| matches!(k, Known::Waiting { .. }));
                if let Some(attempt) = self.pick(&waiting) {
                    let (owner, known) = self.attempts[&attempt];
                    let Known::Waiting { ttl: old } = known else {
                        return;
                    };
                    let ttl = if self.rng.gen_bool(0.8) {
                        old
                    } else {
                        self.span()
                    };
                    let lease = self.span();
                    let reply = self
                        .step(Request::Acquire {
                            owner,
                            attempt,
                            lease,
                            ttl,
                            queue: true,
                        })
                        .await;
                    self.learn_reply(attempt, owner, ttl, &reply, true).await;
                }
            }
            // A guard is released (unlock or drop).
            42..=55 => {
                let guards = self.live(|k| matches!(k, Known::Guard { .. }));
                if let Some(attempt) = self.pick(&guards) {
                    let (owner, known) = self.attempts.remove(&attempt).expect("known");
                    let Known::Guard { grant } = known else {
                        return;
                    };
                    self.step(Request::Release {
                        owner,
                        grant,
                        attempt,
                    })
                    .await;
                }
            }
            // An attempt is cancelled or times out, or a call's reply was lost and the core
            // gives up: abandon, whatever the attempt has.
            56..=64 => {
                let all = self.live(|_| true);
                if let Some(attempt) = self.pick(&all) {
                    let (owner, _) = self.attempts.remove(&attempt).expect("known");
                    self.step(Request::Abandon { owner, attempt }).await;
                }
            }
            // A guard extends (or its keeper renews, or confirms a hand-over it trusted).
            65..=71 => {
                let guards = self.live(|k| matches!(k, Known::Guard { .. }));
                if let Some(attempt) = self.pick(&guards) {
                    let (owner, known) = self.attempts[&attempt];
                    let Known::Guard { grant } = known else {
                        return;
                    };
                    let lease = self.span();
                    self.step(Request::Extend {
                        owner,
                        grant,
                        lease,
                    })
                    .await;
                }
            }
            // A waiter sees a hand-over made to it (its wake-up) and trusts it: its guard
            // confirms it at once, with its own attempt's acquire.
            72..=77 => {
                let mut current = self.model.clone();
                current.expire();
                let Some(hold) = current.hold else { return };
                let Some((pending, _)) = hold.pending else {
                    return;
                };
                if let Some((owner, Known::Waiting { ttl })) = self.attempts.get(&pending).copied()
                {
                    self.log
                        .push(format!("{pending} trusts its hand-over #{}", hold.grant));
                    self.attempts
                        .insert(pending, (owner, Known::Guard { grant: hold.grant }));
                    let lease = self.span();
                    self.step(Request::Acquire {
                        owner,
                        attempt: pending,
                        lease,
                        ttl,
                        queue: false,
                    })
                    .await;
                }
            }
            // An operator force-releases the current hold, or a stale one.
            78..=80 => {
                let current = self.model.hold.as_ref().map(|h| h.grant);
                let grant = match current {
                    Some(grant) if self.rng.gen_bool(0.7) => grant,
                    _ => self.rng.gen_range(1..=self.model.grants.max(1)),
                };
                self.step(Request::ForceRelease { grant }).await;
            }
            // A request delivered again, later: a client re-sending after a reconnect, or a
            // request that sat in a paused server. Within the contract's horizon only.
            81..=92 => {
                let now = self.model.now;
                let horizon = self.model.horizon;
                let recent = self.history.partition_point(|(at, _)| *at + horizon <= now);
                if recent < self.history.len() {
                    let at = self.rng.gen_range(recent..self.history.len());
                    let request = self.history[at].1.clone();
                    self.log.push(format!("re-send of step {at}:"));
                    // Its reply reaches nobody: the attempt learns its state at its next call,
                    // like the core after a lost reply.
                    let _ = self.deliver(request).await;
                }
            }
            // Time passes.
            _ => {
                let units = self.rng.gen_range(1..=3);
                self.advance(units).await;
                self.compare().await;
            }
        }
    }

    async fn learn_reply(
        &mut self,
        attempt: AttemptId,
        owner: usize,
        ttl: Span,
        reply: &Reply,
        queue: bool,
    ) {
        match *reply {
            Reply::Granted { grant, .. } => {
                self.attempts
                    .insert(attempt, (owner, Known::Guard { grant }));
            }
            Reply::Queued { .. } => {
                self.attempts
                    .insert(attempt, (owner, Known::Waiting { ttl }));
            }
            _ => {
                // `try_lock` refused: the core abandons the attempt (in the background).
                self.attempts.remove(&attempt);
                if !queue {
                    self.step(Request::Abandon { owner, attempt }).await;
                }
            }
        }
    }

    /// Everyone goes: the lock must end free, with no waiter.
    async fn finish(&mut self) {
        let all: Vec<(AttemptId, (usize, Known))> =
            self.attempts.iter().map(|(a, k)| (*a, *k)).collect();
        for (attempt, (owner, known)) in all {
            self.attempts.remove(&attempt);
            match known {
                Known::Guard { grant } => {
                    self.step(Request::Release {
                        owner,
                        grant,
                        attempt,
                    })
                    .await;
                }
                Known::Waiting { .. } => {
                    self.step(Request::Abandon { owner, attempt }).await;
                }
            }
        }
        // Hand-overs to attempts that ended (pending levels of nobody) and re-queued
        // stragglers lapse within their TTL; at the longest, one LONG span. Abandon what the
        // model still lists, as the core would for attempts it still knows.
        let mut model = self.model.clone();
        model.expire();
        for entry in model.queue.clone() {
            self.step(Request::Abandon {
                owner: entry.owner,
                attempt: entry.attempt,
            })
            .await;
        }
        let mut model = self.model.clone();
        model.expire();
        if let Some(hold) = model.hold.clone() {
            self.step(Request::ForceRelease { grant: hold.grant }).await;
        }
        self.compare().await;
        let state = match self.backend.inspect(&self.name).await {
            Ok(state) => state,
            Err(err) => self.fail(format!("inspect failed: {err}")),
        };
        if state.holder.is_some() || !state.waiters.is_empty() {
            self.fail(format!("something was left at the end: {state:?}"));
        }
    }
}

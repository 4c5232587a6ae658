//! When a worker's process heard of each hand-over, for the stage breakdown of the processes
//! section: the Redis backend emits a `wake-up received` trace event as its subscriber
//! connection delivers a message (before routing it to the waiting call), and a hand-over's
//! message names the fencing token it grants. Only workers started by that section record it
//! (they get [`ENV`]); a worker run by the external harness installs no subscriber.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

use crate::clock::EpochClock;

/// Set (to anything) for the workers of the processes section.
pub(crate) const ENV: &str = "FAIRLOCK_BENCH_STAGES";

/// The backend's event, by target; nothing else reaches the layer.
const TARGET: &str = "fairlock_redis::wake";

/// Hand-overs heard and not yet claimed: more than this many means no hold claims them.
const KEPT: usize = 64;

/// Hand-overs this process heard of: (token, epoch ns when heard), oldest first.
#[derive(Clone, Debug, Default)]
pub(crate) struct Heard(Arc<Mutex<VecDeque<(u64, u128)>>>);

impl Heard {
    /// Starts recording, if this worker was asked to ([`ENV`]).
    pub(crate) fn install_if_asked(clock: EpochClock) -> Result<Option<Heard>, String> {
        if std::env::var_os(ENV).is_none() {
            return Ok(None);
        }
        let heard = Heard::default();
        let layer = Recorder {
            heard: heard.clone(),
            clock,
        }
        .with_filter(Targets::new().with_target(TARGET, LevelFilter::TRACE));
        // Not `try_init`: that would also route the `log` crate's records (fred's) through
        // tracing, a cost on every command that a worker run by the harness does not pay.
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .map_err(|err| format!("installing the stage recorder: {err}"))?;
        Ok(Some(heard))
    }

    /// When the hand-over of `token` was heard, if it was (a grant the caller's own request
    /// got was not), forgetting it and anything heard before it.
    pub(crate) fn take(&self, token: u64) -> Option<u128> {
        let mut heard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let at = heard
            .iter()
            .position(|&(heard_token, _)| heard_token == token)?;
        let (_, when) = heard[at];
        heard.drain(..=at);
        Some(when)
    }

    fn record(&self, token: u64, when: u128) {
        let mut heard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if heard.len() == KEPT {
            heard.pop_front();
        }
        heard.push_back((token, when));
    }
}

struct Recorder {
    heard: Heard,
    clock: EpochClock,
}

impl<S: tracing::Subscriber> Layer<S> for Recorder {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let when = self.clock.now_ns();
        let mut visit = Visitor {
            received: false,
            token: None,
        };
        event.record(&mut visit);
        if let (true, Some(token)) = (visit.received, visit.token) {
            self.heard.record(token, when);
        }
    }
}

/// Reads a `wake-up received` event: whether it is one, and the token of a hand-over.
struct Visitor {
    received: bool,
    token: Option<u64>,
}

impl Visit for Visitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "payload" {
            self.token = granted_token(value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // The message comes as `format_args!`, so through here: compared as it is written,
        // without allocating.
        if field.name() == "message" {
            let mut expected = Expect {
                rest: MESSAGE,
                same: true,
            };
            self.received = fmt::write(&mut expected, format_args!("{value:?}")).is_ok()
                && expected.same
                && expected.rest.is_empty();
        }
    }
}

/// Compares what is written to it with `rest`.
struct Expect {
    rest: &'static str,
    same: bool,
}

impl fmt::Write for Expect {
    fn write_str(&mut self, written: &str) -> fmt::Result {
        match self.rest.strip_prefix(written) {
            Some(rest) if self.same => self.rest = rest,
            _ => self.same = false,
        }
        Ok(())
    }
}

/// The backend's event, by message (its target has other events).
const MESSAGE: &str = "wake-up received";

/// The token of a hand-over message, `G <token> <attempt> <owner>`.
fn granted_token(payload: &str) -> Option<u64> {
    let rest = payload.strip_prefix("G ")?;
    rest.split(' ').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_token_of_hand_overs_only() {
        assert_eq!(granted_token("G 17 0123 owner x"), Some(17));
        assert_eq!(granted_token("R owner"), None);
        assert_eq!(granted_token("A"), None);
        assert_eq!(granted_token("G x 0123 owner"), None);
    }

    #[test]
    fn a_token_is_claimed_once_with_what_came_before_it() {
        let heard = Heard::default();
        heard.record(1, 10);
        heard.record(2, 20);
        heard.record(3, 30);
        assert_eq!(heard.take(2), Some(20));
        assert_eq!(heard.take(1), None);
        assert_eq!(heard.take(3), Some(30));
        assert_eq!(heard.take(3), None);
    }

    /// The layer as the worker installs it, fed events like the backend's.
    #[test]
    fn records_hand_overs_the_backend_reports_and_nothing_else() {
        let heard = Heard::default();
        let layer = Recorder {
            heard: heard.clone(),
            clock: EpochClock::new(),
        }
        .with_filter(Targets::new().with_target(TARGET, LevelFilter::TRACE));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let payload = String::from("G 41 0123 some owner");
            tracing::trace!(target: "fairlock_redis::wake", channel = "c", payload = payload.as_str(), "wake-up received");
            tracing::trace!(target: "fairlock_redis::wake", channel = "c", payload = "R some owner", "wake-up received");
            tracing::trace!(target: "fairlock_redis::wake", payload = "G 42 0123 owner", "ignoring an unknown message");
            tracing::trace!(target: "elsewhere", payload = "G 43 0123 owner", "wake-up received");
        });
        assert!(heard.take(41).is_some());
        for token in [42, 43] {
            assert_eq!(heard.take(token), None, "token {token}");
        }
    }

    #[test]
    fn keeps_a_bounded_number() {
        let heard = Heard::default();
        for token in 0..(KEPT as u64 + 10) {
            heard.record(token, u128::from(token));
        }
        assert_eq!(heard.take(5), None);
        assert_eq!(
            heard.take(KEPT as u64 + 9),
            Some(u128::from(KEPT as u64 + 9))
        );
    }
}

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
use tracing_subscriber::util::SubscriberInitExt;

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
        tracing_subscriber::registry()
            .with(layer)
            .try_init()
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
        let mut payload = Payload(None);
        event.record(&mut payload);
        if let Some(token) = payload.0.as_deref().and_then(granted_token) {
            self.heard.record(token, when);
        }
    }
}

/// The event's `payload` field, as text.
struct Payload(Option<String>);

impl Visit for Payload {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "payload" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

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

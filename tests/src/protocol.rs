//! The lines the `contender` process prints on its standard output, one event per line.
//!
//! Both sides use this one type: the binary prints an [`Event`] with `Display`, the tests
//! read it back with [`Event::parse`], so the format cannot drift between them.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// One thing a contender did, as a line of text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// `READY <owner> <epoch_ns>`: connected; `owner` is the id it locks as (as listed by
    /// `LockClient::state`), `epoch_ns` its wall clock (so a test can see a fake clock).
    Ready {
        /// The owner id of the contender's lock handle.
        owner: String,
        /// The contender's wall clock, nanoseconds since the Unix epoch.
        epoch_ns: u128,
    },
    /// `REQ <seq>`: about to call `lock()` for acquisition number `seq` (from 0).
    Req {
        /// The acquisition number.
        seq: u64,
    },
    /// `ACQ <seq> <token> <epoch_ns>`: `lock()` returned; the clock was read after it did.
    Acq {
        /// The acquisition number.
        seq: u64,
        /// The hold's fencing token.
        token: u64,
        /// The contender's wall clock when it started holding.
        epoch_ns: u128,
    },
    /// `REL <seq> <epoch_ns>`: released; the clock was read *before* the release was sent,
    /// so `[ACQ, REL]` lies inside the real hold.
    Rel {
        /// The acquisition number.
        seq: u64,
        /// The contender's wall clock just before it released.
        epoch_ns: u128,
    },
    /// `LOST <seq> <epoch_ns>`: the guard's lost-lease signal fired (a fixed lease ran out).
    Lost {
        /// The acquisition number.
        seq: u64,
        /// The contender's wall clock when the signal fired.
        epoch_ns: u128,
    },
    /// `DONE`: every acquisition was made and released; the process exits 0 next.
    Done,
    /// `FAIL <message>`: something went wrong; the process exits non-zero next.
    Fail(String),
}

impl Event {
    /// Parses one line as printed by `Display`, or `None` if it is not one.
    pub fn parse(line: &str) -> Option<Event> {
        let mut words = line.split(' ');
        let kind = words.next()?;
        let mut next = || words.next();
        let event = match kind {
            "READY" => Event::Ready {
                owner: next()?.to_owned(),
                epoch_ns: next()?.parse().ok()?,
            },
            "REQ" => Event::Req {
                seq: next()?.parse().ok()?,
            },
            "ACQ" => Event::Acq {
                seq: next()?.parse().ok()?,
                token: next()?.parse().ok()?,
                epoch_ns: next()?.parse().ok()?,
            },
            "REL" => Event::Rel {
                seq: next()?.parse().ok()?,
                epoch_ns: next()?.parse().ok()?,
            },
            "LOST" => Event::Lost {
                seq: next()?.parse().ok()?,
                epoch_ns: next()?.parse().ok()?,
            },
            "DONE" => Event::Done,
            "FAIL" => return Some(Event::Fail(line["FAIL".len()..].trim().to_owned())),
            _ => return None,
        };
        next().is_none().then_some(event)
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Ready { owner, epoch_ns } => write!(f, "READY {owner} {epoch_ns}"),
            Event::Req { seq } => write!(f, "REQ {seq}"),
            Event::Acq {
                seq,
                token,
                epoch_ns,
            } => write!(f, "ACQ {seq} {token} {epoch_ns}"),
            Event::Rel { seq, epoch_ns } => write!(f, "REL {seq} {epoch_ns}"),
            Event::Lost { seq, epoch_ns } => write!(f, "LOST {seq} {epoch_ns}"),
            Event::Done => f.write_str("DONE"),
            // One line, whatever the message holds.
            Event::Fail(message) => write!(f, "FAIL {}", message.replace('\n', " ")),
        }
    }
}

/// This process's wall clock in nanoseconds since the Unix epoch (0 before 1970).
pub fn epoch_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_reads_back() {
        let events = [
            Event::Ready {
                owner: "abc".into(),
                epoch_ns: 17,
            },
            Event::Req { seq: 3 },
            Event::Acq {
                seq: 3,
                token: 99,
                epoch_ns: 1_700_000_000_000_000_000,
            },
            Event::Rel {
                seq: 3,
                epoch_ns: 5,
            },
            Event::Lost {
                seq: 0,
                epoch_ns: 6,
            },
            Event::Done,
            Event::Fail("no luck: at all".into()),
        ];
        for event in events {
            assert_eq!(Event::parse(&event.to_string()), Some(event));
        }
        assert_eq!(Event::parse("ACQ 1 2"), None);
        assert_eq!(Event::parse("REQ 1 2"), None);
        assert_eq!(Event::parse("hello"), None);
    }
}

//! The operator's subcommands: `status`, `list` and `force-unlock`.
//!
//! JSON field names are part of the tool's interface (docs/cli.md): durations are integer
//! milliseconds with an `_ms` suffix, absent things are `null`, never missing.

use std::fmt::Write as _;
use std::time::Duration;

use fairlock::{LockClient, LockState, LockSummary};
use serde::Serialize;

use crate::args::{ForceUnlockArgs, ListArgs, StatusArgs};
use crate::exit::{Failure, OK};

/// `fairlock status`: prints the lock's holder and waiters.
pub(crate) async fn status(client: &LockClient, args: &StatusArgs) -> Result<u8, Failure> {
    let state = client.state(&args.name).await?;
    if args.json {
        println!("{}", to_json(&StatusJson::from(&state))?);
    } else {
        print!("{}", status_text(&state));
    }
    Ok(OK)
}

/// `fairlock list`: prints one line per lock held or waited on.
pub(crate) async fn list(client: &LockClient, args: &ListArgs) -> Result<u8, Failure> {
    let mut locks = client.list(&args.prefix).await?;
    locks.sort_by(|a, b| a.name.cmp(&b.name));
    if args.json {
        let lines: Vec<_> = locks.iter().map(ListEntryJson::from).collect();
        println!("{}", to_json(&lines)?);
    } else {
        print!("{}", list_text(&locks));
    }
    Ok(OK)
}

/// `fairlock force-unlock`: frees the lock and says whether it was held.
pub(crate) async fn force_unlock(
    client: &LockClient,
    args: &ForceUnlockArgs,
) -> Result<u8, Failure> {
    let was_held = client.force_unlock(&args.name).await?;
    if args.json {
        let json = ForceUnlockJson {
            name: &args.name,
            was_held,
        };
        println!("{}", to_json(&json)?);
    } else if was_held {
        println!("lock {:?} was held; released it", args.name);
    } else {
        println!("lock {:?} was not held", args.name);
    }
    Ok(OK)
}

/// `force-unlock --json`.
#[derive(Debug, Serialize)]
struct ForceUnlockJson<'a> {
    name: &'a str,
    /// Whether the hold this call found was force-released (by it, or by another force
    /// release of that hold at the same time); `false` when the lock was free, or the hold it
    /// read ended by itself first.
    was_held: bool,
}

/// `status --json`.
#[derive(Debug, Serialize)]
struct StatusJson<'a> {
    name: &'a str,
    held: bool,
    holder: Option<HolderJson<'a>>,
    waiters: Vec<WaiterJson<'a>>,
}

#[derive(Debug, Serialize)]
struct HolderJson<'a> {
    owner: &'a str,
    hold_count: u32,
    fencing_token: u64,
    lease_remaining_ms: u64,
    /// `false` while the lock is being handed to a waiter that has not confirmed it yet.
    confirmed: bool,
}

#[derive(Debug, Serialize)]
struct WaiterJson<'a> {
    /// 1 for the first in line.
    position: usize,
    owner: &'a str,
    /// Time left until the waiter's liveness deadline; it heartbeats well before.
    deadline_in_ms: u64,
}

impl<'a> From<&'a LockState> for StatusJson<'a> {
    fn from(state: &'a LockState) -> Self {
        StatusJson {
            name: &state.name,
            held: state.holder.is_some(),
            holder: state.holder.as_ref().map(|holder| HolderJson {
                owner: &holder.owner,
                hold_count: holder.hold_count,
                fencing_token: holder.token,
                lease_remaining_ms: millis(holder.lease_remaining),
                confirmed: holder.confirmed,
            }),
            waiters: state
                .waiters
                .iter()
                .enumerate()
                .map(|(index, waiter)| WaiterJson {
                    position: index + 1,
                    owner: &waiter.owner,
                    deadline_in_ms: millis(waiter.deadline_in),
                })
                .collect(),
        }
    }
}

/// One element of `list --json`.
#[derive(Debug, Serialize)]
struct ListEntryJson<'a> {
    name: &'a str,
    held: bool,
    holder: Option<&'a str>,
    waiters: usize,
}

impl<'a> From<&'a LockSummary> for ListEntryJson<'a> {
    fn from(summary: &'a LockSummary) -> Self {
        ListEntryJson {
            name: &summary.name,
            held: summary.holder.is_some(),
            holder: summary.holder.as_deref(),
            waiters: summary.waiters,
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn to_json(value: &impl Serialize) -> Result<String, Failure> {
    serde_json::to_string_pretty(value)
        .map_err(|err| Failure::new(crate::exit::INTERNAL, format!("cannot write JSON: {err}")))
}

/// Durations for people: whole milliseconds, in humantime's units (`29s 512ms`).
fn human(duration: Duration) -> String {
    humantime::format_duration(Duration::from_millis(millis(duration))).to_string()
}

/// `text` fit for a terminal: control characters escaped (a lock name may hold any but NUL,
/// and must neither break a row nor write to the operator's terminal).
fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            escaped.extend(c.escape_debug());
        } else {
            escaped.push(c);
        }
    }
    escaped.into()
}

fn status_text(state: &LockState) -> String {
    let mut out = format!("lock:     {}\n", shown(&state.name));
    match &state.holder {
        None => out.push_str("holder:   none (free)\n"),
        Some(holder) => {
            let pending = if holder.confirmed {
                ""
            } else {
                ", hand-over not yet confirmed"
            };
            let _ = writeln!(
                out,
                "holder:   {} (hold count {}, fencing token {}, lease {} left{pending})",
                shown(&holder.owner),
                holder.hold_count,
                holder.token,
                human(holder.lease_remaining),
            );
        }
    }
    let _ = writeln!(out, "waiters:  {}", state.waiters.len());
    for (index, waiter) in state.waiters.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {}. {} (liveness deadline in {})",
            index + 1,
            shown(&waiter.owner),
            human(waiter.deadline_in),
        );
    }
    out
}

fn list_text(locks: &[LockSummary]) -> String {
    // Widths in characters, as `{:width$}` pads.
    let width = |text: &str| shown(text).chars().count();
    let name_width = locks
        .iter()
        .map(|lock| width(&lock.name))
        .max()
        .unwrap_or(0)
        .max(4);
    let holder_width = locks
        .iter()
        .map(|lock| lock.holder.as_deref().map_or(1, width))
        .max()
        .unwrap_or(0)
        .max(6);
    let mut out = format!(
        "{:name_width$}  {:holder_width$}  WAITERS\n",
        "NAME", "HOLDER"
    );
    for lock in locks {
        let holder = shown(lock.holder.as_deref().unwrap_or("-"));
        let _ = writeln!(
            out,
            "{:name_width$}  {holder:holder_width$}  {}",
            shown(&lock.name),
            lock.waiters
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairlock::backend::{AttemptId, HolderState, WaiterState};

    fn sample() -> LockState {
        LockState::new(
            "deploy",
            Some(HolderState::new(
                "a1",
                2,
                7,
                Duration::from_micros(29_512_900),
                true,
            )),
            vec![WaiterState::new(
                "b2",
                AttemptId::from_u128(1),
                Duration::from_millis(4_900),
            )],
        )
    }

    #[test]
    fn status_json_has_the_documented_fields() {
        let json = serde_json::to_value(StatusJson::from(&sample())).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "name": "deploy",
                "held": true,
                "holder": {
                    "owner": "a1",
                    "hold_count": 2,
                    "fencing_token": 7,
                    "lease_remaining_ms": 29_512,
                    "confirmed": true
                },
                "waiters": [{ "position": 1, "owner": "b2", "deadline_in_ms": 4_900 }]
            })
        );
    }

    #[test]
    fn a_free_lock_has_a_null_holder() {
        let state = LockState::new("x", None, vec![]);
        let json = serde_json::to_value(StatusJson::from(&state)).unwrap();
        assert_eq!(json["holder"], serde_json::Value::Null);
        assert_eq!(json["held"], false);
        assert!(status_text(&state).contains("none"));
    }

    #[test]
    fn status_text_names_everything() {
        let text = status_text(&sample());
        for part in [
            "deploy",
            "a1",
            "hold count 2",
            "fencing token 7",
            "29s 512ms",
            "1. b2",
            "4s 900ms",
        ] {
            assert!(text.contains(part), "{part:?} missing from:\n{text}");
        }
    }

    #[test]
    fn list_text_aligns_columns() {
        let locks = [
            LockSummary::new("a", Some("owner-1".into()), 2),
            LockSummary::new("long-name", None, 1),
        ];
        let text = list_text(&locks);
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[1].starts_with("a          owner-1  2"), "{text}");
        assert!(lines[2].starts_with("long-name  -        1"), "{text}");
    }

    /// A lock name may hold any character but NUL: control characters are shown escaped, so a
    /// name cannot break the table's rows or write to the operator's terminal, and columns
    /// are as wide as the names' characters, not their bytes.
    #[test]
    fn text_output_escapes_control_characters_and_counts_characters() {
        let locks = [
            LockSummary::new("evil\n\u{1b}[2J", Some("o".into()), 1),
            LockSummary::new("größe", None, 0),
        ];
        let text = list_text(&locks);
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(!text.contains('\u{1b}'), "{text:?}");
        assert!(
            lines[1].starts_with("evil\\n\\u{1b}[2J  o       1"),
            "{text}"
        );
        assert!(lines[2].starts_with("größe            -       0"), "{text}");
        let state = LockState::new("x\ry", None, vec![]);
        assert!(
            status_text(&state).starts_with("lock:     x\\ry\n"),
            "{:?}",
            status_text(&state)
        );
    }
}

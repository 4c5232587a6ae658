//! Exit codes, one per class of outcome, and the one-line error that goes with them.
//!
//! The numbers follow `sysexits.h` where one fits, and the shell's `128 + N` for signals, so
//! scripts can tell "try again later" (75) from "your command failed" (its own code).

use std::fmt;
use std::process::ExitStatus;

/// Success.
pub(crate) const OK: u8 = 0;
/// Bad arguments (clap uses 2 for usage errors too).
pub(crate) const USAGE: u8 = 2;
/// The store could not be reached (`EX_UNAVAILABLE`).
pub(crate) const UNAVAILABLE: u8 = 69;
/// The store failed, or fairlock did (`EX_SOFTWARE`).
pub(crate) const INTERNAL: u8 = 70;
/// Timed out waiting, or `--wait 0` found the lock busy (`EX_TEMPFAIL`).
pub(crate) const TEMPFAIL: u8 = 75;
/// The lease was lost while the command ran.
pub(crate) const LEASE_LOST: u8 = 76;
/// The command was found but could not be run (the shell's code).
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (the shell's code).
pub(crate) const NOT_FOUND: u8 = 127;

/// The shell's code for "ended by signal `signal`".
pub(crate) fn signalled(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(u8::MAX)
}

/// The code a shell would report for a child that ended with `status`.
pub(crate) fn of_child(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        // Unix exit codes are 0..=255 already; the fallback is unreachable in practice.
        (Some(code), _) => u8::try_from(code).unwrap_or(INTERNAL),
        (None, Some(signal)) => signalled(signal),
        (None, None) => INTERNAL,
    }
}

/// A failure to report: one line on stderr, and the exit code of its class.
#[derive(Debug)]
pub(crate) struct Failure {
    /// The exit code.
    pub(crate) code: u8,
    /// What went wrong, for a person.
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One line, whatever the underlying errors put in their messages.
        let one_line = self
            .message
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        write!(f, "fairlock: {one_line}")
    }
}

impl From<fairlock::Error> for Failure {
    fn from(err: fairlock::Error) -> Self {
        use fairlock::Error;
        let code = match &err {
            Error::InvalidArgument { .. } => USAGE,
            Error::Unavailable { .. } => UNAVAILABLE,
            Error::WouldBlock { .. } | Error::Timeout { .. } => TEMPFAIL,
            Error::LeaseLost { .. } => LEASE_LOST,
            _ => INTERNAL,
        };
        // Include the causes: "backend error: io error" alone rarely says enough.
        let mut message = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            let text = cause.to_string();
            if !message.contains(&text) {
                message = format!("{message}: {text}");
            }
            source = cause.source();
        }
        Failure::new(code, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn each_error_class_has_its_code() {
        let timeout = fairlock::Error::Timeout {
            name: "a".into(),
            waited: Duration::from_secs(1),
        };
        assert_eq!(Failure::from(timeout).code, TEMPFAIL);
        let busy = fairlock::Error::WouldBlock { name: "a".into() };
        assert_eq!(Failure::from(busy).code, TEMPFAIL);
        let down = fairlock::Error::Unavailable {
            backend: "redis",
            endpoint: "redis://127.0.0.1:1".into(),
            source: "connection refused".into(),
        };
        let failure = Failure::from(down);
        assert_eq!(failure.code, UNAVAILABLE);
        assert!(
            failure.to_string().contains("redis://127.0.0.1:1"),
            "{failure}"
        );
        assert_eq!(Failure::from(fairlock::Error::NoRuntime).code, INTERNAL);
    }

    #[test]
    fn messages_are_one_line() {
        let failure = Failure::new(INTERNAL, "first\nsecond\n");
        assert_eq!(failure.to_string(), "fairlock: first second");
    }

    #[test]
    fn signals_map_to_128_plus_n() {
        assert_eq!(signalled(15), 143);
        assert_eq!(signalled(2), 130);
    }
}

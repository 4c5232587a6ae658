//! Mapping fred's errors onto fairlock's one error type.

use fairlock::Error;
use fred::error::{Error as RedisError, ErrorKind};

pub(crate) const BACKEND: &str = "redis";

/// What a failed call was about, to name it in the error.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Context<'a> {
    /// The servers, without credentials.
    pub(crate) endpoint: &'a str,
    /// The lock, if the call was about one.
    pub(crate) lock: Option<&'a str>,
}

pub(crate) fn map(error: RedisError, context: Context<'_>) -> Error {
    if error.details().contains("WRONGTYPE") {
        return Error::Conflict {
            backend: BACKEND,
            name: context.lock.unwrap_or_default().to_owned(),
            detail: format!(
                "a key of this lock holds a value of another type than fairlock writes ({})",
                first_line(error.details())
            ),
        };
    }
    if is_unreachable(&error) {
        return unavailable(context.endpoint, error);
    }
    Error::Backend {
        backend: BACKEND,
        source: Box::new(error),
    }
}

pub(crate) fn unavailable(endpoint: &str, source: impl Into<fairlock::BoxError>) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        endpoint: endpoint.to_owned(),
        source: source.into(),
    }
}

pub(crate) fn is_unreachable(error: &RedisError) -> bool {
    match error.kind() {
        ErrorKind::IO | ErrorKind::Timeout | ErrorKind::Canceled => true,
        ErrorKind::Cluster | ErrorKind::Routing => true,
        _ => {
            let details = error.details();
            // The error's code: its first word; for an error raised inside a script on Redis
            // 6.2, also the code after the last ": -" ("ERR Error running script ...:
            // -READONLY ...").
            let inner = details.rfind(": -").map(|at| &details[at + 3..]);
            PASSING.contains(&code(details))
                || inner.is_some_and(|inner| PASSING.contains(&code(inner)))
                // fred, for a command pinned to a node it has no connection to (the `WAIT`
                // after a script, while that node is down).
                || details.starts_with("Failed to route command")
        }
    }
}

/// The first word of an error's text: its code.
fn code(text: &str) -> &str {
    text.split_whitespace().next().unwrap_or("")
}

/// Error codes of refusals a store recovers from by itself: outages to ride out.
const PASSING: &[&str] = &[
    "CLUSTERDOWN",
    "LOADING",
    "MASTERDOWN",
    "TRYAGAIN",
    // A primary demoted by a failover, until the client follows the new one.
    "READONLY",
    // A script running too long (until it ends or is killed).
    "BUSY",
    // Fewer replicas than `min-replicas-to-write` (until they catch up).
    "NOREPLICAS",
    // Snapshots failing with `stop-writes-on-bgsave-error` (until one succeeds).
    "MISCONF",
];

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTEXT: Context<'static> = Context {
        endpoint: "127.0.0.1:1",
        lock: Some("jobs"),
    };

    #[test]
    fn wrongtype_is_a_conflict() {
        let error = RedisError::new(
            ErrorKind::InvalidArgument,
            "WRONGTYPE Operation against a key holding the wrong kind of value script: x",
        );
        let mapped = map(error, CONTEXT);
        assert!(
            matches!(&mapped, Error::Conflict { name, .. } if name == "jobs"),
            "{mapped}"
        );
    }

    #[test]
    fn io_errors_are_unavailable_and_name_the_endpoint() {
        let mapped = map(
            RedisError::new(ErrorKind::IO, "connection refused"),
            CONTEXT,
        );
        assert!(
            matches!(&mapped, Error::Unavailable { endpoint, .. } if endpoint == "127.0.0.1:1"),
            "{mapped}"
        );
    }

    /// A primary demoted by a failover answers writes with READONLY until the client follows
    /// the new primary: an outage to ride out, not a broken backend.
    #[test]
    fn a_demoted_primary_is_unavailable() {
        let mapped = map(
            RedisError::new(
                ErrorKind::Unknown,
                "READONLY You can't write against a read only replica. script: x",
            ),
            CONTEXT,
        );
        assert!(matches!(mapped, Error::Unavailable { .. }), "{mapped}");
    }

    /// fred's answer for a command pinned to a node it has no connection to (the `WAIT` of an
    /// acknowledgement while that node is down): an outage, which `lock()` rides out.
    #[test]
    fn a_node_without_a_connection_is_unavailable() {
        let mapped = map(
            RedisError::new(ErrorKind::Unknown, "Failed to route command."),
            CONTEXT,
        );
        assert!(matches!(mapped, Error::Unavailable { .. }), "{mapped}");
    }

    /// Passing refusals a store recovers from: a script running too long elsewhere (`BUSY`),
    /// too few replicas for `min-replicas-to-write` (`NOREPLICAS`), snapshots failing
    /// (`MISCONF`); also as Redis 6.2 reports an error raised inside a script. Outages, which
    /// the core rides out within its budget.
    #[test]
    fn passing_refusals_are_unavailable_also_inside_a_script() {
        for details in [
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.",
            "NOREPLICAS Not enough good replicas to write.",
            "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
            "ERR Error running script (call to f_0123): @user_script:12: @user_script: 12: \
             -READONLY You can't write against a read only replica.",
            "ERR Error running script (call to f_0123): @user_script:40: @user_script: 40: \
             -NOREPLICAS Not enough good replicas to write.",
        ] {
            let mapped = map(RedisError::new(ErrorKind::Unknown, details), CONTEXT);
            assert!(matches!(mapped, Error::Unavailable { .. }), "{details}: {mapped}");
        }
        // Not a prefix match: BUSYKEY (RESTORE's) is no outage.
        let mapped = map(
            RedisError::new(
                ErrorKind::Unknown,
                "BUSYKEY Target key name already exists.",
            ),
            CONTEXT,
        );
        assert!(matches!(mapped, Error::Backend { .. }), "{mapped}");
    }

    #[test]
    fn other_errors_are_backend_errors() {
        let mapped = map(
            RedisError::new(ErrorKind::Unknown, "ERR something"),
            CONTEXT,
        );
        assert!(matches!(mapped, Error::Backend { .. }), "{mapped}");
    }
}

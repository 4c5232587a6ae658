//! Mapping the client's errors onto fairlock's one error type.

use fairlock::Error;
use tokio_postgres::error::SqlState;

pub(crate) const BACKEND: &str = "postgres";

/// What a failed call was about, to name it in the error.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Context<'a> {
    /// The server, without credentials.
    pub(crate) endpoint: &'a str,
    /// The lock, if the call was about one.
    pub(crate) lock: Option<&'a str>,
}

/// A database error or a lost connection, as the core's error.
pub(crate) fn map(error: tokio_postgres::Error, context: Context<'_>) -> Error {
    if is_unreachable(&error) {
        return unavailable(context.endpoint, error);
    }
    if let Some(db) = error.as_db_error() {
        let code = db.code();
        if is_foreign(code) {
            return Error::Conflict {
                backend: BACKEND,
                name: context.lock.unwrap_or_default().to_owned(),
                detail: format!(
                    "the schema holds data or objects fairlock did not write ({}: {})",
                    code.code(),
                    db.message()
                ),
            };
        }
        if *code == SqlState::INVALID_TRANSACTION_STATE {
            // The functions' own refusal of an isolation level they cannot run under.
            return Error::Backend {
                backend: BACKEND,
                source: format!(
                    "{} ({})",
                    db.message(),
                    db.hint().unwrap_or("see docs/postgres.md")
                )
                .into(),
            };
        }
        if *code == SqlState::INSUFFICIENT_PRIVILEGE {
            return Error::Backend {
                backend: BACKEND,
                source: format!(
                    "permission denied: the database user may not use fairlock's schema ({})",
                    db.message()
                )
                .into(),
            };
        }
    }
    Error::Backend {
        backend: BACKEND,
        source: Box::new(error),
    }
}

/// Data or objects that are not fairlock's: a check constraint or a column type of a table
/// someone else made or changed.
fn is_foreign(code: &SqlState) -> bool {
    [
        SqlState::CHECK_VIOLATION,
        SqlState::NOT_NULL_VIOLATION,
        SqlState::UNDEFINED_COLUMN,
        SqlState::DATATYPE_MISMATCH,
        SqlState::WRONG_OBJECT_TYPE,
        SqlState::INVALID_TEXT_REPRESENTATION,
    ]
    .contains(code)
}

/// Whether the failure means the server could not be reached or the outcome is unknown: the
/// connection broke or could not be made, the server is shutting down or starting, or it is
/// out of connections. The core retries these.
pub(crate) fn is_unreachable(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    match error.code() {
        Some(code) => {
            let class = &code.code()[..2];
            // 08: connection exception; 57: operator intervention (admin shutdown, crash
            // shutdown, cannot connect now); 53: insufficient resources (too many
            // connections). And a call the server rolled back whole to let others on: a
            // deadlock it broke (40P01; the functions lock in one order, but a session
            // outside them may not) or a serialization failure (40001); or one whose
            // outcome is unknown (40003, from PostgreSQL-compatible servers), like a lost
            // reply; or one that waited for a row lock longer than the session's
            // `lock_timeout` allows (55P03: a setting of the database or role; a busy lock's
            // row is waited for), rolled back whole too. Either way the same call may be
            // sent again: each is its own transaction, and the functions answer a re-sent
            // call as they did the first.
            class == "08"
                || class == "57"
                || class == "53"
                || [
                    SqlState::T_R_DEADLOCK_DETECTED,
                    SqlState::T_R_SERIALIZATION_FAILURE,
                    SqlState::T_R_STATEMENT_COMPLETION_UNKNOWN,
                    SqlState::LOCK_NOT_AVAILABLE,
                ]
                .contains(code)
        }
        // No SQLSTATE: an I/O error, a timeout, or a protocol failure of the connection.
        None => error.as_db_error().is_none(),
    }
}

pub(crate) fn unavailable(endpoint: &str, source: impl Into<fairlock::BoxError>) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        endpoint: endpoint.to_owned(),
        source: source.into(),
    }
}

/// A reply the functions never give: the schema's functions are not fairlock's (or another
/// version's).
pub(crate) fn bad_reply(context: Context<'_>, what: &str, reply: &str) -> Error {
    Error::Conflict {
        backend: BACKEND,
        name: context.lock.unwrap_or_default().to_owned(),
        detail: format!("{what} gave an unexpected reply {reply:?}: not fairlock's function"),
    }
}

//! [`LockBackend`] for [`PostgresBackend`]: each operation is one call of its SQL function.

use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Object, PoolError};
use fairlock::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, Grant, HolderState, LockBackend, LockState,
    LockSummary, ReleaseOutcome, WaiterState, Watch, RESEND_HORIZON,
};
use fairlock::{LockName, Owner, Result};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::error::{self, Context};
use crate::PostgresBackend;

/// The longest one operation may take before it counts as an outage (its outcome unknown).
const OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

/// A duration in whole milliseconds, rounded up (a lease never ends early).
fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
}

fn uuid(attempt: AttemptId) -> Uuid {
    Uuid::from_u128(attempt.as_u128())
}

/// A token as the database keeps it (a `bigint`); tokens above `i64::MAX` are never issued,
/// so such a token matches no hold.
fn token_param(token: u64) -> i64 {
    i64::try_from(token).unwrap_or(-1)
}

/// A pool failure as the core's error.
pub(crate) fn pool_error(error: PoolError, context: Context<'_>) -> fairlock::Error {
    match error {
        PoolError::Backend(error) => error::map(error, context),
        PoolError::Timeout(_) | PoolError::Closed => error::unavailable(context.endpoint, error),
        other => error::unavailable(context.endpoint, other.to_string()),
    }
}

/// A connection from `pool` within `limit` (the pool's own wait and create timeouts are
/// the caller's choice with `from_pool`, and may be none), for a statement: see [`InFlight`].
pub(crate) async fn pooled(
    pool: &deadpool_postgres::Pool,
    limit: Duration,
    context: Context<'_>,
) -> fairlock::Result<InFlight> {
    match tokio::time::timeout(limit, pool.get()).await {
        Ok(client) => client
            .map(|client| InFlight(Some(client)))
            .map_err(|error| pool_error(error, context)),
        Err(_elapsed) => Err(error::unavailable(
            context.endpoint,
            format!("no pooled connection within {limit:?}"),
        )),
    }
}

/// How long the background cancel of a statement given up may take.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(10);

/// A pooled connection whose statement may still be running. If it is dropped before
/// [`done`](Self::done) (the caller's future was dropped, or the statement ran out of its
/// time), the connection leaves the pool and closes, and the server is asked to cancel the
/// statement: one waiting for a row lock would not notice the closed socket, and would run
/// on with a session of its own (and, left in the pool, the next call on it would wait
/// behind it).
pub(crate) struct InFlight(Option<Object>);

impl InFlight {
    pub(crate) fn client(&self) -> &Object {
        self.0.as_ref().expect("taken only by done or drop")
    }

    /// The statement was answered: the connection goes back to the pool.
    pub(crate) fn done(&mut self) {
        self.0.take();
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let Some(client) = self.0.take() else { return };
        let cancel = client.cancel_token();
        drop(Object::take(client));
        // Best effort, in the background (a pool of the caller's may need TLS, which this
        // plain cancel request lacks: the statement then runs on until it ends).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let cancelled = tokio::time::timeout(
                    CANCEL_TIMEOUT,
                    cancel.cancel_query(tokio_postgres::NoTls),
                )
                .await;
                if !matches!(cancelled, Ok(Ok(()))) {
                    tracing::debug!(
                        ?cancelled,
                        "fairlock-postgres: could not cancel a statement given up"
                    );
                }
            });
        }
    }
}

/// Whether the error says fairlock's functions or tables are missing (someone dropped the
/// schema): they are created again and the call is retried once.
fn is_missing_schema(error: &tokio_postgres::Error) -> bool {
    error.code().is_some_and(|code| {
        [
            SqlState::UNDEFINED_FUNCTION,
            SqlState::UNDEFINED_TABLE,
            SqlState::INVALID_SCHEMA_NAME,
        ]
        .contains(code)
    })
}

impl PostgresBackend {
    fn context<'a>(&'a self, lock: Option<&'a str>) -> Context<'a> {
        Context {
            endpoint: &self.inner.endpoint,
            lock,
        }
    }

    /// Runs `query` (one statement, so one transaction) on a pooled connection; returns its
    /// rows. If the schema is missing it is created again and the query retried once.
    async fn run(
        &self,
        query: &str,
        params: &[&(dyn ToSql + Sync)],
        lock: Option<&str>,
    ) -> Result<Vec<Row>> {
        let context = self.context(lock);
        let mut in_flight = pooled(&self.inner.pool, self.inner.connect_timeout, context).await?;
        let client = in_flight.client();
        let mut outcome =
            tokio::time::timeout(OPERATION_TIMEOUT, Self::query(client, query, params)).await;
        if matches!(&outcome, Ok(Err(error)) if is_missing_schema(error)) {
            tracing::warn!(schema = %self.inner.sql.schema, "fairlock-postgres: the schema is missing; creating it again");
            client.statement_cache.clear();
            // Within the same bound: the install waits for any other installer (an advisory
            // lock), which may be stuck.
            let reinstalled = async {
                self.inner.sql.install(client, true).await?;
                Self::query(client, query, params).await
            };
            outcome = tokio::time::timeout(OPERATION_TIMEOUT, reinstalled).await;
        }
        match outcome {
            Ok(result) => {
                // Answered: the connection is free for the next call.
                in_flight.done();
                result.map_err(|error| error::map(error, context))
            }
            Err(_elapsed) => {
                // The statement may be stuck (a row lock): `in_flight` cancels it.
                drop(in_flight);
                Err(error::unavailable(
                    context.endpoint,
                    format!("no reply within {OPERATION_TIMEOUT:?}"),
                ))
            }
        }
    }

    async fn query(
        client: &Object,
        query: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
        let statement = client.prepare_cached(query).await?;
        client.query(&statement, params).await
    }

    /// The one value of the one row a mutating function returns.
    async fn scalar<T>(
        &self,
        what: &str,
        query: &str,
        params: &[&(dyn ToSql + Sync)],
        lock: &str,
    ) -> Result<T>
    where
        T: for<'a> tokio_postgres::types::FromSql<'a>,
    {
        let rows = self.run(query, params, Some(lock)).await?;
        let context = self.context(Some(lock));
        match rows.as_slice() {
            [row] => row
                .try_get::<_, T>(0)
                .map_err(|error| error::bad_reply(context, what, &error.to_string())),
            _ => Err(error::bad_reply(
                context,
                what,
                &format!("{} rows", rows.len()),
            )),
        }
    }
}

/// `G <token> <count>`, `Q <ms> <last token>` or `B`.
fn parse_acquire(reply: &str) -> Option<AcquireOutcome> {
    let mut words = reply.split(' ');
    let outcome = match words.next()? {
        "G" => AcquireOutcome::Granted(Grant {
            token: words.next()?.parse().ok()?,
            hold_count: words.next()?.parse().ok()?,
        }),
        "Q" => {
            let ms: i64 = words.next()?.parse().ok()?;
            AcquireOutcome::Queued {
                retry_after: u64::try_from(ms).ok().map(Duration::from_millis),
                last_token: words.next()?.parse().ok()?,
            }
        }
        "B" => AcquireOutcome::Busy,
        _ => return None,
    };
    words.next().is_none().then_some(outcome)
}

/// `R <remaining>` or `N`.
fn parse_release(reply: &str) -> Option<ReleaseOutcome> {
    match reply.split_once(' ') {
        Some(("R", remaining)) => Some(ReleaseOutcome::Released {
            remaining: remaining.parse().ok()?,
        }),
        None if reply == "N" => Some(ReleaseOutcome::NotHeld),
        _ => None,
    }
}

fn micros(value: Option<i64>) -> Duration {
    Duration::from_micros(value.and_then(|us| u64::try_from(us).ok()).unwrap_or(0))
}

/// The rows of `inspect`: the holder (kind `h`) first, then the waiters (kind `w`).
fn parse_inspect(
    name: &LockName,
    rows: &[Row],
) -> std::result::Result<LockState, tokio_postgres::Error> {
    let mut state = LockState::new(name.to_string(), None, Vec::new());
    for row in rows {
        let kind: String = row.try_get(0)?;
        let owner: String = row.try_get(1)?;
        if kind == "h" {
            let token: i64 = row.try_get(3)?;
            let count: i32 = row.try_get(4)?;
            state.holder = Some(HolderState::new(
                owner,
                u32::try_from(count).unwrap_or(0),
                u64::try_from(token).unwrap_or(0),
                micros(row.try_get(5)?),
                row.try_get(6)?,
            ));
        } else {
            let attempt: Uuid = row.try_get(2)?;
            state.waiters.push(WaiterState::new(
                owner,
                AttemptId::from_u128(attempt.as_u128()),
                micros(row.try_get(5)?),
            ));
        }
    }
    Ok(state)
}

#[async_trait]
impl LockBackend for PostgresBackend {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
        let name = request.name.as_str();
        let reply: String = self
            .scalar(
                "acquire",
                &self.inner.sql.acquire,
                &[
                    &name,
                    &request.owner.as_str(),
                    &uuid(request.attempt),
                    &millis(request.lease),
                    &millis(request.waiter_ttl),
                    &request.queue,
                    &millis(RESEND_HORIZON),
                    &millis(self.inner.fence_margin),
                ],
                name,
            )
            .await?;
        parse_acquire(&reply)
            .ok_or_else(|| error::bad_reply(self.context(Some(name)), "acquire", &reply))
    }

    async fn release(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        attempt: AttemptId,
    ) -> Result<ReleaseOutcome> {
        let lock = name.as_str();
        let reply: String = self
            .scalar(
                "release",
                &self.inner.sql.release,
                &[
                    &lock,
                    &owner.as_str(),
                    &token_param(token),
                    &uuid(attempt),
                    &millis(RESEND_HORIZON),
                    &millis(self.inner.fence_margin),
                ],
                lock,
            )
            .await?;
        parse_release(&reply)
            .ok_or_else(|| error::bad_reply(self.context(Some(lock)), "release", &reply))
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> Result<bool> {
        let lock = name.as_str();
        self.scalar(
            "extend",
            &self.inner.sql.extend,
            &[
                &lock,
                &owner.as_str(),
                &token_param(token),
                &millis(lease),
                &millis(self.inner.fence_margin),
            ],
            lock,
        )
        .await
    }

    async fn abandon(&self, name: &LockName, owner: &Owner, attempt: AttemptId) -> Result<()> {
        let lock = name.as_str();
        self.run(
            &self.inner.sql.abandon,
            &[
                &lock,
                &owner.as_str(),
                &uuid(attempt),
                &millis(RESEND_HORIZON),
                &millis(self.inner.fence_margin),
            ],
            Some(lock),
        )
        .await
        .map(drop)
    }

    async fn force_release(&self, name: &LockName, token: u64) -> Result<bool> {
        let lock = name.as_str();
        self.scalar(
            "force_release",
            &self.inner.sql.force_release,
            &[
                &lock,
                &token_param(token),
                &millis(RESEND_HORIZON),
                &millis(self.inner.fence_margin),
            ],
            lock,
        )
        .await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        let lock = name.as_str();
        let rows = self
            .run(&self.inner.sql.inspect, &[&lock], Some(lock))
            .await?;
        parse_inspect(name, &rows).map_err(|error| {
            error::bad_reply(self.context(Some(lock)), "inspect", &error.to_string())
        })
    }

    /// The holder alone, from the lock's row: no read of its queue.
    async fn holder(&self, name: &LockName) -> Result<Option<HolderState>> {
        let lock = name.as_str();
        let rows = self
            .run(&self.inner.sql.holder, &[&lock], Some(lock))
            .await?;
        parse_inspect(name, &rows)
            .map(|state| state.holder)
            .map_err(|error| {
                error::bad_reply(self.context(Some(lock)), "holder", &error.to_string())
            })
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>> {
        let rows = self.run(&self.inner.sql.list, &[&prefix], None).await?;
        rows.iter()
            .map(|row| {
                let waiters: i64 = row.try_get(2)?;
                Ok(LockSummary::new(
                    row.try_get::<_, String>(0)?,
                    row.try_get(1)?,
                    usize::try_from(waiters).unwrap_or(0),
                ))
            })
            .collect::<std::result::Result<_, tokio_postgres::Error>>()
            .map_err(|error| error::bad_reply(self.context(None), "list", &error.to_string()))
    }

    async fn watch(&self, name: &LockName, owner: &Owner) -> Result<Watch> {
        Ok(self.inner.dispatcher.watch(name.as_str(), owner.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_replies() {
        assert_eq!(
            parse_acquire("G 12 2"),
            Some(AcquireOutcome::Granted(Grant {
                token: 12,
                hold_count: 2
            }))
        );
        assert_eq!(
            parse_acquire("Q 250 7"),
            Some(AcquireOutcome::Queued {
                retry_after: Some(Duration::from_millis(250)),
                last_token: 7
            })
        );
        assert_eq!(
            parse_acquire("Q -1 0"),
            Some(AcquireOutcome::Queued {
                retry_after: None,
                last_token: 0
            })
        );
        assert_eq!(parse_acquire("B"), Some(AcquireOutcome::Busy));
        for bad in ["", "G", "G 1", "G x 1", "G 1 1 1", "Q 1", "X", "B 1"] {
            assert_eq!(parse_acquire(bad), None, "{bad:?}");
        }
        assert_eq!(
            parse_release("R 0"),
            Some(ReleaseOutcome::Released { remaining: 0 })
        );
        assert_eq!(parse_release("N"), Some(ReleaseOutcome::NotHeld));
        for bad in ["", "R", "R x", "N 1", "Z 1"] {
            assert_eq!(parse_release(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn durations_round_up_to_milliseconds() {
        assert_eq!(millis(Duration::from_micros(1)), 1);
        assert_eq!(millis(Duration::from_millis(5)), 5);
        assert_eq!(millis(Duration::from_micros(5001)), 6);
    }
}

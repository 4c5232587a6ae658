//! Reaching the store: a [`LockClient`] over Redis or PostgreSQL from `--url` and `--prefix`.

use std::future::Future;
use std::time::Duration;

use fairlock::LockClient;
use fairlock_postgres::PostgresBackend;
use fairlock_redis::{hide_password_values, RedisBackend};

use crate::args::StoreArgs;
use crate::exit::{Failure, UNAVAILABLE};

/// Whether `url` names a PostgreSQL server rather than Redis: a `postgres://` or
/// `postgresql://` URL, or a connection string of `key=value` pairs (`host=/run/postgresql
/// dbname=app`), which no Redis URL is.
pub(crate) fn is_postgres(url: &str) -> bool {
    // A key=value string has an `=` before any `://` (a value may hold a URL).
    let key_value = url
        .find('=')
        .is_some_and(|equals| url.find("://").is_none_or(|scheme| equals < scheme));
    url.starts_with("postgres://") || url.starts_with("postgresql://") || key_value
}

/// Connects to the store, giving up after `--connect-timeout`: PostgreSQL for
/// `postgres://` and `postgresql://` URLs and `key=value` connection strings (`--prefix` is
/// then the schema), Redis otherwise.
pub(crate) async fn connect(store: &StoreArgs) -> Result<LockClient, Failure> {
    if is_postgres(&store.url) {
        let mut builder =
            PostgresBackend::builder(&store.url).connect_timeout(store.connect_timeout);
        if let Some(schema) = &store.prefix {
            builder = builder.schema(schema);
        }
        return bounded(store, "postgres", builder.connect()).await;
    }
    let mut builder = RedisBackend::builder(&store.url).connect_timeout(store.connect_timeout);
    if let Some(prefix) = &store.prefix {
        builder = builder.prefix(prefix);
    }
    bounded(store, "redis", builder.connect()).await
}

/// Awaits `connecting`; the backend keeps its own timeout, this one only guards against it
/// hanging.
async fn bounded<B: fairlock::LockBackend>(
    store: &StoreArgs,
    backend: &str,
    connecting: impl Future<Output = fairlock::Result<B>>,
) -> Result<LockClient, Failure> {
    let limit = store.connect_timeout + Duration::from_secs(1);
    match tokio::time::timeout(limit, connecting).await {
        Ok(backend) => Ok(LockClient::new(backend?)),
        Err(_elapsed) => Err(Failure::new(
            UNAVAILABLE,
            format!(
                "{backend} backend cannot reach {}: no connection within {}",
                redact(&store.url),
                humantime::format_duration(limit),
            ),
        )),
    }
}

/// `url` with its password, if any, replaced by `***`, fit for messages: the one in its user
/// info, and the value of any `password=` parameter (of a query, or of a `key=value`
/// connection string).
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|at| at + 3) else {
        return hide_password_values(url);
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return hide_password_values(url);
    };
    let user_info = &rest[..at];
    let user = user_info
        .split_once(':')
        .map_or(user_info, |(user, _password)| user);
    hide_password_values(&format!("{}{user}:***{}", &url[..scheme_end], &rest[at..]))
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn key_value_strings_are_postgres() {
        use super::is_postgres;
        assert!(is_postgres("host=/run/postgresql dbname=app"));
        assert!(is_postgres("application_name=http://x host=db"));
        assert!(is_postgres("postgres://db/app"));
        assert!(!is_postgres("redis://127.0.0.1:6379"));
        assert!(!is_postgres(
            "redis-sentinel://h:1?sentinelServiceName=m&node=h:2"
        ));
    }

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact("redis://:s3cret@127.0.0.1:6379/0"),
            "redis://:***@127.0.0.1:6379/0"
        );
        assert_eq!(
            redact("redis://app:s3cret@host:6379"),
            "redis://app:***@host:6379"
        );
        assert_eq!(redact("redis://host/0?x=a@b"), "redis://host/0?x=a@b");
        assert_eq!(redact("not a url"), "not a url");
        assert_eq!(
            redact("host=db user=app password=s3cret dbname=app"),
            "host=db user=app password=*** dbname=app"
        );
        assert_eq!(
            redact("redis-sentinel://h:1?sentinelServiceName=m&Password=s3cret&node=h:2"),
            "redis-sentinel://h:1?sentinelServiceName=m&Password=***&node=h:2"
        );
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/app"),
            "postgres://app:***@db:5432/app"
        );
    }
}

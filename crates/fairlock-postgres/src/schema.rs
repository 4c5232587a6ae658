//! The SQL of the state machine (`sql/` in this crate), made ready for one schema, and its
//! installation on first use.

use tokio_postgres::Client;

/// The schema's name when none is configured.
pub const DEFAULT_SCHEMA: &str = "fairlock";

/// The longest schema name: the wake-up channel `<schema>_wake` must fit PostgreSQL's
/// 63-byte identifiers.
pub const MAX_SCHEMA_LEN: usize = 48;

/// Tables and helpers, then one file per operation, in install order.
const FILES: [(&str, &str); 8] = [
    ("schema.sql", include_str!("../sql/schema.sql")),
    ("acquire.sql", include_str!("../sql/acquire.sql")),
    ("release.sql", include_str!("../sql/release.sql")),
    ("extend.sql", include_str!("../sql/extend.sql")),
    ("abandon.sql", include_str!("../sql/abandon.sql")),
    (
        "force_release.sql",
        include_str!("../sql/force_release.sql"),
    ),
    ("inspect.sql", include_str!("../sql/inspect.sql")),
    ("list.sql", include_str!("../sql/list.sql")),
];

/// Checks a schema name: 1 to [`MAX_SCHEMA_LEN`] bytes of `a-z`, `0-9` and `_`, not starting
/// with a digit. Nothing else ever reaches SQL text, so it cannot inject anything.
pub(crate) fn validate(schema: &str) -> fairlock::Result<()> {
    let valid = !schema.is_empty()
        && schema.len() <= MAX_SCHEMA_LEN
        && !schema.starts_with(|c: char| c.is_ascii_digit())
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(fairlock::Error::InvalidArgument {
            what: "postgres schema",
            reason: format!(
                "{schema:?} is not 1 to {MAX_SCHEMA_LEN} bytes of a-z, 0-9 and _ (not starting \
                 with a digit)"
            ),
        })
    }
}

/// The SQL for one schema: the install script and the call of each operation.
#[derive(Debug)]
pub(crate) struct Sql {
    /// The schema, validated.
    pub(crate) schema: String,
    /// The `LISTEN`/`pg_notify` channel of wake-ups.
    pub(crate) channel: String,
    /// Every file, placeholders replaced, in install order.
    install: String,
    /// A digest of `install`: the functions are (re)installed when the stored one differs.
    version: String,
    pub(crate) acquire: String,
    pub(crate) release: String,
    pub(crate) extend: String,
    pub(crate) abandon: String,
    pub(crate) force_release: String,
    pub(crate) inspect: String,
    pub(crate) holder: String,
    pub(crate) list: String,
}

impl Sql {
    /// The SQL for `schema`, which must have passed [`validate`].
    pub(crate) fn new(schema: &str) -> Sql {
        let quoted = format!("\"{schema}\"");
        let channel = format!("{schema}_wake");
        let mut install = String::new();
        for (file, text) in FILES {
            install.push_str(&format!("-- {file}\n"));
            install.push_str(
                &text
                    .replace("@schema@", &quoted)
                    .replace("@channel@", &format!("'{channel}'")),
            );
            install.push('\n');
        }
        let version = format!("{:016x}", fnv1a(install.as_bytes()));
        let call = |function: &str, args: usize| {
            let params: Vec<String> = (1..=args).map(|i| format!("${i}")).collect();
            format!("SELECT {quoted}.{function}({})", params.join(", "))
        };
        let rows = |function: &str| format!("SELECT * FROM {quoted}.{function}($1)");
        Sql {
            schema: schema.to_owned(),
            channel,
            install,
            version,
            acquire: call("acquire", 8),
            release: call("release", 6),
            extend: call("extend", 5),
            abandon: call("abandon", 5),
            force_release: call("force_release", 4),
            inspect: rows("inspect"),
            holder: rows("holder"),
            list: rows("list"),
        }
    }

    /// `LISTEN` for the wake-up channel.
    pub(crate) fn listen(&self) -> String {
        format!("LISTEN \"{}\"", self.channel)
    }

    /// Creates the schema, its tables and functions unless this version is installed (or
    /// always, with `force`: something of it was found missing). Safe
    /// to run from many instances at once: the work is one transaction under an advisory
    /// lock, and every statement is idempotent. Also checks that the tables have the columns
    /// fairlock uses (a table of another program in the schema would not).
    pub(crate) async fn install(
        &self,
        client: &Client,
        force: bool,
    ) -> Result<(), tokio_postgres::Error> {
        let quoted = format!("\"{}\"", self.schema);
        let current = client
            .query_opt(
                &format!(
                    "SELECT version FROM {quoted}.meta WHERE to_regclass('{quoted}.meta') \
                     IS NOT NULL LIMIT 1"
                ),
                &[],
            )
            .await;
        let installed = !force
            && match current {
                Ok(Some(row)) => row.try_get::<_, String>(0).ok() == Some(self.version.clone()),
                _ => false,
            };
        if !installed {
            // One simple-protocol query: PostgreSQL runs a multi-statement query string as
            // one implicit transaction, all of it or nothing, and a failure leaves the
            // session idle (no aborted transaction block to clean up, even if this future is
            // dropped). The advisory lock (keyed by the schema name, held to the end of that
            // transaction) makes concurrent installers wait for each other instead of failing
            // on CREATE SCHEMA/TABLE races.
            let script = format!(
                "SELECT pg_advisory_xact_lock(hashtext('fairlock schema {schema}'));\n\
                 {install}\n\
                 DELETE FROM {quoted}.meta;\n\
                 INSERT INTO {quoted}.meta (version) VALUES ('{version}');",
                schema = self.schema,
                install = self.install,
                version = self.version,
            );
            client.batch_execute(&script).await?;
        }
        client
            .batch_execute(&format!(
                "SELECT name, owner, token, levels, pending, pending_until, lease_until, \
                 last_token, next_seq, gc_after FROM {quoted}.locks LIMIT 0; \
                 SELECT name, seq, attempt, owner, ttl_ms, deadline FROM {quoted}.waiters LIMIT 0; \
                 SELECT name, attempt, until, released FROM {quoted}.spent LIMIT 0; \
                 SELECT name, token, until FROM {quoted}.forced LIMIT 0;"
            ))
            .await
    }
}

/// FNV-1a, 64 bits: a stable digest of the SQL text (not for security).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_checked() {
        for good in [
            "fairlock",
            "app_locks",
            "_x",
            "a1",
            &"x".repeat(MAX_SCHEMA_LEN),
        ] {
            assert!(validate(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "1abc",
            "Fairlock",
            "a-b",
            "a\"; DROP TABLE x; --",
            "a b",
            "é",
            &"x".repeat(MAX_SCHEMA_LEN + 1),
        ] {
            assert!(
                matches!(validate(bad), Err(fairlock::Error::InvalidArgument { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn every_placeholder_is_replaced() {
        let sql = Sql::new("app");
        assert!(!sql.install.contains('@'), "a placeholder is left");
        assert!(sql.install.contains("\"app\".locks"));
        assert_eq!(
            sql.acquire,
            "SELECT \"app\".acquire($1, $2, $3, $4, $5, $6, $7, $8)"
        );
        assert_ne!(Sql::new("other").version, sql.version);
    }
}

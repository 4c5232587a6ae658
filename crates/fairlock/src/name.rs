//! Validated identifiers: lock names and owners.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};

/// Longest lock name accepted, in bytes. Keeps store keys and messages small.
pub const MAX_NAME_LEN: usize = 512;
/// Longest owner id accepted, in bytes.
pub const MAX_OWNER_LEN: usize = 256;

/// The name of a lock: 1 to [`MAX_NAME_LEN`] bytes of UTF-8, any characters but NUL.
///
/// Names are compared byte for byte; backends must keep distinct names apart (a Redis backend
/// may not let `a` and `a}` share keys, for example).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// Checks `name` and wraps it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the name is empty, longer than [`MAX_NAME_LEN`] bytes or
    /// contains a NUL byte.
    pub fn new(name: impl AsRef<str>) -> Result<Self> {
        let name = name.as_ref();
        if name.is_empty() {
            return Err(Error::invalid("lock name", "must not be empty"));
        }
        check_name_text("lock name", name)?;
        Ok(LockName(name.into()))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Checks a prefix of lock names (for `list`): one no name could start with (longer than
/// [`MAX_NAME_LEN`], or with a NUL byte) is a mistake, not a question with an empty answer.
pub(crate) fn check_prefix(prefix: &str) -> Result<()> {
    check_name_text("lock name prefix", prefix)
}

/// What a lock name, or the start of one, may not be: longer than [`MAX_NAME_LEN`] bytes, or
/// with a NUL byte.
fn check_name_text(what: &'static str, text: &str) -> Result<()> {
    if text.len() > MAX_NAME_LEN {
        return Err(Error::invalid(
            what,
            format!("is {} bytes, the limit is {MAX_NAME_LEN}", text.len()),
        ));
    }
    if text.contains('\0') {
        return Err(Error::invalid(what, "must not contain NUL"));
    }
    Ok(())
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who holds or waits for a lock. Acquisitions by the same owner are **reentrant**.
///
/// An owner is explicit: [`Owner::unique`] makes a fresh random one (what
/// [`LockClient::fair_lock`](crate::LockClient::fair_lock) gives every handle), and
/// [`Owner::new`] takes an id you choose, such as a job id, so that ownership can span
/// processes on purpose. Two tasks that share an owner are *one* owner: both may be inside the
/// critical section at once. Give each task its own handle unless that is what you want.
///
/// An owner id is 1 to [`MAX_OWNER_LEN`] bytes of printable UTF-8 (no control characters).
/// Owners compare by id alone.
#[derive(Clone)]
pub struct Owner {
    id: Arc<str>,
    /// Made by `Owner::unique`: see [`Owner::is_unique`].
    unique: bool,
}

impl PartialEq for Owner {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Owner {}

impl std::hash::Hash for Owner {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl PartialOrd for Owner {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Owner {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.id.cmp(&other.id)
    }
}

impl Owner {
    /// An owner id chosen by the caller.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `id` is empty, too long or contains control characters.
    pub fn new(id: impl AsRef<str>) -> Result<Self> {
        let id = id.as_ref();
        if id.is_empty() {
            return Err(Error::invalid("owner", "must not be empty"));
        }
        if id.len() > MAX_OWNER_LEN {
            return Err(Error::invalid(
                "owner",
                format!("is {} bytes, the limit is {MAX_OWNER_LEN}", id.len()),
            ));
        }
        if id.chars().any(char::is_control) {
            return Err(Error::invalid(
                "owner",
                "must not contain control characters",
            ));
        }
        Ok(Owner {
            id: id.into(),
            unique: false,
        })
    }

    /// A fresh owner, unique with overwhelming probability (122 random bits).
    ///
    /// It is taken to act through one backend value (one [`LockClient`](crate::LockClient) and
    /// its clones), which lets a backend send the wake-ups of its attempts there alone (see
    /// [`Owner::is_unique`]). To act as one owner through several clients or processes, use
    /// [`Owner::new`] with an id of your own.
    pub fn unique() -> Self {
        Owner {
            id: uuid::Uuid::new_v4().simple().to_string().into(),
            unique: true,
        }
    }

    /// Whether this owner was made by [`Owner::unique`] (and not rebuilt from its id by
    /// [`Owner::new`]). Such an owner acts through one backend value, so a backend MAY deliver
    /// the wake-ups about its attempts only to the watches registered through the backend
    /// value that made the request (the Redis backend publishes them on a channel of that
    /// process alone). An owner from [`Owner::new`] may act from anywhere: its wake-ups go to
    /// every watch of it.
    ///
    /// ```
    /// use fairlock::Owner;
    ///
    /// let owner = Owner::unique();
    /// assert!(owner.is_unique());
    /// let rebuilt = Owner::new(owner.as_str()).unwrap();
    /// assert!(!rebuilt.is_unique());
    /// assert_eq!(owner, rebuilt, "the same owner all the same");
    /// ```
    pub fn is_unique(&self) -> bool {
        self.unique
    }

    /// The owner id.
    pub fn as_str(&self) -> &str {
        &self.id
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.id, f)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(matches!(
            LockName::new(""),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            LockName::new("x".repeat(MAX_NAME_LEN + 1)),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            LockName::new("a\0b"),
            Err(Error::InvalidArgument { .. })
        ));
        for ok in [
            "a",
            "{a}",
            "a:b c",
            "line\nbreak",
            "größe",
            &"x".repeat(MAX_NAME_LEN),
        ] {
            assert_eq!(LockName::new(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn owners_are_checked() {
        assert!(matches!(Owner::new(""), Err(Error::InvalidArgument { .. })));
        assert!(matches!(
            Owner::new("a\nb"),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(Owner::new("job 42").is_ok());
        assert_ne!(Owner::unique(), Owner::unique());
    }
}

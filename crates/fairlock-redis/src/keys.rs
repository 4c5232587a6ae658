//! Where a lock lives in Redis: its keys and its wake-up channel.

use sha2::{Digest, Sha256};

/// The keys of one lock, in the order every script takes them (as its first six arguments,
/// none declared as a key: see `begin` in `lua/prelude.lua`), and its wake-up channel (an
/// argument too: during a slot migration Redis counts every key it does not hold as missing
/// and refuses the script with `TRYAGAIN`).
///
/// All of them are `{prefix}{<tag>}:<suffix>`, so they share one Cluster hash slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LockKeys {
    /// Hash: the hold (owner, token, levels, pending level).
    pub(crate) holder: String,
    /// Sorted set: FIFO of waiter tickets, each scored by its number.
    pub(crate) queue: String,
    /// Sorted set: live tickets by liveness deadline.
    pub(crate) deadlines: String,
    /// Hash: ticket -> waiter record, attempt -> ticket.
    pub(crate) waiters: String,
    /// Hash: last fencing token, last ticket, name, the last new grant's record; outlives the
    /// other keys by the fence margin, then expires.
    pub(crate) fence: String,
    /// Channel of wake-ups (a shard channel where the server has sharded pub/sub).
    pub(crate) channel: String,
    /// Sorted set: spent attempts (granted a level, released or abandoned) and force-released
    /// tokens (`f:<token>`), by when they are forgotten.
    pub(crate) spent: String,
}

/// Suffix of the holder hash; `list` scans for it.
pub(crate) const HOLDER_SUFFIX: &str = ":h";
/// Suffix of the deadline sorted set; `list` scans for it.
pub(crate) const DEADLINES_SUFFIX: &str = ":z";

/// The hash tag of a lock name.
///
/// A name without braces that does not start with `#` is its own tag, so keys stay readable
/// in `redis-cli`. Any other name (braces would end or confuse the tag) is replaced by `#`
/// and the hex SHA-256 of the name. The two forms cannot meet: only the digest form starts
/// with `#`, and SHA-256 keeps distinct names apart.
pub(crate) fn tag_of(name: &str) -> String {
    if name.contains(['{', '}']) || name.starts_with('#') {
        let digest = Sha256::digest(name.as_bytes());
        let mut tag = String::with_capacity(65);
        tag.push('#');
        for byte in digest {
            tag.push_str(&format!("{byte:02x}"));
        }
        tag
    } else {
        name.to_owned()
    }
}

impl LockKeys {
    /// The keys of lock `name` under `prefix` (which contains no braces).
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        Self::from_tag(prefix, &tag_of(name))
    }

    /// The keys of the lock whose tag is `tag`.
    pub(crate) fn from_tag(prefix: &str, tag: &str) -> Self {
        let key = |suffix: &str| format!("{prefix}{{{tag}}}{suffix}");
        LockKeys {
            holder: key(HOLDER_SUFFIX),
            queue: key(":q"),
            deadlines: key(DEADLINES_SUFFIX),
            waiters: key(":w"),
            fence: key(":f"),
            channel: key(":c"),
            spent: key(":x"),
        }
    }

    /// The tag of a key found by `SCAN` under `prefix`, if it is one of ours.
    pub(crate) fn tag_of_key<'k>(prefix: &str, key: &'k str) -> Option<&'k str> {
        let rest = key.strip_prefix(prefix)?.strip_prefix('{')?;
        let end = rest.find('}')?;
        Some(&rest[..end])
    }

    /// The Cluster hash slot all of them share.
    pub(crate) fn slot(&self) -> u16 {
        fred::util::redis_keyslot(self.holder.as_bytes())
    }

    /// Keys in script order.
    pub(crate) fn as_vec(&self) -> Vec<String> {
        vec![
            self.holder.clone(),
            self.queue.clone(),
            self.deadlines.clone(),
            self.waiters.clone(),
            self.fence.clone(),
            self.spent.clone(),
        ]
    }
}

/// Redis Cluster's hash slot of a key (CRC16/XMODEM of its hash tag, mod 16384).
#[cfg(test)]
fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = match bytes.iter().position(|&b| b == b'{') {
        Some(open) => match bytes[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_names_get_distinct_keys_in_one_slot() {
        let names = [
            "a",
            "a}",
            "{a}",
            "a{",
            "#a",
            "a b",
            "line\nbreak",
            "größe",
            "x:y",
        ];
        let mut seen = std::collections::HashSet::new();
        for name in names {
            let keys = LockKeys::new("fairlock:", name);
            assert!(seen.insert(keys.holder.clone()), "{name:?} shares keys");
            let slots: std::collections::HashSet<u16> = keys
                .as_vec()
                .iter()
                .chain([&keys.channel])
                .map(|k| slot(k))
                .collect();
            assert_eq!(slots.len(), 1, "{name:?}: keys in several slots");
        }
    }

    #[test]
    fn a_digest_tag_cannot_be_claimed_by_a_plain_name() {
        let braced = tag_of("{x}");
        assert!(braced.starts_with('#'));
        // A name spelled like the digest is hashed itself, so it gets another tag.
        assert_ne!(tag_of(&braced), braced);
    }

    #[test]
    fn tags_are_found_back_in_scanned_keys() {
        let keys = LockKeys::new("p:", "{odd} name");
        let tag = LockKeys::tag_of_key("p:", &keys.holder).unwrap();
        assert_eq!(LockKeys::from_tag("p:", tag), keys);
        assert_eq!(LockKeys::tag_of_key("p:", "other"), None);
    }

    #[test]
    fn crc16_matches_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot("123456789"), 0x31c3);
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
    }
}

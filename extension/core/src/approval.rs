//! The approval binding: proof that an approval, not a table write, moved an
//! action out of `pending`.
//!
//! A proposal is bound by its token ([`crate::token`]); an approval must be
//! bound too. Someone who can write `keyturn.action` (a careless `GRANT`, a
//! role with BYPASSRLS) could otherwise set `status = 'queued'` and have the
//! dispatcher carry out something no person approved. So when keyturn's own
//! code records an approval it stores an HMAC, keyed by a secret that only the
//! extension owner can read, over the action, its params hash and who
//! approved it, when and how. `lease`, `begin_dispatch` and the status guard
//! recompute it; a row moved there by anything else does not verify.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes in the per-database approval key.
pub const KEY_BYTES: usize = 32;

/// Domain tag so this MAC can never be confused with the token binding.
const TAG: &[u8] = b"keyturn/v1/approval";

/// What an approval is bound to.
#[derive(Clone, Copy, Debug)]
pub struct Approval<'a> {
    /// The action's id.
    pub action_id: &'a [u8; 16],
    /// The params hash the approval covered.
    pub params_hash: &'a str,
    /// The approving principal.
    pub approved_by: &'a str,
    /// The database role that approved.
    pub approved_role: &'a str,
    /// When, in microseconds since the PostgreSQL epoch.
    pub approved_at_micros: i64,
    /// How: `approve`, `delegation:<id>`, `task:<message id>`.
    pub via: &'a str,
}

/// A fresh key from the OS CSPRNG.
///
/// # Panics
/// If the operating system cannot supply randomness: there is no safe fallback.
pub fn new_key() -> [u8; KEY_BYTES] {
    let mut key = [0u8; KEY_BYTES];
    if let Err(e) = getrandom::fill(&mut key) {
        panic!("the operating system's random number generator failed: {e}");
    }
    key
}

/// HMAC-SHA256 under `key` over every field, each length-prefixed or fixed
/// width, so no two different approvals encode to the same message.
pub fn mac(key: &[u8], a: &Approval<'_>) -> [u8; 32] {
    message(key, a).finalize().into_bytes().into()
}

/// Whether `stored` is the MAC of this approval under `key`, in constant time.
pub fn verify(key: &[u8], a: &Approval<'_>, stored: &[u8]) -> bool {
    message(key, a).verify_slice(stored).is_ok()
}

fn message(key: &[u8], a: &Approval<'_>) -> Hmac<Sha256> {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        unreachable!("HMAC-SHA256 accepts keys of any length")
    };
    mac.update(TAG);
    mac.update(a.action_id);
    for field in [a.params_hash, a.approved_by, a.approved_role, a.via] {
        // usize → u64 is lossless on every supported target.
        mac.update(&(field.len() as u64).to_be_bytes());
        mac.update(field.as_bytes());
    }
    mac.update(&a.approved_at_micros.to_be_bytes());
    mac
}

/// Domain tag of the digest MAC, so it is never confused with an approval's.
const DIGEST_TAG: &[u8] = b"keyturn/v1/digest";

/// What a `retain = digest` action stores and shows in place of its params
/// hash: HMAC-SHA256 under the database's key over the hash, as lowercase
/// hex. A plain SHA-256 of short params (a PIN, an amount, a yes/no) is
/// reversed by guessing; this one cannot be checked without the key, which
/// no role can read. Only the proposing call sees the plain hash.
pub fn digest_mac(key: &[u8], params_hash: &str) -> String {
    hex::encode(digest_message(key, params_hash).finalize().into_bytes())
}

/// Domain tag of an audit event's commitments, never the same MAC as an
/// approval's or a digest's.
const COMMITMENT_TAG: &[u8] = b"keyturn/v1/commitment";

/// What an audit event commits to of its action (docs/audit.md): HMAC-SHA256
/// under the database's key over `what` (the fact's name) and `value`, as
/// lowercase hex. Keyed, so that whoever reads the chain (an operator, an
/// export) cannot test guesses of short params or of a result naming row
/// keys against it, as they could a plain hash.
pub fn commitment(key: &[u8], what: &str, value: &[u8]) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        unreachable!("HMAC-SHA256 accepts keys of any length")
    };
    mac.update(COMMITMENT_TAG);
    // usize → u64 is lossless on every supported target.
    mac.update(&(what.len() as u64).to_be_bytes());
    mac.update(what.as_bytes());
    mac.update(value);
    hex::encode(mac.finalize().into_bytes())
}

/// Whether `stored` (lowercase hex) is the digest MAC of `params_hash`, in
/// constant time.
pub fn digest_matches(key: &[u8], params_hash: &str, stored: &str) -> bool {
    hex::decode(stored)
        .map(|bytes| {
            digest_message(key, params_hash)
                .verify_slice(&bytes)
                .is_ok()
        })
        .unwrap_or(false)
}

fn digest_message(key: &[u8], params_hash: &str) -> Hmac<Sha256> {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        unreachable!("HMAC-SHA256 accepts keys of any length")
    };
    mac.update(DIGEST_TAG);
    mac.update(params_hash.as_bytes());
    mac
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: [u8; 16] = [9; 16];

    fn base() -> Approval<'static> {
        Approval {
            action_id: &ID,
            params_hash: "ab12",
            approved_by: "alice",
            approved_role: "app_human",
            approved_at_micros: 1_000_000,
            via: "approve",
        }
    }

    #[test]
    fn test_digest_mac_needs_the_key_and_matches_only_its_hash() {
        let key = new_key();
        let h = "0f".repeat(32);
        let stored = digest_mac(&key, &h);
        assert_eq!(stored.len(), 64);
        assert_ne!(stored, h);
        assert!(digest_matches(&key, &h, &stored));
        assert!(!digest_matches(&key, &"1f".repeat(32), &stored));
        assert!(!digest_matches(&new_key(), &h, &stored), "another key");
        assert!(!digest_matches(&key, &h, "not hex"));
        // Never the approval MAC of anything: its own domain.
        assert_ne!(stored, hex::encode(mac(&key, &base())));
    }

    #[test]
    fn test_mac_verifies_and_every_field_matters() {
        let key = new_key();
        let m = mac(&key, &base());
        assert!(verify(&key, &base(), &m));
        let other_id = [8; 16];
        let changed = [
            Approval {
                action_id: &other_id,
                ..base()
            },
            Approval {
                params_hash: "ab13",
                ..base()
            },
            Approval {
                approved_by: "mallory",
                ..base()
            },
            Approval {
                approved_role: "app_agent",
                ..base()
            },
            Approval {
                approved_at_micros: 1_000_001,
                ..base()
            },
            Approval {
                via: "delegation:x",
                ..base()
            },
        ];
        for a in changed {
            assert!(!verify(&key, &a, &m), "{a:?}");
        }
        assert!(!verify(&new_key(), &base(), &m), "another key");
        assert!(!verify(&key, &base(), &m[..31]), "truncated");
    }

    #[test]
    fn test_fields_cannot_slide_into_each_other() {
        let key = [1u8; KEY_BYTES];
        let a = Approval {
            approved_by: "al",
            approved_role: "ice",
            ..base()
        };
        let b = Approval {
            approved_by: "ali",
            approved_role: "ce",
            ..base()
        };
        assert_ne!(mac(&key, &a), mac(&key, &b));
    }

    #[test]
    fn test_keys_are_fresh() {
        assert_ne!(new_key(), new_key());
    }

    #[test]
    fn test_a_commitment_is_keyed_and_names_its_fact() {
        let (k1, k2) = ([1u8; KEY_BYTES], [2u8; KEY_BYTES]);
        let c = commitment(&k1, "result", b"{\"rows\": 1}");
        assert_eq!(c.len(), 64);
        assert_eq!(c, commitment(&k1, "result", b"{\"rows\": 1}"));
        assert_ne!(
            c,
            commitment(&k2, "result", b"{\"rows\": 1}"),
            "another key"
        );
        assert_ne!(
            c,
            commitment(&k1, "receipt", b"{\"rows\": 1}"),
            "another fact"
        );
        assert_ne!(
            c,
            commitment(&k1, "result", b"{\"rows\": 2}"),
            "another value"
        );
        // The fact's name is length-prefixed: no name and value pair reads as another.
        assert_ne!(commitment(&k1, "ab", b"c"), commitment(&k1, "a", b"bc"));
        assert_ne!(c, digest_mac(&k1, "{\"rows\": 1}"), "never a digest's MAC");
    }
}

//! The audit chain's event hash (docs/audit.md), one definition for the
//! database's commit (pg_keyturn) and for `keyturnd audit-verify`.

use serde_json::Value;

use crate::canonical::{parse_printed, sha256_hex, MAX_BYTES};
use crate::CoreError;

/// How long a stored event's text may be. The commit admits an event whose
/// canonical form is at most MAX_BYTES (and whose detail, as jsonb prints
/// it, is at most MAX_BYTES); printed as a row, with its hash, the spaces
/// jsonb puts between members and its other columns, it is longer, but
/// never twice as long plus its short columns.
const STORED_EVENT_BYTES: usize = 4 * MAX_BYTES;

/// The 64 zeros the first event of a chain names as its predecessor.
pub const CHAIN_START: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// An event's hash: lowercase hex SHA-256 of the RFC 8785 form of the
/// object of all its columns but `hash` (`prev_hash` included), as
/// `to_jsonb` of the row prints them under TimeZone UTC. A `hash` member in
/// `event` is left out, so an exported line hashes as it stands.
pub fn event_hash(event: &Value) -> Result<String, CoreError> {
    match event.as_object() {
        Some(o) if o.contains_key("hash") => {
            let mut without = o.clone();
            without.remove("hash");
            sha256_hex(&Value::Object(without))
        }
        _ => sha256_hex(event),
    }
}

/// [`event_hash`] of an event's text as PostgreSQL prints the row (what
/// `verify_audit` reads): whatever the commit admitted, this reads.
pub fn event_hash_of_row(text: &str) -> Result<String, CoreError> {
    event_hash(&parse_printed(text, STORED_EVENT_BYTES)?)
}

/// One line of an export, read as strictly as the database reads a stored
/// event: duplicate keys, serde_json's reserved number key, nesting and size
/// beyond an event's are refused. A lenient reader keeps the last of two
/// `"principal"` keys, so a line could show one value to a person or `grep`
/// and hash as another (`keyturnd audit-verify`).
pub fn parse_exported_event(line: &str) -> Result<Value, CoreError> {
    parse_printed(line, STORED_EVENT_BYTES)
}

/// Domain tag of [`chain_lock_id`]: never the same MAC as another use of
/// the key.
const CHAIN_LOCK_TAG: &[u8] = b"keyturn/v1/chain-lock";

/// The 48 bits that name a tenant's chain lock (an object id and a sub-id):
/// HMAC-SHA256 under the database's secret key, not a plain hash of the
/// name. Tenants whose ids collide share a lock and wait for each other's
/// commits; with a plain hash, anyone who may name a tenant could find a
/// name that collides with a victim's in minutes and stall its commits
/// (red-team finding, docs/security.md). Without the key no one can aim.
pub fn chain_lock_id(key: &[u8], tenant: &str) -> (u32, u16) {
    use hmac::{Hmac, Mac};
    let mut mac =
        Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(CHAIN_LOCK_TAG);
    mac.update(tenant.as_bytes());
    let d = mac.finalize().into_bytes();
    (
        u32::from_be_bytes([d[0], d[1], d[2], d[3]]),
        u16::from_be_bytes([d[4], d[5]]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chain_locks_of_names_whose_plain_hashes_collide_are_apart() {
        // Two names whose SHA-256 share their first 4 bytes (a birthday
        // search finds a pair in a fraction of a second): the lock id the
        // chain used before this fix, so one tenant stalled the other.
        use sha2::Digest;
        let (a, b) = ("chain-93606", "chain-115958");
        assert_eq!(sha2::Sha256::digest(a)[..4], sha2::Sha256::digest(b)[..4]);
        let key = [7u8; 32];
        assert_ne!(chain_lock_id(&key, a), chain_lock_id(&key, b));
        // The same tenant, the same lock; another key, another lock.
        assert_eq!(chain_lock_id(&key, a), chain_lock_id(&key, a));
        assert_ne!(chain_lock_id(&key, a), chain_lock_id(&[8u8; 32], a));
    }

    #[test]
    fn a_row_printed_longer_than_the_input_bound_is_read() {
        // Canonical form under MAX_BYTES; printed with spaces, over it.
        let n = MAX_BYTES / 3;
        let items = vec!["1"; n].join(", ");
        let row = format!(r#"{{"detail": {{"a": [{items}]}}, "hash": "{CHAIN_START}", "id": 1}}"#);
        assert!(row.len() > MAX_BYTES);
        let value: Value = serde_json::from_str(&row).unwrap();
        assert_eq!(
            event_hash_of_row(&row).unwrap(),
            event_hash(&value).unwrap()
        );
        // What no commit admits stays refused: a canonical form over the bound.
        let too_big = format!(r#"{{"detail": "{}"}}"#, "x".repeat(MAX_BYTES));
        assert!(event_hash_of_row(&too_big).is_err());
    }

    #[test]
    fn the_hash_member_is_left_out() {
        let e = json!({"id": 1, "prev_hash": CHAIN_START, "detail": {"n": 1.50}});
        let mut with = e.clone();
        with["hash"] = json!("anything");
        assert_eq!(event_hash(&e).unwrap(), event_hash(&with).unwrap());
        // Computed independently: printf '%s' '{"detail":{"n":1.5},"id":1,"prev_hash":"000…0"}' | sha256sum
        let canonical = format!(r#"{{"detail":{{"n":1.5}},"id":1,"prev_hash":"{CHAIN_START}"}}"#);
        use sha2::Digest;
        assert_eq!(
            event_hash(&e).unwrap(),
            hex::encode(sha2::Sha256::digest(canonical.as_bytes()))
        );
    }
}

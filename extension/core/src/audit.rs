//! The audit chain's event hash (docs/audit.md), one definition for the
//! database's commit (pg_keyturn) and for `keyturnd audit-verify`.

use serde_json::Value;

use crate::canonical::sha256_hex;
use crate::CoreError;

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

//! The audit chain's event hash (docs/audit.md), one definition for the
//! database's commit (pg_keyturn) and for `keyturnd audit-verify`.

use serde_json::Value;

use sha2::Digest;

use crate::canonical::{canonicalize_value, parse_printed, sha256_hex, MAX_BYTES};
use crate::CoreError;

/// How long a stored event's text may be. The commit admits an event whose
/// canonical form is at most MAX_BYTES (and whose detail, as jsonb prints
/// it, is at most MAX_BYTES); printed as a row, with its hash, the spaces
/// jsonb puts between members and its other columns, it is longer, but
/// never twice as long plus its short columns.
const STORED_EVENT_BYTES: usize = 4 * MAX_BYTES;

/// The longest line an export can hold: one stored event
/// ([`parse_exported_event`] refuses a longer one). A reader stops there.
pub const EXPORT_LINE_BYTES: usize = STORED_EVENT_BYTES;

/// The largest id an event can have whose canonical form is exact (2^53 - 1):
/// what an event's length is checked with before its id is known.
const LONGEST_ID: u64 = 9_007_199_254_740_991;

/// What comes between an event's id and its predecessor's hash.
const PREV: &str = r#","prev_hash":"#;

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

/// An event's hash in two steps, the same bytes as [`event_hash`] of the
/// whole object: the RFC 8785 form of every member but `id` and `prev_hash`,
/// made first; then, given those two, only their text and the SHA-256. The
/// commit makes the first part before it takes the tenant's chain and the
/// second under it, where every microsecond is every writer's of the tenant
/// (docs/audit.md).
pub struct PreparedEvent {
    /// The canonical form up to and including `"id":`.
    head: String,
    /// The canonical form after the value of `prev_hash`, closing brace included.
    tail: String,
}

impl PreparedEvent {
    /// `members`: the event's columns but `id`, `prev_hash` and `hash`. Every
    /// other member sorts before `"id"` or after `"prev_hash"` (an event's do),
    /// so the two fall together in the canonical form, where they are spliced.
    pub fn new(members: serde_json::Map<String, Value>) -> Result<Self, CoreError> {
        let utf16 = |k: &str| k.encode_utf16().collect::<Vec<u16>>();
        let (id, prev) = (utf16("id"), utf16("prev_hash"));
        let (mut before, mut after) = (serde_json::Map::new(), serde_json::Map::new());
        for (k, v) in members {
            let key = utf16(&k);
            if key < id && k != "hash" {
                before.insert(k, v);
            } else if key > prev {
                after.insert(k, v);
            } else {
                return Err(CoreError::InvalidJson(format!(
                    "an audit event prepared for its chain has a member {k:?} where id and prev_hash go"
                )));
            }
        }
        let mut head = canonicalize_value(&Value::Object(before))?;
        head.pop(); // its closing brace
        if head.len() > 1 {
            head.push(',');
        }
        head.push_str(r#""id":"#);
        let after = canonicalize_value(&Value::Object(after))?;
        let tail = match after.len() {
            2 => "}".to_owned(),
            _ => format!(",{}", &after[1..]),
        };
        // Within the bound whatever id and predecessor it gets: refused
        // here, where the event is made, never when its chain is written.
        let longest = LONGEST_ID.to_string().len() + PREV.len() + CHAIN_START.len() + 2;
        if head.len() + longest + tail.len() > MAX_BYTES {
            return Err(CoreError::TooLarge { limit: MAX_BYTES });
        }
        Ok(Self { head, tail })
    }

    /// The event's hash once it has its id and its predecessor's hash.
    pub fn hash(&self, id: &Value, prev_hash: &str) -> Result<String, CoreError> {
        let id = canonicalize_value(id)?;
        let prev = canonicalize_value(&Value::String(prev_hash.to_owned()))?;
        let length = self.head.len() + id.len() + PREV.len() + prev.len() + self.tail.len();
        if length > MAX_BYTES {
            return Err(CoreError::TooLarge { limit: MAX_BYTES });
        }
        let mut sha = sha2::Sha256::new();
        for part in [self.head.as_str(), &id, PREV, &prev, &self.tail] {
            sha.update(part.as_bytes());
        }
        Ok(hex::encode(sha.finalize()))
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
    keyed_lock_id(key, &[CHAIN_LOCK_TAG, tenant.as_bytes()])
}

/// The first 48 bits of HMAC-SHA256 under `key` over `message`'s pieces, in
/// order: a lock's object id and sub-id.
fn keyed_lock_id(key: &[u8], message: &[&[u8]]) -> (u32, u16) {
    use hmac::{Hmac, Mac};
    let mut mac =
        Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    for piece in message {
        mac.update(piece);
    }
    let d = mac.finalize().into_bytes();
    (
        u32::from_be_bytes([d[0], d[1], d[2], d[3]]),
        u16::from_be_bytes([d[4], d[5]]),
    )
}

/// Domain tag of [`recheck_lock_id`].
const RECHECK_LOCK_TAG: &[u8] = b"keyturn/v1/recheck-lock";

/// The 48 bits that name what a commit's recheck reads (a tool, or a
/// principal's authorization in a tenant: `parts`), for the lock that orders
/// the recheck against a change to it (docs/security.md, row 95). Keyed as
/// [`chain_lock_id`] is, for the same reason; each part length-prefixed, so
/// no two lists of parts share their bytes.
pub fn recheck_lock_id(key: &[u8], parts: &[&str]) -> (u32, u16) {
    let lengths: Vec<[u8; 8]> = parts
        .iter()
        .map(|p| (p.len() as u64).to_be_bytes())
        .collect();
    let mut message: Vec<&[u8]> = vec![RECHECK_LOCK_TAG];
    for (part, length) in parts.iter().zip(&lengths) {
        message.extend([length.as_slice(), part.as_bytes()]);
    }
    keyed_lock_id(key, &message)
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

    #[test]
    fn an_event_prepared_in_two_steps_hashes_as_the_whole() {
        let members = json!({
            "action_id": "4f9c2f8e-0000-4000-8000-000000000001",
            "action_principal": "agent-é",
            "at": "2026-12-06T01:02:03.456789+00:00",
            "db_role": "app_human",
            // The same pair of keys nested in the detail: spliced at the top.
            "detail": {"id": 0, "prev_hash": "", "note": "\"id\":0", "n": [1.50, null, {"z": true}]},
            "from_status": null,
            "principal": "person\u{2028}x",
            "tenant": "acme",
            "to_status": "approved"
        });
        let prepared = PreparedEvent::new(members.as_object().unwrap().clone()).unwrap();
        for (id, prev) in [(json!(1), CHAIN_START), (json!(9007199254740991u64), "ab")] {
            let mut whole = members.clone();
            whole["id"] = id.clone();
            whole["prev_hash"] = json!(prev);
            assert_eq!(
                prepared.hash(&id, prev).unwrap(),
                event_hash(&whole).unwrap()
            );
        }
        // Only before "id" and after "prev_hash", never both empty sides wrong.
        let few = PreparedEvent::new(serde_json::Map::new()).unwrap();
        assert_eq!(
            few.hash(&json!(2), "p").unwrap(),
            event_hash(&json!({"id": 2, "prev_hash": "p"})).unwrap()
        );
        // Too large for the bound with the longest id: refused when made.
        let big = json!({"detail": "x".repeat(MAX_BYTES - 40)});
        assert!(matches!(
            PreparedEvent::new(big.as_object().unwrap().clone()),
            Err(CoreError::TooLarge { .. })
        ));
        let between = json!({"kind": 1});
        assert!(PreparedEvent::new(between.as_object().unwrap().clone()).is_err());
        // An id without an exact canonical form is refused, as event_hash refuses it.
        let big: Value = serde_json::from_str("9007199254740993").unwrap();
        assert!(prepared.hash(&big, CHAIN_START).is_err());
    }

    #[test]
    fn recheck_locks_of_different_parts_are_apart() {
        let key = [7u8; 32];
        let a = recheck_lock_id(&key, &["acme", "p1"]);
        assert_eq!(a, recheck_lock_id(&key, &["acme", "p1"]));
        // The same bytes, split differently: another lock.
        assert_ne!(a, recheck_lock_id(&key, &["acmep", "1"]));
        assert_ne!(a, recheck_lock_id(&key, &["acme", "p1", ""]));
        assert_ne!(a, recheck_lock_id(&[8u8; 32], &["acme", "p1"]));
    }
}

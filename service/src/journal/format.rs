//! The journal's bytes: a magic, then records framed as
//!
//! ```text
//! len: u32 LE | crc32(payload): u32 LE | payload: len bytes of JSON
//! ```
//!
//! Records are only ever appended, so a crash can cut at most the last one
//! short. Reading stops at the first record that is incomplete, longer than
//! [`MAX_RECORD`] or whose checksum does not match: everything from there on
//! is a torn tail, reported by its length and never interpreted. The file is
//! rewritten ([`super::store`]) before anything is appended after such a
//! tail, so a torn record never hides later ones.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The first bytes of every journal file; the digit is the format version.
pub const MAGIC: &[u8; 8] = b"KTJRNL01";

/// A payload longer than this is not a record of ours (a receipt is a few
/// hundred bytes): the length field itself is torn or corrupt.
pub const MAX_RECORD: usize = 1 << 20;

const FRAME: usize = 8;

/// One provider outcome keyturnd observed: exactly what it would pass to
/// `keyturn.complete`, nothing inferred.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The action.
    pub action_id: Uuid,
    /// Its tenant: the calls that record it name it where keyturn's tables
    /// are distributed by tenant. Absent from entries an older keyturnd
    /// wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The lease the call ran under.
    pub lease_id: Uuid,
    /// `succeeded`, `failed`, `retry` or `unknown`.
    pub outcome: String,
    /// The receipt as the adapter made it (the database redacts it again).
    pub receipt: serde_json::Value,
    /// The provider's requested delay of a `retry`, in milliseconds.
    pub retry_after_ms: Option<u64>,
}

impl Entry {
    /// The key acknowledgements name.
    pub fn key(&self) -> (Uuid, Uuid) {
        (self.action_id, self.lease_id)
    }
}

/// One record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Record {
    /// The database whose outcomes this file holds (see
    /// [`crate::db::database_identity`]); written once it is known.
    Database {
        /// The identity.
        id: String,
    },
    /// An observed outcome, not yet known to be in the database.
    Outcome(Entry),
    /// The database answered for this outcome (recorded it, or refused it
    /// for good): it is not replayed.
    Ack {
        /// The action.
        action_id: Uuid,
        /// The lease.
        lease_id: Uuid,
    },
}

/// Appends one framed record to `out`.
pub fn encode(record: &Record, out: &mut Vec<u8>) {
    // Serializing these types cannot fail: every key is a string.
    let payload = serde_json::to_vec(record).unwrap_or_default();
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
}

/// What a file held.
#[derive(Debug, Default, PartialEq)]
pub struct Contents {
    /// Every intact record, in order.
    pub records: Vec<Record>,
    /// Bytes after the last intact record (a torn or corrupt tail).
    pub torn_bytes: usize,
}

/// The file does not start with [`MAGIC`]: not a journal of this format.
#[derive(Debug, PartialEq, Eq)]
pub struct NotAJournal;

/// Reads a whole file's bytes. An empty file is an empty journal (a crash
/// right after it was created).
pub fn decode(bytes: &[u8]) -> Result<Contents, NotAJournal> {
    if bytes.is_empty() {
        return Ok(Contents::default());
    }
    let Some(mut rest) = bytes.strip_prefix(MAGIC.as_slice()) else {
        // A torn magic is an interrupted creation: nothing was journaled yet.
        return if MAGIC.starts_with(bytes) {
            Ok(Contents {
                records: Vec::new(),
                torn_bytes: bytes.len(),
            })
        } else {
            Err(NotAJournal)
        };
    };
    let mut records = Vec::new();
    while let Some(record) = next(rest) {
        let (record, used) = record;
        records.push(record);
        rest = &rest[used..];
    }
    Ok(Contents {
        records,
        torn_bytes: rest.len(),
    })
}

/// The record at the start of `bytes` and its framed length, if it is whole.
fn next(bytes: &[u8]) -> Option<(Record, usize)> {
    let len = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?);
    if len > MAX_RECORD {
        return None;
    }
    let payload = bytes.get(FRAME..FRAME + len)?;
    if crc32fast::hash(payload) != crc {
        return None;
    }
    let record = serde_json::from_slice(payload).ok()?;
    Some((record, FRAME + len))
}

/// The outcomes not acknowledged, in the order they were journaled, and the
/// database identity the file names (the last one, if several).
pub fn pending(records: &[Record]) -> (Vec<Entry>, Option<String>) {
    let mut database = None;
    let mut order: Vec<(Uuid, Uuid)> = Vec::new();
    let mut live: std::collections::HashMap<(Uuid, Uuid), Entry> = Default::default();
    for record in records {
        match record {
            Record::Database { id } => database = Some(id.clone()),
            Record::Outcome(e) => {
                if live.insert(e.key(), e.clone()).is_none() {
                    order.push(e.key());
                }
            }
            Record::Ack {
                action_id,
                lease_id,
            } => {
                live.remove(&(*action_id, *lease_id));
            }
        }
    }
    let entries = order.into_iter().filter_map(|k| live.remove(&k)).collect();
    (entries, database)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(n: u128, outcome: &str) -> Entry {
        Entry {
            action_id: Uuid::from_u128(n),
            // Even entries as an older keyturnd wrote them: no tenant.
            tenant: (n % 2 == 1).then(|| format!("tenant-{n}")),
            lease_id: Uuid::from_u128(1000 + n),
            outcome: outcome.into(),
            receipt: json!({"status": 200, "provider_message_id": format!("m-{n}")}),
            retry_after_ms: (outcome == "retry").then_some(1500),
        }
    }

    fn file(records: &[Record]) -> Vec<u8> {
        let mut bytes = MAGIC.to_vec();
        for r in records {
            encode(r, &mut bytes);
        }
        bytes
    }

    #[test]
    fn test_records_round_trip() {
        let records = vec![
            Record::Database {
                id: "7300000000000000001/keyturn".into(),
            },
            Record::Outcome(entry(1, "succeeded")),
            Record::Outcome(entry(2, "retry")),
            Record::Ack {
                action_id: Uuid::from_u128(1),
                lease_id: Uuid::from_u128(1001),
            },
        ];
        let got = decode(&file(&records)).expect("a journal");
        assert_eq!(got.records, records);
        assert_eq!(got.torn_bytes, 0);
    }

    #[test]
    fn test_an_outcome_an_older_keyturnd_wrote_has_no_tenant() {
        let older = br#"{"t":"outcome","action_id":"00000000-0000-0000-0000-000000000002","lease_id":"00000000-0000-0000-0000-0000000003ea","outcome":"retry","receipt":{},"retry_after_ms":1500}"#;
        let Record::Outcome(e) = serde_json::from_slice(older).expect("an older record") else {
            panic!("an outcome record");
        };
        assert_eq!(e.tenant, None);
        assert_eq!(e.outcome, "retry");
        let written = serde_json::to_string(&Record::Outcome(entry(2, "retry"))).expect("json");
        assert!(!written.contains("tenant"), "no tenant, no key: {written}");
        let written = serde_json::to_string(&Record::Outcome(entry(1, "retry"))).expect("json");
        assert!(written.contains(r#""tenant":"tenant-1""#), "{written}");
    }

    #[test]
    fn test_a_torn_tail_is_ignored_at_every_cut() {
        let whole = vec![
            Record::Outcome(entry(1, "succeeded")),
            Record::Outcome(entry(2, "failed")),
        ];
        let bytes = file(&whole);
        let first_end = {
            let mut b = MAGIC.to_vec();
            encode(&whole[0], &mut b);
            b.len()
        };
        for cut in MAGIC.len()..bytes.len() {
            let got = decode(&bytes[..cut]).expect("a journal");
            let want = usize::from(cut >= first_end);
            assert_eq!(got.records, whole[..want], "cut at {cut}");
            let intact = if want == 1 { first_end } else { MAGIC.len() };
            assert_eq!(got.torn_bytes, cut - intact, "cut at {cut}");
        }
        assert_eq!(decode(&bytes).expect("whole").records, whole);
    }

    #[test]
    fn test_a_torn_magic_is_an_empty_journal_and_a_foreign_file_is_refused() {
        assert_eq!(decode(b"").expect("empty"), Contents::default());
        let got = decode(&MAGIC[..5]).expect("a torn magic");
        assert!(got.records.is_empty());
        assert_eq!(got.torn_bytes, 5);
        assert_eq!(decode(b"not a journal at all"), Err(NotAJournal));
    }

    #[test]
    fn test_a_flipped_bit_stops_reading_at_that_record() {
        let whole = vec![
            Record::Outcome(entry(1, "succeeded")),
            Record::Outcome(entry(2, "succeeded")),
            Record::Outcome(entry(3, "succeeded")),
        ];
        let mut bytes = file(&whole);
        let mut second = MAGIC.to_vec();
        encode(&whole[0], &mut second);
        // A byte inside the second record's payload.
        let at = second.len() + FRAME + 10;
        bytes[at] ^= 0x01;
        let got = decode(&bytes).expect("a journal");
        assert_eq!(got.records, whole[..1], "the checksum catches it");
        assert_eq!(got.torn_bytes, bytes.len() - second.len());
    }

    #[test]
    fn test_an_absurd_length_is_a_torn_tail_not_an_allocation() {
        let mut bytes = file(&[Record::Outcome(entry(1, "succeeded"))]);
        let intact = bytes.len();
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        bytes.extend_from_slice(&[0; 12]);
        let got = decode(&bytes).expect("a journal");
        assert_eq!(got.records.len(), 1);
        assert_eq!(got.torn_bytes, bytes.len() - intact);
    }

    #[test]
    fn test_pending_drops_acknowledged_outcomes_and_keeps_order() {
        let records = vec![
            Record::Database { id: "a".into() },
            Record::Outcome(entry(3, "succeeded")),
            Record::Outcome(entry(1, "retry")),
            Record::Outcome(entry(2, "unknown")),
            Record::Ack {
                action_id: Uuid::from_u128(1),
                lease_id: Uuid::from_u128(1001),
            },
            // An ack for another lease of action 2 leaves this one.
            Record::Ack {
                action_id: Uuid::from_u128(2),
                lease_id: Uuid::from_u128(9),
            },
            Record::Database { id: "b".into() },
        ];
        let (entries, database) = pending(&records);
        assert_eq!(entries, vec![entry(3, "succeeded"), entry(2, "unknown")]);
        assert_eq!(database.as_deref(), Some("b"));
    }
}

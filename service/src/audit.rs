//! `keyturnd audit-verify FILE`: a tenant's audit export
//! (`keyturn.audit_export`, one JSON object a line) checked offline, with no
//! database (docs/audit.md, "Checking an export offline").
//!
//! Each line's `hash` must be the lowercase hex SHA-256 of the RFC 8785
//! form of the line's object without `hash` (keyturn-core's canonical JSON,
//! the very code the database hashes with), and its `prev_hash` the hash of
//! the line before. The first line's `prev_hash` is where the file starts:
//! 64 zeros for an export from the chain's start, another event's hash for
//! an export `since` a time. Taken as it is, and reported, unless `--after`
//! names the hash it must be (64 zeros: the file must hold the whole
//! chain), since only a hash kept elsewhere says what came before; a file
//! rewritten from some line on would verify against itself anyway. Every
//! line is of one tenant, with ids increasing. `--head` checks the last hash
//! against a head kept elsewhere (`keyturn.audit_head`), which is how a
//! deleted tail shows.

use std::io::{BufRead, Read};

use keyturn_core::audit::{CHAIN_START, EXPORT_LINE_BYTES};
use serde_json::Value;

/// One line of an export, or the news that it is longer than any event,
/// read no further than that (a multi-gigabyte line is not held in memory
/// to be refused).
enum Line {
    Text(String),
    TooLong,
}

/// The next line of `input` without its line end (`\n` or `\r\n`, as
/// `BufRead::lines` reads them), None at the end; invalid UTF-8 is an
/// `InvalidData` error, as from `lines`.
fn next_line(input: &mut impl BufRead, buf: &mut Vec<u8>) -> std::io::Result<Option<Line>> {
    buf.clear();
    let limit = EXPORT_LINE_BYTES as u64 + 2;
    let read = input.by_ref().take(limit).read_until(b'\n', buf)?;
    if read == 0 {
        return Ok(None);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
    if buf.len() > EXPORT_LINE_BYTES {
        return Ok(Some(Line::TooLong));
    }
    String::from_utf8(std::mem::take(buf))
        .map(|t| Some(Line::Text(t)))
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// What an export proved: its events and last hash, or the first line
/// (1-based) that does not verify and why.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// `start` is the first line's `prev_hash` (64 zeros: the chain's start).
    Verified {
        events: u64,
        start: String,
        head: String,
    },
    Bad {
        line: u64,
        why: String,
    },
}

/// The hash of one exported event, as the database computes it.
fn event_hash(event: &Value) -> Result<String, String> {
    if !event.is_object() {
        return Err("not a JSON object".into());
    }
    keyturn_core::audit::event_hash(event).map_err(|e| format!("not canonicalizable: {e}"))
}

/// Checks the export read from `input`.
pub fn verify(
    mut input: impl BufRead,
    after: Option<&str>,
    head: Option<&str>,
) -> std::io::Result<Verdict> {
    let mut prev = after.map(str::to_owned);
    let mut start = after.unwrap_or(CHAIN_START).to_owned();
    let mut tenant: Option<String> = None;
    let mut last_id: Option<i64> = None;
    let mut n = 0;
    let mut buf = Vec::new();
    while let Some(line) = next_line(&mut input, &mut buf)? {
        n += 1;
        let bad = |why: String| Ok(Verdict::Bad { line: n, why });
        let Line::Text(line) = line else {
            return bad(format!(
                "longer than any event ({EXPORT_LINE_BYTES} bytes at most)"
            ));
        };
        let event: Value = match keyturn_core::audit::parse_exported_event(&line) {
            Ok(v) => v,
            Err(e) => return bad(format!("not JSON: {e}")),
        };
        let text = |k: &str| event.get(k).and_then(Value::as_str).map(str::to_owned);
        let Some(hash) = text("hash") else {
            return bad("no hash".into());
        };
        match event_hash(&event) {
            Ok(h) if h == hash => {}
            Ok(_) => {
                return bad("its hash is not the hash of its columns: the event was changed".into())
            }
            Err(e) => return bad(e),
        }
        let Some(prev_hash) = text("prev_hash") else {
            return bad("no prev_hash".into());
        };
        match &prev {
            // The first line, and nothing said where the file starts: it
            // starts where its first line says.
            None => start = prev_hash,
            Some(p) if *p == prev_hash => {}
            Some(_) => {
                return bad(format!(
                    "its prev_hash does not name the event before it ({}): an event was deleted, inserted or reordered",
                    if n == 1 { "the --after hash" } else { "the previous line" }
                ))
            }
        }
        match (&tenant, text("tenant")) {
            (_, None) => return bad("no tenant".into()),
            (None, Some(t)) => tenant = Some(t),
            (Some(a), Some(b)) if *a != b => {
                return bad(format!(
                    "tenant {b} in an export of tenant {a}: one chain per tenant"
                ))
            }
            _ => {}
        }
        let Some(id) = event.get("id").and_then(Value::as_i64) else {
            return bad("no id".into());
        };
        if last_id.is_some_and(|last| id <= last) {
            return bad("its id is not after the previous line's".into());
        }
        last_id = Some(id);
        prev = Some(hash);
    }
    let prev = prev.unwrap_or_else(|| start.clone());
    if let Some(head) = head {
        if head != prev {
            return Ok(Verdict::Bad {
                line: n + 1,
                why: format!(
                    "the export ends at {prev}, not at the head {head}: events at its end are missing"
                ),
            });
        }
    }
    Ok(Verdict::Verified {
        events: n,
        start,
        head: prev,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chain(n: usize) -> Vec<Value> {
        let mut prev = CHAIN_START.to_owned();
        (0..n)
            .map(|i| {
                let mut e = json!({"id": i + 10, "tenant": "acme", "action_id": "a", "at": "2026-12-05T00:00:00+00:00",
                                   "to_status": "pending", "detail": {"n": i, "x": 1.5}, "prev_hash": prev});
                let h = event_hash(&e).unwrap();
                e["hash"] = json!(h);
                prev = h;
                e
            })
            .collect()
    }

    fn text(events: &[Value]) -> String {
        events.iter().map(|e| e.to_string() + "\n").collect()
    }

    fn check(events: &[Value]) -> Verdict {
        verify(text(events).as_bytes(), None, None).unwrap()
    }

    #[test]
    fn test_a_line_longer_than_any_event_is_refused_unread() {
        let c = chain(2);
        let mut t = text(&c);
        t.push_str(&"x".repeat(EXPORT_LINE_BYTES + 10));
        t.push('\n');
        match verify(t.as_bytes(), None, None).unwrap() {
            Verdict::Bad { line, why } => {
                assert_eq!(line, 3);
                assert!(why.starts_with("longer than any event"), "{why}");
            }
            v => panic!("{v:?}"),
        }
        // Line ends as BufRead::lines reads them: \r\n, and none at the end.
        let crlf = text(&c).replace('\n', "\r\n");
        assert!(matches!(
            verify(crlf.trim_end().as_bytes(), None, None).unwrap(),
            Verdict::Verified { events: 2, .. }
        ));
        // Invalid UTF-8 is an error, as before.
        let mut bytes = text(&c).into_bytes();
        bytes.extend_from_slice(b"\xff\n");
        assert!(verify(&bytes[..], None, None).is_err());
    }

    #[test]
    fn test_an_intact_chain_verifies() {
        let c = chain(4);
        let head = c[3]["hash"].as_str().unwrap().to_owned();
        let whole = Verdict::Verified {
            events: 4,
            start: CHAIN_START.to_owned(),
            head: head.clone(),
        };
        assert_eq!(check(&c), whole);
        assert_eq!(
            verify(text(&c).as_bytes(), None, Some(&head)).unwrap(),
            whole
        );
        assert_eq!(
            verify(text(&c).as_bytes(), Some(CHAIN_START), Some(&head)).unwrap(),
            whole
        );
        // An export from the middle (`since` a time) verifies from where it
        // starts, which the verdict reports; with --after, it must continue
        // from that hash.
        let after = c[1]["hash"].as_str().unwrap();
        let tail = Verdict::Verified {
            events: 2,
            start: after.to_owned(),
            head: head.clone(),
        };
        assert_eq!(check(&c[2..]), tail);
        assert_eq!(
            verify(text(&c[2..]).as_bytes(), Some(after), None).unwrap(),
            tail
        );
        // An empty export verifies, from where --after says.
        assert_eq!(
            verify(&b""[..], Some(after), Some(after)).unwrap(),
            Verdict::Verified {
                events: 0,
                start: after.to_owned(),
                head: after.to_owned()
            }
        );
    }

    #[test]
    fn test_each_tampering_names_its_line() {
        let c = chain(4);
        let mut changed = c.clone();
        changed[2]["detail"]["n"] = json!(99);
        assert!(matches!(check(&changed), Verdict::Bad { line: 3, .. }));
        let mut deleted = c.clone();
        deleted.remove(1);
        assert!(matches!(check(&deleted), Verdict::Bad { line: 2, .. }));
        let mut swapped = c.clone();
        swapped.swap(1, 2);
        assert!(matches!(check(&swapped), Verdict::Bad { line: 2, .. }));
        assert!(
            matches!(
                verify(text(&c[1..]).as_bytes(), Some(CHAIN_START), None).unwrap(),
                Verdict::Bad { line: 1, .. }
            ),
            "a missing start, where the file must start the chain"
        );
        let other = c[0]["hash"].as_str().unwrap();
        assert!(
            matches!(
                verify(text(&c[2..]).as_bytes(), Some(other), None).unwrap(),
                Verdict::Bad { line: 1, .. }
            ),
            "an export that does not continue from the --after hash"
        );
        let mut no_prev = c.clone();
        no_prev[0].as_object_mut().unwrap().remove("prev_hash");
        assert!(matches!(check(&no_prev), Verdict::Bad { line: 1, .. }));
        let head = c[3]["hash"].as_str().unwrap();
        assert!(
            matches!(
                verify(text(&c[..3]).as_bytes(), None, Some(head)).unwrap(),
                Verdict::Bad { line: 4, .. }
            ),
            "a missing tail against the kept head"
        );
        let mut garbage = text(&c);
        garbage.push_str("not json\n");
        assert!(matches!(
            verify(garbage.as_bytes(), None, None).unwrap(),
            Verdict::Bad { line: 5, .. }
        ));
    }

    /// Red-team pass of 0.3.0 (docs/security.md, row 76): a lenient reader
    /// keeps the last of two keys, so a forged value put first on a line
    /// (what a person or another reader sees) verified; and serde_json read
    /// its reserved number key as a number.
    #[test]
    fn test_a_line_that_reads_two_ways_does_not_verify() {
        let c = chain(3);
        let mut lines: Vec<String> = c.iter().map(Value::to_string).collect();
        lines[1] = lines[1].replacen('{', r#"{"principal":"mallory","#, 1);
        let forged = lines.join("\n") + "\n";
        assert!(
            matches!(
                verify(forged.as_bytes(), None, None).unwrap(),
                Verdict::Bad { line: 2, .. }
            ),
            "a duplicate key"
        );
        let mut lines: Vec<String> = c.iter().map(Value::to_string).collect();
        lines[0] = lines[0].replacen(
            r#""id":10"#,
            r#""id":{"$serde_json::private::Number":"10"}"#,
            1,
        );
        let forged = lines.join("\n") + "\n";
        assert!(
            matches!(
                verify(forged.as_bytes(), None, None).unwrap(),
                Verdict::Bad { line: 1, .. }
            ),
            "the reserved number key"
        );
    }
}

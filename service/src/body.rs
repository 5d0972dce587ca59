//! A request body's JSON, read as the database reads it.
//!
//! keyturn-core's strict reader (what the database hashes and checks
//! identity with) refuses a repeated object key and serde_json's reserved
//! number key (`$serde_json::private::Number`); serde_json, which `/rpc`
//! and the MCP SDK parse bodies with, keeps the last of a repeated key and
//! reads the reserved one as a number. A body the two would read apart is
//! refused before either acts on it: nothing in front of keyturnd that read
//! `"payee": "bob"` first sees `mallory` proposed (docs/security.md, row 130).

use keyturn_core::CoreError;

/// Why `body` is refused, for a body serde_json reads and keyturn-core
/// would read otherwise, at any depth serde_json reads (a deep value beside
/// a repeated key hid it from a check bounded at keyturn's 64 levels:
/// docs/security.md, row 130); `None` for any other (what neither reads, or
/// what is too large, is the reader's further on to answer).
pub fn read_apart(body: &[u8]) -> Option<&'static str> {
    let text = std::str::from_utf8(body).ok()?;
    match keyturn_core::canonical::parse_any_depth(text) {
        Err(CoreError::InvalidJson(_))
            if serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() =>
        {
            Some(
                "the body repeats an object key, or holds the key $serde_json::private::Number: \
                 keyturn reads such JSON one way only; send each key once",
            )
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_body_two_readers_read_apart_is_refused() {
        for body in [
            r#"{"a": 1, "a": 2}"#,
            r#"{"params": {"to": "bob", "to": "mallory"}}"#,
            r#"{"amount": {"$serde_json::private::Number": "950000"}}"#,
            &format!(
                r#"{{"deep": {}1{}, "text": "bob", "text": "mallory"}}"#,
                "[".repeat(80),
                "]".repeat(80)
            ),
        ] {
            assert!(read_apart(body.as_bytes()).is_some(), "{body}");
        }
        for body in [
            r#"{"a": 1, "b": {"a": 2}}"#,
            "not json",
            &format!("{}{}", "[".repeat(100), "]".repeat(100)),
            &format!("{}{}", "[".repeat(200), "]".repeat(200)),
        ] {
            assert!(read_apart(body.as_bytes()).is_none(), "{body}");
        }
    }
}

//! RFC 8785 (JSON Canonicalization Scheme) and the params hash built on it.
//!
//! The hash is what a human's approval is bound to, so the canonical form must be
//! a function of the *value* only: the same params always give the same bytes, and
//! different params never do. JCS gives the first property (sorted keys, no
//! whitespace, one escaping, ECMAScript number printing). The second needs two
//! refusals JCS leaves to the implementation: numbers that a double cannot hold
//! exactly ([`number`]) and duplicate or reserved object keys ([`parse`]).
//!
//! Limits: input text and canonical output are each capped at [`MAX_BYTES`], and
//! nesting at [`MAX_DEPTH`] levels of arrays/objects, so a hostile document can
//! neither exhaust memory nor overflow the stack of the backend running this.

mod number;
mod parse;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::CoreError;

/// Deepest accepted nesting of arrays and objects (`[]` is depth 1).
pub const MAX_DEPTH: usize = 64;

/// Largest accepted JSON text, and largest canonical form produced, in bytes.
pub const MAX_BYTES: usize = 1 << 20;

/// Parses `json` strictly and returns its RFC 8785 canonical form.
///
/// Refuses (besides malformed JSON) duplicate object keys, input over
/// [`MAX_BYTES`], nesting over [`MAX_DEPTH`], and numbers without an exact
/// canonical form.
pub fn canonicalize_str(json: &str) -> Result<String, CoreError> {
    canonicalize_value(&parse::parse_strict(json)?)
}

/// Returns the RFC 8785 canonical form of an already parsed value.
///
/// Numbers are checked against the literal serde_json kept (`arbitrary_precision`),
/// so a value parsed from `9007199254740993` is refused here too.
pub fn canonicalize_value(v: &Value) -> Result<String, CoreError> {
    let mut out = String::with_capacity(256);
    Writer::new(&mut out).value(v, 0)?;
    Ok(out)
}

/// Lowercase hex SHA-256 of the canonical form of `v`: a tool definition's
/// hash (crate::upstream), an audit event's (crate::audit).
pub fn sha256_hex(v: &Value) -> Result<String, CoreError> {
    Ok(hex::encode(Sha256::digest(
        canonicalize_value(v)?.as_bytes(),
    )))
}

/// Lowercase hex SHA-256 of the canonical form of `{"params": params, "tool": tool}`.
pub fn params_hash(tool: &str, params: &Value) -> Result<String, CoreError> {
    // "params" < "tool" in UTF-16 order, so the envelope is written directly
    // instead of building (and copying params into) a wrapper Value.
    let mut out = String::with_capacity(256);
    out.push_str(r#"{"params":"#);
    Writer::new(&mut out).value(params, 0)?;
    out.push_str(r#","tool":"#);
    write_string(&mut out, tool);
    out.push('}');
    Ok(hex::encode(Sha256::digest(out.as_bytes())))
}

/// [`params_hash`] of params given as JSON text (parsed strictly, as in
/// [`canonicalize_str`]).
pub fn params_hash_str(tool: &str, params_json: &str) -> Result<String, CoreError> {
    params_hash(tool, &parse::parse_strict(params_json)?)
}

/// Parses JSON text under the same size and depth bounds as [`canonicalize_str`],
/// without asking numbers for an exact canonical form: for receipts, templates
/// and schema checks, which are never hashed.
pub fn parse_bounded(json: &str) -> Result<Value, CoreError> {
    parse::parse_strict(json)
}

/// [`parse_bounded`] at any depth serde_json reads (128 levels): for a
/// service that checks a whole request, its envelope around what keyturn
/// hashes included, for the keys only this reader refuses (a repeated key,
/// the reserved number key) before another reader acts on it.
pub fn parse_any_depth(json: &str) -> Result<Value, CoreError> {
    parse::parse_strict_bounded(json, MAX_BYTES, usize::MAX)
}

/// [`parse_bounded`] of a text PostgreSQL printed from a value keyturn
/// already admitted, whose printed form may be longer than `max_bytes`
/// allows a caller's input (crate::audit: a stored event).
pub(crate) fn parse_printed(json: &str, max_bytes: usize) -> Result<Value, CoreError> {
    parse::parse_strict_within(json, max_bytes)
}

/// The text an approved write stores for a JSON value: a string as itself, a
/// number in its canonical (RFC 8785) form, `true`/`false`, and for arrays and
/// objects their canonical JSON; `None` for null.
///
/// What the database writes must follow from what was hashed: `1` and `1.00`
/// hash alike, so a text column must receive `1` for both, never the literal
/// the agent happened to send.
pub fn scalar_text(v: &Value) -> Result<Option<String>, CoreError> {
    Ok(match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => {
            let mut out = String::new();
            number::write_number(&mut out, n.as_str())?;
            Some(out)
        }
        Value::Array(_) | Value::Object(_) => Some(canonicalize_value(v)?),
    })
}

/// Appends canonical JSON to a buffer, enforcing depth and output size.
struct Writer<'a> {
    out: &'a mut String,
    /// Where this value's output began, so the size cap applies to the value
    /// alone even when the buffer already holds an envelope prefix.
    start: usize,
}

impl<'a> Writer<'a> {
    fn new(out: &'a mut String) -> Self {
        let start = out.len();
        Writer { out, start }
    }

    fn value(&mut self, v: &Value, depth: usize) -> Result<(), CoreError> {
        match v {
            Value::Null => self.out.push_str("null"),
            Value::Bool(true) => self.out.push_str("true"),
            Value::Bool(false) => self.out.push_str("false"),
            Value::Number(n) => number::write_number(self.out, n.as_str())?,
            Value::String(s) => write_string(self.out, s),
            Value::Array(items) => {
                let depth = enter(depth)?;
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    self.value(item, depth)?;
                }
                self.out.push(']');
            }
            Value::Object(map) => {
                let depth = enter(depth)?;
                self.object(map, depth)?;
            }
        }
        if self.out.len() - self.start > MAX_BYTES {
            return Err(CoreError::TooLarge { limit: MAX_BYTES });
        }
        Ok(())
    }

    fn object(&mut self, map: &Map<String, Value>, depth: usize) -> Result<(), CoreError> {
        // RFC 8785 §3.2.3: sort by UTF-16 code units. serde_json's map is ordered
        // by UTF-8 bytes, which differs for astral characters versus U+E000..U+FFFF
        // (e.g. 😂 sorts before דּ in UTF-16, after it in UTF-8).
        let mut entries: Vec<(&String, &Value)> = map.iter().collect();
        entries.sort_unstable_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
        self.out.push('{');
        for (i, (key, value)) in entries.into_iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            write_string(self.out, key);
            self.out.push(':');
            self.value(value, depth)?;
        }
        self.out.push('}');
        Ok(())
    }
}

fn enter(depth: usize) -> Result<usize, CoreError> {
    let depth = depth + 1;
    if depth > MAX_DEPTH {
        return Err(CoreError::TooDeep { limit: MAX_DEPTH });
    }
    Ok(depth)
}

/// RFC 8785 §3.2.2.2: escape only `"`, `\` and C0 controls (short forms where
/// JSON has them, else `\u00xx` in lowercase hex); everything else, DEL and
/// non-ASCII included, is written as literal UTF-8.
fn write_string(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(s.len() + 2);
    out.push('"');
    let mut run_start = 0;
    for (i, b) in s.bytes().enumerate() {
        let short = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x09 => "\\t",
            0x0a => "\\n",
            0x0c => "\\f",
            0x0d => "\\r",
            0x00..=0x1f => "",
            _ => continue,
        };
        // `i` is an ASCII byte, hence a char boundary: the slice cannot split a char.
        out.push_str(&s[run_start..i]);
        run_start = i + 1;
        if short.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        } else {
            out.push_str(short);
        }
    }
    out.push_str(&s[run_start..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(text: &str) -> String {
        match canonicalize_str(text) {
            Ok(s) => s,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    #[test]
    fn test_scalar_text_writes_what_was_hashed() {
        let v = |t: &str| parse_bounded(t).unwrap();
        assert_eq!(scalar_text(&v("1.00")).unwrap().as_deref(), Some("1"));
        assert_eq!(scalar_text(&v("1")).unwrap().as_deref(), Some("1"));
        assert_eq!(scalar_text(&v("4.50")).unwrap().as_deref(), Some("4.5"));
        assert_eq!(scalar_text(&v("1E30")).unwrap().as_deref(), Some("1e+30"));
        assert_eq!(
            scalar_text(&v(r#""1.00""#)).unwrap().as_deref(),
            Some("1.00")
        );
        assert_eq!(scalar_text(&v("true")).unwrap().as_deref(), Some("true"));
        assert_eq!(scalar_text(&v("null")).unwrap(), None);
        assert_eq!(
            scalar_text(&v(r#"{"b": 1.0, "a": [2.50]}"#))
                .unwrap()
                .as_deref(),
            Some(r#"{"a":[2.5],"b":1}"#)
        );
        assert!(scalar_text(&v("9007199254740993")).is_err());
    }

    #[test]
    fn test_no_whitespace_and_sorted_keys() {
        assert_eq!(
            canon(" { \"b\" : [ 1 , 2 ] ,\n\t\"a\" : { \"d\" : null , \"c\" : true } } "),
            r#"{"a":{"c":true,"d":null},"b":[1,2]}"#
        );
    }

    #[test]
    fn test_keys_sort_by_utf16_not_utf8() {
        // U+1F602 is D83D DE02 in UTF-16, below U+FB33; in UTF-8 it is above.
        assert_eq!(
            canon(r#"{"\ufb33": 1, "\ud83d\ude02": 2, "\u00f6": 3, "a": 4}"#),
            "{\"a\":4,\"\u{f6}\":3,\"\u{1f602}\":2,\"\u{fb33}\":1}"
        );
    }

    #[test]
    fn test_key_prefix_sorts_first() {
        assert_eq!(canon(r#"{"ab":1,"a":2,"":3}"#), r#"{"":3,"a":2,"ab":1}"#);
    }

    #[test]
    fn test_string_escapes() {
        let mut out = String::new();
        write_string(&mut out, "q\"b\\\u{8}\t\n\u{c}\r\u{0}\u{1f}\u{7f}/é😂<");
        assert_eq!(
            out,
            "\"q\\\"b\\\\\\b\\t\\n\\f\\r\\u0000\\u001f\u{7f}/é😂<\""
        );
    }

    #[test]
    fn test_escaped_input_is_unescaped_when_not_needed() {
        assert_eq!(canon(r#""\u0041\/\u00e9\u000F""#), "\"A/é\\u000f\"");
    }

    #[test]
    fn test_numbers_in_context() {
        assert_eq!(
            canon("[0.1, 4.50, 1E30, 56.0, 2e-3, -0, 1000000000000000000000000000000]"),
            "[0.1,4.5,1e+30,56,0.002,0,1e+30]"
        );
    }

    #[test]
    fn test_inexact_number_anywhere_is_refused() {
        assert_eq!(
            canonicalize_str(r#"{"a": [1, {"b": 9007199254740993}]}"#),
            Err(CoreError::InexactNumber("9007199254740993".into()))
        );
        assert_eq!(
            canonicalize_str("[1e400]"),
            // serde_json spells the exponent marker `e+` in the literal it keeps.
            Err(CoreError::NonFiniteNumber("1e+400".into()))
        );
    }

    #[test]
    fn test_value_built_in_rust_canonicalizes() {
        let v = json!({"z": 1.5, "a": [true, null, "x"], "m": -7});
        assert_eq!(
            canonicalize_value(&v).unwrap(),
            r#"{"a":[true,null,"x"],"m":-7,"z":1.5}"#
        );
    }

    #[test]
    fn test_value_depth_limit() {
        let mut v = json!(1);
        for _ in 0..MAX_DEPTH {
            v = json!([v]);
        }
        assert!(canonicalize_value(&v).is_ok());
        let v = json!({ "k": v });
        assert_eq!(
            canonicalize_value(&v),
            Err(CoreError::TooDeep { limit: MAX_DEPTH })
        );
    }

    #[test]
    fn test_output_size_limit() {
        // 1e20 is 4 bytes of input but 21 of output; 200k of them stay under the
        // input cap and blow the output cap.
        let text = format!("[{}1]", "1e20,".repeat(200_000));
        assert!(text.len() < MAX_BYTES);
        assert_eq!(
            canonicalize_str(&text),
            Err(CoreError::TooLarge { limit: MAX_BYTES })
        );
    }

    #[test]
    fn test_params_hash_known_answer() {
        // sha256 of the UTF-8 bytes {"params":{"a":1,"b":"x"},"tool":"send_email"}
        // Computed independently: printf '%s' '<that text>' | sha256sum
        let h = params_hash("send_email", &json!({"b": "x", "a": 1})).unwrap();
        assert_eq!(
            h,
            "a4ef7e703f6022c8e6b746a9d20bce01e98e95696101afa915dc00f859887010"
        );
    }

    fn expected_hash(canonical: &str) -> String {
        hex::encode(Sha256::digest(canonical.as_bytes()))
    }

    #[test]
    fn test_params_hash_envelope_matches_canonical_wrapper() {
        let params = json!({"to": "a@example.com", "n": [1, 2.50]});
        let wrapper = json!({"tool": "t\"x", "params": params});
        let canonical = canonicalize_value(&wrapper).unwrap();
        assert_eq!(
            params_hash("t\"x", &params).unwrap(),
            expected_hash(&canonical)
        );
    }

    #[test]
    fn test_params_hash_str_agrees_and_is_lowercase_hex() {
        let a = params_hash_str("t", r#"{"b": 2, "a": 1.0}"#).unwrap();
        let b = params_hash("t", &json!({"a": 1, "b": 2})).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')));
    }

    #[test]
    fn test_params_hash_separates_tool_and_params() {
        let p = json!({"x": 1});
        assert_ne!(params_hash("a", &p).unwrap(), params_hash("b", &p).unwrap());
        assert_ne!(
            params_hash("a", &p).unwrap(),
            params_hash("a", &json!({"x": 2})).unwrap()
        );
    }

    #[test]
    fn test_parse_bounded_applies_limits_but_not_number_exactness() {
        let v = parse_bounded(r#"{"n": 9007199254740993}"#).unwrap();
        assert_eq!(
            v["n"].as_number().map(|n| n.as_str()),
            Some("9007199254740993")
        );
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(
            parse_bounded(&deep),
            Err(CoreError::TooDeep { limit: MAX_DEPTH })
        );
        assert!(matches!(
            parse_bounded(r#"{"a":1,"a":2}"#),
            Err(CoreError::InvalidJson(_))
        ));
    }

    #[test]
    fn test_params_hash_refuses_inexact_params() {
        assert_eq!(
            params_hash_str("t", r#"{"amount": 1152921504606846976}"#),
            Err(CoreError::InexactNumber("1152921504606846976".into()))
        );
    }
}

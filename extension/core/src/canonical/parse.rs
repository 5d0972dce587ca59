//! Strict parsing of JSON text into a `serde_json::Value`.
//!
//! `serde_json::from_str` is almost what we need, but for a hash that authorizes a
//! write it is too forgiving in two ways:
//!
//! * Duplicate object keys are silently resolved (last one wins). Another parser
//!   (a provider, a log viewer) may keep the first, so the human would approve one
//!   value while another is executed. RFC 8785 requires I-JSON input, which forbids
//!   duplicates, so we refuse them.
//! * With `arbitrary_precision`, serde_json hands numbers to visitors as a one-entry
//!   map keyed `$serde_json::private::Number`. Its own `Value` visitor therefore
//!   turns the *object* `{"$serde_json::private::Number": "1"}` into the number `1`,
//!   giving two different texts one hash. We tell the two apart (a real number's
//!   text arrives as an owned `String`, an object member's value never does) and
//!   refuse the reserved key.
//!
//! Depth is bounded here as well, before a deep document can cost anything;
//! serde_json's own limit (128) stays as a backstop and is mapped to the same error.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::{MAX_BYTES, MAX_DEPTH};
use crate::CoreError;

/// The key serde_json uses to smuggle arbitrary-precision numbers through serde.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

/// Marker inside our serde error messages so they map back to `TooDeep`.
const DEPTH_MARKER: &str = "keyturn: nesting too deep";

pub(super) fn parse_strict(json: &str) -> Result<Value, CoreError> {
    parse_strict_within(json, MAX_BYTES)
}

/// [`parse_strict`] with another bound on the input text's size.
pub(super) fn parse_strict_within(json: &str, max_bytes: usize) -> Result<Value, CoreError> {
    parse_strict_bounded(json, max_bytes, MAX_DEPTH)
}

/// [`parse_strict_within`] with another bound on nesting (serde_json's own,
/// 128, stays below any larger one).
pub(super) fn parse_strict_bounded(
    json: &str,
    max_bytes: usize,
    max_depth: usize,
) -> Result<Value, CoreError> {
    if json.len() > max_bytes {
        return Err(CoreError::TooLarge { limit: max_bytes });
    }
    let mut de = serde_json::Deserializer::from_str(json);
    let value = StrictSeed {
        depth: 0,
        max: max_depth,
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|()| v))
    .map_err(map_error)?;
    Ok(value)
}

fn map_error(e: serde_json::Error) -> CoreError {
    let msg = e.to_string();
    if msg.starts_with(DEPTH_MARKER) || msg.starts_with("recursion limit exceeded") {
        CoreError::TooDeep { limit: MAX_DEPTH }
    } else {
        CoreError::InvalidJson(msg)
    }
}

/// Deserializes one value whose containers sit at nesting level `depth + 1`.
#[derive(Clone, Copy)]
struct StrictSeed {
    depth: usize,
    max: usize,
}

impl StrictSeed {
    fn enter<E: de::Error>(self) -> Result<StrictSeed, E> {
        let depth = self.depth + 1;
        if depth > self.max {
            return Err(E::custom(DEPTH_MARKER));
        }
        Ok(StrictSeed {
            depth,
            max: self.max,
        })
    }
}

impl<'de> DeserializeSeed<'de> for StrictSeed {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictSeed {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    // Without arbitrary_precision these would be how numbers arrive; with it they
    // are unreachable from text, but keeping them makes the seed total.
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("non-finite number"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = self.enter()?;
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element_seed(inner)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let Some(first_key) = map.next_key::<String>()? else {
            self.enter::<A::Error>()?;
            return Ok(Value::Object(Map::new()));
        };
        if first_key == NUMBER_TOKEN {
            let literal = map.next_value_seed(NumberText)?;
            let number: Number = literal.parse().map_err(de::Error::custom)?;
            return Ok(Value::Number(number));
        }
        let inner = self.enter()?;
        let mut object = Map::new();
        let mut key = first_key;
        loop {
            if key == NUMBER_TOKEN {
                return Err(de::Error::custom(format_args!(
                    "the object key {NUMBER_TOKEN:?} is reserved"
                )));
            }
            let value = map.next_value_seed(inner)?;
            if object.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "duplicate object key {key:?}"
                )));
            }
            object.insert(key, value);
            match map.next_key::<String>()? {
                Some(next) => key = next,
                None => return Ok(Value::Object(object)),
            }
        }
    }
}

/// Accepts only the owned `String` through which serde_json passes a number's
/// text; an object member's value (borrowed or escaped string, or any other JSON
/// type) is refused, which is what exposes a forged number object.
struct NumberText;

impl<'de> DeserializeSeed<'de> for NumberText {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Visitor<'_> for NumberText {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a number (the object key {NUMBER_TOKEN:?} is reserved)")
    }

    fn visit_string<E>(self, v: String) -> Result<String, E> {
        Ok(v)
    }

    // Borrowed and escaped strings are how an object member's value arrives, so
    // reaching here means the reserved key was written in the input.
    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Err(E::invalid_type(de::Unexpected::Str(v), &self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_numbers_keep_their_digits() {
        // serde_json keeps the digits verbatim but normalizes the exponent marker
        // to `e+`/`e-`; the value, which is all the exactness check looks at, is kept.
        let v = parse_strict(r#"[4.50, 1E30, -0, 9007199254740993]"#).unwrap();
        let lits: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_number().unwrap().as_str())
            .collect();
        assert_eq!(lits, ["4.50", "1e+30", "-0", "9007199254740993"]);
    }

    #[test]
    fn test_forged_number_object_is_refused() {
        for text in [
            r#"{"$serde_json::private::Number": "1"}"#,
            r#"{"$serde_json::private::Number": "1", "a": 2}"#,
            r#"{"\u0024serde_json::private::Number": "1"}"#,
            r#"{"a": 1, "$serde_json::private::Number": "1"}"#,
            r#"{"$serde_json::private::Number": 1}"#,
        ] {
            match parse_strict(text) {
                Err(CoreError::InvalidJson(msg)) => assert!(msg.contains("reserved"), "{msg}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn test_duplicate_keys_are_refused() {
        match parse_strict(r#"{"to": "a@example.com", "to": "b@example.com"}"#) {
            Err(CoreError::InvalidJson(msg)) => {
                assert!(msg.contains("duplicate object key \"to\""))
            }
            other => panic!("{other:?}"),
        }
        // The same key at different levels is fine.
        assert!(parse_strict(r#"{"a": {"a": 1}}"#).is_ok());
    }

    #[test]
    fn test_depth_limit_counts_containers() {
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(parse_strict(&ok).is_ok());
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(
            parse_strict(&deep),
            Err(CoreError::TooDeep { limit: MAX_DEPTH })
        );
        let deep_obj = r#"{"a":"#.repeat(MAX_DEPTH) + "{}" + &"}".repeat(MAX_DEPTH);
        assert_eq!(
            parse_strict(&deep_obj),
            Err(CoreError::TooDeep { limit: MAX_DEPTH })
        );
    }

    #[test]
    fn test_pathological_depth_fails_as_too_deep() {
        // Far past both our limit and serde_json's (128), and unbalanced: it must
        // still be reported as depth, not as a syntax error or a stack overflow.
        let deep = "[".repeat(10_000);
        assert_eq!(
            parse_strict(&deep),
            Err(CoreError::TooDeep { limit: MAX_DEPTH })
        );
    }

    #[test]
    fn test_trailing_garbage_and_lone_surrogates_are_refused() {
        for text in ["{} {}", "[1,]", r#""\ud800""#, "NaN", "01", ""] {
            assert!(
                matches!(parse_strict(text), Err(CoreError::InvalidJson(_))),
                "{text:?}"
            );
        }
    }

    #[test]
    fn test_size_limit() {
        let big = format!("\"{}\"", "a".repeat(MAX_BYTES));
        assert_eq!(
            parse_strict(&big),
            Err(CoreError::TooLarge { limit: MAX_BYTES })
        );
        let fits = format!("\"{}\"", "a".repeat(MAX_BYTES - 2));
        assert!(parse_strict(&fits).is_ok());
    }
}

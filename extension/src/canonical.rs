//! The public hashing surface: RFC 8785 canonical JSON and params_hash.
//!
//! Both take the jsonb's text (see `jsonb_text`) so keyturn-core can reject, with
//! 22023, what JCS cannot represent exactly (9007199254740993 and friends),
//! documents nested too deeply, and documents too large.

use keyturn_core::canonical;
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::Value;

use crate::error::OrRaise;
use crate::jsonb_text::JsonbText;

/// The RFC 8785 text that keyturn hashes.
#[pg_extern(immutable, strict, parallel_safe)]
fn canonical_json(j: JsonbText) -> String {
    canonical::canonicalize_str(&j.0).or_raise()
}

/// Lowercase hex SHA-256 of the canonical form of {"params": params, "tool": tool}.
#[pg_extern(immutable, strict, parallel_safe)]
fn params_hash(tool: &str, params: JsonbText) -> String {
    canonical::params_hash_str(tool, &params.0).or_raise()
}

/// The keys of a params object in byte order (as COLLATE "C" sorts them,
/// not RFC 8785's UTF-16 order): what `keyturn.action.param_keys` stores.
/// Rust, not `ARRAY(SELECT … ORDER BY …)`: that was a statement per propose.
#[pg_extern(name = "_param_keys", immutable, strict, parallel_safe)]
fn param_keys(params: JsonbText) -> Vec<String> {
    match canonical::parse_bounded(&params.0).or_raise() {
        Value::Object(members) => {
            let mut keys: Vec<String> = members.into_iter().map(|(k, _)| k).collect();
            keys.sort();
            keys
        }
        _ => Vec::new(),
    }
}

/// An sql tool's form as its statements read it: every value in `where`
/// and `set` replaced by what the database must store for it -- the
/// canonical text of what was hashed (a JSON string; null stays null), or,
/// for a json/jsonb column, the canonical JSON value. `1` and `1.00` hash
/// alike, so they must write alike. `types` maps column names to their types.
#[pg_extern(name = "_form_arg", immutable, strict, parallel_safe)]
fn form_arg(form: JsonbText, types: JsonB) -> JsonB {
    let form = canonical::parse_bounded(&form.0).or_raise();
    // A json or jsonb column, or a domain over one, in whatever spelling the
    // catalog gave it (crate::loose_type).
    let json_column = |c: &str| {
        types
            .0
            .get(c)
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .is_some_and(|t| crate::loose_type::loose(t).kind == crate::loose_type::Kind::Json)
    };
    let mut out = serde_json::Map::new();
    for part in ["where", "set"] {
        let Some(Value::Object(values)) = form.get(part) else {
            continue;
        };
        let mut stored = serde_json::Map::new();
        for (column, v) in values {
            let written = match v {
                _ if json_column(column) => canonical::canonicalize_value(v)
                    .and_then(|text| canonical::parse_bounded(&text))
                    .or_raise(),
                Value::Array(items) if part == "where" => {
                    Value::Array(items.iter().map(text_value).collect())
                }
                _ => text_value(v),
            };
            stored.insert(column.clone(), written);
        }
        out.insert(part.to_owned(), Value::Object(stored));
    }
    JsonB(Value::Object(out))
}

fn text_value(v: &Value) -> Value {
    canonical::scalar_text(v)
        .or_raise()
        .map_or(Value::Null, Value::String)
}

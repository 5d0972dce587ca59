//! The public hashing surface: RFC 8785 canonical JSON and params_hash.
//!
//! Both take the jsonb's text (see `jsonb_text`) so keyturn-core can reject, with
//! 22023, what JCS cannot represent exactly (9007199254740993 and friends),
//! documents nested too deeply, and documents too large.

use keyturn_core::canonical;
use pgrx::prelude::*;

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

/// The text an approved write stores for a jsonb value (keyturn-core
/// `scalar_text`): the canonical form of what was hashed, never the literal
/// the agent sent, so `1` and `1.00` write the same text. NULL for JSON null.
#[pg_extern(name = "_scalar_text", immutable, strict, parallel_safe)]
fn scalar_text(v: JsonbText) -> Option<String> {
    canonical::scalar_text(&canonical::parse_bounded(&v.0).or_raise()).or_raise()
}

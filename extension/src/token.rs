//! One-time approval tokens (docs/sql-api.md).
//!
//! The token itself is returned once and never stored. Two derived values are:
//! `token_digest` (SHA-256) finds the claim, and `token_binding` (HMAC keyed by
//! the token over action id, params hash, expiry and origin) lets approve
//! detect a table writer who changed params and hash together, extended the
//! expiry, or changed the origin, without holding the token.

use keyturn_core::token;
use pgrx::prelude::*;

#[pg_extern(name = "_token_new", volatile, parallel_safe)]
fn token_new() -> String {
    token::new_token()
}

#[pg_extern(name = "_token_digest", immutable, strict, parallel_safe)]
fn token_digest(token: &str) -> Vec<u8> {
    token::token_digest(token).to_vec()
}

#[pg_extern(name = "_token_binding", immutable, strict, parallel_safe)]
fn token_binding_of(
    token: &str,
    action_id: pgrx::Uuid,
    params_hash: &str,
    expires_at: TimestampWithTimeZone,
    origin: pgrx::JsonB,
) -> Vec<u8> {
    token::token_binding(
        token,
        action_id.as_bytes(),
        params_hash,
        expires_at.into_inner(),
        &origin_text(&origin),
    )
}

#[pg_extern(name = "_token_binds", immutable, strict, parallel_safe)]
fn token_binds_of(
    token: &str,
    action_id: pgrx::Uuid,
    params_hash: &str,
    expires_at: TimestampWithTimeZone,
    origin: pgrx::JsonB,
    stored: &[u8],
) -> bool {
    token::verify_binding(
        token,
        action_id.as_bytes(),
        params_hash,
        expires_at.into_inner(),
        &origin_text(&origin),
        stored,
    )
}

/// 0.2.0's `_token_binding` and `_token_binds`, by their symbols and
/// arguments: a 0.2.0 database runs this library from its installation until
/// `ALTER EXTENSION pg_keyturn UPDATE`, and its functions call these. The first
/// form of the binding, which 0.3.0 still verifies. No SQL of 0.3.0 names them.
#[pg_extern(sql = false, immutable, strict, parallel_safe)]
fn token_binding(
    token: &str,
    action_id: pgrx::Uuid,
    params_hash: &str,
    expires_at: TimestampWithTimeZone,
) -> Vec<u8> {
    token::first_form_binding(
        token,
        action_id.as_bytes(),
        params_hash,
        expires_at.into_inner(),
    )
    .to_vec()
}

#[pg_extern(sql = false, immutable, strict, parallel_safe)]
fn token_binds(
    token: &str,
    action_id: pgrx::Uuid,
    params_hash: &str,
    expires_at: TimestampWithTimeZone,
    stored: &[u8],
) -> bool {
    let first = token::first_form_binding(
        token,
        action_id.as_bytes(),
        params_hash,
        expires_at.into_inner(),
    );
    token::ct_eq(&first, stored)
}

/// The origin as the binding covers it: its RFC 8785 text, which no
/// rewriting of the stored jsonb changes. An origin keyturn_core cannot
/// canonicalize (propose admits none) binds as its error text, which no
/// admitted origin equals.
fn origin_text(origin: &pgrx::JsonB) -> String {
    keyturn_core::canonical::canonicalize_value(&origin.0).unwrap_or_else(|e| format!("!{e}"))
}

/// Constant-time equality, for comparing token digests.
#[pg_extern(name = "_ct_eq", immutable, strict, parallel_safe)]
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    token::ct_eq(a, b)
}

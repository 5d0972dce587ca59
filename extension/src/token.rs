//! One-time approval tokens (docs/sql-api.md).
//!
//! The token itself is returned once and never stored. Two derived values are:
//! `token_digest` (SHA-256) finds the claim, and `token_binding` (HMAC keyed by
//! the token over action id, params hash and expiry) lets approve detect a table
//! writer who changed params and hash together, or extended the expiry, without
//! holding the token.

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
fn token_binding(
    token: &str,
    action_id: pgrx::Uuid,
    params_hash: &str,
    expires_at: TimestampWithTimeZone,
) -> Vec<u8> {
    token::token_binding(
        token,
        action_id.as_bytes(),
        params_hash,
        expires_at.into_inner(),
    )
    .to_vec()
}

#[pg_extern(name = "_token_binds", immutable, strict, parallel_safe)]
fn token_binds(
    token: &str,
    action_id: pgrx::Uuid,
    params_hash: &str,
    expires_at: TimestampWithTimeZone,
    stored: &[u8],
) -> bool {
    token::verify_binding(
        token,
        action_id.as_bytes(),
        params_hash,
        expires_at.into_inner(),
        stored,
    )
}

/// Constant-time equality, for comparing token digests.
#[pg_extern(name = "_ct_eq", immutable, strict, parallel_safe)]
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    token::ct_eq(a, b)
}

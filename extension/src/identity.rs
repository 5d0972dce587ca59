//! The identity of a call: (tenant, principal, session); docs/sql-api.md,
//! "Identity".
//!
//! `request.jwt.claims` (PostgREST/Supabase), when set to anything but the
//! empty string, is the only source; otherwise the settings `keyturn.tenant`,
//! `keyturn.principal`, `keyturn.session`. The two are never mixed.
//!
//! Identity must be transaction-local. A value set for the whole session
//! (`SET`, `set_config(…, false)`, `PGOPTIONS`, `ALTER ROLE … SET`) stays on
//! the connection after the transaction, and a pooler hands that connection
//! to the next client, who would then read another tenant's rows and propose
//! in its name. Such identity is missing identity unless a superuser set
//! `keyturn.allow_session_identity` for a database whose connections are
//! never shared.
//!
//! A value that would print as another (an embedded NUL, control or
//! invisible characters, surrounding spaces) is missing identity too: `bob\0x`
//! must never pass for `bob`.
//!
//! Anything unusable reads as NULL; the calls that need identity turn NULL
//! into 42501 with the reason from [`problem`]. Written in Rust so that no
//! subtransaction is needed to survive malformed claims: these functions sit
//! inside RLS policies and run once per row.

use std::ffi::CStr;

use keyturn_core::{canonical, text};
use pgrx::prelude::*;
use serde_json::Value;

use crate::guc;

const CLAIMS: &CStr = c"request.jwt.claims";

/// One part of the identity: where it comes from in each source.
#[derive(Clone, Copy)]
struct Part {
    what: &'static str,
    claim_path_setting: &'static CStr,
    default_claim: &'static str,
    setting: &'static CStr,
}

const TENANT: Part = Part {
    what: "tenant",
    claim_path_setting: c"keyturn.claim_tenant",
    default_claim: "tenant_id",
    setting: c"keyturn.tenant",
};
const PRINCIPAL: Part = Part {
    what: "principal",
    claim_path_setting: c"keyturn.claim_principal",
    default_claim: "sub",
    setting: c"keyturn.principal",
};
const SESSION: Part = Part {
    what: "session",
    claim_path_setting: c"keyturn.claim_session",
    default_claim: "session_id",
    setting: c"keyturn.session",
};

/// Why a part of the identity is unusable.
enum Problem {
    /// The setting would outlive the transaction.
    SessionLevel(&'static str),
    Other(String),
}

/// The part's value, or why there is none.
fn read(part: Part) -> Result<String, Problem> {
    let allow_session = guc::ALLOW_SESSION_IDENTITY.get();
    match guc::value(CLAIMS).filter(|c| !c.is_empty()) {
        Some(claims) => {
            if !allow_session && guc::outlives_transaction(CLAIMS) {
                return Err(Problem::SessionLevel("request.jwt.claims"));
            }
            let path = claim_path(part);
            // keyturn-core's strict reader, not serde_json's: with
            // arbitrary_precision, serde_json reads {"$serde_json::private::Number":
            // "123"} as the number 123, and keeps the last of duplicate keys.
            let claim = match canonical::parse_bounded(&claims) {
                Ok(v @ Value::Object(_)) => lookup(&v, &path).cloned(),
                _ => {
                    return Err(Problem::Other(
                        "request.jwt.claims is not one well-formed JSON object".into(),
                    ))
                }
            };
            let value = match claim {
                Some(Value::String(s)) if s.is_empty() => {
                    return Err(Problem::Other(format!(
                        "claim {path} ({}) in request.jwt.claims is empty",
                        part.what
                    )))
                }
                Some(Value::String(s)) => s,
                Some(Value::Number(n)) if guc::CLAIM_NUMBERS.get() => n.to_string(),
                // Supabase and other issuers put numeric ids in their claims;
                // say how to accept them rather than only that they are wrong.
                Some(Value::Number(_)) => {
                    return Err(Problem::Other(format!(
                        "claim {path} ({}) in request.jwt.claims is a number, not a string; a \
                         superuser accepts numbers as identity with keyturn.claim_numbers = on \
                         (ALTER DATABASE ... SET keyturn.claim_numbers = on)",
                        part.what
                    )))
                }
                Some(_) => {
                    return Err(Problem::Other(format!(
                        "claim {path} ({}) in request.jwt.claims is not a string",
                        part.what
                    )))
                }
                None => {
                    return Err(Problem::Other(format!(
                        "claim {path} ({}) is missing from request.jwt.claims",
                        part.what
                    )))
                }
            };
            printable(&value, &format!("claim {path}")).map_err(Problem::Other)
        }
        None => {
            let name = part.setting.to_str().unwrap_or("keyturn identity");
            let value = guc::value(part.setting)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| Problem::Other(format!("{name} is not set")))?;
            if !allow_session && guc::outlives_transaction(part.setting) {
                return Err(Problem::SessionLevel(name));
            }
            printable(&value, name).map_err(Problem::Other)
        }
    }
}

fn claim_path(part: Part) -> String {
    guc::value(part.claim_path_setting)
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| part.default_claim.to_owned())
}

/// `a.b.c` into a JSON object.
fn lookup<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.')
        .try_fold(v, |v, key| v.as_object()?.get(key))
}

/// Refuses values that would print as another value (keyturn-core's
/// `text::prints_as_another`: one rule for identity as asserted and as
/// `add_member` records it).
fn printable(value: &str, what: &str) -> Result<String, String> {
    if text::prints_as_another(value) {
        return Err(format!(
            "{what} holds control, invisible or surrounding space characters, or a form Unicode \
             normalizes (NFKC) to another, so it would print as another identity"
        ));
    }
    Ok(value.to_owned())
}

/// `add_member`'s check of the tenant and principal it records: one that
/// would print as another (22023) could never act, and would read as
/// someone else in every list.
#[pg_extern(name = "_require_identity_text", immutable, strict, parallel_safe)]
fn require_identity_text(value: &str, what: &str) {
    if let Err(why) = printable(value, what) {
        crate::error::KeyturnError::InvalidArgument {
            message: why,
            hint: "Name tenants and principals in their normalized (NFKC) form, without invisible characters.",
        }
        .raise();
    }
}

/// The calling tenant: claim `tenant_id`, else `keyturn.tenant`; NULL if missing.
#[pg_extern(stable, parallel_safe)]
pub fn current_tenant() -> Option<String> {
    read(TENANT).ok()
}

/// The calling principal: claim `sub`, else `keyturn.principal`; NULL if missing.
#[pg_extern(stable, parallel_safe)]
pub fn current_principal() -> Option<String> {
    read(PRINCIPAL).ok()
}

/// The calling session: claim `session_id`, else `keyturn.session`; NULL if missing.
#[pg_extern(stable, parallel_safe)]
pub fn current_session() -> Option<String> {
    read(SESSION).ok()
}

/// Why the call's identity is unusable, or NULL when it is complete: the
/// detail of keyturn's "missing identity" errors.
#[pg_extern(name = "_identity_problem", stable, parallel_safe)]
fn problem() -> Option<String> {
    let mut session_level: Vec<&str> = Vec::new();
    let mut other: Vec<String> = Vec::new();
    for part in [TENANT, PRINCIPAL, SESSION] {
        match read(part) {
            Ok(_) => {}
            Err(Problem::SessionLevel(s)) if !session_level.contains(&s) => session_level.push(s),
            Err(Problem::SessionLevel(_)) => {}
            Err(Problem::Other(o)) => other.push(o),
        }
    }
    if !session_level.is_empty() {
        other.insert(
            0,
            format!(
                "{} set for the whole session (SET, set_config(..., false), PGOPTIONS, \
                 ALTER ROLE/DATABASE ... SET or postgresql.conf), so a pooled connection would \
                 carry it to the next client; identity must be set inside the transaction \
                 (SET LOCAL, or set_config(..., true))",
                if session_level.len() == 1 {
                    format!("{} is", session_level[0])
                } else {
                    format!("{} are", session_level.join(", "))
                }
            ),
        );
    }
    (!other.is_empty()).then(|| other.join("; "))
}

/// The claim that marks a card session's claims ([`card_claims`]).
const CARD_SESSION_CLAIM: &str = "keyturn_card_session";

/// The claims a card session's calls assert (keyturnd sets them as
/// `request.jwt.claims`): the link's person, as [`claims_for`] writes them,
/// marked as a card session's (sql/058_links.sql says why).
#[pg_extern(name = "_card_claims", stable, strict, parallel_safe)]
fn card_claims(tenant: &str, principal: &str, session: &str) -> pgrx::JsonB {
    let pgrx::JsonB(mut claims) = claims_for(None, tenant, principal, session);
    if let Value::Object(map) = &mut claims {
        map.insert(CARD_SESSION_CLAIM.to_owned(), Value::Bool(true));
    }
    pgrx::JsonB(claims)
}

/// Whether the calling transaction asserts a card session's claims, read
/// as identity reads them (keyturn-core's strict parser). Only ever
/// narrows what a call may do, so a JWT that carries the mark itself gains
/// nothing by it.
#[pg_extern(name = "_in_card_session", stable, parallel_safe)]
pub fn in_card_session() -> bool {
    guc::value(CLAIMS)
        .filter(|c| !c.is_empty())
        .and_then(|c| canonical::parse_bounded(&c).ok())
        .is_some_and(|v| v.get(CARD_SESSION_CLAIM) == Some(&Value::Bool(true)))
}

/// The claims that assert (tenant, principal, session) the way this database
/// reads them (`keyturn.claim_*` paths; `a.b` nests), plus `role`: what
/// keyturnd sets as `request.jwt.claims` for a card session, which no JWT
/// carries.
#[pg_extern(name = "_claims_for", stable, parallel_safe)]
fn claims_for(role: Option<&str>, tenant: &str, principal: &str, session: &str) -> pgrx::JsonB {
    let mut claims = serde_json::Map::new();
    if let Some(role) = role {
        claims.insert("role".to_owned(), Value::from(role));
    }
    for (part, value) in [(TENANT, tenant), (PRINCIPAL, principal), (SESSION, session)] {
        let path = claim_path(part);
        let mut keys: Vec<&str> = path.split('.').collect();
        let last = keys.pop().unwrap_or_default();
        let mut node = &mut claims;
        for key in keys {
            let child = node
                .entry(key.to_owned())
                .or_insert_with(|| Value::Object(serde_json::Map::new()));
            if !child.is_object() {
                *child = Value::Object(serde_json::Map::new());
            }
            let Value::Object(map) = child else {
                unreachable!("made an object above")
            };
            node = map;
        }
        node.insert(last.to_owned(), Value::from(value));
    }
    pgrx::JsonB(Value::Object(claims))
}

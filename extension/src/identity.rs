//! The identity of a call: (tenant, principal, session); docs/sql-api.md, "Identity".
//!
//! `request.jwt.claims` (PostgREST/Supabase), when set to anything but the empty
//! string, is the only source; otherwise the GUCs keyturn.tenant/principal/session.
//! The two are never mixed. Anything missing, empty or malformed reads as NULL,
//! and the calls that need identity turn NULL into 42501. Written in Rust so that
//! no subtransaction is needed to survive malformed claims: these functions sit
//! inside RLS policies and run once per row.

use std::ffi::CStr;

use pgrx::prelude::*;
use serde_json::Value;

/// A GUC's current value, or None when it is not set at all.
fn guc(name: &CStr) -> Option<String> {
    // SAFETY: GetConfigOption with missing_ok = true returns NULL or a pointer to
    // the GUC's current string, valid until the GUC changes; we copy it at once.
    unsafe {
        let value = pg_sys::GetConfigOption(name.as_ptr(), true, false);
        if value.is_null() {
            None
        } else {
            Some(CStr::from_ptr(value).to_string_lossy().into_owned())
        }
    }
}

fn identity_part(claim: &str, fallback_guc: &CStr) -> Option<String> {
    match guc(c"request.jwt.claims") {
        Some(claims) if !claims.is_empty() => match serde_json::from_str::<Value>(&claims) {
            Ok(Value::Object(map)) => match map.get(claim) {
                Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
                _ => None,
            },
            _ => None,
        },
        _ => guc(fallback_guc).filter(|s| !s.is_empty()),
    }
}

/// The calling tenant: claim `tenant_id`, else GUC `keyturn.tenant`; NULL if missing.
#[pg_extern(stable, parallel_safe)]
pub fn current_tenant() -> Option<String> {
    identity_part("tenant_id", c"keyturn.tenant")
}

/// The calling principal: claim `sub`, else GUC `keyturn.principal`; NULL if missing.
#[pg_extern(stable, parallel_safe)]
pub fn current_principal() -> Option<String> {
    identity_part("sub", c"keyturn.principal")
}

/// The calling session: claim `session_id`, else GUC `keyturn.session`; NULL if missing.
#[pg_extern(stable, parallel_safe)]
pub fn current_session() -> Option<String> {
    identity_part("session_id", c"keyturn.session")
}

//! Settings: keyturn's own (superuser-only) switches, a look at how long
//! any setting's current value will last, and a setting changed for a
//! stretch of keyturn's own code ([`set_for_now`]).
//!
//! Identity is asserted with settings (`keyturn.tenant`, `request.jwt.claims`,
//! …). A value set for the whole session survives the transaction, and a
//! pooled connection carries it to the next client, who then acts as someone
//! else. [`outlives_transaction`] answers whether a setting's value will still
//! be there after the current transaction ends, from PostgreSQL's own record
//! of it: the GUC stack that `SET LOCAL`, `set_config(…, true)` and function
//! `SET` clauses push, and that the end of the transaction pops.

use std::ffi::{CStr, CString};

use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

/// `keyturn.allow_session_identity`: accept identity set for the whole
/// session. Only for a database whose connections are never shared.
pub static ALLOW_SESSION_IDENTITY: GucSetting<bool> = GucSetting::<bool>::new(false);

/// `keyturn.notify`: send `NOTIFY keyturn_dispatch` when an action becomes
/// due. Off only in benchmarks that measure the polling path.
pub static NOTIFY: GucSetting<bool> = GucSetting::<bool>::new(true);

/// `keyturn.chain_early_release`: a commit that wrote audit events lets its
/// tenants' chains go at its commit record, and its COMMIT returns at the
/// flush (crate::durable). Off: PostgreSQL's own order, the chains held
/// until the flush.
pub static CHAIN_EARLY_RELEASE: GucSetting<bool> = GucSetting::<bool>::new(true);

/// Whether `keyturn.chain_early_release` is on.
pub fn chain_early_release() -> bool {
    CHAIN_EARLY_RELEASE.get()
}

/// Whether `keyturn.notify` is on.
pub fn notify_on() -> bool {
    NOTIFY.get()
}

/// `keyturn.strict_dispatcher_links`: the dispatcher makes a link code only
/// for keyturnd's MCP elicitation (the proposer, in its session, one action,
/// once, while fresh). Off, for anyone who may decide the actions.
pub static STRICT_DISPATCHER_LINKS: GucSetting<bool> = GucSetting::<bool>::new(false);

/// Whether `keyturn.strict_dispatcher_links` is on; asked through the
/// library, so that a value a caller set before it was loaded (a placeholder
/// anyone may set) never counts.
#[pg_extern(name = "_strict_dispatcher_links", stable, parallel_safe)]
fn strict_dispatcher_links() -> bool {
    STRICT_DISPATCHER_LINKS.get()
}

/// `keyturn.claim_numbers`: accept a JSON number as a claim (Supabase and
/// other issuers put numeric ids in JWTs); its text is the identity.
pub static CLAIM_NUMBERS: GucSetting<bool> = GucSetting::<bool>::new(false);

/// `keyturn.claim_tenant`, `keyturn.claim_principal`, `keyturn.claim_session`:
/// the dot paths of the identity inside `request.jwt.claims` (unset: `tenant_id`,
/// `sub`, `session_id`), e.g. `app_metadata.tenant_id` for Supabase.
pub static CLAIM_TENANT: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static CLAIM_PRINCIPAL: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static CLAIM_SESSION: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// Registers keyturn's settings; called once per backend from `_PG_init`.
/// All are superuser-only: a caller who could switch them could leak
/// identity across clients, choose which claim names it, or silence the
/// dispatcher's wake-ups.
pub fn register() {
    GucRegistry::define_bool_guc(
        c"keyturn.allow_session_identity",
        c"Accept keyturn identity set for the whole session (never with a connection pooler).",
        c"By default keyturn refuses identity (request.jwt.claims, keyturn.tenant, keyturn.principal, keyturn.session) whose value outlives the transaction, because a pooled connection would carry it to the next client.",
        &ALLOW_SESSION_IDENTITY,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"keyturn.notify",
        c"Send NOTIFY keyturn_dispatch when an external action becomes due.",
        c"keyturnd also polls; turning this off only delays dispatch. For benchmarks.",
        &NOTIFY,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"keyturn.chain_early_release",
        c"Release a tenant's audit chain at the commit record; COMMIT still returns only once durable.",
        c"On: other sessions may see such a commit up to one WAL flush before it is durable, and one tenant's commits share flushes. Off: the chain is held until the flush, as PostgreSQL holds locks.",
        &CHAIN_EARLY_RELEASE,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"keyturn.strict_dispatcher_links",
        c"Let the dispatcher make a card link code only for keyturnd's MCP elicitation.",
        c"On: the proposer, in the session it proposed in, one action, at most one code, within two minutes of the proposal; so the dispatcher's login alone cannot approve an independent action. Off: a code for anyone who may decide the actions.",
        &STRICT_DISPATCHER_LINKS,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"keyturn.claim_numbers",
        c"Accept JSON numbers as identity claims (their text is the identity).",
        c"",
        &CLAIM_NUMBERS,
        GucContext::Suset,
        GucFlags::default(),
    );
    for (name, setting) in [
        (c"keyturn.claim_tenant", &CLAIM_TENANT),
        (c"keyturn.claim_principal", &CLAIM_PRINCIPAL),
        (c"keyturn.claim_session", &CLAIM_SESSION),
    ] {
        GucRegistry::define_string_guc(
            name,
            c"Dot path of this identity part inside request.jwt.claims.",
            c"Unset: tenant_id, sub and session_id. For Supabase, e.g. app_metadata.tenant_id.",
            setting,
            GucContext::Suset,
            GucFlags::default(),
        );
    }
}

/// A setting's current value, or `None` when it has never been set.
pub fn value(name: &CStr) -> Option<String> {
    // SAFETY: GetConfigOption with missing_ok = true returns NULL or a pointer
    // to the setting's current string, valid until it changes; copied at once.
    unsafe {
        let v = pg_sys::GetConfigOption(name.as_ptr(), true, false);
        (!v.is_null()).then(|| CStr::from_ptr(v).to_string_lossy().into_owned())
    }
}

/// Whether the setting holds a non-empty value that will still be set when
/// the current transaction ends: set with `SET`, `set_config(…, false)`,
/// `PGOPTIONS`, `ALTER ROLE/DATABASE … SET` or postgresql.conf, before this
/// transaction or inside it. A value set only with `SET LOCAL`,
/// `set_config(…, true)` or a function's `SET` clause does not.
pub fn outlives_transaction(name: &CStr) -> bool {
    let Some(gconf) = find(name) else {
        return false;
    };
    // SAFETY: `find` returned a live entry of PostgreSQL's settings table;
    // its stack is a NULL-terminated list of stack entries owned by guc.c,
    // each `prior` of a string setting holding a NUL-terminated string or NULL.
    unsafe {
        let mut entry = (*gconf).stack;
        if entry.is_null() {
            // Untouched in this transaction: what is there now was there before.
            return !current_is_empty(name);
        }
        let mut oldest = entry;
        while !entry.is_null() {
            let state = (*entry).state;
            if state == pg_sys::GucStackState::GUC_SET
                || state == pg_sys::GucStackState::GUC_SET_LOCAL
            {
                // A plain SET in this transaction persists at commit.
                if !current_is_empty(name) || !string_is_empty((*entry).masked.val.stringval) {
                    return true;
                }
            }
            oldest = entry;
            entry = (*entry).prev;
        }
        // The oldest entry saved the value this transaction started with.
        !string_is_empty((*oldest).prior.val.stringval)
    }
}

fn current_is_empty(name: &CStr) -> bool {
    value(name).is_none_or(|v| v.is_empty())
}

/// # Safety
/// `s` is NULL or a NUL-terminated string.
unsafe fn string_is_empty(s: *mut std::ffi::c_char) -> bool {
    // SAFETY: the caller guarantees a non-NULL `s` points at a C string.
    s.is_null() || unsafe { *s == 0 }
}

/// PostgreSQL's entry for a setting (a real one or a placeholder), if any.
#[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15"))]
fn find(name: &CStr) -> Option<*mut pg_sys::config_generic> {
    // SAFETY: guc.c keeps `guc_variables` sorted by guc_name_compare (ASCII
    // case-insensitive) for its own binary search; we search it the same way
    // and only read.
    unsafe {
        let vars = pg_sys::get_guc_variables();
        let n = usize::try_from(pg_sys::GetNumConfigOptions()).ok()?;
        if vars.is_null() || n == 0 {
            return None;
        }
        let vars = std::slice::from_raw_parts(vars, n);
        let wanted = name.to_bytes();
        vars.binary_search_by(|&g| {
            let have = CStr::from_ptr((*g).name).to_bytes();
            guc_name_cmp(have, wanted)
        })
        .ok()
        .map(|i| vars[i])
    }
}

#[cfg(not(any(feature = "pg13", feature = "pg14", feature = "pg15")))]
fn find(name: &CStr) -> Option<*mut pg_sys::config_generic> {
    // SAFETY: find_option without creating placeholders and without raising
    // (skip_errors) only looks the name up.
    let g = unsafe { pg_sys::find_option(name.as_ptr(), false, true, pg_sys::ERROR as i32) };
    (!g.is_null()).then_some(g)
}

/// guc.c's `guc_name_compare`: ASCII case-insensitive, byte by byte.
#[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15"))]
fn guc_name_cmp(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    a.iter()
        .map(u8::to_ascii_lowercase)
        .cmp(b.iter().map(u8::to_ascii_lowercase))
}

/// Sets `name` to `value` at a new GUC nest level, as a function's SET
/// clause does; [`restore`] with the level it returns puts the old value
/// back. An error before then leaves it to the (sub)transaction's abort,
/// which pops every level.
pub fn set_for_now(name: &CStr, value: &CStr) -> i32 {
    // SAFETY: the calls PostgreSQL makes for a SET clause; the names and
    // values are NUL-terminated and outlive the call.
    unsafe {
        let level = pg_sys::NewGUCNestLevel();
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            PgLogLevel::ERROR as i32,
            false,
        );
        level
    }
}

/// Pops the nest level [`set_for_now`] pushed, restoring what it saved.
pub fn restore(level: i32) {
    // SAFETY: pops a level set_for_now pushed (and any above it).
    unsafe { pg_sys::AtEOXact_GUC(true, level) }
}

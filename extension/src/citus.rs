//! Whether Citus is here, and identity that reaches Citus workers
//! (docs/scale-out.md, "Identity on the workers").
//!
//! On a distributed table, the business statement keyturn runs as the caller
//! executes on the workers, in Citus's own connections, where row-level
//! security calls `keyturn.current_tenant()` (or reads `request.jwt.claims`)
//! in a backend that sees only what Citus sent it: `SET LOCAL` statements,
//! and only while `citus.propagate_set_commands = 'local'`. A value set with
//! `set_config(…, true)`, the way PostgREST asserts its claims, never gets
//! there, nor does any `SET LOCAL` under Citus's default `'none'`. The worker
//! would then see no tenant at all.
//!
//! So, when Citus runs in this database, keyturn re-asserts the identity it
//! resolved before each business statement, as `SET LOCAL` statements with
//! propagation switched on for exactly those statements, and afterwards puts
//! back the `keyturn.*` values it changed (also propagated), so the caller's
//! transaction reads the settings it had. Without Citus this is one settings
//! lookup per statement and nothing else: the extension never depends on
//! Citus.

use std::ffi::{CStr, CString};

use pgrx::prelude::*;

use crate::error::KeyturnError;
use crate::{guc, identity};

const PROPAGATE: &CStr = c"citus.propagate_set_commands";
const CLAIMS: &CStr = c"request.jwt.claims";

/// What [`assert_identity`] changed, to be put back by [`restore`].
pub struct Asserted {
    settings: Vec<(&'static str, String)>,
    propagate: Option<String>,
}

/// Whether the Citus extension exists in this database: the test in front
/// of every read of Citus's catalog (sql/012_citus_catalog.sql). In Rust
/// because approve and begin_dispatch ask it once per action: as an SQL
/// function it was planned on every call, 20 µs each
/// (tests/bench/BENCHMARKS.md).
#[pg_extern(name = "_citus_present", stable, strict, parallel_safe)]
fn citus_present() -> bool {
    // SAFETY: a catalog lookup that returns InvalidOid when missing.
    unsafe { pg_sys::get_extension_oid(c"citus".as_ptr(), true) != pg_sys::Oid::INVALID }
}

/// Whether the Citus library is loaded in this backend (its settings are
/// real, not placeholders) and the extension exists in this database.
fn active() -> bool {
    // SAFETY: both calls only look the names up (missing_ok = true).
    let loaded = unsafe {
        !pg_sys::GetConfigOption(PROPAGATE.as_ptr(), true, false).is_null()
            && (pg_sys::GetConfigOptionFlags(PROPAGATE.as_ptr(), true)
                & pg_sys::GUC_CUSTOM_PLACEHOLDER as i32)
                == 0
    };
    loaded && citus_present()
}

fn literal(value: &str) -> String {
    let Ok(c) = CString::new(value) else {
        // Identity with a NUL never resolves (identity.rs refuses it).
        return "''".into();
    };
    // SAFETY: quote_literal_cstr reads a NUL-terminated string and returns a
    // palloc'd one, copied at once.
    unsafe {
        let quoted = pg_sys::quote_literal_cstr(c.as_ptr());
        let out = CStr::from_ptr(quoted).to_string_lossy().into_owned();
        pg_sys::pfree(quoted.cast());
        out
    }
}

/// `SET LOCAL`, through the utility hook (so Citus sees and propagates it).
fn set_local(name: &str, value: &str) {
    if let Err(e) = Spi::run(&format!("SET LOCAL {name} = {}", literal(value))) {
        KeyturnError::NotReady(format!(
            "could not re-assert {name} for the Citus workers ({e}); nothing was written, the \
             call can be repeated"
        ))
        .raise();
    }
}

fn set_propagate(value: &str) {
    if let Err(e) = Spi::run_with_args(
        "SELECT pg_catalog.set_config('citus.propagate_set_commands', $1, true)",
        &[value.into()],
    ) {
        KeyturnError::NotReady(format!(
            "could not set citus.propagate_set_commands ({e}); nothing was written, the call can \
             be repeated"
        ))
        .raise();
    }
}

/// Before a business statement: the resolved identity (and the claims, for
/// policies that read them), as propagated `SET LOCAL`s. `None` without Citus.
pub fn assert_identity() -> Option<Asserted> {
    if !active() {
        return None;
    }
    let parts = [
        ("keyturn.tenant", identity::current_tenant()),
        ("keyturn.principal", identity::current_principal()),
        ("keyturn.session", identity::current_session()),
    ];
    let claims = guc::value(CLAIMS).filter(|c| !c.is_empty());
    let propagate = guc::value(PROPAGATE).filter(|v| v != "local");
    if propagate.is_some() {
        set_propagate("local");
    }
    let mut settings = Vec::new();
    for (name, value) in parts {
        let Some(value) = value else { continue };
        let setting = CString::new(name).unwrap_or_default();
        let before = guc::value(&setting).unwrap_or_default();
        set_local(name, &value);
        if before != value {
            settings.push((name, before));
        }
    }
    if let Some(claims) = claims {
        set_local("request.jwt.claims", &claims);
    }
    Some(Asserted {
        settings,
        propagate,
    })
}

/// After the statement: the `keyturn.*` values the caller had, and
/// propagation as it was.
pub fn restore(asserted: Option<Asserted>) {
    let Some(asserted) = asserted else { return };
    for (name, before) in &asserted.settings {
        set_local(name, before);
    }
    if let Some(propagate) = asserted.propagate {
        set_propagate(&propagate);
    }
}

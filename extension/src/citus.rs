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
/// of every read of Citus's catalog (sql/012_citus_catalog.sql), answered by
/// that catalog itself, `pg_catalog.pg_dist_partition`, which CREATE
/// EXTENSION citus makes and DROP EXTENSION drops. In Rust because approve
/// and begin_dispatch ask it once per action: as an SQL function it was
/// planned on every call, 20 µs each; and a syscache lookup, where
/// `get_extension_oid` scans `pg_extension` (tests/bench/BENCHMARKS.md).
#[pg_extern(name = "_citus_present", stable, strict, parallel_safe)]
fn citus_present() -> bool {
    // SAFETY: a syscache lookup that returns InvalidOid when missing.
    unsafe {
        pg_sys::get_relname_relid(
            c"pg_dist_partition".as_ptr(),
            pg_sys::PG_CATALOG_NAMESPACE.into(),
        ) != pg_sys::Oid::INVALID
    }
}

/// Whether the Citus library is loaded in this backend (its settings are
/// real, not placeholders) and the extension exists in this database.
pub fn active() -> bool {
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

/// For the statements keyturn runs at COMMIT/PREPARE (crate::committed's
/// check of the tool and the principal's authorization epoch,
/// crate::audit's chain write) on a Citus worker, in layout B: a delegated
/// `_for` call's transaction commits after the call has ended, in a backend
/// Citus opened, and Citus then refuses every query on a distributed table
/// ("cannot execute a distributed query from a query on a shard"), even one
/// of a local shard, since it cannot tell it from a nested task. When, and
/// only when, that is the case (Citus here, a Citus-internal backend: the
/// only kind it refuses this in) and `table`'s shard that holds `tenant` is
/// on this node (so a statement on it that names the tenant is
/// single-shard and local; keyturn's tenant tables are colocated), this
/// turns on `citus.allow_nested_distributed_execution` at a GUC nest level
/// of its own and returns that level, which [`end_local`] pops right after
/// the caller's statements for that tenant: nothing else runs with it. A
/// tenant whose shard is elsewhere gets nothing, and Citus refuses as
/// before. Without Citus, or in a client's own backend (where Citus allows
/// these statements anyway), it returns None before any query, so a single
/// node is unchanged.
pub fn begin_local(table: &str, tenant: &str) -> Option<i32> {
    if !internal_backend() || !active() {
        return None;
    }
    let here = crate::committed::on_latest(
        "SELECT keyturn._citus_shard_here($1::pg_catalog.regclass, $2)::pg_catalog.text",
        &[Some(table.to_owned()), Some(tenant.to_owned())],
        &[pg_sys::TEXTOID, pg_sys::TEXTOID],
        true,
    );
    if here.as_deref() != Some("true") {
        return None;
    }
    Some(crate::guc::set_for_now(
        c"citus.allow_nested_distributed_execution",
        c"on",
    ))
}

/// Puts `citus.allow_nested_distributed_execution` back as it was before
/// [`begin_local`].
pub fn end_local(level: Option<i32>) {
    if let Some(level) = level {
        crate::guc::restore(level);
    }
}

/// Whether Citus opened this backend (its connections' application_name,
/// "citus_internal gpid=…", which Citus's own IsCitusInternalBackend reads):
/// the only backends where it refuses a query on a distributed table made
/// outside a delegated call. Any client may claim that name, so it decides
/// nothing a client could not do itself: [`begin_local`] turns on a setting
/// every role may set (docs/security.md row 88).
pub(crate) fn internal_backend() -> bool {
    guc::value(c"application_name").is_some_and(|a| a.starts_with("citus_internal gpid="))
}

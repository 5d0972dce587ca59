//! `keyturn._exec_as(role, query, arg)`: the one door from the extension owner
//! back to the caller's privileges.
//!
//! The gate's plpgsql runs as the extension owner, which bypasses RLS. Business
//! reads (resolving targets, previews) and the business UPDATE must instead run
//! as the approving/proposing role, under its RLS. EXECUTE is revoked from
//! PUBLIC: only the owner (a superuser) can call this, and only keyturn's own
//! code does, with statements it built from registered column names.

use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::Value;

use crate::citus;
use crate::plans;
use crate::privilege::{refuse_rls_bypass, RoleSwitch};

/// Runs `query` (one jsonb parameter, `$1`; first column jsonb) as `role` and
/// returns the first column of every row as a jsonb array.
#[pg_extern(name = "_exec_as", volatile, strict, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn exec_as(role: pg_sys::Oid, query: &str, arg: JsonB) -> JsonB {
    refuse_rls_bypass(role);
    // Before the switch: SET is refused inside a security-restricted operation.
    let asserted = citus::assert_identity();
    let rows = {
        let _as_caller = RoleSwitch::to_caller(role);
        Spi::connect_mut(|client| -> Result<Vec<Value>, pgrx::spi::Error> {
            let table = plans::execute(client, query, &[pg_sys::JSONBOID], &[arg.into()])?;
            let mut rows = Vec::with_capacity(table.len());
            for row in table {
                rows.push(row.get::<JsonB>(1)?.map_or(Value::Null, |j| j.0));
            }
            Ok(rows)
        })
    };
    citus::restore(asserted);
    match rows {
        Ok(rows) => JsonB(Value::Array(rows)),
        Err(e) => error!("keyturn: internal statement failed: {e}"),
    }
}

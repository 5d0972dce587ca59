//! `keyturn._exec_as(role, query, arg)`: the one door from the extension owner
//! back to the caller's privileges.
//!
//! The gate's plpgsql runs as the extension owner, which bypasses RLS. Business
//! reads (resolving targets, previews) and the business UPDATE must instead run
//! as the approving/proposing role, under its RLS. EXECUTE is revoked from
//! PUBLIC: only the owner (a superuser) can call this, and only keyturn's own
//! code does, with statements it built from registered column names.

use pgrx::prelude::*;

use crate::citus;
use crate::jsonb_text::RawJsonb;
use crate::plans;
use crate::privilege::{refuse_rls_bypass, RoleSwitch};

/// Runs `query` (one jsonb parameter, `$1`; first column jsonb) as `role` and
/// returns the first column of every row as a jsonb array. The documents are
/// an application's, of any depth and shape: they are joined as PostgreSQL
/// prints them and read back by PostgreSQL, never parsed here.
#[pg_extern(name = "_exec_as", volatile, strict, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn exec_as(role: pg_sys::Oid, query: &str, arg: RawJsonb) -> RawJsonb {
    refuse_rls_bypass(role);
    // Before the switch: SET is refused inside a security-restricted operation.
    let asserted = citus::assert_identity();
    let rows = {
        let _as_caller = RoleSwitch::to_caller(role);
        Spi::connect_mut(|client| -> Result<String, pgrx::spi::Error> {
            let table = plans::execute(client, query, &[pg_sys::JSONBOID], &[arg.into()])?;
            let mut rows = String::from("[");
            for row in table {
                if rows.len() > 1 {
                    rows.push(',');
                }
                match row.get::<RawJsonb>(1)? {
                    Some(value) => rows.push_str(&value.text()),
                    None => rows.push_str("null"),
                }
            }
            rows.push(']');
            Ok(rows)
        })
    };
    citus::restore(asserted);
    match rows {
        Ok(rows) => RawJsonb::parse(&rows),
        Err(e) => error!("keyturn: internal statement failed: {e}"),
    }
}

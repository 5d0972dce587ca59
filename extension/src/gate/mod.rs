//! The gate's SQL entry points that act for a person or an agent: propose
//! (`agent`), and approve, the ceremony around it, standing approvals and
//! task requests (`human`).
//!
//! Each is SECURITY INVOKER so that `current_user` is the real caller. It checks
//! what only the caller's own context can tell (separation of duties), then runs
//! the state machine (sql/05x_*.sql) as the extension owner, passing the caller's
//! role so business reads and writes can switch back to it (see `privilege`).
//! search_path is pinned: these statements run as a superuser, and a caller's
//! schema must never shadow a type or function in them.

// pg_extern reads a function's return type from its syntax, so the table
// types of these entry points are spelled out, never aliased.
#![allow(clippy::type_complexity)]

mod agent;
mod human;

use pgrx::datum::DatumWithOid;
use pgrx::fn_call::{fn_call, Arg, FnCallArg, FnCallError};
use pgrx::prelude::*;
use pgrx::spi::{SpiHeapTupleData, SpiResult};

use crate::error::KeyturnError;
use crate::identity::current_tenant;
use crate::plans;
use crate::privilege::{current_user, extension_owner, RoleSwitch};
use crate::route_guard::require_tenant;

/// The tenant-explicit entry points (`propose_for`, `approve_for`) name the
/// tenant so that Citus can send the whole call to the worker that holds it
/// (docs/scale-out.md, layout B); the name must be the caller's own tenant,
/// or the call is refused (42501; none at all: 22023, [`require_tenant`])
/// before anything is read. It routes, it never decides: identity stays
/// what the transaction asserted.
fn refuse_other_tenant(what: &str, tenant: Option<&str>) {
    let tenant = require_tenant(what, tenant);
    let own = current_tenant();
    if own.as_deref() != Some(tenant) {
        KeyturnError::Forbidden {
            message: format!(
                "{what} names tenant {tenant}, which is not the caller's ({})",
                own.as_deref().unwrap_or("no tenant")
            ),
            hint: "Pass the tenant of the identity the transaction asserted. On Citus, assert it with SET LOCAL and citus.propagate_set_commands = 'local', so that it reaches the worker (docs/scale-out.md).",
        }
        .raise();
    }
}

/// [`refuse_other_tenant`] for the tenant-explicit calls written in SQL
/// (`end_session_for`, `cancel_origin_for`, `archive_conversation_for`):
/// one rule, one place. Raises 42501; returns nothing.
#[pg_extern(name = "_refuse_other_tenant", stable, parallel_safe)]
fn refuse_other_tenant_sql(what: &str, tenant: Option<&str>) {
    refuse_other_tenant(what, tenant);
}

/// Runs one of the state machine's statements as the extension owner, with
/// the caller's role as `$1`, and reads every row it returns. `types` and
/// `args` are the statement's other parameters (`$2`…); jsonb arguments
/// travel as text (see `jsonb_text`) and the statement casts them back.
fn as_owner<R>(
    sql: &str,
    types: &[pg_sys::Oid],
    args: Vec<DatumWithOid<'_>>,
    mut read: impl FnMut(&SpiHeapTupleData<'_>) -> SpiResult<R>,
) -> Vec<R> {
    let caller = current_user();
    let _as_owner = RoleSwitch::to(extension_owner());
    let mut all_types = Vec::with_capacity(types.len() + 1);
    all_types.push(pg_sys::OIDOID);
    all_types.extend_from_slice(types);
    let mut all_args = Vec::with_capacity(args.len() + 1);
    all_args.push(caller.into());
    all_args.extend(args);
    Spi::connect_mut(|client| -> SpiResult<Vec<R>> {
        let table = plans::execute(client, sql, &all_types, &all_args)?;
        let mut rows = Vec::with_capacity(table.len());
        for row in table {
            rows.push(read(&row)?);
        }
        Ok(rows)
    })
    .unwrap_or_else(|e| error!("keyturn: internal statement failed: {e}"))
}

/// Calls one of the state machine's steps that returns one row as a
/// composite (`keyturn._outcome`, `keyturn._proposed`) as the extension
/// owner, with the caller's role as its first argument, through the function
/// manager: unlike `as_owner`'s `SELECT * FROM …`, no statement for the
/// executor to start and end, and no tuplestore. The function is looked up
/// by name and argument types at each call (a syscache probe), so an
/// extension upgrade that recreates it is never called by a stale OID.
/// `read` takes the row's columns by number.
///
/// None when the function is the previous version's, which returned a
/// table (0.2.0's SQL, until `ALTER EXTENSION UPDATE` runs): the caller then
/// runs it with `as_owner`, as that version did.
fn call_as_owner<R>(
    function: &str,
    args: &[&dyn FnCallArg],
    read: impl FnOnce(&dyn Fn(usize) -> (pg_sys::Datum, bool)) -> R,
) -> Option<R> {
    let caller = Arg::Value(current_user());
    let _as_owner = RoleSwitch::to(extension_owner());
    let mut all: Vec<&dyn FnCallArg> = Vec::with_capacity(args.len() + 1);
    all.push(&caller);
    all.extend_from_slice(args);
    let row = match fn_call::<Composite>(function, &all) {
        Ok(Some(row)) => row,
        Ok(None) => error!("keyturn: internal call of {function} returned NULL"),
        Err(FnCallError::UnsupportedArgumentModes) => return None,
        Err(e) => error!("keyturn: internal call of {function} failed: {e}"),
    };
    // SAFETY: the datum is the composite the function returned (fn_call
    // checked its return type is one); plpgsql may hand back an expanded
    // record, which detoasting flattens once, here.
    let header = unsafe { pg_sys::pg_detoast_datum(row.0.cast_mut_ptr()) };
    Some(read(&|column| {
        let mut null = false;
        // SAFETY: a flat composite datum; GetAttributeByNum reads a column
        // of it by its type's descriptor.
        let datum = unsafe {
            pg_sys::GetAttributeByNum(
                header.cast(),
                i16::try_from(column).unwrap_or(i16::MAX),
                &mut null,
            )
        };
        (datum, null)
    }))
}

/// A composite datum as a function returned it, read with
/// GetAttributeByNum; fn_call accepts it for any composite return type.
struct Composite(pg_sys::Datum);

impl FromDatum for Composite {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        (!is_null).then_some(Composite(datum))
    }
}

impl IntoDatum for Composite {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::RECORDOID
    }

    fn is_compatible_with(other: pg_sys::Oid) -> bool {
        // SAFETY: a type cache lookup of a type OID from pg_proc.
        other == pg_sys::RECORDOID || unsafe { pg_sys::type_is_rowtype(other) }
    }
}

/// A column of `call_as_owner`'s row.
fn column<T: FromDatum>(value: (pg_sys::Datum, bool)) -> Option<T> {
    // SAFETY: the column's type is the one the caller names for it (the
    // composite type's declaration in sql/005_status.sql).
    unsafe { T::from_datum(value.0, value.1) }
}

/// A column of `call_as_owner`'s row that the state machine never leaves NULL.
fn required_column<T: FromDatum>(value: (pg_sys::Datum, bool)) -> T {
    column(value)
        .unwrap_or_else(|| error!("keyturn: internal call returned NULL in a required column"))
}

/// An argument for `call_as_owner`: SQL NULL for None.
fn nullable<T: IntoDatum + Clone>(value: Option<T>) -> Arg<T> {
    value.map_or(Arg::Null, Arg::Value)
}

/// A column the state machine never leaves NULL.
fn required<T: IntoDatum + FromDatum>(row: &SpiHeapTupleData<'_>, ordinal: usize) -> SpiResult<T> {
    Ok(row
        .get::<T>(ordinal)?
        .unwrap_or_else(|| error!("keyturn: internal statement returned NULL in column {ordinal}")))
}

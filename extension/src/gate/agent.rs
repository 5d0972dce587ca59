//! The agent's entry point: propose, and `propose_for`, the same call with
//! the tenant named so that Citus can route it.

use pgrx::prelude::*;

use super::{
    as_owner, call_as_owner, column, nullable, refuse_other_tenant, required, required_column,
};
use crate::jsonb_text::{JsonbText, RawJsonb};
use crate::privilege::refuse_inside_business_statement;

/// Agent: stores an immutable proposal and returns its one-time token. A
/// standing approval that covers it, or (task tools) the person's recorded
/// request, approves it in the same call: `status` says what came of it.
/// `token` is NULL when a task request's replay returns the action it
/// already admitted.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn propose(
    tool: Option<String>,
    params: Option<JsonbText>,
    origin: default!(Option<JsonbText>, "'{}'"),
) -> TableIterator<
    'static,
    (
        name!(action_id, pgrx::Uuid),
        name!(token, Option<String>),
        name!(summary, String),
        name!(params_hash, String),
        name!(expires_at, TimestampWithTimeZone),
        name!(status, String),
        name!(delegation_id, Option<pgrx::Uuid>),
    ),
> {
    refuse_inside_business_statement("propose");
    let raw = |j: &Option<JsonbText>| j.as_ref().map(|j| RawJsonb::parse(&j.0));
    call_as_owner(
        "keyturn._propose",
        &[
            &nullable(tool.clone()),
            &nullable(raw(&params)),
            &nullable(raw(&origin)),
        ],
        |col| {
            TableIterator::once((
                required_column(col(1)),
                column(col(2)),
                required_column(col(3)),
                required_column(col(4)),
                required_column(col(5)),
                required_column(col(6)),
                column(col(7)),
            ))
        },
    )
    .unwrap_or_else(|| {
        TableIterator::new(as_owner(
            "SELECT * FROM keyturn._propose($1, $2, $3::pg_catalog.jsonb, $4::pg_catalog.jsonb)",
            &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
            vec![
                tool.into(),
                params.map(|p| p.0).into(),
                origin.map(|o| o.0).into(),
            ],
            |row| {
                Ok((
                    required(row, 1)?,
                    row.get(2)?,
                    required(row, 3)?,
                    required(row, 4)?,
                    required(row, 5)?,
                    required(row, 6)?,
                    row.get(7)?,
                ))
            },
        ))
    })
}

/// Agent: `propose` for the tenant named, which must be the caller's own
/// (42501): the form Citus can delegate, whole, to the worker that holds the
/// tenant's rows (docs/scale-out.md, layout B).
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn propose_for(
    tenant: Option<String>,
    tool: Option<String>,
    params: Option<JsonbText>,
    origin: default!(Option<JsonbText>, "'{}'"),
) -> TableIterator<
    'static,
    (
        name!(action_id, pgrx::Uuid),
        name!(token, Option<String>),
        name!(summary, String),
        name!(params_hash, String),
        name!(expires_at, TimestampWithTimeZone),
        name!(status, String),
        name!(delegation_id, Option<pgrx::Uuid>),
    ),
> {
    refuse_other_tenant("propose_for", tenant.as_deref());
    propose(tool, params, origin)
}

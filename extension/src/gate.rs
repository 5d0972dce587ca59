//! The gate's SQL entry points: propose, approve, preview, reject.
//!
//! Each is SECURITY INVOKER so that `current_user` is the real caller. It checks
//! what only the caller's own context can tell (separation of duties), then runs
//! the state machine (sql/05x_*.sql) as the extension owner, passing the caller's
//! role so business reads and writes can switch back to it (see `privilege`).
//! search_path is pinned: these statements run as a superuser, and a caller's
//! schema must never shadow a type or function in them.

use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::Value;

use crate::jsonb_text::JsonbText;
use crate::plans;
use crate::privilege::{
    current_user, extension_owner, refuse_agents, refuse_inside_business_statement, RoleSwitch,
};

// The state machine's entry points, run as the extension owner. The jsonb
// arguments travel as text (see `jsonb_text`) and are cast back here.
const PROPOSE: &str =
    "SELECT * FROM keyturn._propose($1, $2, $3::pg_catalog.jsonb, $4::pg_catalog.jsonb)";
const APPROVE: &str = "SELECT * FROM keyturn._approve($1, $2, $3, $4::pg_catalog.jsonb)";
const PREVIEW: &str = "SELECT keyturn._preview($1, $2, $3)";
const REJECT: &str = "SELECT keyturn._reject($1, $2, $3, $4)";

fn spi_failed(e: pgrx::spi::Error) -> ! {
    error!("keyturn: internal statement failed: {e}")
}

/// Agent: stores an immutable proposal and returns its one-time token.
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
        name!(token, String),
        name!(summary, String),
        name!(params_hash, String),
        name!(expires_at, TimestampWithTimeZone),
    ),
> {
    refuse_inside_business_statement("propose");
    let caller = current_user();
    let _as_owner = RoleSwitch::to(extension_owner());
    let rows = Spi::connect_mut(|client| -> Result<Vec<_>, pgrx::spi::Error> {
        let table = plans::execute(
            client,
            PROPOSE,
            &[
                pg_sys::OIDOID,
                pg_sys::TEXTOID,
                pg_sys::TEXTOID,
                pg_sys::TEXTOID,
            ],
            &[
                caller.into(),
                tool.into(),
                params.map(|p| p.0).into(),
                origin.map(|o| o.0).into(),
            ],
        )?;
        let mut rows = Vec::with_capacity(1);
        for row in table {
            rows.push((
                row.get::<pgrx::Uuid>(1)?.expect("action_id is never NULL"),
                row.get::<String>(2)?.expect("token is never NULL"),
                row.get::<String>(3)?.expect("summary is never NULL"),
                row.get::<String>(4)?.expect("params_hash is never NULL"),
                row.get::<TimestampWithTimeZone>(5)?
                    .expect("expires_at is never NULL"),
            ));
        }
        Ok(rows)
    })
    .unwrap_or_else(|e| spi_failed(e));
    TableIterator::new(rows)
}

/// Human: approves exactly what was proposed, once.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn approve(
    action_id: Option<pgrx::Uuid>,
    token: Option<String>,
    params: default!(Option<JsonbText>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(action_id, pgrx::Uuid),
        name!(status, String),
        name!(result, Option<JsonB>),
    ),
> {
    refuse_agents("approve");
    let caller = current_user();
    let _as_owner = RoleSwitch::to(extension_owner());
    let rows = Spi::connect_mut(|client| -> Result<Vec<_>, pgrx::spi::Error> {
        let table = client.update(
            APPROVE,
            None,
            &[
                caller.into(),
                action_id.into(),
                token.into(),
                params.map(|p| p.0).into(),
            ],
        )?;
        let mut rows = Vec::with_capacity(1);
        for row in table {
            rows.push((
                row.get::<pgrx::Uuid>(1)?.expect("action_id is never NULL"),
                row.get::<String>(2)?.expect("status is never NULL"),
                row.get::<JsonB>(3)?,
            ));
        }
        Ok(rows)
    })
    .unwrap_or_else(|e| spi_failed(e));
    TableIterator::new(rows)
}

/// Human: the approval card's data. Read-only.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn preview(action_id: Option<pgrx::Uuid>, token: Option<String>) -> JsonB {
    refuse_agents("preview");
    let caller = current_user();
    let _as_owner = RoleSwitch::to(extension_owner());
    let card = Spi::connect_mut(|client| {
        plans::execute(
            client,
            PREVIEW,
            &[pg_sys::OIDOID, pg_sys::UUIDOID, pg_sys::TEXTOID],
            &[caller.into(), action_id.into(), token.into()],
        )?
        .first()
        .get_one::<JsonB>()
    })
    .unwrap_or_else(|e| spi_failed(e));
    card.unwrap_or(JsonB(Value::Null))
}

/// Human: declines a pending proposal; returns the action's status.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn reject(
    action_id: Option<pgrx::Uuid>,
    token: Option<String>,
    reason: default!(Option<String>, "NULL"),
) -> String {
    refuse_agents("reject");
    let caller = current_user();
    let _as_owner = RoleSwitch::to(extension_owner());
    Spi::connect_mut(|client| {
        plans::execute(
            client,
            REJECT,
            &[
                pg_sys::OIDOID,
                pg_sys::UUIDOID,
                pg_sys::TEXTOID,
                pg_sys::TEXTOID,
            ],
            &[caller.into(), action_id.into(), token.into(), reason.into()],
        )?
        .first()
        .get_one::<String>()
    })
    .unwrap_or_else(|e| spi_failed(e))
    .unwrap_or_default()
}

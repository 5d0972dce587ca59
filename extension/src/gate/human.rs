//! The person's entry points: approve and what surrounds it (preview,
//! reject, the queue, batch approval, edit before approve), standing
//! approvals, and the request that is a task tool's approval. Every one
//! refuses agents first (separation of duties, `privilege::refuse_agents`):
//! a standing approval or a recorded request is an approval too.

use pgrx::prelude::*;

use super::{
    as_owner, call_as_owner, column, nullable, refuse_other_tenant, required, required_column,
};
use crate::jsonb_text::{JsonbText, RawJsonb};
use crate::privilege::refuse_agents;

// (Spelled out in each signature too: pg_extern reads the return type's
// syntax, so an alias there would be an unknown SQL type.)
type Outcomes = TableIterator<
    'static,
    (
        name!(action_id, pgrx::Uuid),
        name!(status, String),
        name!(result, Option<RawJsonb>),
    ),
>;

fn outcomes(
    sql: &str,
    types: &[pg_sys::Oid],
    args: Vec<pgrx::datum::DatumWithOid<'_>>,
) -> Outcomes {
    TableIterator::new(as_owner(sql, types, args, |row| {
        Ok((required(row, 1)?, required(row, 2)?, row.get(3)?))
    }))
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
        name!(result, Option<RawJsonb>),
    ),
> {
    refuse_agents("approve");
    approved(action_id, token, params)
}

/// approve's state machine, for `approve` and `approve_for` once each has
/// refused what it refuses.
fn approved(
    action_id: Option<pgrx::Uuid>,
    token: Option<String>,
    params: Option<JsonbText>,
) -> Outcomes {
    let raw = params.as_ref().map(|p| RawJsonb::parse(&p.0));
    call_as_owner(
        "keyturn._approve",
        &[
            &nullable(action_id),
            &nullable(token.clone()),
            &nullable(raw),
        ],
        |col| {
            TableIterator::once((
                required_column(col(1)),
                required_column(col(2)),
                column(col(3)),
            ))
        },
    )
    .unwrap_or_else(|| {
        outcomes(
            "SELECT * FROM keyturn._approve($1, $2, $3, $4::pg_catalog.jsonb)",
            &[pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
            vec![action_id.into(), token.into(), params.map(|p| p.0).into()],
        )
    })
}

/// Human: `approve` for the tenant named, which must be the caller's own
/// (42501): the form Citus can delegate, whole, to the worker that holds the
/// tenant's rows (docs/scale-out.md, layout B).
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn approve_for(
    tenant: Option<String>,
    action_id: Option<pgrx::Uuid>,
    token: Option<String>,
    params: default!(Option<JsonbText>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(action_id, pgrx::Uuid),
        name!(status, String),
        name!(result, Option<RawJsonb>),
    ),
> {
    refuse_agents("approve_for");
    refuse_other_tenant("approve_for", tenant.as_deref());
    approved(action_id, token, params)
}

/// Human: one card for several proposals, each element exactly `approve`.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn approve_many(
    items: Option<JsonbText>,
) -> TableIterator<
    'static,
    (
        name!(action_id, pgrx::Uuid),
        name!(status, String),
        name!(result, Option<RawJsonb>),
    ),
> {
    refuse_agents("approve_many");
    approved_many(items)
}

/// Human: `approve_many` for the tenant named, which must be the caller's
/// own (42501), as `approve_for`.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn approve_many_for(
    tenant: Option<String>,
    items: Option<JsonbText>,
) -> TableIterator<
    'static,
    (
        name!(action_id, pgrx::Uuid),
        name!(status, String),
        name!(result, Option<RawJsonb>),
    ),
> {
    refuse_agents("approve_many_for");
    refuse_other_tenant("approve_many_for", tenant.as_deref());
    approved_many(items)
}

/// approve_many's batch, for `approve_many` and `approve_many_for`.
fn approved_many(items: Option<JsonbText>) -> Outcomes {
    outcomes(
        "SELECT * FROM keyturn._approve_many($1, $2::pg_catalog.jsonb)",
        &[pg_sys::TEXTOID],
        vec![items.map(|i| i.0).into()],
    )
}

/// Human: the approval card's data, `preview(action_id, token)`.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn preview(action_id: Option<pgrx::Uuid>, token: Option<String>) -> RawJsonb {
    refuse_agents("preview");
    previewed(action_id, token, None)
}

/// Human: `preview` with `params` (a digest action's reviewed fields, from
/// its link): also whether they are the proposed ones (`params_match`);
/// params that are not end the proposal `rejected_tampered`, as approving
/// with them would, so a guess is checked once at most. An overload with
/// no default, so that the two-argument form keeps its exact signature and
/// every call names one of them unambiguously.
#[pg_extern(name = "preview", volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn preview_checking(
    action_id: Option<pgrx::Uuid>,
    token: Option<String>,
    params: Option<JsonbText>,
) -> RawJsonb {
    refuse_agents("preview");
    previewed(action_id, token, params)
}

/// Human: `preview` for the tenant named, which must be the caller's own
/// (42501), as `approve_for`.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn preview_for(
    tenant: Option<String>,
    action_id: Option<pgrx::Uuid>,
    token: Option<String>,
) -> RawJsonb {
    refuse_agents("preview_for");
    refuse_other_tenant("preview_for", tenant.as_deref());
    previewed(action_id, token, None)
}

/// Human: `preview_for` with `params`, as `preview`'s overload.
#[pg_extern(name = "preview_for", volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn preview_for_checking(
    tenant: Option<String>,
    action_id: Option<pgrx::Uuid>,
    token: Option<String>,
    params: Option<JsonbText>,
) -> RawJsonb {
    refuse_agents("preview_for");
    refuse_other_tenant("preview_for", tenant.as_deref());
    previewed(action_id, token, params)
}

/// preview's read, for `preview` and `preview_for`.
fn previewed(
    action_id: Option<pgrx::Uuid>,
    token: Option<String>,
    params: Option<JsonbText>,
) -> RawJsonb {
    as_owner(
        "SELECT keyturn._preview($1, $2, $3, $4::pg_catalog.jsonb)",
        &[pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
        vec![action_id.into(), token.into(), params.map(|p| p.0).into()],
        |row| row.get::<RawJsonb>(1),
    )
    .into_iter()
    .next()
    .flatten()
    .unwrap_or_else(|| RawJsonb::parse("null"))
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
    rejected(action_id, token, reason)
}

/// reject's state machine, for `reject` and `reject_for` once each has
/// refused what it refuses.
fn rejected(
    action_id: Option<pgrx::Uuid>,
    token: Option<String>,
    reason: Option<String>,
) -> String {
    as_owner(
        "SELECT keyturn._reject($1, $2, $3, $4)",
        &[pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
        vec![action_id.into(), token.into(), reason.into()],
        |row| required::<String>(row, 1),
    )
    .into_iter()
    .next()
    .unwrap_or_default()
}

/// Human: `reject` for the tenant named, which must be the caller's own
/// (42501); the form Citus can delegate (docs/scale-out.md, layout B).
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn reject_for(
    tenant: Option<String>,
    action_id: Option<pgrx::Uuid>,
    token: Option<String>,
    reason: default!(Option<String>, "NULL"),
) -> String {
    refuse_agents("reject_for");
    refuse_other_tenant("reject_for", tenant.as_deref());
    rejected(action_id, token, reason)
}

/// Human: edit before approve. The proposal becomes `superseded`; the new
/// one, with the edited params, is returned with its own token.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn revise(
    action_id: Option<pgrx::Uuid>,
    token: Option<String>,
    params: Option<JsonbText>,
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
    refuse_agents("revise");
    revised(action_id, token, params)
}

/// Human: `revise` for the tenant named, which must be the caller's own
/// (42501), as `approve_for`.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn revise_for(
    tenant: Option<String>,
    action_id: Option<pgrx::Uuid>,
    token: Option<String>,
    params: Option<JsonbText>,
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
    refuse_agents("revise_for");
    refuse_other_tenant("revise_for", tenant.as_deref());
    revised(action_id, token, params)
}

/// revise's state machine, for `revise` and `revise_for`.
fn revised(
    action_id: Option<pgrx::Uuid>,
    token: Option<String>,
    params: Option<JsonbText>,
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
    TableIterator::new(as_owner(
        "SELECT * FROM keyturn._revise($1, $2, $3, $4::pg_catalog.jsonb)",
        &[pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
        vec![action_id.into(), token.into(), params.map(|p| p.0).into()],
        |row| {
            Ok((
                required(row, 1)?,
                required(row, 2)?,
                required(row, 3)?,
                required(row, 4)?,
                required(row, 5)?,
            ))
        },
    ))
}

/// Human: what waits for the caller, soonest expiry first. Never a token.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn pending(
    max_rows: default!(Option<i32>, 50),
) -> TableIterator<
    'static,
    (
        name!(action_id, pgrx::Uuid),
        name!(tool, String),
        name!(summary, String),
        name!(effect, String),
        name!(approval, String),
        name!(principal, String),
        name!(created_at, TimestampWithTimeZone),
        name!(expires_at, TimestampWithTimeZone),
        name!(votes, i32),
        name!(quorum, i32),
    ),
> {
    refuse_agents("pending");
    TableIterator::new(as_owner(
        "SELECT * FROM keyturn._pending($1, $2)",
        &[pg_sys::INT4OID],
        vec![max_rows.into()],
        |row| {
            Ok((
                required(row, 1)?,
                required(row, 2)?,
                required(row, 3)?,
                required(row, 4)?,
                required(row, 5)?,
                required(row, 6)?,
                required(row, 7)?,
                required(row, 8)?,
                required(row, 9)?,
                required(row, 10)?,
            ))
        },
    ))
}

/// Human: a standing approval of the caller's own principal for one tool.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn delegate(
    tool: Option<String>,
    scope: Option<JsonbText>,
    max_uses: Option<i32>,
    valid_for: Option<pgrx::datum::Interval>,
) -> pgrx::Uuid {
    refuse_agents("delegate");
    as_owner(
        "SELECT keyturn._delegate($1, $2, $3::pg_catalog.jsonb, $4, $5)",
        &[
            pg_sys::TEXTOID,
            pg_sys::TEXTOID,
            pg_sys::INT4OID,
            pg_sys::INTERVALOID,
        ],
        vec![
            tool.into(),
            scope.map(|s| s.0).into(),
            max_uses.into(),
            valid_for.into(),
        ],
        |row| required::<pgrx::Uuid>(row, 1),
    )
    .into_iter()
    .next()
    .unwrap_or_else(|| error!("keyturn: delegate returned no row"))
}

/// Human: ends a standing approval (its principal, or a tenant admin).
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn revoke_delegation(delegation_id: Option<pgrx::Uuid>) -> bool {
    refuse_agents("revoke_delegation");
    as_owner(
        "SELECT keyturn._revoke_delegation($1, $2)",
        &[pg_sys::UUIDOID],
        vec![delegation_id.into()],
        |row| required::<bool>(row, 1),
    )
    .into_iter()
    .next()
    .unwrap_or(false)
}

/// Human: the visible standing approvals, with their uses so far.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn delegations() -> TableIterator<
    'static,
    (
        name!(delegation_id, pgrx::Uuid),
        name!(principal, String),
        name!(tool, String),
        name!(scope, RawJsonb),
        name!(max_uses, i32),
        name!(uses, i32),
        name!(expires_at, TimestampWithTimeZone),
        name!(revoked, bool),
        name!(tool_version, i32),
        name!(ended, Option<String>),
    ),
> {
    refuse_agents("delegations");
    TableIterator::new(as_owner(
        "SELECT * FROM keyturn._delegations() WHERE $1 IS NOT NULL",
        &[],
        vec![],
        |row| {
            Ok((
                required(row, 1)?,
                required(row, 2)?,
                required(row, 3)?,
                required(row, 4)?,
                required(row, 5)?,
                required(row, 6)?,
                required(row, 7)?,
                required(row, 8)?,
                required(row, 9)?,
                row.get(10)?,
            ))
        },
    ))
}

/// Human side: records the person's message of a turn, the approval of the
/// task tool calls it asks for. An agent cannot record one.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn record_request(
    conversation_id: Option<String>,
    turn_id: Option<String>,
    message_id: Option<String>,
    text_sha256: Option<String>,
) -> bool {
    refuse_agents("record_request");
    as_owner(
        "SELECT keyturn._record_request($1, $2, $3, $4, $5)",
        &[
            pg_sys::TEXTOID,
            pg_sys::TEXTOID,
            pg_sys::TEXTOID,
            pg_sys::TEXTOID,
        ],
        vec![
            conversation_id.into(),
            turn_id.into(),
            message_id.into(),
            text_sha256.into(),
        ],
        |row| required::<bool>(row, 1),
    )
    .into_iter()
    .next()
    .unwrap_or(false)
}

/// Human side: a fresh token for a pending action the caller may decide,
/// to approve it from the queue or the console without the original link;
/// the previous token stops working.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn issue_token(action_id: Option<pgrx::Uuid>) -> Option<String> {
    refuse_agents("issue_token");
    as_owner(
        "SELECT keyturn._issue_token($1, $2)",
        &[pg_sys::UUIDOID],
        vec![action_id.into()],
        |row| row.get::<String>(1),
    )
    .into_iter()
    .next()
    .flatten()
}

/// Human side and dispatcher: a one-time code for a card link to these
/// actions, for a person who may decide every one of them (the caller's own
/// principal). An agent never gets one.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn link_code(
    action_ids: Option<Vec<Option<pgrx::Uuid>>>,
    ttl: default!(Option<pgrx::datum::Interval>, "'15 minutes'"),
) -> String {
    refuse_agents("link_code");
    as_owner(
        "SELECT keyturn._link_code($1, $2, $3)",
        &[pg_sys::UUIDARRAYOID, pg_sys::INTERVALOID],
        vec![action_ids.into(), ttl.into()],
        |row| required::<String>(row, 1),
    )
    .into_iter()
    .next()
    .unwrap_or_else(|| error!("keyturn: link_code returned nothing"))
}

/// Human side: records evidence the person saw (its kind, a reference, the
/// SHA-256 of its content) for the caller's principal, which its proposals
/// may cite. An agent never records evidence: fence records what it fenced.
///
/// Its SQL is written out: the second argument is named `ref`, a Rust
/// keyword, and pgrx names an argument after its Rust pattern (`r#ref`),
/// which a call by name (`ref => …`) could not reach.
#[pg_extern(
    volatile,
    parallel_unsafe,
    sql = r#"
CREATE FUNCTION "record_evidence"(
	"kind" TEXT,
	"ref" TEXT,
	"sha256" TEXT
) RETURNS uuid
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#
)]
fn record_evidence(
    kind: Option<String>,
    reference: Option<String>,
    sha256: Option<String>,
) -> pgrx::Uuid {
    refuse_agents("record_evidence");
    as_owner(
        "SELECT keyturn._record_evidence_for_caller($1, $2, $3, $4)",
        &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
        vec![kind.into(), reference.into(), sha256.into()],
        |row| required::<pgrx::Uuid>(row, 1),
    )
    .into_iter()
    .next()
    .unwrap_or_else(|| error!("keyturn: record_evidence returned nothing"))
}

/// Human side: where the caller's own principal is reached when an action
/// starts to wait for them (`email`, `webhook`, `webpush`), one target per
/// channel. An agent never sets one: a notification carries a card link.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn set_notify(
    channel: Option<String>,
    target: Option<String>,
    settings: default!(Option<JsonbText>, "'{}'"),
) {
    refuse_agents("set_notify");
    as_owner(
        "SELECT keyturn._set_notify($1, $2, $3, $4::pg_catalog.jsonb)",
        &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
        vec![channel.into(), target.into(), settings.map(|s| s.0).into()],
        |_| Ok(()),
    );
}

/// Human side: the caller's channels, as the caller may see them (a URL's
/// scheme and host, never a secret).
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn notify_channels() -> TableIterator<
    'static,
    (
        name!(channel, String),
        name!(target, String),
        name!(remind_before, pgrx::datum::Interval),
        name!(max_per_hour, i32),
        name!(own_secret, bool),
        name!(db_role, String),
        name!(updated_at, TimestampWithTimeZone),
    ),
> {
    refuse_agents("notify_channels");
    TableIterator::new(as_owner(
        "SELECT * FROM keyturn._notify_channels($1)",
        &[],
        vec![],
        |row| {
            Ok((
                required(row, 1)?,
                required(row, 2)?,
                required(row, 3)?,
                required(row, 4)?,
                required(row, 5)?,
                required(row, 6)?,
                required(row, 7)?,
            ))
        },
    ))
}

/// Human side: removes one of the caller's channels; true if there was one.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn remove_notify(channel: Option<String>) -> bool {
    refuse_agents("remove_notify");
    as_owner(
        "SELECT keyturn._remove_notify($1, $2)",
        &[pg_sys::TEXTOID],
        vec![channel.into()],
        |row| required::<bool>(row, 1),
    )
    .into_iter()
    .next()
    .unwrap_or(false)
}

/// Human side: ends every link code of the caller's not yet opened, and
/// every card session one opened; how many.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn revoke_links() -> i32 {
    refuse_agents("revoke_links");
    as_owner("SELECT keyturn._revoke_links($1)", &[], vec![], |row| {
        required::<i32>(row, 1)
    })
    .into_iter()
    .next()
    .unwrap_or(0)
}

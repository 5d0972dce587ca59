//! The two row triggers on `keyturn.action` that run on the hot path
//! (sql/020_guards.sql creates the triggers and says what they keep):
//!
//! - `_guard_status`, BEFORE UPDATE OF status: only a step of the status
//!   graph (`keyturn.transition`), and an approval-only status only with a
//!   valid approval binding;
//! - `_action_lifecycle`, AFTER: the work list, the usage row, the staged
//!   payload and files, the NOTIFY, in the status change's statement, and the
//!   event, noted for the commit to write into the tenant's chain
//!   (crate::audit).
//!
//! Why Rust: they fire on every status change, three times for each
//! dispatched action, and as plpgsql each firing converted both rows to
//! records and ran a dozen expressions and three statements; that was the
//! largest per-row cost in the profile (docs/benchmarks.md). Here each firing
//! reads the few columns it needs straight from the tuples and runs one kept
//! statement. The guard was two triggers with WHEN conditions, which
//! PostgreSQL parses again for every statement that updates the table; the
//! graph is read once per backend instead.
//!
//! They run as the extension owner (as the SECURITY DEFINER plpgsql did): the
//! side effects are keyturn's to write whoever changed the row, so a direct
//! write by a role someone granted UPDATE is logged, not failed. Every name in
//! their statements is schema-qualified, operators included, so no caller's
//! search_path can change what they mean.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::num::NonZeroUsize;

use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;

use crate::approval;
use crate::error::KeyturnError;
use crate::privilege::{extension_owner, RoleSwitch};
use crate::{actor, audit, plans};

/// The columns the triggers read, in this order.
const COLUMNS: [&str; 23] = [
    "id",
    "tenant",
    "principal",
    "session",
    "conversation_id",
    "status",
    "expires_at",
    "next_attempt_at",
    "lease_expires_at",
    "dispatched_at",
    "tool",
    "executor",
    "retain",
    "attempts",
    "params_hash",
    "approved_by",
    "approved_role",
    "approved_at",
    "approved_via",
    "approval_mac",
    "tool_version",
    "result",
    "receipt",
];
const ID: usize = 0;
const TENANT: usize = 1;
const PRINCIPAL: usize = 2;
const SESSION: usize = 3;
const CONVERSATION: usize = 4;
const STATUS: usize = 5;
const EXPIRES_AT: usize = 6;
const NEXT_ATTEMPT_AT: usize = 7;
const LEASE_EXPIRES_AT: usize = 8;
const DISPATCHED_AT: usize = 9;
const TOOL: usize = 10;
const EXECUTOR: usize = 11;
const RETAIN: usize = 12;
const ATTEMPTS: usize = 13;
const PARAMS_HASH: usize = 14;
const APPROVED_BY: usize = 15;
const APPROVED_ROLE: usize = 16;
const APPROVED_AT: usize = 17;
const APPROVED_VIA: usize = 18;
const APPROVAL_MAC: usize = 19;
const TOOL_VERSION: usize = 20;
const RESULT: usize = 21;
const RECEIPT: usize = 22;

/// What a backend knows about `keyturn.action` and `keyturn.status`, for the
/// relation it was read for (a new extension has a new relation).
struct Shape {
    attnums: [NonZeroUsize; COLUMNS.len()],
    types: [pg_sys::Oid; COLUMNS.len()],
    /// enum label oid → (label, final)
    statuses: HashMap<pg_sys::Oid, (String, bool)>,
    /// The legal status changes, as (from, to) enum label oids.
    transitions: HashSet<(pg_sys::Oid, pg_sys::Oid)>,
    /// (executing, leased): the work list lists an executing action as
    /// leased (see [`Shape::listed`]).
    in_flight: (pg_sys::Oid, pg_sys::Oid),
}

impl Shape {
    /// The status an action's work-list row carries: its own, except that
    /// an executing action stays listed as leased. Every reader of the work
    /// list treats the two alike (a lapsed lease; each locks the action row
    /// and reads its true status), so `begin_dispatch` does not move the row:
    /// one non-HOT update and its index entries fewer per dispatched action.
    fn listed(&self, status: pg_sys::Oid) -> pg_sys::Oid {
        if status == self.in_flight.0 {
            self.in_flight.1
        } else {
            status
        }
    }
}

thread_local! {
    static SHAPE: RefCell<Option<(pg_sys::Oid, std::rc::Rc<Shape>)>> = const { RefCell::new(None) };
}

fn shape(relid: pg_sys::Oid, tupdesc: pg_sys::TupleDesc) -> std::rc::Rc<Shape> {
    if let Some(shape) = SHAPE.with(|s| {
        s.borrow()
            .as_ref()
            .filter(|(r, _)| *r == relid)
            .map(|(_, shape)| shape.clone())
    }) {
        return shape;
    }
    let mut attnums = [NonZeroUsize::MIN; COLUMNS.len()];
    let mut types = [pg_sys::Oid::INVALID; COLUMNS.len()];
    for (i, name) in COLUMNS.iter().enumerate() {
        let cname = std::ffi::CString::new(*name).expect("column names have no NUL");
        // SAFETY: tupdesc is the trigger relation's, valid for this call.
        let attno = unsafe { pg_sys::SPI_fnumber(tupdesc, cname.as_ptr()) };
        let attno = usize::try_from(attno)
            .ok()
            .and_then(NonZeroUsize::new)
            .unwrap_or_else(|| {
                KeyturnError::NotReady(format!("keyturn.action has no column {name}")).raise()
            });
        attnums[i] = attno;
        // SAFETY: attno is a valid 1-based attribute number of tupdesc.
        types[i] = unsafe { (*(*tupdesc).attrs.as_ptr().add(attno.get() - 1)).atttypid };
    }
    // As the owner: whoever changed the row may not execute keyturn's helpers.
    let as_owner = RoleSwitch::to(extension_owner());
    let (statuses, transitions) = Spi::connect(|client| -> Result<_, pgrx::spi::Error> {
        let mut statuses = HashMap::new();
        let rows = client.select(
            "SELECT e.oid, e.enumlabel::pg_catalog.text, keyturn._is_final(e.enumlabel::keyturn.status) \
               FROM pg_catalog.pg_enum e WHERE e.enumtypid OPERATOR(pg_catalog.=) $1",
            None,
            &[types[STATUS].into()],
        )?;
        for row in rows {
            let oid: pg_sys::Oid = row.get(1)?.unwrap_or(pg_sys::Oid::INVALID);
            let label: String = row.get(2)?.unwrap_or_default();
            let is_final: bool = row.get(3)?.unwrap_or(false);
            statuses.insert(oid, (label, is_final));
        }
        let mut transitions = HashSet::new();
        let rows = client.select(
            "SELECT f.oid, t.oid FROM keyturn.transition x \
               JOIN pg_catalog.pg_enum f ON f.enumtypid OPERATOR(pg_catalog.=) $1 \
                AND f.enumlabel OPERATOR(pg_catalog.=) x.from_status::pg_catalog.text::pg_catalog.name \
               JOIN pg_catalog.pg_enum t ON t.enumtypid OPERATOR(pg_catalog.=) $1 \
                AND t.enumlabel OPERATOR(pg_catalog.=) x.to_status::pg_catalog.text::pg_catalog.name",
            None,
            &[types[STATUS].into()],
        )?;
        for row in rows {
            let from: pg_sys::Oid = row.get(1)?.unwrap_or(pg_sys::Oid::INVALID);
            let to: pg_sys::Oid = row.get(2)?.unwrap_or(pg_sys::Oid::INVALID);
            transitions.insert((from, to));
        }
        Ok((statuses, transitions))
    })
    .unwrap_or_else(|e| error!("keyturn: reading keyturn.status failed: {e}"));
    drop(as_owner);
    let oid_of = |label: &str| {
        statuses
            .iter()
            .find(|(_, (l, _))| l == label)
            .map(|(oid, _)| *oid)
            .unwrap_or_else(|| {
                KeyturnError::NotReady(format!("keyturn.status has no label {label}")).raise()
            })
    };
    let in_flight = (oid_of("executing"), oid_of("leased"));
    let shape = std::rc::Rc::new(Shape {
        attnums,
        types,
        statuses,
        transitions,
        in_flight,
    });
    SHAPE.with(|s| *s.borrow_mut() = Some((relid, shape.clone())));
    shape
}

/// One row of `keyturn.action` as the trigger sees it: raw datums, valid
/// for the trigger call.
struct Row {
    datums: [Option<pg_sys::Datum>; COLUMNS.len()],
}

impl Row {
    /// SAFETY: `tuple` and `tupdesc` are the trigger's, valid for this call.
    unsafe fn read(
        tuple: *mut pg_sys::HeapTupleData,
        tupdesc: pg_sys::TupleDesc,
        shape: &Shape,
    ) -> Row {
        // One pass over the row: a heap_getattr per column walked it from its
        // start for each column after the first of variable length
        // (nocachegetattr), 8 % of this trigger's time in a drain.
        // SAFETY: see the function's contract.
        let natts = usize::try_from(unsafe { (*tupdesc).natts }).unwrap_or(0);
        let mut values = vec![pg_sys::Datum::from(0); natts];
        let mut nulls = vec![true; natts];
        // SAFETY: both arrays hold natts elements, as heap_deform_tuple
        // writes; it fills columns the tuple predates with their defaults.
        unsafe {
            pg_sys::heap_deform_tuple(tuple, tupdesc, values.as_mut_ptr(), nulls.as_mut_ptr())
        };
        let mut datums = [None; COLUMNS.len()];
        for (i, attno) in shape.attnums.iter().enumerate() {
            let at = attno.get() - 1;
            datums[i] = (!nulls[at]).then_some(values[at]);
        }
        Row { datums }
    }

    fn param(&self, shape: &Shape, col: usize) -> DatumWithOid<'static> {
        match self.datums[col] {
            // SAFETY: the datum is of the column's own type, and the
            // statement reads it before the trigger returns.
            Some(d) => unsafe { DatumWithOid::new(d, shape.types[col]) },
            None => DatumWithOid::null_oid(shape.types[col]),
        }
    }

    fn text(&self, col: usize) -> Option<&str> {
        // SAFETY: text columns hold text datums (varlena), valid for this call.
        self.datums[col].and_then(|d| unsafe { <&str as FromDatum>::from_datum(d, false) })
    }

    fn bytes(&self, col: usize) -> Option<&[u8]> {
        // SAFETY: bytea columns hold bytea datums (varlena), valid for this call.
        self.datums[col].and_then(|d| unsafe { <&[u8] as FromDatum>::from_datum(d, false) })
    }

    fn timestamp(&self, col: usize) -> Option<i64> {
        // timestamptz is an int64 passed by value.
        self.datums[col].map(|d| d.value() as i64)
    }

    fn status_oid(&self) -> pg_sys::Oid {
        self.datums[STATUS]
            .map(|d| pg_sys::Oid::from(d.value() as u32))
            .unwrap_or(pg_sys::Oid::INVALID)
    }

    fn status<'s>(&self, shape: &'s Shape) -> (&'s str, bool) {
        self.datums[STATUS]
            .and_then(|d| shape.statuses.get(&pg_sys::Oid::from(d.value() as u32)))
            .map(|(label, fin)| (label.as_str(), *fin))
            .unwrap_or_else(|| {
                KeyturnError::NotReady("an action row has an unknown status".into()).raise()
            })
    }
}

fn trigger_rows<'a>(trigger: &'a PgTrigger<'a>) -> (std::rc::Rc<Shape>, Option<Row>, Row) {
    let data = trigger.trigger_data();
    // SAFETY: a row trigger's relation and tuples are valid for this call;
    // for UPDATE tg_trigtuple is the old row and tg_newtuple the new one, for
    // INSERT tg_trigtuple is the new row.
    unsafe {
        let rel = data.tg_relation;
        let tupdesc = (*rel).rd_att;
        let shape = shape((*rel).rd_id, tupdesc);
        let is_update = matches!(trigger.op(), Ok(PgTriggerOperation::Update));
        if is_update {
            let old = Row::read(data.tg_trigtuple, tupdesc, &shape);
            let new = Row::read(data.tg_newtuple, tupdesc, &shape);
            (shape, Some(old), new)
        } else {
            let new = Row::read(data.tg_trigtuple, tupdesc, &shape);
            (shape, None, new)
        }
    }
}

/// Whether the trigger fires on a Citus shard of `keyturn.action` (named
/// `action_<shard id>`) rather than on the table itself.
fn on_a_shard(trigger: &PgTrigger<'_>) -> bool {
    // SAFETY: a trigger's relation and its pg_class row are valid for this call.
    let name = unsafe {
        std::ffi::CStr::from_ptr(
            (*(*trigger.trigger_data().tg_relation).rd_rel)
                .relname
                .data
                .as_ptr(),
        )
    };
    name.to_bytes() != b"action"
}

/// Whether this backend's statement is a COPY: how Citus brings rows into a
/// shard when it distributes a table that holds some, or moves a shard. Such
/// rows bring their events and work list with them, as a restore's do.
fn copying_rows() -> bool {
    // SAFETY: the backend's current statement text, or NULL; read only.
    let text = unsafe { pg_sys::debug_query_string };
    if text.is_null() {
        return false;
    }
    // SAFETY: a NUL-terminated string PostgreSQL keeps for the statement.
    let text = unsafe { std::ffi::CStr::from_ptr(text) }.to_bytes();
    let start = text
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(text.len());
    text[start..]
        .get(..4)
        .is_some_and(|w| w.eq_ignore_ascii_case(b"copy"))
}

/// A change to an action's row that reached its shard from a call keyturn
/// did not run in this backend: a plain call (propose, approve, lease, …)
/// on a coordinator whose keyturn tables Citus distributes, or a direct
/// write. Its events would be lost or name the wrong actor, so it is
/// refused; the tenant-explicit calls run whole on the shard's worker, where
/// keyturn knows who acts (docs/scale-out.md, layout B). Rows Citus copies
/// into a shard ([`copying_rows`]) are let through, as a restore's are.
fn refuse_remote_change() -> ! {
    KeyturnError::WrongState {
        message: "keyturn's tables are distributed by tenant (Citus): this change to an action reached its shard from a call that did not run on the tenant's worker, so its audit event would be lost".into(),
        hint: "Call the tenant-explicit forms (propose_for, approve_for, reject_for, lease_for, begin_dispatch_many_for, complete_many_for, sweep_for, reconcile_for, …), which keyturn.citus_distribute() registers so that Citus runs them whole on the tenant's worker; keyturnd does so by itself (docs/scale-out.md).",
    }
    .raise()
}

/// The statuses only an approval gives a pending proposal.
const APPROVAL_ONLY: [&str; 4] = ["queued", "succeeded", "conflict", "failed"];

/// BEFORE UPDATE OF status: the change must be a step of the graph, and an
/// approval-only status from pending needs a binding that verifies.
#[pg_trigger]
fn _guard_status<'a>(
    trigger: &'a PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, KeyturnError> {
    let (shape, old, new) = trigger_rows(trigger);
    let Some(old) = old else {
        return Ok(trigger.new());
    };
    if old.status_oid() == new.status_oid() {
        return Ok(trigger.new());
    }
    let (from, _) = old.status(&shape);
    let (to, _) = new.status(&shape);
    // SAFETY: a uuid datum of this row, valid for this call.
    let id = new.datums[ID].and_then(|d| unsafe { pgrx::Uuid::from_datum(d, false) });
    let id_text = id.map(|u| u.to_string()).unwrap_or_default();
    if from == "pending" && APPROVAL_ONLY.contains(&to) {
        // SAFETY: bytea datum of this row, valid for this call.
        let mac = new.datums[APPROVAL_MAC]
            .and_then(|d| unsafe { <&[u8] as FromDatum>::from_datum(d, false) });
        let valid = approval::binding_valid(
            id,
            new.text(PARAMS_HASH),
            new.text(APPROVED_BY),
            new.text(APPROVED_ROLE),
            new.timestamp(APPROVED_AT),
            new.text(APPROVED_VIA),
            mac,
        );
        if !valid {
            // Raised, not returned: pgrx reports a trigger's Err as XX000.
            KeyturnError::Forbidden {
                message: format!("action {id_text} cannot become {to} without an approval"),
                hint: "Only keyturn.approve (or a standing approval, or a task request) gives this status; a table write cannot.",
            }
            .raise();
        }
    }
    if !shape
        .transitions
        .contains(&(old.status_oid(), new.status_oid()))
    {
        KeyturnError::WrongState {
            message: format!("illegal status transition {from} -> {to} for action {id_text}"),
            hint: "keyturn.transition lists every legal status change (docs/concepts.md, \"The state machine\").",
        }
        .raise();
    }
    Ok(trigger.new())
}

// The statements, one per kind of change, each a single statement (one
// executor start) for all the rows it writes. Every row is inserted with
// VALUES, never INSERT ... SELECT: Citus plans an INSERT ... SELECT as a
// distributed query even when it selects only parameters, and refuses one in
// a call it delegated to a worker (docs/scale-out.md, layout B), so a row that
// is written only sometimes is a variant of the statement instead of a WHERE.
// The event is not among them: it is written at commit, chained
// (crate::audit).
const OPEN_INSERT: &str = "\
INSERT INTO keyturn.open_action (action_id, tenant, principal, session, conversation_id, status, \
                                 expires_at, next_attempt_at, lease_expires_at, dispatched_at) \
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
/// The work-list row moved: a new status, a lease's expiry, a next attempt.
const OPEN_MOVE: &str = "\
UPDATE keyturn.open_action o SET status = $6, next_attempt_at = $8, lease_expires_at = $9, dispatched_at = $10 \
 WHERE o.action_id OPERATOR(pg_catalog.=) $1 AND o.tenant OPERATOR(pg_catalog.=) $2";
/// A final status: the work-list row goes, and with it, as variants, the
/// staged payload (a digest action's) and files (an external action's), and
/// (succeeded) the usage row is written. Variants, not `WHERE $3 AND …`:
/// Citus prunes a router query in which any table's condition is a constant
/// false to no shard at all, and then runs none of its data-modifying CTEs
/// either, so a failed external action (no payload to delete) kept its
/// work-list row on a worker (b_dispatch). On one node a DELETE whose WHERE
/// is false deletes nothing: leaving it out changes nothing there.
macro_rules! final_statement {
    ($ctes:expr) => {
        concat!(
            $ctes,
            "DELETE FROM keyturn.open_action o \
              WHERE o.action_id OPERATOR(pg_catalog.=) $1 AND o.tenant OPERATOR(pg_catalog.=) $2"
        )
    };
}
macro_rules! payload {
    () => {
        "p AS (DELETE FROM keyturn.staged_payload s \
                WHERE s.action_id OPERATOR(pg_catalog.=) $1 AND s.tenant OPERATOR(pg_catalog.=) $2)"
    };
}
macro_rules! files {
    () => {
        "f AS (DELETE FROM keyturn.staged_file s \
                WHERE s.action_id OPERATOR(pg_catalog.=) $1 AND s.tenant OPERATOR(pg_catalog.=) $2)"
    };
}
macro_rules! usage {
    () => {
        "u AS (INSERT INTO keyturn.usage (action_id, tenant, principal, tool, executor, attempts) \
                VALUES ($1, $2, $5, $6, $7, $8))"
    };
}
/// [succeeded][external][digest]: the statement for a final status (a
/// digest action is always external: [_][0][1] is [_][0][0] again).
const FINAL: [[[&str; 2]; 2]; 2] = [
    [
        [final_statement!(""), final_statement!("")],
        [
            final_statement!(concat!("WITH ", files!(), " ")),
            final_statement!(concat!("WITH ", files!(), ", ", payload!(), " ")),
        ],
    ],
    [
        [
            final_statement!(concat!("WITH ", usage!(), " ")),
            final_statement!(concat!("WITH ", usage!(), " ")),
        ],
        [
            final_statement!(concat!("WITH ", usage!(), ", ", files!(), " ")),
            final_statement!(concat!(
                "WITH ",
                usage!(),
                ", ",
                files!(),
                ", ",
                payload!(),
                " "
            )),
        ],
    ],
];
const NOTIFY: &str = "SELECT pg_catalog.pg_notify('keyturn_dispatch', '')";

/// The work list's columns, $1 … $10 of OPEN_INSERT and OPEN_MOVE.
const WORK_LIST: [usize; 10] = [
    ID,
    TENANT,
    PRINCIPAL,
    SESSION,
    CONVERSATION,
    STATUS,
    EXPIRES_AT,
    NEXT_ATTEMPT_AT,
    LEASE_EXPIRES_AT,
    DISPATCHED_AT,
];
/// $6: the status the row lists (an executing action's is leased).
const WORK_LIST_STATUS: usize = 5;
const _: () = assert!(WORK_LIST[WORK_LIST_STATUS] == STATUS);

/// AFTER INSERT OR UPDATE OF status, next_attempt_at, lease_expires_at,
/// dispatched_at: everything a status change implies (sql/020_guards.sql).
#[pg_trigger]
fn _action_lifecycle<'a>(
    trigger: &'a PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, KeyturnError> {
    let acting = actor::acting();
    let (shape, old, new) = trigger_rows(trigger);
    if !acting && on_a_shard(trigger) && !(old.is_none() && copying_rows()) {
        refuse_remote_change();
    }
    // A row inserted by anything but keyturn's propose (a restore from a
    // dump, which brings its own events and work list) implies nothing.
    if old.is_none() && !acting {
        return Ok(None);
    }
    let (status, is_final) = new.status(&shape);
    let changed = match &old {
        None => true,
        Some(old) => old.datums[STATUS].map(|d| d.value()) != new.datums[STATUS].map(|d| d.value()),
    };
    // The work-list row's dispatch time is written whenever the row moves;
    // it is read only once the action is uncertain, a move of its own.
    let work_list_moved = match &old {
        None => true,
        Some(old) => {
            shape.listed(old.status_oid()) != shape.listed(new.status_oid())
                || [NEXT_ATTEMPT_AT, LEASE_EXPIRES_AT]
                    .iter()
                    .any(|&c| old.datums[c].map(|d| d.value()) != new.datums[c].map(|d| d.value()))
        }
    };
    if !changed && !work_list_moved {
        return Ok(None);
    }

    // SAFETY: a uuid datum of this row, valid for this call.
    let id = new.datums[ID].and_then(|d| unsafe { pgrx::Uuid::from_datum(d, false) });
    let detail = event_detail(
        actor::event_detail_of(id).as_deref(),
        !acting,
        commitments(old.as_ref(), &new, is_final),
    );
    let db_role = actor::actor_role().unwrap_or_else(outer_role_name);
    let principal = actor::actor_principal();
    let external = new.text(EXECUTOR) == Some("external");
    let notify = status == "queued"
        && new
            .timestamp(NEXT_ATTEMPT_AT)
            // SAFETY: reads the clock.
            .is_some_and(|t| t <= unsafe { pg_sys::GetCurrentTimestamp() })
        && crate::guc::notify_on();

    let p = |c| new.param(&shape, c);
    let statement: Option<(&str, Vec<pg_sys::Oid>, Vec<DatumWithOid<'_>>)> = if is_final {
        // Nothing inserts a final action; should something, it gets what a
        // final status change gets (with no work-list row to delete).
        let digest = external && new.text(RETAIN) == Some("digest");
        let mut types = vec![
            shape.types[ID],
            shape.types[TENANT],
            pg_sys::BOOLOID,
            pg_sys::BOOLOID,
        ];
        let mut args = vec![p(ID), p(TENANT), digest.into(), external.into()];
        let succeeded = status == "succeeded";
        if succeeded {
            types.extend([PRINCIPAL, TOOL, EXECUTOR, ATTEMPTS].map(|c| shape.types[c]));
            args.extend([PRINCIPAL, TOOL, EXECUTOR, ATTEMPTS].map(p));
        }
        // $3 and $4 (digest, external) choose the variant and stay bound,
        // unused, so every variant takes the same parameters.
        Some((
            FINAL[usize::from(succeeded)][usize::from(external)][usize::from(digest)],
            types,
            args,
        ))
    } else if work_list_moved {
        let types: Vec<pg_sys::Oid> = WORK_LIST.iter().map(|&c| shape.types[c]).collect();
        let mut args: Vec<DatumWithOid<'_>> = WORK_LIST.iter().map(|&c| p(c)).collect();
        // SAFETY: an enum label's oid is the datum of keyturn.status.
        args[WORK_LIST_STATUS] = unsafe {
            DatumWithOid::new(
                pg_sys::Datum::from(shape.listed(new.status_oid())),
                shape.types[STATUS],
            )
        };
        Some((
            if old.is_none() {
                OPEN_INSERT
            } else {
                OPEN_MOVE
            },
            types,
            args,
        ))
    } else {
        None
    };

    if changed {
        if let (Some(id), Some(tenant), Some(action_principal)) =
            (id, new.text(TENANT), new.text(PRINCIPAL))
        {
            let from_status = old.as_ref().map(|o| o.status(&shape).0);
            audit::append(
                id,
                tenant,
                action_principal,
                &db_role,
                principal.as_deref(),
                from_status,
                status,
                &detail,
            );
        }
    }

    if statement.is_none() && !notify {
        return Ok(None);
    }
    let _as_owner = RoleSwitch::to(extension_owner());
    Spi::connect_mut(|client| -> pgrx::spi::SpiResult<()> {
        if let Some((sql, types, args)) = &statement {
            plans::execute(client, sql, types, args)?;
        }
        if notify {
            plans::execute(client, NOTIFY, &[], &[])?;
        }
        Ok(())
    })
    .unwrap_or_else(|e| error!("keyturn: the lifecycle of an action failed: {e}"));
    Ok(None)
}

/// The event's detail: what the code that changed the row noted, marked
/// `direct_write` when keyturn did not make the change, with the row's
/// [`commitments`] (which no caller's note can replace).
fn event_detail(
    noted: Option<&str>,
    direct_write: bool,
    commitments: serde_json::Map<String, serde_json::Value>,
) -> String {
    if !direct_write && commitments.is_empty() {
        return noted.unwrap_or("{}").to_owned();
    }
    let mut detail = match noted.map(serde_json::from_str::<serde_json::Value>) {
        Some(Ok(serde_json::Value::Object(m))) => m,
        _ => serde_json::Map::new(),
    };
    if direct_write {
        detail.insert("direct_write".into(), serde_json::Value::Bool(true));
    }
    detail.extend(commitments);
    serde_json::Value::Object(detail).to_string()
}

/// What a status change's event commits to besides the status, read from
/// the row (docs/audit.md, "What an event commits to"): when the action is
/// created, its tool and tool version, and a MAC of its params hash; when
/// its approval binding is first written, the binding's MAC (over who
/// approved, as which role, when, how, and the params hash); at a final
/// status, the binding's MAC again and MACs of its result's and receipt's
/// jsonb text, each null where the action has none. The MACs are
/// under the database's key ([`approval::commitment`]): no reader of the
/// chain can test guesses against them. `verify_audit` recomputes them from
/// the row, so a rewrite of what was approved or of how it ended shows
/// against an anchored head (twenty-fifth red-team pass).
fn commitments(
    old: Option<&Row>,
    new: &Row,
    is_final: bool,
) -> serde_json::Map<String, serde_json::Value> {
    use serde_json::Value;
    let mut facts = serde_json::Map::new();
    let created = old.is_none();
    let approved =
        old.is_none_or(|o| o.datums[APPROVAL_MAC].is_none()) && new.datums[APPROVAL_MAC].is_some();
    if !(created || approved || is_final) {
        return facts;
    }
    // The key is the extension owner's to read, whoever changed the row.
    let _as_owner = RoleSwitch::to(extension_owner());
    if created {
        if let Some(tool) = new.text(TOOL) {
            facts.insert("tool".into(), Value::String(tool.to_owned()));
        }
        if let Some(v) = new.datums[TOOL_VERSION] {
            // int4, passed by value.
            facts.insert("tool_version".into(), Value::from(v.value() as i32));
        }
        if let Some(hash) = new.text(PARAMS_HASH) {
            let mac = approval::commitment("params_hash", hash.as_bytes());
            facts.insert("params_mac".into(), Value::String(mac));
        }
    }
    // A final status commits to how the action ended whatever it holds:
    // no approval, no result and no receipt are facts too (null), or a
    // rejected action rewritten as approved and sent would verify.
    if approved || is_final {
        let mac = new.bytes(APPROVAL_MAC).map(hex::encode);
        facts.insert(
            "approval_mac".into(),
            mac.map_or(Value::Null, Value::String),
        );
    }
    if is_final {
        for (key, what, col) in [
            ("result_mac", "result", RESULT),
            ("receipt_mac", "receipt", RECEIPT),
        ] {
            let mac = new.datums[col].map(|d| approval::commitment(what, jsonb_text(d).to_bytes()));
            facts.insert(key.into(), mac.map_or(Value::Null, Value::String));
        }
    }
    facts
}

/// A jsonb datum's text, as `jsonb_out` prints it (and `::text` in SQL).
fn jsonb_text<'d>(d: pg_sys::Datum) -> &'d std::ffi::CStr {
    // SAFETY: d is a jsonb datum of the trigger's row, valid for this call;
    // jsonb_out detoasts it and returns a palloc'd NUL-terminated string,
    // which lives as long as the trigger's memory context.
    unsafe {
        let printed = pg_sys::OidOutputFunctionCall(pg_sys::Oid::from(pg_sys::F_JSONB_OUT), d);
        std::ffi::CStr::from_ptr(printed)
    }
}

/// The session's role as the audit log names a change keyturn did not make:
/// the SET ROLE role, else the session user.
fn outer_role_name() -> String {
    // SAFETY: reads backend state; the name is copied before returning.
    unsafe {
        let name = pg_sys::GetUserNameFromId(pg_sys::GetOuterUserId(), false);
        std::ffi::CStr::from_ptr(name)
            .to_string_lossy()
            .into_owned()
    }
}

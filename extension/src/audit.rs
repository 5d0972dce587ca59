//! The audit log's hash chain (docs/audit.md): each tenant's events form one
//! chain, each event storing the previous event's hash and its own.
//!
//! An event depends on the tenant's head when it is written, so two
//! transactions writing events of one tenant must write them one after the
//! other, and the second must see the first commit (a chain that named an
//! event of a transaction that then rolled back would be broken). Holding
//! the tenant's head from the first status change to the commit would
//! serialize every approval of the tenant end to end. So the events a
//! transaction produces are kept here, in backend memory, in the order they
//! happen, and written at PRE_COMMIT (PRE_PREPARE on a Citus worker): the
//! tenant's chain is locked there, the events get their ids and hashes in
//! order ([`write_pending`]), and the lock lasts only for the commit itself.
//! Until then they are not rows of keyturn.event; keyturn.audit shows a
//! transaction its own ([`noted_events`]) after the committed ones.

use std::cell::RefCell;

use pgrx::prelude::*;

use keyturn_core::canonical;

use crate::committed::on_latest;
use crate::error::OrRaise;
use crate::jsonb_text::{JsonbText, RawJsonb};
use crate::privilege::{extension_owner, RoleSwitch};

/// One event, as the lifecycle trigger (or a SQL path) produced it.
struct Pending {
    level: i32,
    action_id: pgrx::Uuid,
    tenant: String,
    action_principal: String,
    at: i64,
    db_role: String,
    principal: Option<String>,
    from_status: Option<String>,
    to_status: String,
    /// As jsonb prints it: the text the row will hold.
    detail: String,
    /// Its hash's first step, made when the event is noted.
    prepared: keyturn_core::audit::PreparedEvent,
}

thread_local! {
    static PENDING: RefCell<Vec<Pending>> = const { RefCell::new(Vec::new()) };
}

/// Notes an event of this transaction, written at its commit.
#[allow(clippy::too_many_arguments)]
pub fn append(
    action_id: pgrx::Uuid,
    tenant: &str,
    action_principal: &str,
    db_role: &str,
    principal: Option<&str>,
    from_status: Option<&str>,
    to_status: &str,
    detail: &str,
) {
    if chain_table() == pg_sys::Oid::INVALID {
        return write_unchained(
            action_id,
            tenant,
            action_principal,
            db_role,
            principal,
            from_status,
            to_status,
            detail,
        );
    }
    // The commit writes the events as the extension owner, with no snapshot
    // of its own to look the owner up with: look it up now, in the
    // statement (it is kept for the backend). Without this a transaction
    // whose only keyturn call was one that appends events from SQL (a
    // notification's outcome, record_not_sent) failed at COMMIT.
    extension_owner();
    // SAFETY: plain reads of backend state.
    let (level, at) = unsafe {
        (
            pg_sys::GetCurrentTransactionNestLevel(),
            pg_sys::GetCurrentTimestamp(),
        )
    };
    let detail = RawJsonb::parse(detail).text();
    // The hash's first step now, in the statement that made the event: a
    // detail the chain cannot hold (a reason over 1 MiB) fails here, with
    // words for it, not at COMMIT; and the commit, which every writer of the
    // tenant waits for, has that much less to do.
    let prepared = prepare(
        action_id,
        tenant,
        action_principal,
        at,
        db_role,
        principal,
        from_status,
        to_status,
        &detail,
    );
    PENDING.with(|p| {
        p.borrow_mut().push(Pending {
            level,
            action_id,
            tenant: tenant.to_owned(),
            action_principal: action_principal.to_owned(),
            at,
            db_role: db_role.to_owned(),
            principal: principal.map(str::to_owned),
            from_status: from_status.map(str::to_owned),
            to_status: to_status.to_owned(),
            detail,
            prepared,
        })
    });
}

/// A database whose extension is still at 0.2.0 (this library installed,
/// `ALTER EXTENSION pg_keyturn UPDATE` not yet run) has no chain: its
/// events are written at once, unchained, as 0.2.0 wrote them, and the
/// upgrade chains them with the rest.
#[allow(clippy::too_many_arguments)]
fn write_unchained(
    action_id: pgrx::Uuid,
    tenant: &str,
    action_principal: &str,
    db_role: &str,
    principal: Option<&str>,
    from_status: Option<&str>,
    to_status: &str,
    detail: &str,
) {
    const UNCHAINED: &str = "INSERT INTO keyturn.event (action_id, tenant, action_principal, db_role, principal, \
                                                        from_status, to_status, detail) \
                             VALUES ($1, $2, $3, $4, $5, $6::keyturn.status, $7::keyturn.status, $8::pg_catalog.jsonb)";
    let text = pg_sys::TEXTOID;
    let types = [pg_sys::UUIDOID, text, text, text, text, text, text, text];
    let args: Vec<pgrx::datum::DatumWithOid<'_>> = vec![
        action_id.into(),
        tenant.into(),
        action_principal.into(),
        db_role.into(),
        principal.into(),
        from_status.into(),
        to_status.into(),
        detail.into(),
    ];
    let _as_owner = RoleSwitch::to(extension_owner());
    Spi::connect_mut(|client| crate::plans::execute(client, UNCHAINED, &types, &args).map(|_| ()))
        .unwrap_or_else(|e| error!("keyturn: writing an audit event failed: {e}"));
}

/// `append` for the SQL paths that write an event without a status change
/// (a quorum vote, keyturnd's account of an attempt).
#[pg_extern(name = "_append_event", volatile, parallel_unsafe)]
#[allow(clippy::too_many_arguments)]
fn append_event(
    action_id: pgrx::Uuid,
    tenant: &str,
    action_principal: &str,
    db_role: &str,
    principal: Option<&str>,
    from_status: Option<&str>,
    to_status: &str,
    detail: JsonbText,
) {
    append(
        action_id,
        tenant,
        action_principal,
        db_role,
        principal,
        from_status,
        to_status,
        &detail.0,
    );
}

/// The events this transaction has noted for `action_id` and not yet
/// written (they are written at its commit), in the order they happened,
/// for keyturn.audit: a transaction sees its own events, as it sees its own
/// status changes and usage rows. Backend memory, so parallel unsafe.
#[pg_extern(name = "_noted_events", volatile, strict, parallel_unsafe)]
// pgrx reads the columns from the signature itself: no type alias.
#[allow(clippy::type_complexity)]
fn noted_events(
    action_id: pgrx::Uuid,
) -> TableIterator<
    'static,
    (
        name!(at, Option<TimestampWithTimeZone>),
        name!(db_role, String),
        name!(principal, Option<String>),
        name!(from_status, Option<String>),
        name!(to_status, String),
        name!(detail, String),
    ),
> {
    let rows: Vec<_> = PENDING.with(|p| {
        p.borrow()
            .iter()
            .filter(|e| e.action_id == action_id)
            .map(|e| {
                (
                    TimestampWithTimeZone::try_from(e.at).ok(),
                    e.db_role.clone(),
                    e.principal.clone(),
                    e.from_status.clone(),
                    e.to_status.clone(),
                    e.detail.clone(),
                )
            })
            .collect()
    });
    TableIterator::new(rows)
}

/// The hash of an event given as the JSON object of its columns (a `hash`
/// member left out): keyturn_core::audit::event_hash, which the commit
/// hashes with too, for verify_audit and the upgrade that chains 0.2.0's
/// events. Read as a stored row, whose printed text may be longer than the
/// bound on a caller's JSON: every event the commit admitted is read.
/// 22023 for what RFC 8785 cannot represent exactly.
#[pg_extern(name = "_event_hash", immutable, strict, parallel_safe)]
fn event_hash_sql(event: JsonbText) -> String {
    keyturn_core::audit::event_hash_of_row(&event.0).or_raise()
}

const HEAD_MADE: &str = "INSERT INTO keyturn.audit_chain (tenant, events, head) \
     VALUES ($1, 0, keyturn._chain_start()) ON CONFLICT ON CONSTRAINT audit_chain_pkey DO NOTHING";
/// The tenant's head, and the id of the transaction's first event (one
/// statement under the tenant's lock where two were: NEXT_ID's id, of the
/// head's last id). No row: the tenant has no chain yet.
const HEAD: &str = "\
SELECT c.events || ' ' || c.head || ' ' || c.last_id || ' ' || \
       (SELECT CASE WHEN n > c.last_id THEN n \
                    ELSE pg_catalog.setval('keyturn.event_id_seq', c.last_id + 1) END \
          FROM pg_catalog.nextval('keyturn.event_id_seq') n) \
  FROM keyturn.audit_chain c WHERE c.tenant = $1";
/// The ids of a transaction's further events of a tenant ($1 of them),
/// after the first that HEAD took: the sequence's next values, in order.
/// On one node every id comes from this sequence, taken under the tenant's
/// lock, so they are above the tenant's last id. On Citus (layout B) the
/// tenant's events are written on its worker, whose sequence is that node's
/// own and may be behind the ids the tenant's events already have (copied
/// from the coordinator by citus_distribute, or written on another node
/// before a shard move): the ids of a tenant's events must follow its chain
/// (docs/audit.md; verify_audit recomputes in id order), so HEAD's first id
/// is then the last one's plus one and moves the sequence past it, and these
/// follow it.
const MORE_IDS: &str = "SELECT pg_catalog.string_agg(pg_catalog.nextval('keyturn.event_id_seq')::pg_catalog.text, ' ' ORDER BY g) \
                          FROM pg_catalog.generate_series(1, $1::int) g";
/// Events written by one statement at most (one kept plan per row count).
const ROWS_PER_WRITE: usize = 16;
/// The columns of each row of `write_statement`, each a text parameter.
const WRITE_COLUMNS: usize = 12;
/// The statement writing `n` events (1 ..= ROWS_PER_WRITE), hashed already
/// (`hash_event`). `at` is written from the number (PostgreSQL's
/// microseconds since 2000-01-01), so the session's TimeZone is never read
/// or set. Rows, not `INSERT … SELECT` over arrays: Citus routes a
/// multi-row VALUES of one tenant to its shard from a delegated call.
///
/// `moves_head`: the statement also moves the head (HEAD_MOVED, its four
/// parameters after the rows'), in a data-modifying WITH: one statement
/// fewer under the tenant's chain lock. Not on Citus, which does not plan
/// two writes of distributed tables in one statement from a delegated call.
fn write_statement(n: usize, moves_head: bool) -> &'static str {
    static WRITES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    static WRITES_MOVING: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    if moves_head {
        let writes = WRITES_MOVING.get_or_init(|| {
            (1..=ROWS_PER_WRITE)
                .map(|rows| {
                    let p = |c: usize| format!("${}", rows * WRITE_COLUMNS + c);
                    format!(
                        "WITH written AS ({}) UPDATE keyturn.audit_chain c SET events = {}::bigint, head = {}, \
                         last_id = {}::bigint WHERE c.tenant = {}",
                        write_statement(rows, false),
                        p(2),
                        p(3),
                        p(4),
                        p(1)
                    )
                })
                .collect()
        });
        return writes[n - 1].as_str();
    }
    let writes = WRITES.get_or_init(|| {
        (1..=ROWS_PER_WRITE)
            .map(|rows| {
                let values: Vec<String> = (0..rows)
                    .map(|r| {
                        let p = |c: usize| format!("${}", r * WRITE_COLUMNS + c);
                        format!(
                            "({}::bigint, {}::pg_catalog.uuid, {}, {}, \
                             pg_catalog.timestamptz '2000-01-01 00:00:00+00' + ({} || ' microseconds')::interval, \
                             {}, {}, {}::keyturn.status, {}::keyturn.status, {}::pg_catalog.jsonb, {}, {})",
                            p(1), p(2), p(3), p(4), p(5), p(6), p(7), p(8), p(9), p(10), p(11), p(12)
                        )
                    })
                    .collect();
                format!(
                    "INSERT INTO keyturn.event (id, action_id, tenant, action_principal, at, db_role, principal, \
                                                from_status, to_status, detail, prev_hash, hash) \
                     OVERRIDING SYSTEM VALUE VALUES {}",
                    values.join(", ")
                )
            })
            .collect()
    });
    writes[n - 1].as_str()
}
const HEAD_MOVED: &str =
    "UPDATE keyturn.audit_chain c SET events = $2::bigint, head = $3, last_id = $4::bigint WHERE c.tenant = $1";

/// Writes this transaction's events at its commit, tenant by tenant in name
/// order, each tenant's in the order they happened. A tenant's chain is
/// written under a lock of keyturn's own on that tenant (a lock on an object
/// no statement of anyone else's can name, unlike an advisory lock), held
/// until the commit ends; the head is read, and written, in its newest
/// version (read_head, committed::on_latest), so a REPEATABLE READ
/// transaction chains to what committed after its snapshot instead of
/// failing to serialize. However many events a tenant has in the transaction
/// (a batch call of the dispatcher's commits one per action), its part of
/// the commit under the lock is the head and the ids ([`head_and_ids`]), the
/// hashes finished, and one insert per ROWS_PER_WRITE events, the last with
/// the head moved. Answers whether it wrote any.
pub fn write_pending() -> bool {
    let mut pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if pending.is_empty() {
        return false;
    }
    // SAFETY: a plain read of the transaction's state.
    if unsafe { pg_sys::XactReadOnly } {
        crate::error::KeyturnError::ReadOnly {
            message: "this transaction changed keyturn actions and was then made read only, so their \
                      audit events cannot be written at its COMMIT"
                .into(),
            hint: "Leave out SET TRANSACTION READ ONLY in a transaction that calls keyturn, or do the \
                   read-only work in a transaction of its own.",
        }
        .raise();
    }
    // Stable: within a tenant the order is the order of the changes.
    pending.sort_by(|a, b| a.tenant.cmp(&b.tenant));
    let _as_owner = RoleSwitch::to(extension_owner());
    let text = pg_sys::TEXTOID;
    let chain_lock_class = chain_table();
    // The events and the head in one statement, but on Citus
    // (`write_statement`). Without Citus loaded in this backend, a settings
    // lookup.
    let together = !crate::citus::active();
    let mut start = 0;
    while start < pending.len() {
        let tenant = pending[start].tenant.clone();
        let end = pending[start..]
            .iter()
            .position(|e| e.tenant != tenant)
            .map_or(pending.len(), |n| start + n);
        let events = &pending[start..end];
        // On a Citus worker, at the commit of a delegated call (layout B),
        // Citus refuses these statements unless allowed, for this tenant's
        // statements only and only when its shard is here (citus.rs).
        // Without Citus: None, nothing set. Before the lock: naming it reads
        // the database's key, which is such a statement the first time.
        let local = crate::citus::begin_local("keyturn.event", &tenant);
        lock_chain(chain_lock_class, &tenant);
        let t = Some(tenant.clone());
        let (count, mut prev, ids) = head_and_ids(&tenant, events.len(), together);
        if ids.len() != events.len() {
            error!("keyturn: no id for an audit event");
        }
        let mut rows: Vec<Option<String>> = Vec::with_capacity(events.len() * WRITE_COLUMNS);
        for (e, id) in events.iter().zip(&ids) {
            let hash = hash_event(id, &e.prepared, &prev);
            rows.extend([
                Some(id.clone()),
                Some(e.action_id.to_string()),
                t.clone(),
                Some(e.action_principal.clone()),
                Some(e.at.to_string()),
                Some(e.db_role.clone()),
                e.principal.clone(),
                e.from_status.clone(),
                Some(e.to_status.clone()),
                Some(e.detail.clone()),
                Some(std::mem::replace(&mut prev, hash.clone())),
                Some(hash),
            ]);
        }
        let moved = [
            t,
            Some((count + events.len() as i64).to_string()),
            Some(prev),
            ids.last().cloned(),
        ];
        let chunks: Vec<&[Option<String>]> = rows.chunks(ROWS_PER_WRITE * WRITE_COLUMNS).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let n = chunk.len() / WRITE_COLUMNS;
            if together && i + 1 == chunks.len() {
                let args: Vec<Option<String>> = chunk.iter().chain(&moved).cloned().collect();
                on_latest(
                    write_statement(n, true),
                    &args,
                    &vec![text; args.len()],
                    false,
                );
            } else {
                on_latest(
                    write_statement(n, false),
                    chunk,
                    &vec![text; chunk.len()],
                    false,
                );
            }
        }
        if !together {
            on_latest(HEAD_MOVED, &moved, &[text; 4], false);
        }
        crate::citus::end_local(local);
        start = end;
    }
    true
}

/// Under the tenant's lock: its chain's event count and head, and the ids of
/// its `n` events of this commit, in order. The head row is made once per
/// tenant, ever: read first, made only when there is none (under the lock,
/// so by this writer alone). On one node (`direct`) the head is read from
/// its index and the ids taken from the sequence without a statement, the
/// first part of a commit that every writer of the tenant waits for; on
/// Citus, where the head lives in the tenant's shard, by HEAD and MORE_IDS.
fn head_and_ids(tenant: &str, n: usize, direct: bool) -> (i64, String, Vec<String>) {
    let text = pg_sys::TEXTOID;
    let t = [Some(tenant.to_owned())];
    if direct {
        let (count, head, last_id) = read_head(tenant).unwrap_or_else(|| {
            on_latest(HEAD_MADE, &t, &[text], false);
            // SAFETY: makes the row just inserted visible to the next
            // snapshot of this transaction, as SPI does before a statement.
            unsafe { pg_sys::CommandCounterIncrement() };
            read_head(tenant).unwrap_or_else(|| error!("keyturn: no audit chain head for a tenant"))
        });
        let sequence = event_sequence();
        let next = || {
            // SAFETY: nextval of keyturn's own sequence, by OID, as the
            // extension owner (write_pending switched to it).
            unsafe {
                pgrx::direct_function_call::<i64>(
                    pg_sys::nextval_oid,
                    &[Some(pg_sys::Datum::from(sequence))],
                )
                .unwrap_or_else(|| error!("keyturn: no id for an audit event"))
            }
        };
        // Each id above the one before it, the chain's last included. The
        // sequence can be behind the chain (a restore, a shard moved back
        // from Citus): HEAD's setval, taken here the same way. Another
        // tenant's commit may set it back meanwhile (its own chain behind
        // it), so every id is checked, not only the first.
        let above = |before: i64| {
            let id = next();
            if id > before {
                return id;
            }
            on_latest(
                "SELECT pg_catalog.setval('keyturn.event_id_seq', $1::bigint)::text",
                &[Some((before + 1).to_string())],
                &[text],
                false,
            )
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| error!("keyturn: no id for an audit event"))
        };
        let mut ids = Vec::with_capacity(n);
        let mut before = last_id;
        for _ in 0..n {
            before = above(before);
            ids.push(before.to_string());
        }
        return (count, head, ids);
    }
    let head = on_latest(HEAD, &t, &[text], false).or_else(|| {
        on_latest(HEAD_MADE, &t, &[text], false);
        on_latest(HEAD, &t, &[text], false)
    });
    let head = head.unwrap_or_else(|| error!("keyturn: no audit chain head for a tenant"));
    let mut parts = head.splitn(4, ' ');
    let count: i64 = parts.next().unwrap_or("0").parse().unwrap_or(0);
    let prev = parts.next().unwrap_or("").to_owned();
    parts.next(); // the last id, which the first id is above
    let mut ids: Vec<String> = parts.next().map(str::to_owned).into_iter().collect();
    if n > 1 {
        let more =
            on_latest(MORE_IDS, &[Some((n - 1).to_string())], &[text], false).unwrap_or_default();
        ids.extend(more.split(' ').map(str::to_owned));
    }
    (count, prev, ids)
}

/// The tenant's head row (events, head, last_id) in its newest committed
/// version, by its primary key: what HEAD reads, without a statement. The
/// snapshot is taken under the tenant's lock, after the last writer's commit
/// released it, so that commit is in it.
fn read_head(tenant: &str) -> Option<(i64, String, i64)> {
    let (table, index) = (chain_table(), chain_index());
    // SAFETY: the relation is opened and closed here, the snapshot registered
    // and unregistered around the scan, and the tuple read before the scan
    // ends; the key is a text datum of this memory context.
    unsafe {
        let rel = pg_sys::table_open(table, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let mut key: pg_sys::ScanKeyData = std::mem::zeroed();
        pg_sys::ScanKeyInit(
            &mut key,
            pg_sys::get_attnum(table, c"tenant".as_ptr()),
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::RegProcedure::from(pg_sys::F_TEXTEQ),
            tenant.into_datum().unwrap_or(pg_sys::Datum::from(0)),
        );
        key.sk_collation = pg_sys::DEFAULT_COLLATION_OID;
        let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
        let scan = pg_sys::systable_beginscan(rel, index, true, snapshot, 1, &mut key);
        let tuple = pg_sys::systable_getnext(scan);
        let row = (!tuple.is_null()).then(|| {
            let desc = (*rel).rd_att;
            // By name: the columns' numbers are the install's or the upgrade's.
            let column = |name: &std::ffi::CStr| {
                let mut null = false;
                let n = pg_sys::get_attnum(table, name.as_ptr());
                (pg_sys::heap_getattr(tuple, n.into(), desc, &mut null), null)
            };
            let (events, _) = column(c"events");
            let (head, _) = column(c"head");
            let (last_id, _) = column(c"last_id");
            (
                i64::from_datum(events, false).unwrap_or(0),
                String::from_datum(head, false).unwrap_or_default(),
                i64::from_datum(last_id, false).unwrap_or(0),
            )
        });
        pg_sys::systable_endscan(scan);
        pg_sys::UnregisterSnapshot(snapshot);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        row
    }
}

/// An event's hash's first step (keyturn_core::audit::PreparedEvent): the
/// object verify_audit makes from `to_jsonb` of the row under TimeZone UTC,
/// but its id and `prev_hash`. `detail` as jsonb_out prints it, the text the
/// row will hold; `at` as PostgreSQL's JSON encoder prints it in UTC
/// (`json_utc`). 22023 for a detail the chain cannot hold.
#[allow(clippy::too_many_arguments)]
fn prepare(
    action_id: pgrx::Uuid,
    tenant: &str,
    action_principal: &str,
    at: i64,
    db_role: &str,
    principal: Option<&str>,
    from_status: Option<&str>,
    to_status: &str,
    detail: &str,
) -> keyturn_core::audit::PreparedEvent {
    let refuse = |e: keyturn_core::CoreError| -> ! {
        let message = match e {
            keyturn_core::CoreError::TooLarge { limit } => format!(
                "an audit event's detail (a reason, a note) is larger than {limit} bytes as \
                 canonical JSON, which the audit log cannot hold"
            ),
            other => format!("an audit event's detail cannot be recorded: {other}"),
        };
        crate::error::KeyturnError::InvalidArgument {
            message,
            hint: "Shorten the reason or note; keep long text elsewhere and refer to it.",
        }
        .raise()
    };
    let text = |s: &str| serde_json::Value::String(s.to_owned());
    let or_null = |s: Option<&str>| s.map_or(serde_json::Value::Null, text);
    let value = canonical::parse_bounded(detail).unwrap_or_else(|e| refuse(e));
    let serde_json::Value::Object(members) = serde_json::json!({
        "action_id": text(&action_id.to_string()),
        "tenant": text(tenant),
        "action_principal": text(action_principal),
        "at": text(&json_utc(at)),
        "db_role": text(db_role),
        "principal": or_null(principal),
        "from_status": or_null(from_status),
        "to_status": text(to_status),
        "detail": value,
    }) else {
        unreachable!("json! of braces is an object")
    };
    keyturn_core::audit::PreparedEvent::new(members).unwrap_or_else(|e| refuse(e))
}

/// The event's hash under the tenant's chain: its id and predecessor added
/// to what [`prepare`] made (keyturn_core::audit::event_hash of the whole).
fn hash_event(id: &str, prepared: &keyturn_core::audit::PreparedEvent, prev: &str) -> String {
    let number: serde_json::Value = serde_json::from_str(id)
        .unwrap_or_else(|_| error!("keyturn: an audit event's id is not a number"));
    prepared
        .hash(&number, prev)
        .unwrap_or_else(|e| error!("keyturn: an audit event cannot be hashed: {e}"))
}

/// A timestamptz (`at`, microseconds since 2000-01-01) as PostgreSQL's JSON
/// encoder writes it in UTC, whatever the session's TimeZone: the text
/// to_jsonb gives it under TimeZone UTC, which is what verify_audit hashes.
fn json_utc(at: i64) -> String {
    let utc: std::ffi::c_int = 0;
    // SAFETY: JsonEncodeDateTime with a NULL buffer pallocs one and returns
    // it NUL-terminated; the offset points at a local that outlives the call.
    unsafe {
        let text = pg_sys::JsonEncodeDateTime(
            std::ptr::null_mut(),
            pg_sys::Datum::from(at),
            pg_sys::TIMESTAMPTZOID,
            &utc,
        );
        std::ffi::CStr::from_ptr(text)
            .to_string_lossy()
            .into_owned()
    }
}

/// The OID of keyturn.audit_chain (the class of keyturn's per-tenant chain
/// locks), or InvalidOid where the extension predates the chain.
fn chain_table() -> pg_sys::Oid {
    crate::privilege::keyturn_relid(c"audit_chain").unwrap_or(pg_sys::Oid::INVALID)
}

/// The OID of keyturn.audit_chain's primary key (its columns: tenant).
fn chain_index() -> pg_sys::Oid {
    keyturn_relation(c"audit_chain_pkey")
}

/// The OID of keyturn.event's id sequence.
fn event_sequence() -> pg_sys::Oid {
    keyturn_relation(c"event_id_seq")
}

/// The OID of one of keyturn's relations, by name; a missing one is a broken install.
pub(crate) fn keyturn_relation(name: &std::ffi::CStr) -> pg_sys::Oid {
    crate::privilege::keyturn_relid(name).unwrap_or_else(|| {
        error!(
            "keyturn: {} is missing; reinstall the extension",
            name.to_string_lossy()
        )
    })
}

/// Takes keyturn's lock on a tenant's chain until the transaction ends:
/// LOCKTAG_OBJECT with keyturn.audit_chain's OID as its class, which is no
/// catalog, so nothing but this can ever take it, and 48 bits keyed by the
/// database's secret as its object ([`keyturn_core::audit::chain_lock_id`]):
/// two tenants share a lock only by chance, never by someone's choice.
fn lock_chain(class: pg_sys::Oid, tenant: &str) {
    let (objid, subid) = keyturn_core::audit::chain_lock_id(&crate::approval::key(), tenant);
    // SAFETY: a heavyweight lock on a made-up object, released at the end of
    // the transaction like every such lock.
    unsafe {
        pg_sys::LockDatabaseObject(
            class,
            pg_sys::Oid::from(objid),
            subid,
            pg_sys::ExclusiveLock as pg_sys::LOCKMODE,
        )
    }
}

/// A subtransaction at `level` committed (RELEASE, or a plpgsql block
/// that ended without an error): what it noted now belongs to its parent,
/// so a later sibling at the same depth that rolls back leaves it be.
pub fn keep_in_parent(level: i32) {
    PENDING.with(|s| {
        for x in s.borrow_mut().iter_mut().filter(|x| x.level >= level) {
            x.level = level - 1;
        }
    });
}

/// Forgets what an aborted subtransaction produced.
pub fn forget_from_level(level: i32) {
    PENDING.with(|p| p.borrow_mut().retain(|e| e.level < level));
}

/// Whether this transaction has events to chain at its commit.
pub fn has_pending() -> bool {
    PENDING.with(|p| !p.borrow().is_empty())
}

/// Forgets everything at the end of the transaction.
pub fn forget_all() {
    PENDING.with(|p| p.borrow_mut().clear());
}

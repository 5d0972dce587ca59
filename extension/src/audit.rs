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
//! head row is locked there, the events get their ids and hashes in order
//! (keyturn._chain_events), and the lock lasts only for the commit itself.
//! A transaction thus sees its own events after it commits, not before.

use std::cell::RefCell;

use pgrx::prelude::*;

use crate::committed::on_latest;
use crate::jsonb_text::JsonbText;
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
    detail: String,
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
            detail: detail.to_owned(),
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
                             VALUES ($1, $2, $3, $4, $5, $6::keyturn.status, $7::keyturn.status, $8::jsonb)";
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
/// The next event's id: the sequence's next value, which on one node is
/// always above the tenant's last id ($1; every id came from this sequence,
/// taken under the tenant's lock), so there it is exactly nextval. On Citus
/// (layout B) the tenant's events are written on its worker, whose sequence
/// is that node's own and may be behind the ids the tenant's events already
/// have (copied from the coordinator by citus_distribute, or written on
/// another node before a shard move): the ids of a tenant's events must
/// follow its chain (docs/audit.md; verify_audit recomputes in id order), so
/// the id is then the last one's plus one, and the sequence is moved past
/// it so that this node's later ids are above it too. HEAD takes the first
/// event's so; this, each further one's.
const NEXT_ID: &str = "SELECT (CASE WHEN n > $1::bigint THEN n \
                                   ELSE pg_catalog.setval('keyturn.event_id_seq', $1::bigint + 1) END)::text \
                         FROM pg_catalog.nextval('keyturn.event_id_seq') n";
/// The event and its hash, of the very values written. The hash is of the
/// row as to_jsonb prints it with TimeZone UTC: `at` ($5, PostgreSQL's
/// microseconds since 2000-01-01) is written from the number, and hashed
/// as the text PostgreSQL's JSON encoder makes of it in UTC ($12,
/// `json_utc`), so the session's TimeZone is never set (it was one more
/// statement a commit, under the lock).
const WRITE: &str = "\
INSERT INTO keyturn.event (id, action_id, tenant, action_principal, at, db_role, principal, from_status, to_status, \
                           detail, prev_hash, hash) OVERRIDING SYSTEM VALUE \
VALUES ($1::bigint, $2::uuid, $3, $4, timestamptz '2000-01-01 00:00:00+00' + ($5 || ' microseconds')::interval, \
        $6, $7, $8::keyturn.status, $9::keyturn.status, $10::jsonb, $11, \
        keyturn._event_hash(jsonb_build_object( \
            'id', $1::bigint, 'action_id', $2::uuid, 'tenant', $3, 'action_principal', $4, \
            'at', $12, \
            'db_role', $6, 'principal', $7, 'from_status', $8::keyturn.status, 'to_status', $9::keyturn.status, \
            'detail', $10::jsonb, 'prev_hash', $11))) \
RETURNING hash";
const HEAD_MOVED: &str =
    "UPDATE keyturn.audit_chain c SET events = $2::bigint, head = $3, last_id = $4::bigint WHERE c.tenant = $1";

/// Writes this transaction's events at its commit, tenant by tenant in name
/// order, each tenant's in the order they happened. A tenant's chain is
/// written under a lock of keyturn's own on that tenant (a lock on an object
/// no statement of anyone else's can name, unlike an advisory lock), held
/// until the commit ends; the head is read, and written, in its newest
/// version (committed::on_latest), so a REPEATABLE READ transaction chains
/// to what committed after its snapshot instead of failing to serialize.
pub fn write_pending() {
    let mut pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if pending.is_empty() {
        return;
    }
    // Stable: within a tenant the order is the order of the changes.
    pending.sort_by(|a, b| a.tenant.cmp(&b.tenant));
    let _as_owner = RoleSwitch::to(extension_owner());
    let text = pg_sys::TEXTOID;
    let chain_lock_class = chain_table();
    let mut start = 0;
    while start < pending.len() {
        let tenant = pending[start].tenant.clone();
        let end = pending[start..]
            .iter()
            .position(|e| e.tenant != tenant)
            .map_or(pending.len(), |n| start + n);
        lock_chain(chain_lock_class, &tenant);
        // On a Citus worker, at the commit of a delegated call (layout B),
        // Citus refuses these statements unless allowed, for this tenant's
        // statements only and only when its shard is here (citus.rs).
        // Without Citus: None, nothing set.
        let local = crate::citus::begin_local("keyturn.event", &tenant);
        let t = Some(tenant.clone());
        // The head row is made once per tenant, ever: read first, made
        // only when there is none (under the lock, so by this writer alone).
        let head = on_latest(HEAD, std::slice::from_ref(&t), &[text], false).or_else(|| {
            on_latest(HEAD_MADE, std::slice::from_ref(&t), &[text], false);
            on_latest(HEAD, std::slice::from_ref(&t), &[text], false)
        });
        let head = head.unwrap_or_else(|| error!("keyturn: no audit chain head for a tenant"));
        let mut parts = head.splitn(4, ' ');
        let mut count: i64 = parts.next().unwrap_or("0").parse().unwrap_or(0);
        let mut prev = parts.next().unwrap_or("").to_owned();
        let mut last_id = parts.next().unwrap_or("0").to_owned();
        let mut first_id = parts.next().map(str::to_owned);
        for e in &pending[start..end] {
            let id = first_id
                .take()
                .or_else(|| on_latest(NEXT_ID, &[Some(last_id)], &[text], false));
            last_id = id
                .clone()
                .unwrap_or_else(|| error!("keyturn: no id for an audit event"));
            let written = on_latest(
                WRITE,
                &[
                    id,
                    Some(e.action_id.to_string()),
                    t.clone(),
                    Some(e.action_principal.clone()),
                    Some(e.at.to_string()),
                    Some(e.db_role.clone()),
                    e.principal.clone(),
                    e.from_status.clone(),
                    Some(e.to_status.clone()),
                    Some(e.detail.clone()),
                    Some(prev.clone()),
                    Some(json_utc(e.at)),
                ],
                &[text; 12],
                false,
            );
            prev = written.unwrap_or_else(|| error!("keyturn: an audit event was not written"));
            count += 1;
        }
        on_latest(
            HEAD_MOVED,
            &[t, Some(count.to_string()), Some(prev), Some(last_id)],
            &[text; 4],
            false,
        );
        crate::citus::end_local(local);
        start = end;
    }
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
    // SAFETY: catalog cache lookups; both names are keyturn's own.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"keyturn".as_ptr(), true);
        if schema == pg_sys::Oid::INVALID {
            return pg_sys::Oid::INVALID;
        }
        pg_sys::get_relname_relid(c"audit_chain".as_ptr(), schema)
    }
}

/// Takes keyturn's lock on a tenant's chain until the transaction ends:
/// LOCKTAG_OBJECT with keyturn.audit_chain's OID as its class, which is no
/// catalog, so nothing but this can ever take it. Two tenants whose names
/// hash alike share a lock, which only makes them wait for each other.
fn lock_chain(class: pg_sys::Oid, tenant: &str) {
    let digest = keyturn_core::token::token_digest(tenant);
    let objid = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    // SAFETY: a heavyweight lock on a made-up object, released at the end of
    // the transaction like every such lock.
    unsafe {
        pg_sys::LockDatabaseObject(
            class,
            pg_sys::Oid::from(objid),
            0,
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

/// Forgets everything at the end of the transaction.
pub fn forget_all() {
    PENDING.with(|p| p.borrow_mut().clear());
}

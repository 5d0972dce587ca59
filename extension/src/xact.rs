//! Backend state that must not outlive a transaction (the acting role, a
//! business statement under way, the approval decisions to check again at
//! commit, the audit events to write) is forgotten when every transaction
//! ends, committed or aborted, whatever path the code took; and the commit
//! itself checks those decisions again (crate::committed) and writes the
//! events into their tenants' chains (crate::audit).

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::{actor, audit, committed, durable, privilege};

/// Registers the callbacks; once per backend, from `_PG_init`.
pub fn register() {
    // SAFETY: registering plain function pointers with no argument.
    unsafe {
        pg_sys::RegisterXactCallback(Some(at_end), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(at_sub_end), std::ptr::null_mut());
    }
}

/// pg_guard: the commit check may raise an ERROR, which must reach
/// PostgreSQL as an ERROR (aborting the commit), never unwind into C.
#[pg_guard]
unsafe extern "C-unwind" fn at_end(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_PRE_COMMIT | XACT_EVENT_PRE_PREPARE => {
            // An implicit commit (a single statement outside BEGIN, over the
            // extended protocol) runs after the statement's portal closed,
            // with no active snapshot: the SQL run here (planning a
            // statement, a function it calls) needs one, as deferred
            // triggers do at the same point (AfterTriggerFireDeferred).
            // SAFETY: the push is popped below on the normal path; an ERROR
            // aborts the transaction, whose cleanup resets the stack.
            let pushed = unsafe {
                if pg_sys::ActiveSnapshotSet() {
                    false
                } else {
                    pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
                    true
                }
            };
            if event == XACT_EVENT_PRE_PREPARE {
                refuse_prepare();
            }
            refuse_temporary_tables();
            // In this order: what the recheck will read is locked first,
            // before any wait, so a kill switch from here on waits for this
            // commit to end (docs/security.md, row 95); then the events,
            // which take each tenant's chain, which another commit of the
            // tenant may hold for as long as its own commit takes; then the
            // decisions are read again, after that wait, so a revocation or
            // the kill switch committed during it is seen (row 90). An error
            // here rolls the events back with the rest.
            committed::hold_noted();
            let chained = audit::write_pending();
            committed::check_noted();
            if chained {
                // Last: what follows cannot fail on keyturn's account.
                durable::release_early();
            }
            if pushed {
                // SAFETY: pops the snapshot pushed above.
                unsafe { pg_sys::PopActiveSnapshot() };
            }
        }
        XACT_EVENT_COMMIT
        | XACT_EVENT_ABORT
        | XACT_EVENT_PREPARE
        | XACT_EVENT_PARALLEL_COMMIT
        | XACT_EVENT_PARALLEL_ABORT => {
            if event == XACT_EVENT_COMMIT {
                durable::at_commit();
            } else {
                durable::at_abort();
            }
            actor::clear();
            privilege::reset_business();
            committed::forget_all();
            audit::forget_all();
        }
        _ => {}
    }
}

/// PREPARE TRANSACTION of a transaction in which any keyturn entry point ran
/// is refused (0A000). One that changed actions would keep its tenant's audit chain locked
/// (its events are chained at PREPARE) until someone commits or rolls it
/// back, which outlives the session and a restart; every commit of that
/// tenant, and keyturnd's work across tenants, would wait behind it. And the
/// commit's rechecks (crate::committed) run at PREPARE, so a COMMIT PREPARED
/// much later would commit a decision nobody checked since (sixth red-team
/// pass, docs/security.md row 87). Citus's own two-phase commit is no
/// exception: nothing marks its connections in a way a client cannot copy
/// (their application_name is anyone's to claim: row 88), and keyturn's
/// Citus layouts commit a transaction that changed actions in one phase.
/// And any keyturn call that writes or locks keyturn's rows without an
/// event would keep those locks as long: an agent's `cancel_origin` of its
/// own conversation kept it live while the person's waited for ever
/// (fourteenth red-team pass, row 107); the dispatcher's prepared
/// `register_discovered_tool` held the tool's recheck lock, so every
/// approval of the tool waited in its COMMIT and the kill switch behind it
/// (fifteenth pass, row 112). So the rule is keyturn's entry, not a list of
/// calls.
fn refuse_prepare() {
    if changed_actions() || privilege::entered() {
        crate::error::KeyturnError::NotSupported {
            message: "a transaction in which keyturn acted cannot be prepared (PREPARE TRANSACTION)".into(),
            hint: "COMMIT it instead; a prepared transaction would keep keyturn's rows (and a tenant's audit chain) locked until COMMIT PREPARED.",
        }
        .raise();
    }
}

/// A transaction that changed actions, touched temporary tables, and runs in a
/// session with more than [`TEMPORARY_RELATIONS`] temporary relations (tables,
/// their indexes, views, sequences) is refused at COMMIT
/// (0A000). PostgreSQL drops a transaction's `ON COMMIT DROP` tables, and
/// empties its `ON COMMIT DELETE ROWS` ones, after this callback: after the
/// commit's recheck of its decisions, with its tenants' chains held. A few
/// thousand such tables made that last part of a commit take half a second,
/// during which a kill switch returned and the covered write still committed
/// after it (eighth red-team pass, docs/security.md row 92). The bound keeps
/// that part to a few milliseconds and leaves a script that keeps a proposal
/// in a temporary table alone. Only a transaction PostgreSQL flags as having
/// touched its temporary namespace has such work to do.
fn refuse_temporary_tables() {
    // SAFETY: a plain read of this backend's transaction flags.
    let flags = unsafe { pg_sys::MyXactFlags } as u32;
    if flags & pg_sys::XACT_FLAGS_ACCESSEDTEMPNAMESPACE == 0 || !changed_actions() {
        return;
    }
    // Relations, not tables: dropping or emptying a table costs as much
    // again for each of its indexes.
    let many = Spi::get_one::<bool>(&format!(
        "SELECT count(*) > {TEMPORARY_RELATIONS} FROM (SELECT FROM pg_catalog.pg_class \
          WHERE relnamespace = pg_catalog.pg_my_temp_schema() LIMIT {TEMPORARY_RELATIONS} + 1) t"
    ));
    if many != Ok(Some(false)) {
        crate::error::KeyturnError::NotSupported {
            message: format!(
                "a transaction that changed keyturn actions cannot commit in a session with more than {TEMPORARY_RELATIONS} temporary tables and indexes"
            ),
            hint: "Drop temporary tables you no longer need, or change actions in a session of its own: PostgreSQL drops and empties temporary tables after keyturn's last check at COMMIT, where a revocation or the kill switch would go unseen.",
        }
        .raise();
    }
}

/// How many temporary relations a session that changes actions may hold.
const TEMPORARY_RELATIONS: u32 = 64;

/// Whether this transaction changed actions: it has audit events to write,
/// or decisions the commit checks again.
fn changed_actions() -> bool {
    audit::has_pending() || committed::has_noted()
}

#[pg_guard]
unsafe extern "C-unwind" fn at_sub_end(
    event: pg_sys::SubXactEvent::Type,
    _my_subid: pg_sys::SubTransactionId,
    _parent_subid: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    // SAFETY: a plain read of the backend's transaction state; the ending
    // subtransaction is still the current level here.
    let level = unsafe { pg_sys::GetCurrentTransactionNestLevel() };
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        committed::forget_from_level(level);
        audit::forget_from_level(level);
        actor::forget_from_level(level);
    } else if event == pg_sys::SubXactEvent::SUBXACT_EVENT_COMMIT_SUB {
        // Its events and noted decisions are its parent's now: without this,
        // a sibling savepoint rolled back at the same depth later dropped
        // them (an action's creation event lost, a commit recheck skipped).
        committed::keep_in_parent(level);
        audit::keep_in_parent(level);
        actor::keep_in_parent(level);
    }
}

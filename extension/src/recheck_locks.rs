//! The locks that order a commit's recheck against the changes it rechecks
//! (docs/security.md, row 95).
//!
//! A commit reads its approval decisions again at PRE_COMMIT (crate::committed):
//! the tool still enabled at the version approved, each principal's
//! authorization unchanged. What PostgreSQL does after that callback (queue
//! the transaction's NOTIFYs, under a lock of the whole database; drop its
//! ON COMMIT DROP tables) can take seconds, and a kill switch that committed
//! in those seconds would return before a write it covers committed. So the
//! commit takes a share lock on each tool and authorization it rechecks
//! before it reads them (before its tenants' chains, which it may wait for),
//! held to its end, and every change to a tool's switch or version, or to an
//! authorization, takes the same lock exclusively before it commits: it
//! waits for every commit that has read the old state to end, and a commit
//! that comes after it waits for it and reads the new state. Nothing waits
//! while a transaction is merely open: the share lock is the commit's.

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::audit::keyturn_relation;

/// What a recheck reads, as the lock that stands for it: keyturn.tool's OID
/// for a tool, keyturn.auth_epoch's for an authorization, as the lock's
/// class (a class no other lock uses), and a keyed hash of the names.
fn lock_of(
    key: &[u8],
    tool: Option<&str>,
    tenant: &str,
    principal: &str,
) -> (pg_sys::Oid, u32, u16) {
    match tool {
        Some(tool) => {
            let (objid, subid) = keyturn_core::audit::recheck_lock_id(key, &[tool]);
            (keyturn_relation(c"tool"), objid, subid)
        }
        None => {
            let (objid, subid) = keyturn_core::audit::recheck_lock_id(key, &[tenant, principal]);
            (keyturn_relation(c"auth_epoch"), objid, subid)
        }
    }
}

fn lock(object: (pg_sys::Oid, u32, u16), mode: u32) {
    // SAFETY: a heavyweight lock on a made-up object of a class nothing else
    // locks, released at the end of the transaction like every such lock.
    unsafe {
        pg_sys::LockDatabaseObject(
            object.0,
            pg_sys::Oid::from(object.1),
            object.2,
            mode as pg_sys::LOCKMODE,
        )
    }
}

/// At PRE_COMMIT, before the recheck reads anything: a share lock on each
/// tool and authorization `decisions` names (tool, tenant, principal), in one
/// order for every backend.
pub fn hold<'a>(decisions: impl Iterator<Item = (Option<&'a str>, &'a str, &'a str)>) {
    let key = crate::approval::key();
    let mut objects: Vec<(pg_sys::Oid, u32, u16)> = Vec::new();
    for (tool, tenant, principal) in decisions {
        if tool.is_some() {
            objects.push(lock_of(&key, tool, tenant, principal));
        }
        objects.push(lock_of(&key, None, tenant, principal));
    }
    objects.sort_by_key(|o| (o.0.to_u32(), o.1, o.2));
    objects.dedup();
    for object in objects {
        lock(object, pg_sys::ShareLock);
    }
}

/// Called by every change to a tool's switch or version (`tool`) or to a
/// principal's authorization (`tool` NULL), after the change and before its
/// transaction commits: waits for the commits that have read the old state.
/// Returns '' (assigned, not PERFORMed).
#[pg_extern(name = "_await_rechecks", volatile, parallel_unsafe)]
fn await_rechecks(tool: Option<&str>, tenant: Option<&str>, principal: Option<&str>) -> String {
    // The database's key (keyturn_secret) is the owner's to read.
    let _as_owner = crate::privilege::RoleSwitch::to(crate::privilege::extension_owner());
    let key = crate::approval::key();
    lock(
        lock_of(&key, tool, tenant.unwrap_or(""), principal.unwrap_or("")),
        pg_sys::ExclusiveLock,
    );
    String::new()
}

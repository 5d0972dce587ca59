//! The approval binding's SQL entry points (keyturn-core `approval` has the
//! MAC). The key lives in `keyturn_secret.approval_key`, one row made on
//! first use, readable by the extension owner alone (no grants, RLS forced
//! with no policy), and dumped with the data so that a restored database
//! still verifies the approvals it holds.

use keyturn_core::approval::{self, Approval};
use pgrx::prelude::*;

use crate::error::KeyturnError;

thread_local! {
    // (installation, key): the key never changes while the extension exists;
    // a new extension (DROP + CREATE) is a new installation with a new key
    // (crate::privilege::installation).
    static KEY: std::cell::RefCell<Option<(pg_sys::Oid, Vec<u8>)>> = const { std::cell::RefCell::new(None) };
}

/// The database's approval key, if it has one yet. Cached only once read
/// back from the table: a key this transaction inserted might still roll back.
fn existing_key() -> Option<Vec<u8>> {
    let installation = crate::privilege::installation();
    if let Some(k) = KEY.with(|k| {
        k.borrow()
            .as_ref()
            .filter(|(oid, _)| Some(*oid) == installation)
            .map(|(_, key)| key.clone())
    }) {
        return Some(k);
    }
    let key = Spi::get_one::<Vec<u8>>("SELECT key FROM keyturn_secret.approval_key WHERE id = 1")
        .ok()
        .flatten()
        .filter(|k| k.len() == approval::KEY_BYTES)?;
    KEY.with(|k| *k.borrow_mut() = installation.map(|i| (i, key.clone())));
    Some(key)
}

/// The database's secret key (the approval key, which also keys the audit
/// chain's lock ids), made on first use. Not at CREATE EXTENSION: a restore
/// creates the extension and then copies the dumped key in, which must be
/// the one that verifies the dumped approvals. Two first uses at once agree:
/// the second waits on the first's insert and reads its key.
pub fn key() -> Vec<u8> {
    if let Some(key) = existing_key() {
        return key;
    }
    let fresh = approval::new_key().to_vec();
    Spi::get_one_with_args::<Vec<u8>>(
        "WITH made AS (INSERT INTO keyturn_secret.approval_key (id, key) VALUES (1, $1) \
                       ON CONFLICT (id) DO NOTHING RETURNING key) \
         SELECT key FROM made UNION ALL \
         SELECT key FROM keyturn_secret.approval_key WHERE id = 1 AND NOT EXISTS (SELECT 1 FROM made)",
        &[fresh.into()],
    )
    .ok()
    .flatten()
    // A concurrent first use committed its key after this statement's
    // snapshot: a new statement sees it (under READ COMMITTED).
    .or_else(existing_key)
    .unwrap_or_else(|| {
        KeyturnError::Busy("the approval key was being made by another transaction; try again".into())
            .raise()
    })
}

/// Makes the approval key now if there is none yet. For
/// `keyturn.citus_distribute()`: on Citus the key lives in a reference
/// table, which a call delegated to a worker cannot write, so the first
/// approval there could not make it. Returns true.
#[pg_extern(name = "_ensure_approval_key", volatile, parallel_unsafe)]
pub fn ensure_approval_key() -> bool {
    !key().is_empty()
}

/// The MAC binding an approval to the action and its params hash.
#[pg_extern(name = "_approval_mac", volatile, strict, parallel_unsafe)]
fn approval_mac(
    action_id: pgrx::Uuid,
    params_hash: &str,
    approved_by: &str,
    approved_role: &str,
    approved_at: TimestampWithTimeZone,
    via: &str,
) -> Vec<u8> {
    approval::mac(
        &key(),
        &Approval {
            action_id: action_id.as_bytes(),
            params_hash,
            approved_by,
            approved_role,
            approved_at_micros: approved_at.into_inner(),
            via,
        },
    )
    .to_vec()
}

/// What a `retain = digest` action stores for its params hash: a MAC under
/// the key no role can read (keyturn-core `approval::digest_mac`).
#[pg_extern(name = "_digest_mac", volatile, strict, parallel_unsafe)]
fn digest_mac(params_hash: &str) -> String {
    approval::digest_mac(&key(), params_hash)
}

/// [`keyturn_core::approval::commitment`] under the database's key: what
/// an audit event commits to of its action (the lifecycle trigger), and what
/// `verify_audit` recomputes from the action row.
pub fn commitment(what: &str, value: &[u8]) -> String {
    approval::commitment(&key(), what, value)
}

/// [`commitment`] for `verify_audit` (sql/059_audit.sql).
#[pg_extern(name = "_commitment", volatile, strict, parallel_unsafe)]
fn commitment_sql(what: &str, value: &str) -> String {
    commitment(what, value.as_bytes())
}

/// Whether `plain`, the params hash of what is being approved, is what the
/// action stored: equal for `retain = full`, the digest MAC of it for
/// `retain = digest`; in constant time either way. The one comparison of a
/// resubmitted or replayed params hash with a stored one.
#[pg_extern(name = "_params_hash_matches", volatile, parallel_unsafe)]
fn params_hash_matches(retain: Option<&str>, stored: Option<&str>, plain: Option<&str>) -> bool {
    let (Some(retain), Some(stored), Some(plain)) = (retain, stored, plain) else {
        return false;
    };
    if retain == "digest" {
        approval::digest_matches(&key(), plain, stored)
    } else {
        keyturn_core::token::ct_eq(stored.as_bytes(), plain.as_bytes())
    }
}

/// Whether an approval produced this row's state: false when any field or
/// the MAC is missing or does not verify.
#[pg_extern(name = "_approval_valid", volatile, parallel_unsafe)]
fn approval_valid(
    action_id: Option<pgrx::Uuid>,
    params_hash: Option<&str>,
    approved_by: Option<&str>,
    approved_role: Option<&str>,
    approved_at: Option<TimestampWithTimeZone>,
    via: Option<&str>,
    mac: Option<&[u8]>,
) -> bool {
    binding_valid(
        action_id,
        params_hash,
        approved_by,
        approved_role,
        approved_at.map(TimestampWithTimeZone::into_inner),
        via,
        mac,
    )
}

/// `_approval_valid` for Rust callers (the approval trigger), the time in
/// PostgreSQL's microseconds.
pub fn binding_valid(
    action_id: Option<pgrx::Uuid>,
    params_hash: Option<&str>,
    approved_by: Option<&str>,
    approved_role: Option<&str>,
    approved_at_micros: Option<i64>,
    via: Option<&str>,
    mac: Option<&[u8]>,
) -> bool {
    let (
        Some(action_id),
        Some(params_hash),
        Some(approved_by),
        Some(approved_role),
        Some(approved_at_micros),
        Some(via),
        Some(mac),
    ) = (
        action_id,
        params_hash,
        approved_by,
        approved_role,
        approved_at_micros,
        via,
        mac,
    )
    else {
        return false;
    };
    // No key yet: no approval was ever bound, so none verifies.
    let Some(key) = existing_key() else {
        return false;
    };
    approval::verify(
        &key,
        &Approval {
            action_id: action_id.as_bytes(),
            params_hash,
            approved_by,
            approved_role,
            approved_at_micros,
            via,
        },
        mac,
    )
}

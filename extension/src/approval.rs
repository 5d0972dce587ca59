//! The approval binding's SQL entry points (keyturn-core `approval` has the
//! MAC). The key lives in `keyturn_secret.approval_key`, one row written at
//! `CREATE EXTENSION`, readable by the extension owner alone (no grants, RLS
//! forced with no policy), and dumped with the data so that a restored
//! database still verifies the approvals it holds.

use keyturn_core::approval::{self, Approval};
use pgrx::prelude::*;

use crate::error::KeyturnError;

thread_local! {
    // (extension oid, key): the key never changes while the extension exists;
    // a new extension (DROP + CREATE) has a new oid and a new key.
    static KEY: std::cell::RefCell<Option<(pg_sys::Oid, Vec<u8>)>> = const { std::cell::RefCell::new(None) };
}

fn key() -> Vec<u8> {
    // SAFETY: a catalog lookup that returns InvalidOid when missing.
    let extension = unsafe { pg_sys::get_extension_oid(c"pg_keyturn".as_ptr(), true) };
    if let Some(k) = KEY.with(|k| {
        k.borrow()
            .as_ref()
            .filter(|(oid, _)| *oid == extension)
            .map(|(_, key)| key.clone())
    }) {
        return k;
    }
    let key = Spi::get_one::<Vec<u8>>("SELECT key FROM keyturn_secret.approval_key")
        .ok()
        .flatten()
        .filter(|k| k.len() == approval::KEY_BYTES)
        .unwrap_or_else(|| {
            KeyturnError::NotReady(
                "the approval key is missing; no approval can be recorded or verified (restore keyturn_secret.approval_key from a dump of this database)".into(),
            )
            .raise()
        });
    KEY.with(|k| *k.borrow_mut() = Some((extension, key.clone())));
    key
}

/// A fresh approval key, for `CREATE EXTENSION`.
#[pg_extern(name = "_new_approval_key", volatile, parallel_unsafe)]
fn new_approval_key() -> Vec<u8> {
    approval::new_key().to_vec()
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
    let (
        Some(action_id),
        Some(params_hash),
        Some(approved_by),
        Some(approved_role),
        Some(approved_at),
        Some(via),
        Some(mac),
    ) = (
        action_id,
        params_hash,
        approved_by,
        approved_role,
        approved_at,
        via,
        mac,
    )
    else {
        return false;
    };
    approval::verify(
        &key(),
        &Approval {
            action_id: action_id.as_bytes(),
            params_hash,
            approved_by,
            approved_role,
            approved_at_micros: approved_at.into_inner(),
            via,
        },
        mac,
    )
}

//! When a commit that wrote audit events lets its tenants' chains go, and
//! when its COMMIT returns.
//!
//! A commit that writes events holds each of its tenants' chains (crate::audit)
//! until PostgreSQL releases its locks, and PostgreSQL releases a transaction's
//! locks only after its commit record is flushed. So one tenant's commits would
//! pass its chain one WAL flush at a time, and could never share a flush the
//! way concurrent commits do: 16 clients of one busy tenant ran at 0.69 of the
//! same clients spread over tenants.
//!
//! The chain needs order, not that wait. Such a commit is therefore written as
//! an asynchronous one (its commit record inserted, not flushed), which lets
//! PostgreSQL end it and release its locks at once; then, before COMMIT returns
//! to its client, it waits for the flush, and for synchronous standbys, exactly
//! as the session's `synchronous_commit` asks. The chain stays whole through a
//! crash: the next writer of the tenant reads this commit's head only after
//! this commit record is in the WAL, so its own record comes later, and no crash
//! keeps it without this one. What changes is what other sessions may see: this
//! commit, up to one flush before it is durable (a crash in that window loses
//! it, as it would have lost it a moment earlier). Its own client is told only
//! once it is durable. `keyturn.chain_early_release = off` (superuser) keeps
//! PostgreSQL's own order. docs/audit.md says all of this for operators.

use std::cell::Cell;

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::guc;

thread_local! {
    /// The session's `synchronous_commit`, while this commit runs as an
    /// asynchronous one.
    static LEVEL: Cell<Option<i32>> = const { Cell::new(None) };
    /// Where the committed transaction's WAL ends, to be flushed before
    /// COMMIT returns.
    static FLUSH_TO: Cell<Option<pg_sys::XLogRecPtr>> = const { Cell::new(None) };
}

/// Registers the wait; once per backend, from `_PG_init`.
pub fn register() {
    // SAFETY: registering a plain function pointer with no argument.
    unsafe { pg_sys::RegisterResourceReleaseCallback(Some(after_locks), std::ptr::null_mut()) }
}

/// At the end of the pre-commit, once this transaction's events are written
/// and nothing of keyturn's can fail any more: commit without waiting for
/// the flush. Later failures of the commit (another extension, a
/// serialization failure) abort it, and `at_abort` puts the setting back.
pub fn release_early() {
    if !guc::chain_early_release() {
        return;
    }
    // SAFETY: PostgreSQL's own setting, read by RecordTransactionCommit in
    // this backend; set directly (not through the GUC machinery) so that
    // nothing else about the setting changes, and put back at this
    // transaction's end, whichever way it ends.
    unsafe {
        let level = pg_sys::synchronous_commit;
        if level <= pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_OFF as i32 {
            return; // the session asked for asynchronous commits itself
        }
        LEVEL.set(Some(level));
        pg_sys::synchronous_commit = pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_OFF as i32;
    }
}

/// XACT_EVENT_COMMIT: the commit record is written and the transaction is
/// over for everyone else; its locks are still held. The session's setting
/// comes back, and the wait for its flush is due.
pub fn at_commit() {
    if let Some(level) = LEVEL.take() {
        // SAFETY: see release_early; XactLastCommitEnd was set by
        // RecordTransactionCommit of this very commit.
        unsafe {
            pg_sys::synchronous_commit = level;
            FLUSH_TO.set(Some(pg_sys::XactLastCommitEnd));
        }
    }
}

/// Any other end of the transaction: the session's setting comes back.
pub fn at_abort() {
    if let Some(level) = LEVEL.take() {
        // SAFETY: see release_early.
        unsafe { pg_sys::synchronous_commit = level };
    }
    FLUSH_TO.set(None);
}

/// After the committed transaction's locks are released (the next writer of
/// the chain is on its way), and before COMMIT returns: the flush, and the
/// synchronous standbys, that RecordTransactionCommit would have waited for
/// with the locks held. Called for every resource owner released; the first
/// call at the top level's commit does the wait.
#[pg_guard]
unsafe extern "C-unwind" fn after_locks(
    phase: pg_sys::ResourceReleasePhase::Type,
    is_commit: bool,
    is_top_level: bool,
    _arg: *mut std::ffi::c_void,
) {
    if phase != pg_sys::ResourceReleasePhase::RESOURCE_RELEASE_AFTER_LOCKS
        || !is_commit
        || !is_top_level
    {
        return;
    }
    if let Some(lsn) = FLUSH_TO.take() {
        // SAFETY: both are what RecordTransactionCommit calls for a
        // synchronous commit, with the record's end; the session's
        // synchronous_commit is its own again, so SyncRepWaitForLSN waits
        // exactly when it would have.
        unsafe {
            pg_sys::XLogFlush(lsn);
            pg_sys::SyncRepWaitForLSN(lsn, true);
        }
    }
}

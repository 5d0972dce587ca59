//! The outcome journal: every provider outcome keyturnd observed, on its own
//! disk, from before it is sent to the database until the database has
//! answered for it. A keyturnd killed in between (SIGKILL, OOM, a host
//! reboot) leaves the outcome here, and the next keyturnd started on the same
//! directory records it ([`crate::worker`]'s start-up replay) before it
//! sweeps: the action gets the outcome that was observed instead of ending
//! `uncertain`.
//!
//! **Only observations.** An entry is written only for an outcome an adapter
//! (or the worker, for a call it certainly did not make) returned, with the
//! receipt it returned; nothing is ever inferred from a journal, and a call
//! still in flight has no entry.
//!
//! **Written at once, synced in groups.** An outcome is written to the file
//! the moment it is observed ([`Journal::write`], no sync: it survives the
//! process from then on, a SIGKILL included); the journal writer then makes
//! everything written meanwhile durable with one `fdatasync`
//! ([`Journal::sync`], group commit) before passing it on to be sent in a
//! `keyturn.complete_many`. Once the database answered for an outcome
//! (recorded, or refused for good) an acknowledgement is appended without a
//! sync ([`Journal::ack`]): were it lost with the host, the replay's
//! `complete` is refused with `55000` and the entry dropped.
//!
//! **Bounded.** The file is rewritten with only the unacknowledged outcomes
//! once it passes [`COMPACT_BYTES`] (and twice their size), and always at
//! start, so it stays below that plus one batch; while the database is
//! unreachable no job is leased, so the unacknowledged outcomes are at most
//! the calls that were in flight, plus those whose recording was given up.
//!
//! **Failure.** A directory that cannot be created, locked, read or written
//! stops keyturnd at start, saying so ([`store`]); `KEYTURN_JOURNAL=false`
//! is the explicit opt-out. A write that fails later is logged, the outcome
//! still goes to the database, and no new job is leased until a rewrite of
//! the file succeeds ([`Journal::ready`]).

pub mod format;
pub mod store;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use uuid::Uuid;

use self::format::{Entry, Record};
use self::store::Store;
use crate::error::Error;
use crate::metrics::Metrics;

/// Past this size the file is rewritten with only what is unacknowledged.
pub const COMPACT_BYTES: u64 = 1 << 20;

/// The journal, or its explicit absence (`KEYTURN_JOURNAL=false`).
pub struct Journal {
    inner: Option<Mutex<Inner>>,
    metrics: Arc<Metrics>,
}

struct Inner {
    store: Store,
    live: HashMap<(Uuid, Uuid), Entry>,
    database: Option<String>,
    /// A write failed: nothing is appended until a rewrite succeeds.
    broken: bool,
}

impl Inner {
    fn image(&self) -> Vec<u8> {
        let mut bytes = format::MAGIC.to_vec();
        if let Some(id) = &self.database {
            format::encode(&Record::Database { id: id.clone() }, &mut bytes);
        }
        for e in self.live.values() {
            format::encode(&Record::Outcome(e.clone()), &mut bytes);
        }
        bytes
    }

    fn rewrite(&mut self, metrics: &Metrics) -> std::io::Result<()> {
        let t0 = Instant::now();
        let image = self.image();
        self.store.rewrite(&image)?;
        metrics
            .journal_fsync_seconds
            .observe(t0.elapsed().as_secs_f64());
        metrics.journal_bytes.set(gauge(self.store.len()));
        self.broken = false;
        Ok(())
    }
}

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Journal {
    /// Opens (creating it if needed) the journal in `dir`, takes its lock,
    /// and returns the outcomes a previous process left unacknowledged. The
    /// file is rewritten at once with only those, so a torn tail is gone
    /// before anything is appended.
    pub fn open(dir: &Path, metrics: Arc<Metrics>) -> Result<(Journal, Vec<Entry>), Error> {
        let (store, bytes) = Store::open(dir)?;
        let contents = format::decode(&bytes).map_err(|_| {
            Error::Journal(format!(
                "{} is not a keyturnd journal (it does not start with {:?}); keyturnd will not \
                 overwrite it: move it away, or point KEYTURN_JOURNAL_DIR at a directory of its own",
                store.path().display(),
                String::from_utf8_lossy(format::MAGIC)
            ))
        })?;
        if contents.torn_bytes > 0 {
            tracing::warn!(
                path = %store.path().display(),
                torn_bytes = contents.torn_bytes,
                records = contents.records.len(),
                "the journal ends in a torn or corrupt record (a write cut short by a crash); ignoring those bytes"
            );
        }
        let (pending, database) = format::pending(&contents.records);
        let mut inner = Inner {
            store,
            live: pending.iter().map(|e| (e.key(), e.clone())).collect(),
            database,
            broken: false,
        };
        inner.rewrite(&metrics).map_err(|e| {
            Error::Journal(format!(
                "cannot write {}: {e}; make KEYTURN_JOURNAL_DIR writable by this user, or set \
                 KEYTURN_JOURNAL=false to run without a journal",
                inner.store.path().display()
            ))
        })?;
        Ok((
            Journal {
                inner: Some(Mutex::new(inner)),
                metrics,
            },
            pending,
        ))
    }

    /// No journal: every call is a no-op and [`Journal::ready`] is true.
    pub fn disabled(metrics: Arc<Metrics>) -> Journal {
        Journal {
            inner: None,
            metrics,
        }
    }

    /// Whether outcomes are journaled.
    pub fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Names the database this process serves. Outcomes observed for
    /// another database are never sent to this one: if the file still holds
    /// some, this fails, saying which.
    pub fn bind_database(&self, id: &str) -> Result<(), Error> {
        let Some(m) = &self.inner else { return Ok(()) };
        let mut inner = lock(m);
        match &inner.database {
            Some(known) if known == id => return Ok(()),
            Some(known) if !inner.live.is_empty() => {
                return Err(Error::Journal(format!(
                    "{} holds {} provider outcome(s) observed for database {known}, and this \
                     keyturnd's DATABASE_URL is database {id}; start a keyturnd of that database \
                     on this directory to record them, or give this one another KEYTURN_JOURNAL_DIR",
                    inner.store.path().display(),
                    inner.live.len()
                )))
            }
            _ => {}
        }
        inner.database = Some(id.to_owned());
        let path = inner.store.path();
        inner.rewrite(&self.metrics).map_err(|e| {
            Error::Journal(format!(
                "cannot write {}: {e}; make KEYTURN_JOURNAL_DIR writable",
                path.display()
            ))
        })
    }

    /// Writes `entries` to the file at once, without a sync: from here on
    /// they survive the process (they are in the kernel's page cache), and
    /// [`Journal::sync`] makes them survive the host. `false`: not written
    /// (logged, counted); the caller still records them, and leasing stops
    /// until [`Journal::ready`].
    pub fn write(&self, entries: &[Entry]) -> bool {
        let Some(m) = &self.inner else { return true };
        if entries.is_empty() {
            return true;
        }
        let mut inner = lock(m);
        for e in entries {
            inner.live.insert(e.key(), e.clone());
        }
        if inner.broken {
            // The next sync rewrites the file with these too: they are live.
            return false;
        }
        let mut bytes = Vec::with_capacity(entries.len() * 256);
        for e in entries {
            format::encode(&Record::Outcome(e.clone()), &mut bytes);
        }
        match inner.store.append(&bytes, false) {
            Ok(()) => {
                self.metrics
                    .journal_records
                    .get_or_create(&crate::metrics::KindLabel { kind: "outcome" })
                    .inc_by(entries.len() as u64);
                true
            }
            Err(e) => {
                self.failed(&mut inner, &e, entries.len());
                false
            }
        }
    }

    /// Makes everything written so far durable with one `fdatasync` (group
    /// commit: the caller syncs once for all that was written meanwhile).
    /// The sync runs on a handle of its own, outside the lock, so writers
    /// are never held up by the disk. `false`: not durable (logged, counted).
    pub fn sync(&self) -> bool {
        let Some(m) = &self.inner else { return true };
        let handle = {
            let mut inner = lock(m);
            if inner.broken {
                // A rewrite syncs what is live, these outcomes included.
                return match inner.rewrite(&self.metrics) {
                    Ok(()) => true,
                    Err(e) => {
                        self.failed(&mut inner, &e, 0);
                        false
                    }
                };
            }
            self.maybe_compact(&mut inner);
            match inner.store.handle() {
                Some(Ok(handle)) => handle,
                Some(Err(e)) => {
                    self.failed(&mut inner, &e, 0);
                    return false;
                }
                // Only a failed write leaves no file, and that marked it broken.
                None => return false,
            }
        };
        let t0 = Instant::now();
        match handle.sync_data() {
            Ok(()) => {
                self.metrics
                    .journal_fsync_seconds
                    .observe(t0.elapsed().as_secs_f64());
                true
            }
            Err(e) => {
                self.failed(&mut lock(m), &e, 0);
                false
            }
        }
    }

    /// [`Journal::write`] then [`Journal::sync`].
    pub fn append(&self, entries: &[Entry]) -> bool {
        let written = self.write(entries);
        self.sync() && written
    }

    fn failed(&self, inner: &mut Inner, e: &std::io::Error, outcomes: usize) {
        inner.broken = true;
        self.metrics.journal_errors.inc();
        tracing::error!(
            path = %inner.store.path().display(),
            error = %e,
            outcomes,
            "CANNOT WRITE THE JOURNAL: observed outcomes are being recorded in the database but would be lost if keyturnd died first; no new job is leased until the journal can be written again (check the disk of KEYTURN_JOURNAL_DIR)"
        );
    }

    /// The database answered for these outcomes: they are not replayed.
    /// Written without a sync (see the module docs).
    pub fn ack(&self, keys: &[(Uuid, Uuid)]) {
        let Some(m) = &self.inner else { return };
        if keys.is_empty() {
            return;
        }
        let mut inner = lock(m);
        let mut bytes = Vec::with_capacity(keys.len() * 112);
        for (action_id, lease_id) in keys {
            inner.live.remove(&(*action_id, *lease_id));
            format::encode(
                &Record::Ack {
                    action_id: *action_id,
                    lease_id: *lease_id,
                },
                &mut bytes,
            );
        }
        if inner.broken {
            // The next rewrite leaves them out anyway.
            return;
        }
        match inner.store.append(&bytes, false) {
            Ok(()) => {
                self.metrics
                    .journal_records
                    .get_or_create(&crate::metrics::KindLabel { kind: "ack" })
                    .inc_by(keys.len() as u64);
                self.metrics.journal_bytes.set(gauge(inner.store.len()));
            }
            Err(e) => {
                inner.broken = true;
                self.metrics.journal_errors.inc();
                tracing::error!(error = %e, "cannot append to the journal; it is rewritten before the next outcome, and no job is leased until then");
            }
        }
    }

    /// Whether new jobs may be leased: true unless a write failed and a
    /// rewrite of the file still fails.
    pub fn ready(&self) -> bool {
        let Some(m) = &self.inner else { return true };
        let mut inner = lock(m);
        if !inner.broken {
            return true;
        }
        match inner.rewrite(&self.metrics) {
            Ok(()) => {
                tracing::info!("the journal can be written again; leasing resumes");
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "the journal still cannot be written");
                false
            }
        }
    }

    /// Whether an outcome of `action_id` is journaled and not acknowledged.
    pub fn holds(&self, action_id: Uuid) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|m| lock(m).live.keys().any(|(a, _)| *a == action_id))
    }

    /// Outcomes journaled and not acknowledged.
    pub fn unacknowledged(&self) -> usize {
        self.inner.as_ref().map_or(0, |m| lock(m).live.len())
    }

    fn maybe_compact(&self, inner: &mut Inner) {
        let live_bytes: u64 = inner.live.len() as u64 * 512;
        if inner.store.len() <= COMPACT_BYTES.max(2 * live_bytes) {
            self.metrics.journal_bytes.set(gauge(inner.store.len()));
            return;
        }
        if let Err(e) = inner.rewrite(&self.metrics) {
            inner.broken = true;
            self.metrics.journal_errors.inc();
            tracing::error!(error = %e, "cannot compact the journal; no job is leased until it can be rewritten");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(n: u128) -> Entry {
        Entry {
            action_id: Uuid::from_u128(n),
            tenant: Some("acme".into()),
            lease_id: Uuid::from_u128(n + 7),
            outcome: "succeeded".into(),
            receipt: json!({"status": 200, "note": "x".repeat(200)}),
            retry_after_ms: None,
        }
    }

    fn metrics() -> Arc<Metrics> {
        Arc::new(Metrics::new())
    }

    #[test]
    fn test_unacknowledged_outcomes_survive_the_process_and_acknowledged_ones_do_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (j, pending) = Journal::open(dir.path(), metrics()).expect("open");
        assert!(pending.is_empty());
        j.bind_database("db-1").expect("bind");
        assert!(j.append(&[entry(1), entry(2), entry(3)]));
        j.ack(&[entry(2).key()]);
        drop(j);
        let (j, mut pending) = Journal::open(dir.path(), metrics()).expect("reopen");
        pending.sort_by_key(|e| e.action_id);
        assert_eq!(pending, vec![entry(1), entry(3)]);
        j.bind_database("db-1").expect("same database");
        j.ack(&[entry(1).key(), entry(3).key()]);
        drop(j);
        let (_j, pending) = Journal::open(dir.path(), metrics()).expect("third");
        assert!(pending.is_empty());
    }

    #[test]
    fn test_a_torn_tail_is_dropped_and_later_appends_are_readable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (j, _) = Journal::open(dir.path(), metrics()).expect("open");
        assert!(j.append(&[entry(1)]));
        drop(j);
        // A crash in the middle of appending entry 2.
        let path = dir.path().join("journal");
        let mut torn = Vec::new();
        format::encode(&Record::Outcome(entry(2)), &mut torn);
        let mut bytes = std::fs::read(&path).expect("read");
        bytes.extend_from_slice(&torn[..torn.len() / 2]);
        std::fs::write(&path, &bytes).expect("write");

        let (j, pending) = Journal::open(dir.path(), metrics()).expect("reopen");
        assert_eq!(pending, vec![entry(1)], "entry 2 was never whole");
        assert!(j.append(&[entry(3)]));
        drop(j);
        let (_j, mut pending) = Journal::open(dir.path(), metrics()).expect("third");
        pending.sort_by_key(|e| e.action_id);
        assert_eq!(
            pending,
            vec![entry(1), entry(3)],
            "3 follows the torn bytes"
        );
    }

    #[test]
    fn test_compaction_keeps_the_file_bounded_and_the_live_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (j, _) = Journal::open(dir.path(), metrics()).expect("open");
        let mut max = 0;
        // Batches of 20, as the completion queue would send them: 300 syncs.
        for batch in 0..300u128 {
            let entries: Vec<Entry> = (batch * 20..batch * 20 + 20).map(entry).collect();
            assert!(j.append(&entries));
            // Every outcome but one in a hundred is acknowledged.
            let acked: Vec<(Uuid, Uuid)> = entries
                .iter()
                .filter(|e| e.action_id.as_u128() % 100 != 0)
                .map(Entry::key)
                .collect();
            j.ack(&acked);
            max = max.max(
                std::fs::metadata(dir.path().join("journal"))
                    .expect("len")
                    .len(),
            );
        }
        assert!(
            max <= COMPACT_BYTES + 16 * 1024,
            "the file grew to {max} bytes"
        );
        drop(j);
        let (_j, pending) = Journal::open(dir.path(), metrics()).expect("reopen");
        assert_eq!(pending.len(), 60);
        assert!(pending.iter().all(|e| e.action_id.as_u128() % 100 == 0));
    }

    #[test]
    fn test_outcomes_of_another_database_are_never_replayed_into_this_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (j, _) = Journal::open(dir.path(), metrics()).expect("open");
        j.bind_database("db-a").expect("bind");
        assert!(j.append(&[entry(1)]));
        drop(j);
        let (j, pending) = Journal::open(dir.path(), metrics()).expect("reopen");
        assert_eq!(pending.len(), 1);
        let err = j
            .bind_database("db-b")
            .expect_err("other database")
            .to_string();
        assert!(err.contains("db-a") && err.contains("db-b"), "{err}");
        drop(j);
        // Once db-a's keyturnd has recorded them, the directory may move on.
        let (j, _) = Journal::open(dir.path(), metrics()).expect("again");
        j.bind_database("db-a").expect("its own database");
        j.ack(&[entry(1).key()]);
        j.bind_database("db-b").expect("nothing left of db-a");
    }

    #[test]
    fn test_written_outcomes_survive_the_process_before_any_sync() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (j, _) = Journal::open(dir.path(), metrics()).expect("open");
        assert!(j.write(&[entry(1)]));
        // Dropped without a sync, as a SIGKILL would leave it: the bytes are
        // in the page cache, which a process kill does not lose.
        drop(j);
        let (_j, pending) = Journal::open(dir.path(), metrics()).expect("reopen");
        assert_eq!(pending, vec![entry(1)]);
    }

    #[test]
    fn test_after_a_failed_write_nothing_is_ready_until_a_rewrite_succeeds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j");
        let (j, _) = Journal::open(&path, metrics()).expect("open");
        assert!(j.append(&[entry(1)]));
        // A write failed (a full or failing disk), and the directory is gone.
        lock(j.inner.as_ref().expect("enabled")).broken = true;
        std::fs::remove_dir_all(&path).expect("remove");
        assert!(!j.ready(), "the rewrite cannot succeed");
        assert!(!j.append(&[entry(2)]), "nor can an append");
        std::fs::create_dir(&path).expect("the disk is back");
        assert!(j.ready(), "the rewrite succeeds");
        drop(j);
        let (_j, mut pending) = Journal::open(&path, metrics()).expect("reopen");
        pending.sort_by_key(|e| e.action_id);
        assert_eq!(
            pending,
            vec![entry(1), entry(2)],
            "the rewrite kept every unacknowledged outcome"
        );
    }

    #[test]
    fn test_a_disabled_journal_does_nothing() {
        let j = Journal::disabled(metrics());
        assert!(!j.enabled());
        assert!(j.append(&[entry(1)]));
        j.ack(&[entry(1).key()]);
        assert!(j.ready());
        assert_eq!(j.unacknowledged(), 0);
        j.bind_database("x").expect("no-op");
    }
}

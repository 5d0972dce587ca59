//! The journal's directory on disk: one keyturnd per directory, held by an
//! exclusive lock on `lock` (which names the holder's pid), and one file,
//! `journal`, appended to and now and then rewritten whole.
//!
//! A rewrite goes to `journal.new`, is synced, renamed over `journal`, and
//! the directory is synced: a crash leaves either the old file or the new
//! one, never a mix. The lock is an `flock` held by the open file, so the
//! kernel releases it whichever way the process ends, SIGKILL included.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::Error;

const FILE: &str = "journal";
const NEW: &str = "journal.new";
const LOCK: &str = "lock";

/// The open journal directory.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    /// `None` until the first [`Store::rewrite`]: a file read at open may end
    /// in a torn record, after which nothing may be appended.
    file: Option<File>,
    len: u64,
    /// Held for the life of the process.
    _lock: File,
}

impl Store {
    /// Creates `dir` (mode 0700) if needed, takes its lock, and reads what
    /// the journal file holds (empty when there is none).
    pub fn open(dir: &Path) -> Result<(Store, Vec<u8>), Error> {
        let unusable = |what: &str, e: io::Error| {
            Error::Journal(format!(
                "KEYTURN_JOURNAL_DIR={}: cannot {what}: {e}. keyturnd keeps every provider outcome \
                 it observed there until the database has it; make the directory writable by this \
                 user (on a local disk), point KEYTURN_JOURNAL_DIR at one that is, or set \
                 KEYTURN_JOURNAL=false to run without it (outcomes not yet recorded are then lost \
                 with the process and their actions end uncertain)",
                dir.display()
            ))
        };
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| unusable("create it", e))?;
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(dir.join(LOCK))
            .map_err(|e| unusable("open its lock file", e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = lock.read_to_string(&mut holder);
                return Err(Error::Journal(format!(
                    "KEYTURN_JOURNAL_DIR={} is in use by another keyturnd (pid {}): every keyturnd \
                     on a host needs a journal directory of its own; give this one another \
                     KEYTURN_JOURNAL_DIR",
                    dir.display(),
                    holder.trim()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(unusable("lock it", e)),
        }
        lock.set_len(0)
            .and_then(|()| lock.write_all(std::process::id().to_string().as_bytes()))
            .map_err(|e| unusable("write its lock file", e))?;
        let bytes = match std::fs::read(dir.join(FILE)) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(unusable("read its journal", e)),
        };
        Ok((
            Store {
                dir: dir.to_path_buf(),
                file: None,
                len: 0,
                _lock: lock,
            },
            bytes,
        ))
    }

    /// The journal file's path (for messages).
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// The journal file's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Replaces the journal file with `bytes`, durably, and appends to the
    /// new file from now on.
    pub fn rewrite(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file = None;
        let new = self.dir.join(NEW);
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&new)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&new, self.dir.join(FILE))?;
        File::open(&self.dir)?.sync_all()?;
        self.len = bytes.len() as u64;
        self.file = Some(file);
        Ok(())
    }

    /// A second handle on the journal file, to `fdatasync` it without
    /// holding up writers; `None` while the file needs a rewrite.
    pub fn handle(&self) -> Option<io::Result<File>> {
        self.file.as_ref().map(File::try_clone)
    }

    /// Appends `bytes`; with `sync`, returns only once they are on disk
    /// (`fdatasync`). A failure leaves the file unusable until the next
    /// [`Store::rewrite`]: part of a record may have been written.
    pub fn append(&mut self, bytes: &[u8], sync: bool) -> io::Result<()> {
        let Some(file) = self.file.as_mut() else {
            return Err(io::Error::other(
                "the journal file needs rewriting after an earlier failure",
            ));
        };
        let written = file
            .write_all(bytes)
            .and_then(|()| if sync { file.sync_data() } else { Ok(()) });
        match written {
            Ok(()) => {
                self.len += bytes.len() as u64;
                Ok(())
            }
            Err(e) => {
                self.file = None;
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_second_opener_is_refused_while_the_first_holds_the_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (first, _) = Store::open(dir.path()).expect("first");
        let err = Store::open(dir.path()).expect_err("second").to_string();
        assert!(err.contains("in use by another keyturnd"), "{err}");
        assert!(err.contains(&std::process::id().to_string()), "{err}");
        drop(first);
        Store::open(dir.path()).expect("free again once the first is gone");
    }

    #[test]
    fn test_rewrite_then_append_and_reopen_reads_it_all() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut store, bytes) = Store::open(dir.path()).expect("open");
        assert!(bytes.is_empty());
        assert!(
            store.append(b"x", false).is_err(),
            "no append before a rewrite"
        );
        store.rewrite(b"head").expect("rewrite");
        store.append(b"-tail", true).expect("append");
        assert_eq!(store.len(), 9);
        drop(store);
        let (_store, bytes) = Store::open(dir.path()).expect("reopen");
        assert_eq!(bytes, b"head-tail");
    }

    #[test]
    fn test_an_unwritable_directory_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"").expect("file");
        let err = Store::open(&file.join("journal"))
            .expect_err("under a file")
            .to_string();
        assert!(err.contains("KEYTURN_JOURNAL_DIR="), "{err}");
        assert!(err.contains("KEYTURN_JOURNAL=false"), "{err}");
    }
}

//! The private cluster's server log (KT_PGLOG, which tests/harness.sh
//! exports), read by the load and fuzz binaries for what no client sees: a
//! backend that crashed, a server that panicked.

use std::io::{Read, Seek, SeekFrom};

/// Where the log ends now, or None without a readable log.
pub fn mark() -> Option<u64> {
    std::fs::metadata(std::env::var("KT_PGLOG").ok()?)
        .ok()
        .map(|m| m.len())
}

/// Lines logged since `mark` that say a backend crashed or the server
/// panicked. Without a readable log it prints that it skipped the check.
pub fn crashes_since(mark: Option<u64>) -> Vec<String> {
    let (Some(mark), Ok(path)) = (mark, std::env::var("KT_PGLOG")) else {
        let why = "KT_PGLOG does not name a readable server log";
        println!("SKIPPED the server log check: {why}");
        crate::note_skip("the server log check", why);
        return Vec::new();
    };
    let mut bytes = Vec::new();
    if let Err(e) = std::fs::File::open(&path).and_then(|mut f| {
        f.seek(SeekFrom::Start(mark))?;
        f.read_to_end(&mut bytes)
    }) {
        println!("SKIPPED the server log check: {path}: {e}");
        crate::note_skip("the server log check", &format!("{path}: {e}"));
        return Vec::new();
    }
    String::from_utf8_lossy(&bytes)
        .lines()
        .filter(|l| {
            // A FATAL exit (a terminated backend) is exit code 1 and not
            // logged as a process exit; these lines mean a crash.
            l.contains("was terminated by signal")
                || l.contains("PANIC:")
                || (l.contains("server process") && l.contains("exited with exit code"))
        })
        .map(str::to_owned)
        .collect()
}

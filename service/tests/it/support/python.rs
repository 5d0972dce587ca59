//! Receivers written in Python, run by a venv's interpreter that
//! `tests/run-all` makes (harness.sh: `kt_standard_webhooks`,
//! `kt_webpush_python`), so that what keyturnd sends is checked with
//! libraries that are not keyturnd's. A script prints one JSON object per
//! line on stdout: first what it is (its port, …), then one per request.
//! Without the interpreter a test says it skipped, and why.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::skipped;

/// A script's own directory: `service/tests/it/support/`.
pub fn script(name: &str) -> String {
    format!("{}/tests/it/support/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The interpreter `var` names, or `None` after saying the test skipped:
/// `unavailable` names the variable tests/run-all sets to pip's reason.
pub fn interpreter(test: &str, var: &str, unavailable: &str, libraries: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(p) if !p.is_empty() => Some(p),
        _ => {
            let why = std::env::var(unavailable).unwrap_or_else(|_| {
                format!(
                    "{var} is not set (tests/run-all installs {libraries} into a venv and sets it)"
                )
            });
            skipped(
                test,
                &format!("{why}; or set {var} to a Python that has {libraries}"),
            );
            None
        }
    }
}

/// A running script: its first line, and every line after it.
pub struct PyServer {
    _child: Child,
    /// The first line (`{"port": …, …}`).
    pub first: Value,
    seen: Arc<Mutex<Vec<Value>>>,
}

impl PyServer {
    /// Runs `python script args…` and waits for its first line.
    pub async fn start(python: &str, script: &str, args: &[&str]) -> PyServer {
        let mut child = Command::new(python)
            .arg(script)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the Python receiver");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the receiver starts")
            .expect("read")
            .expect("a first line");
        let first: Value = serde_json::from_str(&first).expect("JSON");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str(&line) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        PyServer {
            _child: child,
            first,
            seen,
        }
    }

    /// Its port, from its first line.
    pub fn port(&self) -> u16 {
        self.first["port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .expect("its port")
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port())
    }

    /// Every line after the first, so far.
    pub fn events(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }
}

/// The interpreter with the Standard Webhooks library, or `None` after
/// saying the test skipped.
pub fn standard_webhooks(test: &str) -> Option<String> {
    interpreter(
        test,
        "KT_STANDARDWEBHOOKS_PYTHON",
        "KT_STANDARDWEBHOOKS_UNAVAILABLE",
        "the standardwebhooks library",
    )
}

/// The interpreter with the Web Push checks' libraries (and the Standard
/// Webhooks one), or `None` after saying the test skipped.
pub fn webpush(test: &str) -> Option<String> {
    interpreter(
        test,
        "KT_WEBPUSH_PYTHON",
        "KT_WEBPUSH_UNAVAILABLE",
        "the http_ece and py_vapid libraries",
    )
}

//! The real `keyturnd` binary: starts without a database, reports itself
//! alive but not ready, and exits 0 on SIGTERM.

use crate::support;
use crate::support::e2e::Keyturnd;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

async fn status(client: &reqwest::Client, url: &str) -> Option<u16> {
    client
        .get(url)
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16())
}

#[tokio::test]
async fn test_binary_without_database_is_alive_not_ready_and_exits_0_on_sigterm() {
    let journal = tempfile::tempdir().expect("journal dir");
    let db_port = support::closed_port();
    let http_port = support::closed_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyturnd"))
        .env_clear()
        .env(
            "DATABASE_URL",
            format!("postgres://keyturnd:pw@127.0.0.1:{db_port}/keyturn"),
        )
        .env("KEYTURN_LISTEN", format!("127.0.0.1:{http_port}"))
        .env("KEYTURN_POLL_MS", "200")
        .env("KEYTURN_JOURNAL_DIR", journal.path())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start keyturnd");

    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let base = format!("http://127.0.0.1:{http_port}");
    let started = Instant::now();
    let mut healthy = None;
    while started.elapsed() < Duration::from_secs(20) {
        healthy = status(&client, &format!("{base}/healthz")).await;
        if healthy.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if healthy.is_none() {
        let _ = child.kill();
    }
    assert_eq!(
        healthy,
        Some(200),
        "/healthz answers while the process runs"
    );
    assert_eq!(
        status(&client, &format!("{base}/readyz")).await,
        Some(503),
        "no database, not ready"
    );
    assert_eq!(status(&client, &format!("{base}/metrics")).await, Some(200));

    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill(1)");
    assert!(kill.success());

    let deadline = Instant::now() + Duration::from_secs(15);
    let exit = loop {
        if let Some(exit) = child.try_wait().expect("wait") {
            break exit;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("keyturnd did not exit within 15 s of SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut log = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        use std::io::Read;
        let _ = stderr.read_to_string(&mut log);
    }
    assert_eq!(
        exit.code(),
        Some(0),
        "exit status after SIGTERM; log:\n{log}"
    );
    assert!(log.contains("SIGTERM"), "the shutdown is logged:\n{log}");
    assert!(
        !log.contains(":pw@"),
        "the connection string never reaches the log:\n{log}"
    );
}

/// A lease with no room for a whole call, its margin and the lease round
/// trip is refused at start, with a message naming the setting.
#[tokio::test]
async fn test_lease_too_short_for_a_call_is_refused_at_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_keyturnd"))
        .env_clear()
        .env(
            "DATABASE_URL",
            format!(
                "postgres://keyturnd@127.0.0.1:{}/keyturn",
                support::closed_port()
            ),
        )
        .env("KEYTURN_LEASE_SECONDS", "5")
        .env("KEYTURN_HTTP_TIMEOUT_SECONDS", "3")
        .output()
        .expect("run keyturnd");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains(
            "KEYTURN_LEASE_SECONDS=5 must be at least KEYTURN_HTTP_TIMEOUT_SECONDS=3 plus 3 s"
        ),
        "{log}"
    );
}

fn no_database() -> String {
    format!(
        "postgres://keyturnd@127.0.0.1:{}/keyturn",
        support::closed_port()
    )
}

/// A journal directory keyturnd cannot create is refused at start, before
/// any database work, saying what to do (and how to opt out).
#[tokio::test]
async fn test_an_unusable_journal_dir_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"").expect("file");
    let out = Command::new(env!("CARGO_BIN_EXE_keyturnd"))
        .env_clear()
        .env("DATABASE_URL", no_database())
        .env(
            "KEYTURN_LISTEN",
            format!("127.0.0.1:{}", support::closed_port()),
        )
        .env("KEYTURN_JOURNAL_DIR", file.join("journal"))
        .output()
        .expect("run keyturnd");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{log}");
    assert!(log.contains("KEYTURN_JOURNAL_DIR="), "{log}");
    assert!(log.contains("KEYTURN_JOURNAL=false"), "{log}");
}

/// Two keyturnd processes on one journal directory: the second is refused
/// at start, naming the first.
#[tokio::test]
async fn test_a_second_keyturnd_on_one_journal_dir_is_refused() {
    let journal = tempfile::tempdir().expect("journal dir");
    let http_port = support::closed_port();
    let mut first = Command::new(env!("CARGO_BIN_EXE_keyturnd"))
        .env_clear()
        .env("DATABASE_URL", no_database())
        .env("KEYTURN_LISTEN", format!("127.0.0.1:{http_port}"))
        .env("KEYTURN_JOURNAL_DIR", journal.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start keyturnd");
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let started = Instant::now();
    while status(&client, &format!("http://127.0.0.1:{http_port}/healthz"))
        .await
        .is_none()
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the first keyturnd never served /healthz"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_keyturnd"))
        .env_clear()
        .env("DATABASE_URL", no_database())
        .env(
            "KEYTURN_LISTEN",
            format!("127.0.0.1:{}", support::closed_port()),
        )
        .env("KEYTURN_JOURNAL_DIR", journal.path())
        .output()
        .expect("run the second keyturnd");
    let _ = first.kill();
    let _ = first.wait();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains("in use by another keyturnd") && log.contains(&format!("pid {}", first.id())),
        "{log}"
    );
}

#[tokio::test]
async fn test_a_jwks_with_a_weak_rsa_key_stops_keyturnd_at_start_naming_its_kid() {
    let dir = tempfile::tempdir().expect("dir");
    let jwks = dir.path().join("jwks.json");
    let key = crate::http::rpc::rsa_jwk(1024, "legacy-1024");
    std::fs::write(&jwks, serde_json::json!({ "keys": [key] }).to_string()).expect("write jwks");
    let mut k = Keyturnd::spawn(
        support::closed_port(),
        vec![
            ("KEYTURN_JWT_JWKS", jwks.display().to_string()),
            ("KEYTURN_JWT_ROLES", "web_human".into()),
            (
                "KEYTURN_RPC_DATABASE_URL",
                format!(
                    "postgres://auth@127.0.0.1:{}/keyturn",
                    support::closed_port()
                ),
            ),
        ],
    );
    // A keyturnd that took the key waits for its /rpc database forever.
    let status = k.wait_exit(Duration::from_secs(30)).await;
    assert!(
        !status.success(),
        "started with a 1024-bit key:\n{}",
        k.log()
    );
    // The log is read from the pipe by a task of its own: wait for the line.
    let line = crate::support::e2e::eventually(Duration::from_secs(30), "the refusal", || async {
        k.log()
            .lines()
            .find(|l| l.contains("legacy-1024"))
            .map(str::to_owned)
    })
    .await;
    assert!(line.contains("2048"), "{line}");
}

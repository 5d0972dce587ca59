//! End to end, `keyturnd audit-verify`: a real tenant's export, from
//! keyturn.audit_export, verifies offline against its head; a changed line,
//! a dropped line and a dropped tail each name their line and exit 1.

use std::process::Command;

use serde_json::{json, Value};

use crate::support::e2e::{self, World};

fn audit_verify(lines: &[String], extra: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("acme.jsonl");
    std::fs::write(
        &file,
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .expect("write");
    // No database setting at all: the check is offline.
    let out = Command::new(env!("CARGO_BIN_EXE_keyturnd"))
        .env_clear()
        .arg("audit-verify")
        .arg(&file)
        .args(extra)
        .output()
        .expect("run keyturnd audit-verify");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test]
async fn test_an_export_verifies_offline_and_tampering_names_its_line() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    for text in ["one", "two", "three"] {
        w.queue(&tool, json!({ "text": text }), false).await;
    }
    let op = e2e::connect(port, "app_operator").await;
    let lines: Vec<String> = op
        .query(
            "SELECT e::text FROM keyturn.audit_export($1) e",
            &[&w.tenant],
        )
        .await
        .expect("export")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let head: String = op
        .query_one("SELECT hash FROM keyturn.audit_head($1)", &[&w.tenant])
        .await
        .expect("head")
        .get(0);
    assert_eq!(lines.len(), 6, "three proposals, three approvals");

    let (code, out) = audit_verify(&lines, &["--head", &head]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.trim(), format!("verified: 6 events, head {head}"));

    let mut changed = lines.clone();
    let mut e: Value = serde_json::from_str(&changed[3]).unwrap();
    e["principal"] = json!("mallory");
    changed[3] = e.to_string();
    let (code, out) = audit_verify(&changed, &[]);
    assert_eq!((code, out.split(':').next()), (1, Some("line 4")), "{out}");

    let mut dropped = lines.clone();
    dropped.remove(2);
    let (code, out) = audit_verify(&dropped, &[]);
    assert_eq!((code, out.split(':').next()), (1, Some("line 3")), "{out}");

    let (code, out) = audit_verify(&lines[..5], &["--head", &head]);
    assert_eq!((code, out.split(':').next()), (1, Some("line 6")), "{out}");

    // An export `since` a time starts mid-chain: it verifies from where it
    // starts, and says where; with --after, it must continue from there.
    let at: String = serde_json::from_str::<Value>(&lines[3]).unwrap()["at"]
        .as_str()
        .unwrap()
        .to_owned();
    let since: Vec<String> = op
        .query(
            "SELECT e::text FROM keyturn.audit_export($1, $2::text::timestamptz) e",
            &[&w.tenant, &at],
        )
        .await
        .expect("export since")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!since.is_empty() && since.len() < 6, "{since:?}");
    let start: Value = serde_json::from_str(&since[0]).unwrap();
    let start = start["prev_hash"].as_str().unwrap();
    let (code, out) = audit_verify(&since, &["--head", &head]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("events after {start}, head {head}")),
        "{out}"
    );
    let (code, out) = audit_verify(&since, &["--after", start]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = audit_verify(&since, &["--after", &"0".repeat(64)]);
    assert_eq!((code, out.split(':').next()), (1, Some("line 1")), "{out}");
}

//! End to end, process life: keyturnd killed with SIGKILL mid-call (the
//! action ends `uncertain`, is never re-sent, and an operator reconciles it
//! with `keyturnd reconcile`), and SIGTERM mid-call (the call finishes, its
//! outcome is recorded, `/readyz` is 503 meanwhile, exit code 0), and the
//! `keyturn_uncertain` gauge with and without `keyturn_operator`.

use std::time::Duration;

use crate::support::e2e::{self, eventually, Keyturnd, Receiver, Reply, World};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(20);

#[tokio::test]
async fn test_sigkill_mid_call_ends_uncertain_once_and_is_reconciled() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    // Holds the request past keyturnd's death; nobody is waiting by then.
    let rx = Receiver::start(
        &w.tenant,
        vec![Reply::status(200).delay(Duration::from_secs(30))],
    )
    .await;
    let mut k1 = Keyturnd::start(port, rx.env()).await;

    let a = w
        .queue(&tool, json!({"text": "in flight when killed"}), false)
        .await;
    rx.wait_requests(a.id, 1, WITHIN).await;
    assert_eq!(
        w.status(a.id).await,
        "executing",
        "begin_dispatch committed before the call"
    );
    k1.kill9().await;

    // A fresh keyturnd: its sweep finds the lapsed lease (4 s) of an
    // executing action and makes it uncertain; nothing re-sends it.
    let k2 = Keyturnd::start(port, rx.env()).await;
    w.wait_status(a.id, "uncertain", WITHIN).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        rx.requests(a.id).len(),
        1,
        "exactly one request, never re-sent"
    );
    assert_eq!(w.state(a.id).await, ("uncertain".into(), 1));
    assert_eq!(w.attempts(a.id).await, vec![(1, Some("lapsed".into()))]);
    let log = k2.stop().await;
    assert!(log.contains("sweep marked actions uncertain"), "{log}");

    // The operator's queue lists it; the dispatcher role may not reconcile.
    let (code, out, err) = e2e::run_cli(port, "app_operator", &["uncertain", "--json"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(&a.id.to_string()), "{out}");
    let id = a.id.to_string();
    let reconcile = [
        "reconcile",
        id.as_str(),
        "--outcome",
        "succeeded",
        "--note",
        "receiver log shows it arrived",
    ];
    let (code, _, _) = e2e::run_cli(port, "app_dispatcher", &reconcile).await;
    assert_ne!(code, Some(0), "reconcile needs keyturn_operator");
    assert_eq!(w.status(a.id).await, "uncertain");

    let (code, out, err) = e2e::run_cli(port, "app_operator", &reconcile).await;
    assert_eq!(code, Some(0), "reconcile: {out}{err}");
    assert_eq!(out.trim(), format!("{} succeeded", a.id));
    assert_eq!(w.state(a.id).await, ("succeeded".into(), 1));
    assert_eq!(
        w.usage_rows(a.id).await,
        1,
        "one usage row, from the reconciliation"
    );
    assert_eq!(
        w.attempts(a.id).await,
        vec![(1, Some("lapsed".into()))],
        "the attempt history stays"
    );
    assert_eq!(rx.requests(a.id).len(), 1);

    // Only from uncertain: a second reconcile is refused and changes nothing.
    let (code, _, _) = e2e::run_cli(port, "app_operator", &reconcile).await;
    assert_ne!(code, Some(0));
    assert_eq!(w.usage_rows(a.id).await, 1);
}

#[tokio::test]
async fn test_sigterm_mid_call_finishes_records_and_exits_0() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let rx = Receiver::start(
        &w.tenant,
        vec![Reply::status(200).delay(Duration::from_millis(2000))],
    )
    .await;
    let mut env = rx.env();
    env.push(("KEYTURN_HTTP_TIMEOUT_SECONDS", "4".into()));
    env.push(("KEYTURN_LEASE_SECONDS", "8".into()));
    let mut k = Keyturnd::start(port, env.clone()).await;

    let a = w.queue(&tool, json!({"text": "drain me"}), false).await;
    rx.wait_requests(a.id, 1, WITHIN).await;
    k.signal("-TERM");
    // Still serving HTTP while it drains, and not ready.
    e2e::eventually(
        Duration::from_secs(2),
        "/readyz 503 after SIGTERM",
        || async { (k.get_status("/readyz").await == Some(503)).then_some(()) },
    )
    .await;
    assert_eq!(
        k.get_status("/healthz").await,
        Some(200),
        "alive while draining"
    );
    // Queued after SIGTERM: not leased by this process.
    let later = w
        .queue(&tool, json!({"text": "after SIGTERM"}), false)
        .await;

    let status = k.wait_exit(Duration::from_secs(15)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let log = k.log();
    assert_eq!(
        status.code(),
        Some(0),
        "exit code after SIGTERM; log:\n{log}"
    );
    assert_eq!(
        w.state(a.id).await,
        ("succeeded".into(), 1),
        "the call in flight was recorded; log:\n{log}"
    );
    assert_eq!(w.usage_rows(a.id).await, 1);
    assert_eq!(rx.requests(a.id).len(), 1);
    assert_eq!(
        w.state(later.id).await,
        ("queued".into(), 0),
        "nothing new leased after SIGTERM"
    );
    assert!(rx.requests(later.id).is_empty());

    // Leave nothing of ours queued behind: a fresh keyturnd delivers it.
    let k2 = Keyturnd::start(port, env).await;
    w.wait_status(later.id, "succeeded", WITHIN).await;
    k2.stop().await;
}

/// The `keyturn_uncertain` gauge: as a role with `keyturn_operator` it
/// counts `uncertain_actions()`; as a dispatcher alone it is off, and
/// keyturnd asks PostgreSQL instead of trying the call, so the server's log
/// holds no refused call (it used to hold one at every start).
#[tokio::test]
async fn test_the_uncertain_gauge_counts_for_an_operator_and_leaves_no_error_without_one() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let log_path = std::env::var("KT_PGLOG").ok();
    let mark = log_path
        .as_ref()
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| m.len());

    let rx = Receiver::start(&w.tenant, vec![]).await;
    let k = Keyturnd::start(port, rx.env()).await;
    eventually(WITHIN, "the dispatcher's gauge switched off", || async {
        k.log()
            .contains("this role lacks keyturn_operator; the keyturn_uncertain gauge is off")
            .then_some(())
    })
    .await;
    k.stop().await;
    match (log_path, mark) {
        (Some(path), Some(mark)) => {
            let bytes = std::fs::read(&path).expect("read the server log");
            let since = String::from_utf8_lossy(&bytes[mark as usize..]);
            assert!(
                !since.contains("permission denied for function uncertain_actions"),
                "keyturnd's gauge made the server log a refused call:\n{since}"
            );
        }
        _ => println!("SKIPPED the server log half: KT_PGLOG names no readable log"),
    }

    // An action left executing under a lease that lapses: the sweep makes
    // it uncertain, and an operator's keyturnd counts it.
    let tool = w.webhook_tool(json!({})).await;
    let a = w
        .queue(&tool, json!({"text": "begun, never completed"}), false)
        .await;
    let d = e2e::connect(port, "app_dispatcher").await;
    let leased = d
        .query(
            "SELECT action_id, lease_id FROM keyturn.lease('gauge-test', 1000, '1 second')",
            &[],
        )
        .await
        .expect("lease");
    let lease: uuid::Uuid = leased
        .iter()
        .find(|r| r.get::<_, uuid::Uuid>(0) == a.id)
        .expect("our action leased")
        .get(1);
    let begun: bool = d
        .query_one("SELECT keyturn.begin_dispatch($1, $2)", &[&a.id, &lease])
        .await
        .expect("begin_dispatch")
        .get(0);
    assert!(begun);
    let su = e2e::connect(port, "postgres").await;
    su.batch_execute(
        "DO $$ BEGIN
           IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'app_dispatcher_operator') THEN
             CREATE ROLE app_dispatcher_operator LOGIN IN ROLE keyturn_dispatcher, keyturn_operator;
           END IF;
         END $$",
    )
    .await
    .expect("a role with both");
    let mut env = rx.env();
    env.push(("DATABASE_URL", e2e::url(port, "app_dispatcher_operator")));
    let k = Keyturnd::start(port, env).await;
    w.wait_status(a.id, "uncertain", WITHIN).await;
    let op = e2e::connect(port, "app_operator").await;
    let gauge = eventually(
        WITHIN,
        "the gauge counting the uncertain action",
        || async {
            let want: i64 = op
                .query_one("SELECT count(*) FROM keyturn.uncertain_actions()", &[])
                .await
                .expect("count")
                .get(0);
            let m = k.metrics().await;
            let line = m
                .lines()
                .find(|l| l.starts_with("keyturn_uncertain "))?
                .to_owned();
            (want >= 1 && line == format!("keyturn_uncertain {want}")).then_some(line)
        },
    )
    .await;
    assert!(!k.log().contains("gauge is off"), "{gauge}");
    k.stop().await;
    let id = a.id.to_string();
    let (code, out, err) = e2e::run_cli(
        port,
        "app_operator",
        &[
            "reconcile",
            &id,
            "--outcome",
            "failed",
            "--note",
            "gauge test: never sent",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "reconcile: {out}{err}");
}

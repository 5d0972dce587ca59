//! End to end: PostgreSQL restarted under a running keyturnd. It reconnects
//! (`/readyz` back to 200), and actions approved before, across and after
//! the restart are each delivered exactly once, none lost.
//!
//! This test restarts the shared cluster of `tests/run-all`; like every
//! database test it holds [`e2e::serial`], so no other one runs meanwhile.
//! It restarts with [`e2e::restart_postgres`]`("fast")`.

use std::time::Duration;

use crate::support::e2e::{self, Keyturnd, Receiver, Reply, World};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(30);

#[tokio::test]
async fn test_postgres_restart_reconnects_and_loses_nothing() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let mut w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    // Every call takes 1.5 s, so the first one is in flight across the restart.
    let rx = Receiver::start(
        &w.tenant,
        vec![Reply::status(200).delay(Duration::from_millis(1500))],
    )
    .await;
    let mut env = rx.env();
    env.push(("KEYTURN_HTTP_TIMEOUT_SECONDS", "4".into()));
    env.push(("KEYTURN_LEASE_SECONDS", "10".into()));
    let k = Keyturnd::start(port, env).await;

    // Before: delivered.
    let before = w.queue(&tool, json!({"text": "before"}), false).await;
    w.wait_status(before.id, "succeeded", WITHIN).await;

    // Across: its call is in flight while the database restarts, so its
    // outcome is recorded on a new connection.
    let across = w.queue(&tool, json!({"text": "across"}), false).await;
    rx.wait_requests(across.id, 1, WITHIN).await;
    e2e::restart_postgres("fast");
    w.reconnect().await;

    // Right after: approved while keyturnd may still be reconnecting.
    let right_after = w.queue(&tool, json!({"text": "right after"}), false).await;
    k.wait_ready(WITHIN).await;
    // After readiness is back.
    let after = w.queue(&tool, json!({"text": "after"}), false).await;

    let all = [&before, &across, &right_after, &after];
    for a in all {
        w.wait_status(a.id, "succeeded", WITHIN).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for a in all {
        assert_eq!(
            rx.requests(a.id).len(),
            1,
            "{} delivered exactly once",
            a.id
        );
        assert_eq!(w.usage_rows(a.id).await, 1);
        assert_eq!(w.state(a.id).await.0, "succeeded");
    }
    assert_eq!(
        w.attempts(across.id).await,
        vec![(1, Some("succeeded".into()))],
        "the in-flight outcome was recorded once the database was back"
    );

    let metrics = k.metrics().await;
    let log = k.stop().await;
    assert!(
        log.contains("LISTEN connection lost"),
        "the loss was noticed:\n{log}"
    );
    assert!(log.contains("LISTEN connection re-established"), "{log}");
    assert!(
        metrics.contains("keyturn_db_reconnects_total{conn=\"listen\"}"),
        "reconnect counted:\n{metrics}"
    );
}

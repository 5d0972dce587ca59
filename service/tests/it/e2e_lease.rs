//! End to end, issue 34: dispatch under a lapsed lease. A proxy between
//! keyturnd and PostgreSQL holds the answer to the lease step's `COMMIT`
//! ([`PgProxy`]); keyturnd is paused with SIGSTOP while it arrives, or the
//! answer comes too late. keyturnd must never call a provider once the
//! lease it holds has lapsed, and never leave an action it knows it did not
//! send waiting as a mystery: it records `retry` while it still can, and
//! says "not sent" when it cannot.

use std::time::Duration;

use serde_json::json;

use crate::support::e2e::{self, Keyturnd, Receiver, World};
use crate::support::pg_proxy::PgProxy;

const WITHIN: Duration = Duration::from_secs(30);

/// A webhook action approved while keyturnd (as app_dispatcher through a
/// [`PgProxy`], with a 4 s lease) waits, the answer to the COMMIT that
/// begins it held by the proxy.
struct Held {
    w: World,
    rx: Receiver,
    proxy: PgProxy,
    k: Keyturnd,
    a: e2e::Queued,
}

async fn held(port: u16, text: &str) -> Held {
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let rx = Receiver::start(&w.tenant, vec![]).await;
    let proxy = PgProxy::start(port).await;
    let mut env = rx.env();
    env.push(("DATABASE_URL", e2e::url(proxy.port, "app_dispatcher")));
    let k = Keyturnd::start(port, env).await;
    proxy.arm_for(&w.tenant);
    let a = w.queue(&tool, json!({ "text": text }), false).await;
    proxy.held().await;
    Held { w, rx, proxy, k, a }
}

#[tokio::test]
async fn test_a_worker_paused_past_its_lease_sends_nothing() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let Held { w, rx, proxy, k, a } = held(port, "paused past its lease").await;
    // Paused with the COMMIT answer on its way: it reads it on SIGCONT.
    k.signal("-STOP");
    proxy.release();
    // Another dispatcher's sweep finds the lapsed lease.
    let sweeper = e2e::connect(port, "app_dispatcher").await;
    e2e::eventually(WITHIN, "the sweep to make the action uncertain", || async {
        sweeper
            .execute("SELECT keyturn.sweep()", &[])
            .await
            .expect("sweep");
        (w.status(a.id).await == "uncertain").then_some(())
    })
    .await;
    k.signal("-CONT");
    // Whatever keyturnd did with the job, it then tried to record it.
    e2e::eventually(WITHIN, "keyturnd to report the job", || async {
        k.log().contains("complete refused").then_some(())
    })
    .await;
    assert_eq!(
        rx.requests(a.id).len(),
        0,
        "a call after the lease lapsed; log:\n{}",
        k.log()
    );
    assert!(
        !k.log().contains("webhook request failed"),
        "a request begun past the lease (a zero budget is no reason to try); log:\n{}",
        k.log()
    );
    assert!(
        k.log().contains("not sent, by keyturnd's own account"),
        "{}",
        k.log()
    );
    assert_eq!(w.status(a.id).await, "uncertain");
    // The account reaches the database after the refused complete: wait for
    // it before stopping keyturnd.
    e2e::eventually(WITHIN, "keyturnd to try recording its account", || async {
        let log = k.log();
        [
            "keyturnd's account recorded",
            "did not take keyturnd's account",
            "keeps no dispatcher account",
            "could not record keyturnd's account",
        ]
        .iter()
        .any(|line| log.contains(line))
        .then_some(())
    })
    .await;
    assert!(
        k.log().contains("keyturnd's account recorded"),
        "the database took keyturnd's account; log:\n{}",
        k.log()
    );
    k.stop().await;
    // The operator's queue says so (keyturn.record_not_sent).
    let (code, out, err) = e2e::run_cli(port, "app_operator", &["uncertain", "--json"]).await;
    assert_eq!(code, Some(0), "{err}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).expect("JSON");
    let row = rows
        .iter()
        .find(|r| r["action_id"] == a.id.to_string())
        .expect("listed");
    assert_eq!(row["not_sent_by_dispatcher"], true, "{row}");
    assert!(!row["safe_to_decide_after"].is_null(), "{row}");
}

#[tokio::test]
async fn test_a_late_commit_answer_never_leaves_a_never_sent_action_uncertain() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let Held { w, rx, proxy, k, a } = held(port, "late commit answer").await;
    // Held until the action leaves executing: keyturnd's own sweep (every
    // second) gets to it once the lease lapses, unless keyturnd records
    // first what it knows, that it called nothing.
    e2e::eventually(WITHIN, "the action to leave executing", || async {
        (w.status(a.id).await != "executing").then_some(())
    })
    .await;
    proxy.release();
    assert_ne!(
        w.status(a.id).await,
        "uncertain",
        "never sent, yet uncertain; log:\n{}",
        k.log()
    );
    w.wait_status(a.id, "succeeded", WITHIN).await;
    assert_eq!(
        rx.requests(a.id).len(),
        1,
        "sent once, by the second attempt"
    );
    assert_eq!(w.events_to(a.id, "uncertain").await, 0);
    k.stop().await;
}

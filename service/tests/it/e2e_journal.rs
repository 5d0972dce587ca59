//! End to end, the outcome journal: keyturnd killed after the provider
//! answered and before the database recorded the answer. The kill is put
//! there deterministically, without a hook in keyturnd: the test holds the
//! action's row lock, so keyturnd's `complete_many` (sent only after the
//! outcome was journaled) waits on it; the test sees it waiting in
//! `pg_stat_activity`, SIGKILLs keyturnd, ends its backends (so the waiting
//! statement dies with it) and lets go of the row.
//!
//! The next keyturnd on the same journal directory records the observed
//! outcome, or, when a sweep made the action `uncertain` first, drops it
//! and says so for the operator.

use std::sync::Arc;
use std::time::Duration;

use crate::support::e2e::{self, Keyturnd, Queued, Receiver, World};
use serde_json::json;
use tokio_postgres::Client;

const WITHIN: Duration = Duration::from_secs(20);

/// A tenant with one webhook action queued, whose call the receiver holds
/// until `gate` gets a permit.
async fn held_action(
    port: u16,
    text: &str,
) -> (World, Receiver, Arc<tokio::sync::Semaphore>, Queued) {
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let (rx, gate) = Receiver::held(&w.tenant).await;
    let a = w.queue(&tool, json!({ "text": text }), false).await;
    (w, rx, gate, a)
}

/// A keyturnd killed with `a`'s outcome journaled and not recorded.
async fn killed_after_the_answer(
    w: &World,
    env: Vec<(&'static str, String)>,
    rx: &Receiver,
    gate: &tokio::sync::Semaphore,
    a: &Queued,
) -> Keyturnd {
    let mut k = Keyturnd::start(w.port, env).await;
    let id = a.id;
    rx.wait_requests(id, 1, WITHIN).await;
    assert_eq!(w.status(id).await, "executing");
    let holder = e2e::connect(w.port, "postgres").await;
    holder.batch_execute("BEGIN").await.expect("BEGIN");
    holder
        .execute(
            "SELECT 1 FROM keyturn.action WHERE id = $1 FOR UPDATE",
            &[&id],
        )
        .await
        .expect("lock the action");
    gate.add_permits(1);
    e2e::eventually(WITHIN, "keyturnd's complete waiting on the row", || async {
        let n: i64 = w
            .superuser
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'keyturnd' \
                   AND wait_event_type = 'Lock' AND query LIKE '%complete%'",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .get(0);
        (n > 0).then_some(())
    })
    .await;
    k.kill9().await;
    end_keyturnd_backends(&w.superuser).await;
    holder.batch_execute("ROLLBACK").await.expect("ROLLBACK");
    k
}

/// Terminates every backend of a keyturnd, and waits until they are gone:
/// a statement of a killed client may otherwise still run to its end.
async fn end_keyturnd_backends(db: &Client) {
    db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'keyturnd'",
        &[],
    )
    .await
    .expect("terminate");
    e2e::eventually(WITHIN, "keyturnd's backends gone", || async {
        let n: i64 = db
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'keyturnd'",
                &[],
            )
            .await
            .expect("count")
            .get(0);
        (n == 0).then_some(())
    })
    .await;
}

fn metric(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// The replay's count of `result` is the test's own outcome plus at most one
/// per foreign job the killed keyturnd delivered: every keyturnd leases every
/// due action, and jobs other layers left queued may fall due meanwhile
/// (exactly one when none did).
fn assert_replayed(metrics: &str, result: &str, rx: &Receiver) {
    let series = format!("keyturn_journal_replayed_total{{result=\"{result}\"}}");
    let n = metric(metrics, &series).unwrap_or(0);
    let foreign = rx.foreign() as u64;
    assert!(
        (1..=1 + foreign).contains(&n),
        "{n} {result}, {foreign} foreign requests delivered: {metrics}"
    );
}

#[tokio::test]
async fn test_an_outcome_observed_before_a_kill_is_recorded_by_the_next_keyturnd() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let (w, rx, gate, a) = held_action(port, "answered, then killed").await;
    let k1 = killed_after_the_answer(&w, rx.env(), &rx, &gate, &a).await;
    assert_eq!(
        w.status(a.id).await,
        "executing",
        "the outcome never reached the database; log:\n{}",
        k1.log()
    );
    let journal = std::fs::read(e2e::journal_dir().join("journal")).expect("the journal file");
    assert!(
        String::from_utf8_lossy(&journal).contains(&a.id.to_string()),
        "the observed outcome is in the journal"
    );

    let k2 = Keyturnd::start(port, rx.env()).await;
    w.wait_status(a.id, "succeeded", WITHIN).await;
    assert_eq!(w.attempts(a.id).await, vec![(1, Some("succeeded".into()))]);
    assert_eq!(w.usage_rows(a.id).await, 1);
    assert_eq!(rx.requests(a.id).len(), 1, "never re-sent");
    assert_eq!(w.events_to(a.id, "succeeded").await, 1);
    let metrics = k2.metrics().await;
    assert_replayed(&metrics, "recorded", &rx);
    let log = k2.stop().await;
    assert!(log.contains("journaled outcome recorded"), "{log}");

    // Acknowledged: a third keyturnd has nothing to replay.
    let k3 = Keyturnd::start(port, rx.env()).await;
    let log = k3.stop().await;
    assert!(!log.contains("journaled outcome"), "{log}");
}

#[tokio::test]
async fn test_a_journaled_outcome_swept_to_uncertain_first_is_dropped_and_logged() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let (w, rx, gate, a) = held_action(port, "answered, killed, swept").await;
    let _k1 = killed_after_the_answer(&w, rx.env(), &rx, &gate, &a).await;

    // Another keyturnd's sweep, once the lease (4 s) lapsed.
    let dispatcher = e2e::connect(port, "app_dispatcher").await;
    e2e::eventually(WITHIN, "the sweep making it uncertain", || async {
        dispatcher
            .execute("SELECT keyturn.sweep()", &[])
            .await
            .expect("sweep");
        (w.status(a.id).await == "uncertain").then_some(())
    })
    .await;

    let k2 = Keyturnd::start(port, rx.env()).await;
    let metrics = k2.metrics().await;
    let log = k2.stop().await;
    assert!(
        log.contains("journaled outcome refused") && log.contains("reconcile"),
        "the operator is told: {log}"
    );
    assert!(log.contains("observed_outcome=succeeded"), "{log}");
    assert_replayed(&metrics, "refused", &rx);
    assert_eq!(w.state(a.id).await, ("uncertain".into(), 1));
    assert_eq!(w.attempts(a.id).await, vec![(1, Some("lapsed".into()))]);
    assert_eq!(w.usage_rows(a.id).await, 0);
    assert_eq!(rx.requests(a.id).len(), 1, "never re-sent");

    // Dropped: it is not replayed again.
    let k3 = Keyturnd::start(port, rx.env()).await;
    let log = k3.stop().await;
    assert!(!log.contains("journaled outcome"), "{log}");
}

/// The same kill without the journal (`KEYTURN_JOURNAL=false`): the answer
/// the provider gave is lost with the process, and the action ends
/// `uncertain`, for an operator.
#[tokio::test]
async fn test_without_the_journal_the_same_kill_ends_uncertain() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let (rx, gate) = Receiver::held(&w.tenant).await;
    let mut env = rx.env();
    env.push(("KEYTURN_JOURNAL", "false".into()));
    let a = w
        .queue(
            &tool,
            json!({"text": "answered, killed, no journal"}),
            false,
        )
        .await;
    let k1 = killed_after_the_answer(&w, env.clone(), &rx, &gate, &a).await;
    assert!(k1.log().contains("KEYTURN_JOURNAL=false"), "{}", k1.log());

    let k2 = Keyturnd::start(port, env).await;
    w.wait_status(a.id, "uncertain", WITHIN).await;
    let log = k2.stop().await;
    assert!(!log.contains("journaled outcome"), "{log}");
    assert_eq!(w.attempts(a.id).await, vec![(1, Some("lapsed".into()))]);
    assert_eq!(rx.requests(a.id).len(), 1, "never re-sent");
}

/// SIGTERM while the database takes no outcome (`keyturn.action` locked):
/// the shutdown drain ends with the outcome journaled and not recorded, and
/// the log says the next keyturnd records it, not that the sweep will make
/// it uncertain; the next keyturnd does.
#[tokio::test]
async fn test_an_outcome_journaled_and_unrecorded_at_shutdown_is_named_so() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let (w, rx, gate, a) = held_action(port, "journaled at shutdown").await;
    let mut env = rx.env();
    env.push(("KEYTURN_SHUTDOWN_SECONDS", "2".into()));
    let k1 = Keyturnd::start(port, env).await;
    rx.wait_requests(a.id, 1, WITHIN).await;

    let mut locker = e2e::connect(port, "postgres").await;
    let lock = locker.transaction().await.expect("begin");
    lock.batch_execute("LOCK TABLE keyturn.action IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock");
    gate.add_permits(1);
    let journal = e2e::journal_dir().join("journal");
    e2e::eventually(WITHIN, "the outcome journaled", || async {
        std::fs::read(&journal)
            .ok()
            .filter(|j| String::from_utf8_lossy(j).contains(&a.id.to_string()))
            .map(|_| ())
    })
    .await;
    let log = k1.stop().await;
    let line = log
        .lines()
        .find(|l| l.contains(&a.id.to_string()) && l.contains("at exit"))
        .unwrap_or_else(|| panic!("no line about {} at exit; log:\n{log}", a.id));
    assert!(
        line.contains("journaled, not yet recorded") && line.contains("KEYTURN_JOURNAL_DIR"),
        "{line}"
    );
    assert!(!log.contains("still executing at exit"), "{log}");
    lock.rollback().await.expect("unlock");

    let k2 = Keyturnd::start(port, rx.env()).await;
    w.wait_status(a.id, "succeeded", WITHIN).await;
    assert_eq!(rx.requests(a.id).len(), 1, "never re-sent");
    k2.stop().await;
}

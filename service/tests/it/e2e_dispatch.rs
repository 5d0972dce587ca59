//! End to end, the lease rules: every lease `Config::validate` accepts
//! dispatches; a lease that leaves no job enough time hands back with a
//! growing delay and one log line, never in a loop; a step slow to be
//! answered holds up neither the slots it leased no job for nor the next
//! step; and keyturnd serves only against a database with a `pg_keyturn` of
//! its own release.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use keyturnd::config::Secret;
use keyturnd::metrics::Metrics;
use keyturnd::providers::webhook::WebhookProvider;
use keyturnd::providers::Providers;
use keyturnd::state::Health;
use keyturnd::worker::{Dispatcher, Settings};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::e2e::{self, Keyturnd, Receiver, Reply, World};
use crate::support::pg_proxy::PgProxy;

const WITHIN: Duration = Duration::from_secs(20);

/// The shortest lease accepted for a 3 s call (3 + 2 s margin + 1 s for the
/// lease round trip) dispatches, with no hand-back.
#[tokio::test]
async fn test_shortest_accepted_lease_dispatches() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let mut env = rx.env();
    env.push(("KEYTURN_LEASE_SECONDS", "6".into()));
    env.push(("KEYTURN_HTTP_TIMEOUT_SECONDS", "3".into()));
    let k = Keyturnd::start(port, env).await;

    let a = w.queue(&tool, json!({"text": "tight lease"}), false).await;
    w.wait_status(a.id, "succeeded", WITHIN).await;
    let metrics = k.metrics().await;
    let log = k.stop().await;
    assert_eq!(rx.requests(a.id).len(), 1);
    assert_eq!(w.events_to(a.id, "leased").await, 1, "leased once");
    assert!(
        metrics.contains("keyturn_handbacks_total{reason=\"lease_too_short\"} 0"),
        "{metrics}"
    );
    assert!(!log.contains("too little lease"), "{log}");
}

/// Log lines of an in-process dispatcher.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// A lease no longer than the call (which `Config::validate` refuses, so the
/// dispatcher is built by hand here, as a database that answers slowly
/// would leave it) hands every job back. Each hand-back asks for a longer
/// delay, so over five seconds the job is leased a few times, not
/// thousands, and the reason is logged once.
#[tokio::test]
async fn test_a_lease_that_must_hand_back_never_spins() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;

    // #[tokio::test] runs every task on this thread, so this catches the
    // dispatcher's lines and no other test's.
    let log = Capture::default();
    let sink = log.clone();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish(),
    );
    let url = e2e::url(port, "app_dispatcher");
    let metrics = Arc::new(Metrics::new());
    let pool = keyturnd::db::pool(&url, 4, metrics.clone()).expect("pool");
    let mut providers = Providers::default();
    providers.insert(Arc::new(
        WebhookProvider::new(
            rx.url().parse().expect("url"),
            Secret::from(rx.secret.clone()),
        )
        .expect("webhook provider"),
    ));
    let settings = Settings {
        worker_name: e2e::unique("spin"),
        lease: Duration::from_secs(3),
        call_timeout: Duration::from_secs(3),
        poll: Duration::from_millis(50),
        linger: Duration::from_millis(2),
        lease_steps: 2,
        sweep_every: Duration::from_secs(1),
        workers: 4,
        listen_notify: true,
        drain: Duration::from_secs(5),
        listen_database_url: Secret::from(url),
        notify_heartbeat: None,
    };
    let shutdown = CancellationToken::new();
    let dispatcher = tokio::spawn(
        Dispatcher::new(
            pool,
            providers,
            metrics.clone(),
            Arc::new(Health::default()),
            settings,
        )
        .run(shutdown.clone()),
    );

    let a = w
        .queue(&tool, json!({"text": "never lease enough"}), false)
        .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    shutdown.cancel();
    dispatcher
        .await
        .expect("dispatcher task")
        .expect("dispatcher");

    let text = log.text();
    let leased = w.events_to(a.id, "leased").await;
    assert!(
        (1..=4).contains(&leased),
        "leased {leased} times in 5 s; delays of 1, 2, 4 s allow 3:\n{text}"
    );
    assert_eq!(w.state(a.id).await, ("queued".into(), 0), "no attempt");
    assert!(rx.requests(a.id).is_empty(), "never dispatched");
    let lines = text
        .lines()
        .filter(|l| l.contains("too little lease"))
        .count();
    assert_eq!(lines, 1, "the reason is logged once:\n{text}");
    let rendered = metrics.render().expect("metrics");
    assert!(
        !rendered.contains("keyturn_handbacks_total{reason=\"lease_too_short\"} 0"),
        "hand-backs are counted:\n{rendered}"
    );
}

/// Pointed at a database without `pg_keyturn`, keyturnd refuses to serve
/// and says why, instead of failing every lease.
#[tokio::test]
async fn test_a_database_without_pg_keyturn_is_refused_at_start() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let mut k = Keyturnd::spawn(
        port,
        vec![(
            "DATABASE_URL",
            format!("postgres://app_dispatcher@127.0.0.1:{port}/postgres"),
        )],
    );
    let status = k.wait_exit(WITHIN).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let log = k.log();
    assert!(!status.success(), "refused: non-zero exit; log:\n{log}");
    assert!(
        log.contains("incompatible database") && log.contains("pg_keyturn is not installed"),
        "{log}"
    );
}

/// The outcome words keyturnd reports are the database's: every word of
/// keyturnd's `Outcome` is a label of `keyturn.attempt_outcome`, and the
/// type's labels are exactly those four and the sweep's `lapsed`. One list,
/// checked against the other, so neither can grow alone.
#[tokio::test]
async fn test_keyturnds_outcome_words_are_the_databases() {
    use keyturnd::classify::Outcome;
    let port = require_db!();
    let db = e2e::connect(port, "postgres").await;
    let labels: Vec<String> = db
        .query_one(
            "SELECT enum_range(NULL::keyturn.attempt_outcome)::text[]",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // Exhaustive: a new variant of Outcome fails to compile here until it
    // is listed below.
    let _every = |o: &Outcome| match o {
        Outcome::Succeeded | Outcome::Failed | Outcome::Retry { .. } | Outcome::Unknown => (),
    };
    let mut ours: Vec<&str> = [
        Outcome::Succeeded,
        Outcome::Failed,
        Outcome::Retry { after: None },
        Outcome::Unknown,
    ]
    .iter()
    .map(Outcome::word)
    .collect();
    ours.push("lapsed");
    assert_eq!(labels, ours);
}

/// More provider calls in flight than the dispatcher has connections
/// (`KEYTURN_WORKERS` 24, `KEYTURN_DB_CONNECTIONS` 2): every call is at the
/// receiver at once while keyturnd holds no more than its pool and its
/// `LISTEN` connection, since no call holds a connection across the
/// provider; then each ends `succeeded`, sent once.
#[tokio::test]
async fn test_calls_in_flight_outnumber_the_pool_and_hold_none_of_it() {
    const CALLS: usize = 24;
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let (rx, gate) = Receiver::held(&w.tenant).await;
    let mut queued = Vec::with_capacity(CALLS);
    for n in 0..CALLS {
        queued.push(
            w.queue(&tool, json!({"text": format!("in flight {n}")}), false)
                .await,
        );
    }
    let app = e2e::unique("kt_pool");
    let mut env = rx.env();
    env.extend([
        (
            "DATABASE_URL",
            format!(
                "{}?application_name={app}",
                e2e::url(port, "app_dispatcher")
            ),
        ),
        ("KEYTURN_WORKERS", CALLS.to_string()),
        ("KEYTURN_DB_CONNECTIONS", "2".into()),
        // Held calls must not time out or lapse while the test counts.
        ("KEYTURN_HTTP_TIMEOUT_SECONDS", "20".into()),
        ("KEYTURN_LEASE_SECONDS", "30".into()),
    ]);
    let k = Keyturnd::start(port, env).await;
    e2e::eventually(WITHIN, "every call at the receiver at once", || async {
        (rx.all().len() >= CALLS).then_some(())
    })
    .await;
    let connections: i64 = w
        .superuser
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await
        .expect("pg_stat_activity")
        .get(0);
    assert!(
        (1..=3).contains(&connections),
        "{CALLS} calls in flight on {connections} connections: at most the pool of 2 and LISTEN's"
    );
    gate.add_permits(CALLS);
    for q in &queued {
        w.wait_status(q.id, "succeeded", WITHIN).await;
        assert_eq!(rx.requests(q.id).len(), 1, "sent once: {}", q.id);
    }
    k.stop().await;
}

/// The answer to one step's COMMIT held by a proxy (a database slow to
/// answer): that step holds only the slot of the job it leased, and a wake-up
/// meanwhile starts a second step, which dispatches an action approved in
/// the meantime. With `KEYTURN_LEASE_STEPS=1` (0.2.0's one step at a time)
/// the second action waits for the first step, which is what the first half
/// would see if the loop still awaited each step or a step held every free
/// slot until its COMMIT was answered.
#[tokio::test]
async fn test_a_second_lease_step_dispatches_while_the_first_waits() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    for steps in [2, 1] {
        let w = World::new(port).await;
        let tool = w.webhook_tool(json!({})).await;
        let rx = Receiver::start(&w.tenant, vec![]).await;
        let proxy = PgProxy::start(port).await;
        let mut env = rx.env();
        env.extend([
            ("DATABASE_URL", e2e::url(proxy.port, "app_dispatcher")),
            ("KEYTURN_LEASE_STEPS", steps.to_string()),
            // More than the jobs other tests may have left queued, which
            // this keyturnd leases too (a step takes every free slot, and
            // keeps one for each job it leased).
            ("KEYTURN_WORKERS", "64".into()),
            // Nothing lapses while the answer is held.
            ("KEYTURN_LEASE_SECONDS", "30".into()),
            ("KEYTURN_HTTP_TIMEOUT_SECONDS", "5".into()),
        ]);
        let k = Keyturnd::start(port, env).await;
        proxy.arm_for(&w.tenant);
        let first = w.queue(&tool, json!({"text": "first step"}), false).await;
        proxy.held().await;
        let second = w.queue(&tool, json!({"text": "second step"}), false).await;
        if steps == 2 {
            rx.wait_requests(second.id, 1, WITHIN).await;
            // keyturnd stops waiting for a COMMIT answer after a while
            // (10 s here) and hands its jobs back, freeing its slots: the
            // second action must have gone before that.
            assert!(
                !k.log().contains("COMMIT unconfirmed"),
                "the second action waited for the first step to give up; log:\n{}",
                k.log()
            );
            assert!(
                rx.requests(first.id).is_empty(),
                "the first step's COMMIT is still held, so its call has not been made"
            );
        } else {
            // Several polls (200 ms) and the approval's wake-up go by.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            assert!(
                rx.requests(second.id).is_empty(),
                "one step at a time: nothing is leased while a step waits; log:\n{}",
                k.log()
            );
        }
        proxy.release();
        for q in [&first, &second] {
            w.wait_status(q.id, "succeeded", WITHIN).await;
            assert_eq!(rx.requests(q.id).len(), 1, "sent once: {}", q.id);
        }
        assert!(!k.log().contains("COMMIT unconfirmed"), "{}", k.log());
        k.stop().await;
    }
}

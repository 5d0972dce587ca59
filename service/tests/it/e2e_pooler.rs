//! End to end behind PgBouncer in transaction mode (the pgbouncer layer,
//! `KT_ONLY=pgbouncer tests/run-all`): keyturnd's pool works through it, its
//! `LISTEN` does not, and keyturnd says so; with `KEYTURN_LISTEN_DATABASE_URL`
//! pointing past the pooler, notifications arrive again.
//!
//! Each test prints the approve → provider request latencies it saw, for
//! the record; nothing asserts a time.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::e2e::{self, eventually, Keyturnd, Receiver, Reply, World};

const WITHIN: Duration = Duration::from_secs(30);

/// PgBouncer's port; without it (or the cluster) the test says that it
/// skipped, why and how to run it, and returns.
macro_rules! require_bouncer {
    () => {{
        let port = require_db!();
        match std::env::var("KT_PGBOUNCER_PORT") {
            Ok(p) => (
                port,
                p.parse::<u16>()
                    .expect("KT_PGBOUNCER_PORT must be a port number"),
            ),
            Err(_) => {
                skipped(test_name!());
                return;
            }
        }
    }};
}

/// Says loudly that `test` did not run, why and how to run it (to the
/// process's stderr: the harness shows captured output only on failure).
fn skipped(test: &str) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED {test}: KT_PGBOUNCER_PORT is not set, and this test needs PgBouncer in \
         front of the private cluster. Run it with `KT_ONLY=pgbouncer tests/run-all`, or against \
         a cluster and PgBouncer of your own (CONTRIBUTING.md) with `KT_PGPORT=<port> \
         KT_PGBOUNCER_PORT=<port> cargo test -p keyturnd --test it {test}`. ***\n"
    );
    crate::support::note_skip(test, "KT_PGBOUNCER_PORT is not set");
}

/// `GET /readyz`: status and body.
async fn readyz(k: &Keyturnd) -> Option<(u16, String)> {
    let r = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
        .get(format!("{}/readyz", k.base))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.text().await.unwrap_or_default()))
}

/// The value of one sample line of `/metrics`, e.g.
/// `keyturn_notify_heartbeats_total{result="missed"}`.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// How many clients PgBouncer has for `user`, from its admin console
/// (which speaks only the simple query protocol).
async fn bouncer_clients(bouncer: u16, user: &str) -> usize {
    let (client, connection) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={bouncer} user=postgres dbname=pgbouncer"),
        tokio_postgres::NoTls,
    )
    .await
    .expect("PgBouncer's admin console");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
        .simple_query("SHOW CLIENTS")
        .await
        .expect("SHOW CLIENTS")
        .iter()
        .filter(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get("user") == Some(user),
            _ => false,
        })
        .count()
}

/// Proposes `n` webhook actions one after the other and, for each, how long
/// from the approve's commit to the provider's request; printed (min, median,
/// max) for the record, never asserted.
async fn approve_to_request(w: &World, rx: &Receiver, tool: &str, n: usize, what: &str) {
    let mut took = Vec::with_capacity(n);
    for i in 0..n {
        let params = json!({ "text": format!("{what} {i}") });
        let row = w
            .as_identity(
                &w.agent,
                "SELECT action_id, token FROM keyturn.propose($1, $2)",
                &[&tool, &params],
            )
            .await
            .expect("propose");
        let (id, token): (uuid::Uuid, String) = (row.get(0), row.get(1));
        w.as_identity(
            &w.human,
            "SELECT status FROM keyturn.approve($1, $2)",
            &[&id, &token],
        )
        .await
        .expect("approve");
        let committed = Instant::now();
        // Finer than Receiver::wait_requests' 50 ms, to see the wake-up.
        while rx.requests(id).is_empty() {
            assert!(committed.elapsed() < WITHIN, "no request for {id}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        took.push(committed.elapsed());
        w.wait_status(id, "succeeded", WITHIN).await;
        assert_eq!(rx.requests(id).len(), 1, "dispatched once");
    }
    took.sort();
    eprintln!(
        "approve commit -> provider request, {what}: min {:?}, median {:?}, max {:?} ({n} actions)",
        took[0],
        took[n / 2],
        took[n - 1]
    );
}

#[tokio::test]
async fn test_listen_through_a_transaction_pooler_is_reported_stalled() {
    let (pg, bouncer) = require_bouncer!();
    let _serial = e2e::serial().await;
    let w = World::new(pg).await;
    let tool = w.webhook_tool(json!({})).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let mut env = rx.env();
    // Pool and LISTEN both through PgBouncer, as a deployment that set only
    // DATABASE_URL to the pooler has them.
    env.push(("DATABASE_URL", e2e::url(bouncer, "app_dispatcher")));
    env.push(("KEYTURN_NOTIFY_HEARTBEAT_SECONDS", "1".into()));
    // The default poll period, as the deployments that reported the stall had.
    env.push(("KEYTURN_POLL_MS", "1000".into()));
    let k = Keyturnd::spawn(pg, env);

    let body = eventually(WITHIN, "/readyz to report the stall", || async {
        readyz(&k)
            .await
            .filter(|(status, _)| *status == 503)
            .map(|(_, body)| body)
            .filter(|body| body.contains("stalled"))
    })
    .await;
    assert!(body.contains("KEYTURN_LISTEN_DATABASE_URL"), "{body}");
    // Several heartbeats missed by now, and the stall logged once.
    let metrics = eventually(WITHIN, "three missed heartbeats", || async {
        let m = k.metrics().await;
        (sample(&m, "keyturn_notify_heartbeats_total{result=\"missed\"}")? >= 3.0).then_some(m)
    })
    .await;
    assert_eq!(
        sample(&metrics, "keyturn_notify_stalled"),
        Some(1.0),
        "{metrics}"
    );
    assert!(
        bouncer_clients(bouncer, "app_dispatcher").await >= 2,
        "the pool and the LISTEN connection are PgBouncer's clients"
    );
    // Polling is the safety net: actions are still dispatched, once each.
    approve_to_request(
        &w,
        &rx,
        &tool,
        5,
        "LISTEN through PgBouncer, polling every 1 s",
    )
    .await;
    let log = k.stop().await;
    let warnings = log
        .lines()
        .filter(|l| l.contains("notifications stalled"))
        .count();
    assert_eq!(warnings, 1, "the stall is logged once:\n{log}");
    assert!(
        log.contains("LISTEN behind a transaction-mode pooler? set KEYTURN_LISTEN_DATABASE_URL"),
        "the log says what to do:\n{log}"
    );
}

#[tokio::test]
async fn test_a_direct_listen_connection_beside_a_pooled_pool_is_not_stalled() {
    let (pg, bouncer) = require_bouncer!();
    let _serial = e2e::serial().await;
    let w = World::new(pg).await;
    let tool = w.webhook_tool(json!({})).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let mut env = rx.env();
    env.push(("DATABASE_URL", e2e::url(bouncer, "app_dispatcher")));
    env.push((
        "KEYTURN_LISTEN_DATABASE_URL",
        e2e::url(pg, "app_dispatcher"),
    ));
    // Longer than the stalled test's: under a loaded machine a heartbeat
    // must not miss by being slow.
    env.push(("KEYTURN_NOTIFY_HEARTBEAT_SECONDS", "2".into()));
    // Polling slow enough that a wake-up within it shows it was the NOTIFY.
    env.push(("KEYTURN_POLL_MS", "1000".into()));
    let k = Keyturnd::spawn(pg, env);
    k.wait_ready(WITHIN).await;

    let metrics = eventually(WITHIN, "three heartbeats received", || async {
        let m = k.metrics().await;
        (sample(&m, "keyturn_notify_heartbeats_total{result=\"received\"}")? >= 3.0).then_some(m)
    })
    .await;
    assert_eq!(
        sample(
            &metrics,
            "keyturn_notify_heartbeats_total{result=\"missed\"}"
        ),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(sample(&metrics, "keyturn_notify_stalled"), Some(0.0));
    assert_eq!(readyz(&k).await.map(|(s, _)| s), Some(200));
    // The pool (lease, begin, complete) goes through PgBouncer, the wake-up
    // comes over the direct connection.
    approve_to_request(&w, &rx, &tool, 5, "pool through PgBouncer, LISTEN direct").await;
    assert!(
        bouncer_clients(bouncer, "app_dispatcher").await >= 1,
        "keyturnd's pool is a client of PgBouncer"
    );
    let log = k.stop().await;
    assert!(!log.contains("notifications stalled"), "{log}");
}

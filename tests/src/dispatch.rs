//! The dispatcher's side: `LISTEN`, leases of the tests' own actions, begin
//! and complete, and the attempts they leave.

use crate::conn::{dbname, port};
use crate::world::{count, World};
use crate::SqlState;
use serde_json::{json, Value};
use tokio_postgres::{Client, Error, NoTls};

/// A connection that has run `LISTEN channel`; notifications arrive on the receiver.
pub async fn listen(
    channel: &str,
) -> (
    Client,
    tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
) {
    let url = format!(
        "host=127.0.0.1 port={} user=postgres dbname={}",
        port(),
        dbname()
    );
    let (client, mut connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .expect("connect listener");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let msg = std::future::poll_fn(|cx| connection.poll_message(cx)).await;
            match msg {
                Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                    if tx.send(n).is_err() {
                        break;
                    }
                }
                Some(Ok(_)) => {}
                _ => break,
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {channel}"))
        .await
        .expect("listen");
    (client, rx)
}

/// Serializes the tests that lease or sweep, and the tests whose rows a lease
/// or a sweep would disturb: lease() and sweep() work across tenants, and all
/// integration tests share one process, so a test holding this lock may lease
/// (and hand back) any queued row and expire any pending row past its expiry.
/// Take it before creating the rows a test wants to lease itself: a foreign
/// lease_mine hands a queued row back for a day.
pub static DISPATCH_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One leased job.
#[derive(Debug, Clone)]
pub struct Lease {
    pub action_id: uuid::Uuid,
    pub lease_id: uuid::Uuid,
    pub tenant: String,
    pub tool: String,
    pub provider: Option<String>,
    pub params: Option<Value>,
    pub idempotency_key: String,
    pub attempt: i32,
}

impl Lease {
    /// A row of `lease` or `lease_for`, its columns in their order.
    pub fn from_row(r: &tokio_postgres::Row) -> Lease {
        Lease {
            action_id: r.get(0),
            lease_id: r.get(1),
            tenant: r.get(2),
            tool: r.get(3),
            provider: r.get(4),
            params: r.get(5),
            idempotency_key: r.get(6),
            attempt: r.get(7),
        }
    }
}

/// Leases every due job as `worker` and returns those among `mine`; any other
/// due job (left queued by earlier tests) is handed back for a day, untouched.
pub async fn lease_mine(dispatcher: &Client, mine: &[uuid::Uuid], lease_for: &str) -> Vec<Lease> {
    // The cluster is shared with every other test: lease in batches until ours
    // are found or nothing is due, handing every foreign job back for a day.
    let mut out = Vec::new();
    loop {
        let rows = dispatcher
            .query(
                "SELECT action_id, lease_id, tenant, tool, provider, params, idempotency_key, attempt \
                 FROM keyturn.lease('itest-worker', 1000, $1::text::interval)",
                &[&lease_for],
            )
            .await
            .expect("lease");
        if rows.is_empty() {
            break;
        }
        for r in rows {
            let l = Lease::from_row(&r);
            if mine.contains(&l.action_id) {
                out.push(l);
            } else {
                // A test that does not lease may cancel or invalidate its own
                // job while we hold it; then it is no longer ours to hand back.
                let r = dispatcher
                    .execute(
                        "SELECT keyturn.complete($1, $2, 'retry', '{}', interval '1 day')",
                        &[&l.action_id, &l.lease_id],
                    )
                    .await;
                if let Err(e) = r {
                    assert_eq!(
                        e.code(),
                        Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE),
                        "hand back a foreign job: {e}"
                    );
                }
            }
        }
        if out.len() == mine.len() {
            break;
        }
    }
    out
}

/// A world with an external (webhook) tool and `n` approved, `queued` actions.
pub async fn queued(n: usize) -> (World, String, Vec<uuid::Uuid>) {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let mut ids = Vec::new();
    for i in 0..n {
        let p = w
            .propose(&t, json!({"channel": "c", "text": format!("m{i}")}))
            .await
            .unwrap();
        assert_eq!(w.approve(&p).await.unwrap().0, "queued");
        ids.push(p.id);
    }
    (w, t, ids)
}

/// `keyturn.begin_dispatch` for a lease.
pub async fn begin(d: &Client, l: &Lease) -> Result<bool, Error> {
    d.query_one(
        "SELECT keyturn.begin_dispatch($1, $2)",
        &[&l.action_id, &l.lease_id],
    )
    .await
    .map(|r| r.get(0))
}

/// `keyturn.complete` for a lease; `retry` is an interval text such as "1 hour".
pub async fn complete(
    d: &Client,
    l: &Lease,
    outcome: &str,
    receipt: Value,
    retry: Option<&str>,
) -> Result<String, Error> {
    d.query_one(
        "SELECT keyturn.complete($1, $2, $3, $4, $5::text::interval)",
        &[&l.action_id, &l.lease_id, &outcome, &receipt, &retry],
    )
    .await
    .map(|r| r.get(0))
}

/// The action's attempt counter, read as superuser.
pub async fn attempts(w: &World, id: uuid::Uuid) -> i32 {
    w.superuser
        .query_one("SELECT attempts FROM keyturn.action WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0)
}

/// How many attempt rows (keyturn.attempt) the action has, read as superuser.
pub async fn attempt_rows(w: &World, id: uuid::Uuid) -> i64 {
    count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.attempt WHERE action_id = $1",
        &[&id],
    )
    .await
}

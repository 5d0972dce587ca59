//! The benchmark's bare worker (tests/bench, item 3): what a team would write
//! by hand to drain a queue of webhook jobs, for comparison with keyturnd.
//!
//! Same HTTP client as keyturnd (keyturnd's own `WebhookProvider`: same body,
//! signature, headers and reqwest settings), same slot count and the same
//! wake-up rule (lease again when a job ends, else poll), but no gate: one
//! `FOR UPDATE SKIP LOCKED` lease statement per batch and one `complete`
//! UPDATE per job on the plain table `bare.job` (tests/bench/setup.sql).
//! No begin_dispatch, no grant/epoch/tool rechecks, no event rows.
//!
//! ```text
//! cargo run --release -p keyturnd --example bench_worker -- \
//!     --database-url postgres://app_dispatcher@127.0.0.1:PORT/keyturn \
//!     --webhook-url http://127.0.0.1:9000/ --secret S [--workers 64] [--exit-when-empty]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use keyturnd::config::Secret;
use keyturnd::db::LeasedJob;
use keyturnd::providers::webhook::WebhookProvider;
use keyturnd::providers::Provider;
use tokio::sync::{Notify, Semaphore};

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    #[arg(long)]
    webhook_url: url::Url,
    #[arg(long)]
    secret: String,
    /// Provider calls in flight at most (keyturnd: KEYTURN_WORKERS, default 64).
    #[arg(long, default_value_t = 64)]
    workers: usize,
    /// Poll period when no job ended (keyturnd: KEYTURN_POLL_MS, default 1000).
    #[arg(long, default_value_t = 1000)]
    poll_ms: u64,
    /// Exit once a lease finds nothing and no job is in flight.
    #[arg(long)]
    exit_when_empty: bool,
}

const LEASE: &str = "UPDATE bare.job j SET status = 'leased', lease_id = gen_random_uuid(), \
        lease_expires_at = now() + interval '30 seconds', updated_at = now() \
    FROM (SELECT id FROM bare.job WHERE status = 'queued' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) d \
    WHERE j.id = d.id \
    RETURNING j.id, j.lease_id, j.tenant, j.tool, j.params, j.idempotency_key";
const COMPLETE: &str =
    "UPDATE bare.job SET status = $3, receipt = $4, lease_expires_at = NULL, updated_at = now() \
    WHERE id = $1 AND lease_id = $2 AND status = 'leased'";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let pg: tokio_postgres::Config = args.database_url.parse()?;
    let mgr = deadpool_postgres::Manager::new(pg, tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(mgr)
        .max_size(args.workers + 2)
        .build()?;
    let provider = Arc::new(WebhookProvider::new(
        args.webhook_url.clone(),
        Secret::from(args.secret.clone()),
    )?);
    let slots = Arc::new(Semaphore::new(args.workers));
    let wake = Arc::new(Notify::new());
    let started = Instant::now();
    let mut done = 0u64;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();

    loop {
        while rx.try_recv().is_ok() {
            done += 1;
        }
        let free = slots.available_permits();
        if free > 0 {
            let client = pool.get().await?;
            let stmt = client.prepare_cached(LEASE).await?;
            let rows = client.query(&stmt, &[&(free as i64)]).await?;
            drop(client);
            if rows.is_empty() && free == args.workers && args.exit_when_empty {
                while rx.try_recv().is_ok() {
                    done += 1;
                }
                break;
            }
            for row in rows {
                let permit = slots.clone().try_acquire_owned()?;
                let job = LeasedJob {
                    action_id: row.get(0),
                    lease_id: row.get(1),
                    tenant: row.get(2),
                    tool: row.get(3),
                    provider: "webhook".into(),
                    params: row.get(4),
                    idempotency_key: row.get(5),
                    attempt: 1,
                };
                let (pool, provider, wake, tx) =
                    (pool.clone(), provider.clone(), wake.clone(), tx.clone());
                tokio::spawn(async move {
                    let result = provider
                        .call(
                            &job,
                            &[],
                            tokio::time::Instant::now() + Duration::from_secs(10),
                        )
                        .await;
                    let status = match result.outcome.word() {
                        "succeeded" => "succeeded",
                        "retry" => "queued",
                        other => other,
                    };
                    if let Ok(client) = pool.get().await {
                        if let Ok(stmt) = client.prepare_cached(COMPLETE).await {
                            let _ = client
                                .execute(
                                    &stmt,
                                    &[&job.action_id, &job.lease_id, &status, &result.receipt],
                                )
                                .await;
                        }
                    }
                    drop(permit);
                    let _ = tx.send(());
                    wake.notify_one();
                });
            }
        }
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(args.poll_ms)) => {}
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{{\"jobs\": {done}, \"seconds\": {secs:.3}, \"rate\": {:.1}}}",
        done as f64 / secs
    );
    Ok(())
}

//! The benchmark's wake-up probe (tests/bench, item 4): approve commit →
//! webhook request arrives, measured on one clock.
//!
//! It is both the human and the provider: it serves the webhook endpoint
//! keyturnd posts to (answering 200 at once and noting when each action's
//! first request arrived), and approves the pending proposals listed in
//! `bare.token` at a fixed rate, one transaction each, noting when each
//! COMMIT was acknowledged. Latency = arrival − acknowledgement (a request
//! that arrives before the acknowledgement counts as 0 and is reported).
//!
//! ```text
//! cargo run --release -p keyturnd --example bench_wakeup -- \
//!     --database-url postgres://app_human@127.0.0.1:PORT/keyturn --listen 127.0.0.1:9001 \
//!     --rate 100 --principal p0 --session s0
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Router;
use clap::Parser;
use uuid::Uuid;

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    #[arg(long, default_value = "127.0.0.1:9001")]
    listen: SocketAddr,
    /// Approvals per second.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    #[arg(long, default_value = "acme")]
    tenant: String,
    #[arg(long, default_value = "p0")]
    principal: String,
    #[arg(long, default_value = "s0")]
    session: String,
    /// Seconds to wait for stragglers after the last approval.
    #[arg(long, default_value_t = 5)]
    grace: u64,
}

type Arrivals = Arc<Mutex<HashMap<Uuid, Instant>>>;

async fn receive(State(arrivals): State<Arrivals>, body: Bytes) -> StatusCode {
    let now = Instant::now();
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) {
        if let Some(id) = v
            .get("action_id")
            .and_then(|x| x.as_str())
            .and_then(|s| s.parse().ok())
        {
            arrivals
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(id)
                .or_insert(now);
        }
    }
    StatusCode::OK
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let arrivals: Arrivals = Arc::default();
    let app = Router::new().fallback(receive).with_state(arrivals.clone());
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    let pg: tokio_postgres::Config = args.database_url.parse()?;
    let mgr = deadpool_postgres::Manager::new(pg, tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(mgr).max_size(16).build()?;
    let tokens: Vec<(Uuid, String)> = {
        let client = pool.get().await?;
        client
            .query("SELECT action_id, token FROM bare.token ORDER BY n", &[])
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    };
    // Open the connections before the clock starts.
    {
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(pool.get().await?);
        }
    }

    let acks: Arc<Mutex<HashMap<Uuid, Instant>>> = Arc::default();
    let approve_ms: Arc<Mutex<Vec<f64>>> = Arc::default();
    let period = Duration::from_secs_f64(1.0 / args.rate);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for (i, (id, token)) in tokens.into_iter().enumerate() {
        tokio::time::sleep_until(start + period * i as u32).await;
        let (pool, acks, approve_ms) = (pool.clone(), acks.clone(), approve_ms.clone());
        let ident = (
            args.tenant.clone(),
            args.principal.clone(),
            args.session.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut client = pool.get().await.expect("connection");
            let t0 = Instant::now();
            let tx = client.transaction().await.expect("begin");
            tx.query(
                "SELECT set_config('keyturn.tenant', $1, true), set_config('keyturn.principal', $2, true), \
                 set_config('keyturn.session', $3, true)",
                &[&ident.0, &ident.1, &ident.2],
            )
            .await
            .expect("identity");
            let row = tx
                .query_one("SELECT status FROM keyturn.approve($1, $2)", &[&id, &token])
                .await
                .expect("approve");
            let status: String = row.get(0);
            tx.commit().await.expect("commit");
            let ack = Instant::now();
            if status == "queued" {
                acks.lock().unwrap_or_else(|e| e.into_inner()).insert(id, ack);
            }
            approve_ms.lock().unwrap_or_else(|e| e.into_inner()).push((ack - t0).as_secs_f64() * 1e3);
        }));
    }
    for t in tasks {
        t.await?;
    }
    let n = acks.lock().unwrap_or_else(|e| e.into_inner()).len();
    let deadline = Instant::now() + Duration::from_secs(args.grace);
    while Instant::now() < deadline {
        if arrivals.lock().unwrap_or_else(|e| e.into_inner()).len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let acks = acks.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let arrivals = arrivals.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut lat = Vec::new();
    let mut early = 0;
    for (id, ack) in &acks {
        if let Some(at) = arrivals.get(id) {
            if at < ack {
                early += 1;
                lat.push(0.0);
            } else {
                lat.push((*at - *ack).as_secs_f64() * 1e3);
            }
        }
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let mut ap = approve_ms.lock().unwrap_or_else(|e| e.into_inner()).clone();
    ap.sort_by(|a, b| a.total_cmp(b));
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "{{\"approved\": {n}, \"arrived\": {}, \"missing\": {}, \"early\": {early}, \"rate\": {:.1}, \
         \"p50_ms\": {:.2}, \"p90_ms\": {:.2}, \"p99_ms\": {:.2}, \"max_ms\": {:.2}, \
         \"approve_p50_ms\": {:.2}, \"approve_p99_ms\": {:.2}}}",
        lat.len(),
        n - lat.len(),
        n as f64 / elapsed,
        pct(&lat, 50.0),
        pct(&lat, 90.0),
        pct(&lat, 99.0),
        lat.last().copied().unwrap_or(f64::NAN),
        pct(&ap, 50.0),
        pct(&ap, 99.0),
    );
    Ok(())
}

//! The periodic `keyturn.sweep()`: the database moves lapsed rows forward
//! (`pending` past expiry → `expired`, `leased` with a lapsed lease →
//! `queued`, `executing` with a lapsed lease → `uncertain`); keyturnd only
//! calls it on a timer, counts what it did, wakes the loop when it requeued
//! something, and refreshes the `keyturn_uncertain` gauge.
//!
//! It waits while the completion queue is recording a batch (retries
//! included): an outcome this process observed is recorded before its own
//! sweep can call the action `uncertain`, however long the database was
//! away.
//!
//! By tenant, it sweeps each tenant `keyturn.tenants_due` names with work
//! to sweep (`keyturn.sweep_for`, which Citus runs on the tenant's worker).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::Ctx;
use crate::db::{self, SweepCounts};
use crate::error::Error;

/// Tenants swept per period at most, by tenant; the rest wait for the next.
const SWEEP_TENANTS: i32 = 1000;

/// One sweep: `keyturn.sweep()`, or by tenant `keyturn.sweep_for` for each
/// tenant with something to sweep, the counts added up.
async fn sweep_once(ctx: &Ctx, client: &tokio_postgres::Client) -> Result<SweepCounts, Error> {
    if !ctx.by_tenant() {
        return db::sweep(client, None).await;
    }
    let mut all = SweepCounts::default();
    for due in db::tenants_due(client, None, SWEEP_TENANTS).await? {
        if due.to_sweep == 0 {
            continue;
        }
        let c = db::sweep(client, Some(&due.tenant)).await?;
        all.expired += c.expired;
        all.requeued += c.requeued;
        all.uncertain += c.uncertain;
    }
    Ok(all)
}

/// Runs `keyturn.sweep()` every sweep period and refreshes the uncertain
/// gauge.
pub(super) async fn sweep_loop(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(ctx.settings.sweep_every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    // Whether this role may count the uncertain actions: asked once.
    let mut gauge: Option<bool> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let swept = tokio::select! {
            _ = shutdown.cancelled() => break,
            swept = async {
                let _recording = ctx.recording.lock().await;
                let client = ctx.pool.get().await?;
                sweep_once(&ctx, &client).await
            } => swept,
        };
        match swept {
            Ok(counts) => {
                failing = false;
                let m = &ctx.metrics;
                for (kind, n) in [
                    ("expired", counts.expired),
                    ("requeued", counts.requeued),
                    ("uncertain", counts.uncertain),
                ] {
                    m.sweep
                        .get_or_create(&crate::metrics::KindLabel { kind })
                        .inc_by(u64::try_from(n).unwrap_or(0));
                }
                if counts.requeued > 0 {
                    ctx.wake.notify_one();
                }
                if counts.uncertain > 0 {
                    tracing::warn!(count = counts.uncertain, "sweep marked actions uncertain; an operator must reconcile them (`keyturnd uncertain`)");
                }
            }
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "keyturn.sweep failed; will retry every period");
            }
            Err(e) => tracing::debug!(error = %e, "keyturn.sweep failed again"),
        }
        if gauge != Some(false) {
            let counted = async {
                let client = ctx.pool.get().await?;
                if gauge.is_none() {
                    gauge = Some(db::may_count_uncertain(&client).await?);
                    if gauge == Some(false) {
                        tracing::info!(
                            "this role lacks keyturn_operator; the keyturn_uncertain gauge is off"
                        );
                        return Ok(None);
                    }
                }
                db::uncertain_count(&client).await.map(Some)
            }
            .await;
            match counted {
                Ok(Some(n)) => {
                    ctx.metrics.uncertain.set(n);
                }
                Ok(None) => {}
                Err(e) => tracing::debug!(error = %e, "could not count uncertain actions"),
            }
        }
    }
}

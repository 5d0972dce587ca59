//! The per-job provider call: bounded by the lease left, its outcome then
//! recorded. Two entry points: [`call_job`] for a job the batched begin
//! ([`super::begin`]) answered `dispatch`, and [`run_job`], the single-call
//! path that repeats the hand-back checks, calls `keyturn.begin_dispatch`
//! itself and records with `keyturn.complete`.
//!
//! **begin_dispatch that may or may not have committed** (the connection
//! broke around it): the provider is *not* called, and the worker records
//! `retry`, which is right in both cases — from `leased` it requeues without
//! counting an attempt, from `executing` it requeues counting one that did
//! nothing.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::completion::{enqueue, record, Done};
use super::lease::{hand_back, Slot};
use super::{lock, Ctx, UNKNOWN_PROVIDER_DELAY};
use crate::classify::Outcome;
use crate::config::LEASE_SAFETY_MARGIN;
use crate::db::{self, LeasedJob};
use crate::providers::CallResult;

/// Extra time a provider gets past its own bound before the worker stops
/// waiting and records `unknown` (a provider that ignores its timeout).
const PROVIDER_GRACE: Duration = Duration::from_millis(500);

/// The provider call of a begun job; its outcome goes to the completion
/// queue.
#[tracing::instrument(
    name = "job",
    skip_all,
    fields(action_id = %job.action_id, tenant = %job.tenant, tool = %job.tool, provider = %job.provider, attempt = job.attempt)
)]
pub(super) async fn call_job(
    ctx: Arc<Ctx>,
    job: LeasedJob,
    deadline: Instant,
    slot: Slot,
    done: mpsc::UnboundedSender<Done>,
) {
    let Some(provider) = ctx.providers.get(&job.provider) else {
        // Checked before begin; a provider cannot disappear.
        return;
    };
    let result = call_provider(&ctx, provider.as_ref(), &job, deadline).await;
    enqueue(&done, job, result, deadline, slot);
}

/// Removes the action from the in-flight set and wakes the loop (a slot is
/// free) however the job task ends.
struct JobGuard {
    ctx: Arc<Ctx>,
    action_id: Uuid,
}

impl Drop for JobGuard {
    fn drop(&mut self) {
        lock(&self.ctx.inflight).remove(&self.action_id);
        self.ctx.wake.notify_one();
    }
}

#[tracing::instrument(
    name = "job",
    skip_all,
    fields(action_id = %job.action_id, tenant = %job.tenant, tool = %job.tool, provider = %job.provider, attempt = job.attempt)
)]
pub(super) async fn run_job(
    ctx: Arc<Ctx>,
    job: LeasedJob,
    deadline: Instant,
    permit: OwnedSemaphorePermit,
    shutdown: CancellationToken,
) {
    let _permit = permit;
    lock(&ctx.inflight).insert(job.action_id);
    let _guard = JobGuard {
        ctx: ctx.clone(),
        action_id: job.action_id,
    };

    let Some(provider) = ctx.providers.get(&job.provider) else {
        tracing::error!(
            configured = ?ctx.providers.names(),
            "no provider of this name is configured here; handing the job back undispatched (configure it, or cancel the action)"
        );
        ctx.metrics.handback("unknown_provider");
        hand_back(&ctx, &job, Some(UNKNOWN_PROVIDER_DELAY)).await;
        return;
    };
    if shutdown.is_cancelled() {
        ctx.metrics.handback("shutdown");
        hand_back(&ctx, &job, None).await;
        return;
    }
    let needed = ctx.settings.call_timeout + LEASE_SAFETY_MARGIN;
    if deadline.saturating_duration_since(Instant::now()) < needed {
        tracing::warn!("too little lease left for a full call; handing the job back");
        ctx.metrics.handback("lease_too_short");
        hand_back(&ctx, &job, None).await;
        return;
    }

    let begun = async {
        let client = ctx.pool.get().await?;
        db::begin_dispatch(&client, job.action_id, job.lease_id).await
    }
    .await;
    match begun {
        Ok(true) => {}
        Ok(false) => {
            tracing::info!("begin_dispatch: invalidated; the provider is not called");
            ctx.metrics.action("invalidated");
            return;
        }
        Err(e) if e.is_object_not_in_state() => {
            tracing::warn!(error = %e, "begin_dispatch refused (lease lapsed or action moved on); the provider is not called");
            return;
        }
        Err(e) => {
            // It may or may not have committed; see the module docs.
            tracing::warn!(error = %e, "begin_dispatch unconfirmed; the provider is not called, recording retry");
            let unsent = CallResult {
                outcome: Outcome::Retry { after: None },
                receipt: json!({ "error": "begin_dispatch unconfirmed; provider not called" }),
            };
            record(&ctx, &job, &unsent, deadline).await;
            return;
        }
    }

    let result = call_provider(&ctx, provider.as_ref(), &job, deadline).await;
    record(&ctx, &job, &result, deadline).await;
}

/// The provider call, bounded by the lease left (never by more than the
/// configured timeout), with its metrics.
async fn call_provider(
    ctx: &Ctx,
    provider: &dyn crate::providers::Provider,
    job: &LeasedJob,
    deadline: Instant,
) -> CallResult {
    let budget = deadline
        .saturating_duration_since(Instant::now())
        .saturating_sub(LEASE_SAFETY_MARGIN)
        .min(ctx.settings.call_timeout);
    let t0 = Instant::now();
    let result =
        match tokio::time::timeout(budget + PROVIDER_GRACE, provider.call(job, budget)).await {
            Ok(result) => result,
            Err(_) => {
                tracing::error!(
                    ?budget,
                    "provider overran its time bound; recording unknown"
                );
                CallResult {
                    outcome: Outcome::Unknown,
                    receipt: json!({ "error": "provider call overran its time bound" }),
                }
            }
        };
    ctx.metrics
        .dispatch_seconds
        .observe(t0.elapsed().as_secs_f64());
    ctx.metrics.action(result.outcome.word());
    result
}

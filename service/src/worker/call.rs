//! The call: one provider attempt for a job the database has committed
//! `executing`, bounded by the lease left (never by more than the configured
//! timeout); its outcome goes to the completion queue.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::completion::enqueue;
use super::{Ctx, Done, Slot};
use crate::classify::Outcome;
use crate::config::LEASE_SAFETY_MARGIN;
use crate::db::LeasedJob;
use crate::providers::{CallResult, Provider};

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

async fn call_provider(
    ctx: &Ctx,
    provider: &dyn Provider,
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

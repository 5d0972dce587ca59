//! The batched begin: one `keyturn.begin_dispatch_many` (one commit) for the
//! jobs of a lease batch, in a task of its own so the loop keeps leasing
//! while it runs. Each job it answers `dispatch` gets a provider-call task
//! ([`call_job`]); a job answered `dispatch = false` is never called. A
//! database without the batch functions (`42883`: nothing ran) switches the
//! process to the single-call path ([`run_job`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::completion::{enqueue, Done};
use super::job::{call_job, run_job};
use super::lease::Slot;
use super::Ctx;
use crate::classify::Outcome;
use crate::db::{self, LeasedJob};
use crate::providers::CallResult;

/// One `keyturn.begin_dispatch_many` (one commit) for the jobs of a lease
/// batch, then a provider-call task for each job it answered `dispatch`.
pub(super) async fn begin_batch(
    ctx: Arc<Ctx>,
    tracker: TaskTracker,
    jobs: Vec<(LeasedJob, Slot)>,
    deadline: Instant,
    done: mpsc::UnboundedSender<Done>,
    shutdown: CancellationToken,
) {
    let pairs: Vec<(Uuid, Uuid)> = jobs
        .iter()
        .map(|(j, _)| (j.action_id, j.lease_id))
        .collect();
    let begun = async {
        let client = ctx.pool.get().await?;
        db::begin_dispatch_many(&client, &pairs).await
    }
    .await;
    let answers = match begun {
        Ok(answers) => answers,
        Err(e) if e.sqlstate() == Some(&SqlState::UNDEFINED_FUNCTION) => {
            // Nothing ran: the statement did not even plan. An older
            // pg_keyturn without sql/061: single calls from now on.
            if ctx.batch.swap(false, Ordering::Relaxed) {
                tracing::warn!(error = %e, "keyturn.begin_dispatch_many is not installed; using single begin_dispatch/complete calls");
            }
            for (job, slot) in jobs {
                let permit = slot.into_permit();
                tracker.spawn(run_job(
                    ctx.clone(),
                    job,
                    deadline,
                    permit,
                    shutdown.clone(),
                ));
            }
            return;
        }
        Err(e) => {
            // It may or may not have committed (the object-not-in-state case
            // cannot arise for the batch as a whole; treated alike): no
            // provider is called, `retry` is recorded for each job, which is
            // right either way (see [`super::job`]).
            tracing::warn!(error = %e, jobs = jobs.len(), "begin_dispatch_many unconfirmed; no provider is called, recording retry");
            for (job, slot) in jobs {
                let unsent = CallResult {
                    outcome: Outcome::Retry { after: None },
                    receipt: json!({ "error": "begin_dispatch unconfirmed; provider not called" }),
                };
                enqueue(&done, job, unsent, deadline, slot);
            }
            return;
        }
    };
    for (i, (job, slot)) in jobs.into_iter().enumerate() {
        let span = tracing::info_span!("job", action_id = %job.action_id, tenant = %job.tenant, tool = %job.tool, provider = %job.provider, attempt = job.attempt);
        let _e = span.enter();
        match answers.get(i).filter(|a| a.action_id == job.action_id) {
            Some(a) if a.dispatch => {
                tracker.spawn(call_job(ctx.clone(), job, deadline, slot, done.clone()));
            }
            Some(a) if a.error.is_none() => {
                tracing::info!("begin_dispatch: invalidated; the provider is not called");
                ctx.metrics.action("invalidated");
            }
            Some(a) => {
                tracing::warn!(error = a.error.as_deref().unwrap_or(""), "begin_dispatch refused (lease lapsed or action moved on); the provider is not called");
            }
            None => {
                // Cannot happen (one answer per pair, in order); if it did,
                // this job's begin is unconfirmed.
                tracing::error!("begin_dispatch_many gave no answer for this job; the provider is not called, recording retry");
                let unsent = CallResult {
                    outcome: Outcome::Retry { after: None },
                    receipt: json!({ "error": "begin_dispatch unconfirmed; provider not called" }),
                };
                enqueue(&done, job, unsent, deadline, slot);
            }
        }
    }
}

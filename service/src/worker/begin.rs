//! The batched begin: `keyturn.begin_dispatch_many` for the jobs of a lease
//! batch, run inside the same transaction as the `keyturn.lease` that leased
//! them (see [`super::lease`]), and what follows its `COMMIT`: each job it
//! answered `dispatch` gets a provider-call task ([`call_job`]); a job
//! answered `dispatch = false` is never called.
//!
//! **Why one transaction is safe.** The contract requires `executing` to be
//! committed before any provider call (docs/sql-api.md).
//! That still holds: [`dispatch_begun`] runs only after `COMMIT` returned
//! success, so every row it calls a provider for is committed `executing`
//! under its lease. What changes is only that the `leased` state is never
//! committed on its own: if anything fails before `COMMIT` (a statement, the
//! connection, the process), the transaction rolls back, the leases never
//! existed, the rows are still `queued` with no attempt counted, and no
//! provider is called. If the outcome of `COMMIT` itself is unknown (the
//! connection broke during it), [`unconfirmed`] treats the batch exactly as
//! an unconfirmed `begin_dispatch` (see [`super::job`]): no provider is
//! called and `retry` is recorded for each job, which the database accepts
//! only while the row is still `executing` (or `leased`) under that lease —
//! requeued, the attempt counted and doing nothing — and refuses with
//! `55000` if the transaction did not commit (the row is `queued` and never
//! was leased).

use std::sync::Arc;

use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::completion::{enqueue, Done};
use super::job::call_job;
use super::lease::Slot;
use super::Ctx;
use crate::classify::Outcome;
use crate::db::{BeginAnswer, LeasedJob};
use crate::providers::CallResult;

/// After a successful `COMMIT`: a provider-call task for each job
/// `begin_dispatch_many` answered `dispatch` (in order, one answer per job).
pub(super) fn dispatch_begun(
    ctx: &Arc<Ctx>,
    tracker: &TaskTracker,
    jobs: Vec<(LeasedJob, Slot)>,
    answers: &[BeginAnswer],
    deadline: Instant,
    done: &mpsc::UnboundedSender<Done>,
) {
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
                enqueue(done, job, unsent(), deadline, slot);
            }
        }
    }
}

/// The `COMMIT` of a lease-and-begin transaction may or may not have
/// happened: no provider is called, `retry` is recorded for each job that
/// was to be begun (see the module docs).
pub(super) fn unconfirmed(
    jobs: Vec<(LeasedJob, Slot)>,
    deadline: Instant,
    done: &mpsc::UnboundedSender<Done>,
) {
    for (job, slot) in jobs {
        enqueue(done, job, unsent(), deadline, slot);
    }
}

fn unsent() -> CallResult {
    CallResult {
        outcome: Outcome::Retry { after: None },
        receipt: json!({ "error": "begin_dispatch unconfirmed; provider not called" }),
    }
}

//! The begin: `keyturn.begin_dispatch_many` for the jobs of a lease step,
//! inside the step's transaction, then its `COMMIT`; and only after that, a
//! provider call ([`super::call`]) for each job answered `dispatch`. A job
//! answered `dispatch = false` is never called: invalidated (the database
//! re-checked tool, grants, epoch and origin), or refused with its `55000`.
//!
//! One durable commit per step instead of two (`lease`, then the begin) is
//! safe because the rule that matters still holds: a row is committed
//! `executing` before its provider is called. Only the `leased` state is
//! never committed on its own, so anything failing before `COMMIT` (a
//! statement, the connection, the process) rolls back to rows still
//! `queued`, with no attempt counted and nothing called.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_postgres::Transaction;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::call::call_job;
use super::completion::enqueue;
use super::{job_span, Ctx, Done, Slot};
use crate::classify::Outcome;
use crate::config::LEASE_SAFETY_MARGIN;
use crate::db::{self, LeasedJob};
use crate::error::Error;
use crate::providers::{not_sent, CallResult};

/// Begins `jobs` in `tx` (all of `tenant`, when it names one), commits, and
/// starts a provider call for each job the database answered `dispatch`.
///
/// **A COMMIT whose outcome is unknown** (the connection broke, or the
/// answer did not come while the lease still had its margin left: keyturnd
/// fits this wait inside the lease rather than asking for a longer one) may have made every job `executing` or none
/// of them. Nothing is called, and `retry` is recorded for each job: if the
/// commit happened, that requeues the row (the attempt counted, having done
/// nothing); if it did not, the row is `queued` under no lease and the
/// database refuses it with `55000`, changing nothing. Either way the
/// provider was not called, so nothing can have happened twice. The jobs
/// handed back in the same transaction need nothing: committed or not, they
/// are `queued`.
pub(super) async fn begin_and_commit(
    ctx: &Arc<Ctx>,
    tracker: &TaskTracker,
    tx: Transaction<'_>,
    tenant: Option<&str>,
    jobs: Vec<(LeasedJob, Slot)>,
    deadline: Instant,
    done: &mpsc::UnboundedSender<Done>,
) -> Result<(), Error> {
    let answers = if jobs.is_empty() {
        Vec::new()
    } else {
        let pairs: Vec<(Uuid, Uuid)> = jobs
            .iter()
            .map(|(j, _)| (j.action_id, j.lease_id))
            .collect();
        db::begin_dispatch_many(tx.client(), tenant, &pairs).await?
    };
    // An answer later than this could no longer be followed by a `retry`
    // the database still takes: the sweep may get there first. So keyturnd
    // stops waiting for it while the lease has its margin left, and records
    // that it called nothing (issue 34).
    let commit_by = deadline
        .checked_sub(LEASE_SAFETY_MARGIN)
        .unwrap_or_else(Instant::now);
    let committed = match tokio::time::timeout_at(commit_by, db::commit(tx)).await {
        Ok(committed) => committed,
        Err(_) => Err(Error::DbTimeout(
            ctx.settings.lease.saturating_sub(LEASE_SAFETY_MARGIN),
        )),
    };
    if let Err(e) = committed {
        tracing::warn!(error = %e, jobs = jobs.len(), "lease and begin COMMIT unconfirmed; no provider is called, recording retry");
        for (job, slot) in jobs {
            enqueue(done, job, not_called(), deadline, slot);
        }
        return Err(e);
    }
    for (i, (job, slot)) in jobs.into_iter().enumerate() {
        let _span = job_span(&job).entered();
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
                // One answer per pair, in order; were one missing, its begin
                // would be as unconfirmed as an unanswered COMMIT.
                tracing::error!("begin_dispatch_many gave no answer for this job; the provider is not called, recording retry");
                enqueue(done, job, not_called(), deadline, slot);
            }
        }
    }
    Ok(())
}

fn not_called() -> CallResult {
    not_sent(
        Outcome::Retry { after: None },
        "begin_dispatch unconfirmed; provider not called",
    )
}

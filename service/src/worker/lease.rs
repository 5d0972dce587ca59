//! Leasing and hand-backs: the lease loop's one step. Takes every free slot,
//! asks `keyturn.lease` for that many jobs, and sends each one either back
//! (`complete 'retry'` before begin) or on to be begun — in one
//! `begin_dispatch_many` ([`super::begin`]) or, on the single-call path, in
//! its own [`run_job`] task.
//!
//! **Deadlines.** `keyturn.lease` does not return its expiry, so the worker
//! takes the instant *before* it sent the lease call plus the lease length:
//! the database's own `now()` is later, so the local deadline is never later
//! than the real one. Every call ends [`LEASE_SAFETY_MARGIN`] before it.
//!
//! **Unknown provider: fail closed.** `keyturn.lease` is given the names of
//! the providers configured here (`webhook` when `KEYTURN_WEBHOOK_URL` is
//! set, `smtp` when `KEYTURN_SMTP_URL` is), and the database leases only
//! actions whose tool names one of them. An action whose provider no running
//! keyturnd supports (say `carrier_pigeon`, or `smtp` with no SMTP URL
//! anywhere) is therefore never leased and never dispatched: it stays
//! `queued`, visible in `action_status`, until a keyturnd with that provider
//! starts, or someone cancels it (`end_session`, `cancel_origin`). Failing it
//! is not possible before dispatch under the contract, and would be wrong
//! anyway: the human approved it, and the fix is configuration. With no
//! provider configured at all, keyturnd leases nothing.
//!
//! As defence in depth (a database whose `lease` ignored the filter), a
//! leased job whose provider is not here is still never dispatched:
//! `begin_dispatch` is not called, the job is handed back with
//! `complete 'retry'` and a delay of [`UNKNOWN_PROVIDER_DELAY`] (no attempt
//! is counted before dispatch), an ERROR is logged and
//! `keyturn_handbacks_total{reason="unknown_provider"}` counts it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::begin::begin_batch;
use super::completion::Done;
use super::job::run_job;
use super::{lock, Ctx, UNKNOWN_PROVIDER_DELAY};
use crate::config::LEASE_SAFETY_MARGIN;
use crate::db::{self, LeasedJob};

/// Leases as many jobs as there are free slots and starts them. Returns
/// whether leasing is currently failing (to log the first failure loudly and
/// the rest quietly).
pub(super) async fn lease_batch(
    ctx: &Arc<Ctx>,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
    done: &mpsc::UnboundedSender<Done>,
    was_failing: bool,
) -> bool {
    let free = ctx.slots.available_permits();
    if free == 0 {
        return was_failing;
    }
    // `free` ≤ KEYTURN_WORKERS ≤ 1024 (validated), so both conversions hold.
    let (Ok(n_permits), Ok(max_jobs)) = (u32::try_from(free), i32::try_from(free)) else {
        return was_failing;
    };
    let Ok(mut permits) = ctx.slots.clone().try_acquire_many_owned(n_permits) else {
        return was_failing;
    };
    // Before the call: the database's lease starts later than this.
    let started = Instant::now();
    let leased = async {
        let client = ctx.pool.get().await?;
        db::lease(
            &client,
            &ctx.settings.worker_name,
            max_jobs,
            ctx.settings.lease,
            &ctx.provider_names,
        )
        .await
    }
    .await;
    let jobs = match leased {
        Ok(jobs) => {
            if was_failing {
                tracing::info!("leasing works again");
            }
            if !ctx.settings.listen_notify {
                ctx.health.set_db_ready(true);
            }
            jobs
        }
        Err(e) => {
            if !was_failing {
                tracing::warn!(error = %e, "keyturn.lease failed; will keep polling");
            } else {
                tracing::debug!(error = %e, "keyturn.lease failed again");
            }
            if !ctx.settings.listen_notify {
                ctx.health.set_db_ready(false);
            }
            return true;
        }
    };
    if jobs.is_empty() {
        return false;
    }
    ctx.metrics.lease_batch_size.observe(jobs.len() as f64);
    let deadline = started + ctx.settings.lease;
    let batch = ctx.batch.load(Ordering::Relaxed);
    let mut to_begin = Vec::with_capacity(jobs.len());
    for job in jobs {
        // `free` permits were taken and at most `free` jobs came back.
        let Some(permit) = permits.split(1) else {
            tracing::error!(action_id = %job.action_id, "more jobs than slots; leaving it to lapse");
            continue;
        };
        if !batch {
            tracker.spawn(run_job(
                ctx.clone(),
                job,
                deadline,
                permit,
                shutdown.clone(),
            ));
            continue;
        }
        let slot = Slot::new(ctx, permit, job.action_id);
        if let Some(reason) = handback_reason(ctx, &job, deadline, shutdown) {
            tracker.spawn(async move {
                let _slot = slot;
                let delay = (reason == "unknown_provider").then_some(UNKNOWN_PROVIDER_DELAY);
                hand_back(&_slot.ctx, &job, delay).await;
            });
            continue;
        }
        to_begin.push((job, slot));
    }
    if !to_begin.is_empty() {
        // Its own task, so the loop can lease again as soon as a slot frees.
        tracker.spawn(begin_batch(
            ctx.clone(),
            tracker.clone(),
            to_begin,
            deadline,
            done.clone(),
            shutdown.clone(),
        ));
    }
    false
}

/// A slot (one of KEYTURN_WORKERS) held by a job until its provider call has
/// ended (or it was not dispatched). Dropping it frees the slot and wakes the
/// lease loop; the job leaves the in-flight set unless its outcome was
/// queued for recording (the flusher removes it then).
pub(super) struct Slot {
    pub(super) ctx: Arc<Ctx>,
    action_id: Uuid,
    permit: Option<OwnedSemaphorePermit>,
    pub(super) queued: bool,
}

impl Slot {
    fn new(ctx: &Arc<Ctx>, permit: OwnedSemaphorePermit, action_id: Uuid) -> Self {
        lock(&ctx.inflight).insert(action_id);
        Slot {
            ctx: ctx.clone(),
            action_id,
            permit: Some(permit),
            queued: false,
        }
    }

    /// The bare permit, for [`run_job`] (which keeps its own bookkeeping).
    pub(super) fn into_permit(mut self) -> OwnedSemaphorePermit {
        lock(&self.ctx.inflight).remove(&self.action_id);
        self.queued = true;
        self.permit
            .take()
            .expect("a slot holds its permit until dropped")
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.queued {
            lock(&self.ctx.inflight).remove(&self.action_id);
        }
        self.ctx.wake.notify_one();
    }
}

/// Why a leased job must be handed back instead of begun, if it must (the
/// same checks, in the same order, as [`run_job`]); logs and counts it.
fn handback_reason(
    ctx: &Ctx,
    job: &LeasedJob,
    deadline: Instant,
    shutdown: &CancellationToken,
) -> Option<&'static str> {
    let span = tracing::info_span!("job", action_id = %job.action_id, tenant = %job.tenant, tool = %job.tool, provider = %job.provider, attempt = job.attempt);
    let _e = span.enter();
    let reason = if ctx.providers.get(&job.provider).is_none() {
        tracing::error!(
            configured = ?ctx.providers.names(),
            "no provider of this name is configured here; handing the job back undispatched (configure it, or cancel the action)"
        );
        "unknown_provider"
    } else if shutdown.is_cancelled() {
        "shutdown"
    } else if deadline.saturating_duration_since(Instant::now())
        < ctx.settings.call_timeout + LEASE_SAFETY_MARGIN
    {
        tracing::warn!("too little lease left for a full call; handing the job back");
        "lease_too_short"
    } else {
        return None;
    };
    ctx.metrics.handback(reason);
    Some(reason)
}

/// Hands a job back before `begin_dispatch`: `complete 'retry'` from
/// `leased` requeues it without counting an attempt. One try: if it fails,
/// the lease lapses and the sweep requeues the job the same way.
pub(super) async fn hand_back(ctx: &Ctx, job: &LeasedJob, delay: Option<Duration>) {
    let receipt = json!({});
    let result = async {
        let client = ctx.pool.get().await?;
        db::complete(
            &client,
            job.action_id,
            job.lease_id,
            "retry",
            &receipt,
            delay,
        )
        .await
    }
    .await;
    match result {
        Ok(status) => tracing::info!(%status, "handed back"),
        Err(e) => {
            tracing::warn!(error = %e, "hand-back not recorded; the lease will lapse and the sweep requeues the job")
        }
    }
}

//! Leasing and hand-backs: the lease loop's one step. Takes every free slot,
//! asks `keyturn.lease` for that many jobs, and sends each one either back
//! (`complete 'retry'` before begin) or on to be begun.
//!
//! **Batched path: lease and begin in one transaction.** While the database
//! has `begin_dispatch_many` (sql/061), one step is one transaction on one
//! pooled connection, in a task of its own ([`lease_and_begin`]):
//!
//! ```text
//!  BEGIN
//!    keyturn.lease(worker, free slots, lease, providers)
//!    per job, the hand-back checks (unknown provider, shutting down,
//!      too little lease left) → keyturn.complete(…, 'retry')   same transaction
//!    keyturn.begin_dispatch_many(the other jobs)
//!  COMMIT
//!    ── only after COMMIT succeeded ──
//!    a provider call for each job answered dispatch = true
//! ```
//!
//! One durable commit per batch instead of two (`lease`, then
//! `begin_dispatch_many`, each in autocommit). It is safe because the
//! contract's rule — `executing` is committed before any provider call —
//! still holds: no provider is called before `COMMIT` returned success.
//! Anything failing before that (a statement, the pool, the connection, a
//! timeout) drops the transaction, which rolls back: the leases never
//! existed, the rows stay `queued` with no attempt counted, no provider is
//! called, and the next poll leases them again. A `COMMIT` whose outcome is
//! unknown (the connection broke during it) is the unconfirmed
//! `begin_dispatch` case: no provider is called and `retry` is recorded for
//! every job that was to be begun (accepted only while the row is still
//! `executing` under that lease; the sweep handles the rest) — see
//! [`super::begin`]. The jobs handed back inside the transaction need
//! nothing then: committed or not, they are `queued`. The transaction runs
//! in a task on the tracker, so a shutdown never drops it between `COMMIT`
//! and the provider calls; the loop still awaits it (one lease step at a
//! time). Row locks taken by `lease` are held only until `COMMIT`, a few
//! round trips; other workers skip them (`SKIP LOCKED`) as before.
//!
//! A database without `begin_dispatch_many` (`42883`) aborts that
//! transaction, which rolls back (nothing ran, no lease exists); the process
//! switches to the single-call path and the next step leases the same jobs
//! again: `lease` in autocommit, then each job in its own [`run_job`] task
//! (`begin_dispatch` in autocommit, the provider call, `complete`).
//!
//! **Deadlines.** `keyturn.lease` does not return its expiry, so the worker
//! takes the instant *before* it sent the lease call (before `BEGIN` on the
//! batched path) plus the lease length: the database's own `now()` is later,
//! so the local deadline is never later than the real one. Every call ends
//! [`LEASE_SAFETY_MARGIN`] before it.
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
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::begin::{dispatch_begun, unconfirmed};
use super::completion::Done;
use super::job::run_job;
use super::{lock, Ctx, UNKNOWN_PROVIDER_DELAY};
use crate::config::LEASE_SAFETY_MARGIN;
use crate::db::{self, LeasedJob};
use crate::error::Error;

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
    let Ok(permits) = ctx.slots.clone().try_acquire_many_owned(n_permits) else {
        return was_failing;
    };
    let result = if ctx.batch.load(Ordering::Relaxed) {
        // Its own task: cancelling this await (shutdown) must never drop the
        // transaction between COMMIT and the provider calls. The loop still
        // waits for it, one lease step at a time.
        let step = tracker.spawn(lease_and_begin(
            ctx.clone(),
            tracker.clone(),
            permits,
            max_jobs,
            done.clone(),
            shutdown.clone(),
        ));
        match step.await {
            Ok(result) => result,
            Err(e) => {
                tracing::error!(error = %e, "the lease step panicked; its transaction rolled back unless it had committed");
                return true;
            }
        }
    } else {
        lease_single(ctx, tracker, shutdown, permits, max_jobs).await
    };
    match result {
        Ok(()) => {
            if was_failing {
                tracing::info!("leasing works again");
            }
            if !ctx.settings.listen_notify {
                ctx.health.set_db_ready(true);
            }
            false
        }
        Err(e) => {
            if !was_failing {
                tracing::warn!(error = %e, "leasing failed (nothing was dispatched); will keep polling");
            } else {
                tracing::debug!(error = %e, "leasing failed again");
            }
            if !ctx.settings.listen_notify {
                ctx.health.set_db_ready(false);
            }
            true
        }
    }
}

/// The single-call path: `keyturn.lease` in autocommit, then each job in its
/// own [`run_job`] task.
async fn lease_single(
    ctx: &Arc<Ctx>,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
    mut permits: OwnedSemaphorePermit,
    max_jobs: i32,
) -> Result<(), Error> {
    // Before the call: the database's lease starts later than this.
    let started = Instant::now();
    let jobs = {
        let client = ctx.pool.get().await?;
        db::lease(
            &client,
            &ctx.settings.worker_name,
            max_jobs,
            ctx.settings.lease,
            &ctx.provider_names,
        )
        .await?
    };
    if jobs.is_empty() {
        return Ok(());
    }
    ctx.metrics.lease_batch_size.observe(jobs.len() as f64);
    let deadline = started + ctx.settings.lease;
    for job in jobs {
        // `free` permits were taken and at most `free` jobs came back.
        let Some(permit) = permits.split(1) else {
            tracing::error!(action_id = %job.action_id, "more jobs than slots; leaving it to lapse");
            continue;
        };
        tracker.spawn(run_job(
            ctx.clone(),
            job,
            deadline,
            permit,
            shutdown.clone(),
        ));
    }
    Ok(())
}

/// The batched path: `lease`, the hand-backs and `begin_dispatch_many` in
/// one transaction, then, only after its `COMMIT`, the provider calls (see
/// the module docs). `Err`: nothing was dispatched (rolled back, or the
/// `COMMIT` is unconfirmed and `retry` is queued for each job).
async fn lease_and_begin(
    ctx: Arc<Ctx>,
    tracker: TaskTracker,
    mut permits: OwnedSemaphorePermit,
    max_jobs: i32,
    done: mpsc::UnboundedSender<Done>,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    // Before BEGIN, so before the lease call: the database's lease starts
    // later than this.
    let started = Instant::now();
    let mut client = ctx.pool.get().await?;
    // From here until COMMIT, any early return drops `tx`: rolled back.
    let tx = db::transaction(&mut client).await?;
    let jobs = db::lease(
        tx.client(),
        &ctx.settings.worker_name,
        max_jobs,
        ctx.settings.lease,
        &ctx.provider_names,
    )
    .await?;
    if jobs.is_empty() {
        // Nothing was changed: dropping it queues a ROLLBACK, no wait.
        drop(tx);
        return Ok(());
    }
    ctx.metrics.lease_batch_size.observe(jobs.len() as f64);
    let deadline = started + ctx.settings.lease;
    let mut handed_back = Vec::new();
    let mut to_begin = Vec::with_capacity(jobs.len());
    for job in jobs {
        // `free` permits were taken and at most `free` jobs came back.
        let Some(permit) = permits.split(1) else {
            tracing::error!(action_id = %job.action_id, "more jobs than slots; leaving it to lapse");
            continue;
        };
        let slot = Slot::new(&ctx, permit, job.action_id);
        match handback_reason(&ctx, &job, deadline, &shutdown) {
            Some(reason) => handed_back.push((job, slot, reason)),
            None => to_begin.push((job, slot)),
        }
    }
    // Hand-backs, in the same transaction: `complete 'retry'` from `leased`
    // requeues without counting an attempt. If one fails, the whole
    // transaction rolls back, which hands every job back the same way.
    let receipt = json!({});
    let mut statuses = Vec::with_capacity(handed_back.len());
    for (job, _, reason) in &handed_back {
        let delay = (*reason == "unknown_provider").then_some(UNKNOWN_PROVIDER_DELAY);
        statuses.push(
            db::complete(
                tx.client(),
                job.action_id,
                job.lease_id,
                "retry",
                &receipt,
                delay,
            )
            .await?,
        );
    }
    let answers = if to_begin.is_empty() {
        Vec::new()
    } else {
        let pairs: Vec<(Uuid, Uuid)> = to_begin
            .iter()
            .map(|(j, _)| (j.action_id, j.lease_id))
            .collect();
        match db::begin_dispatch_many(tx.client(), &pairs).await {
            Ok(answers) => answers,
            Err(e) if e.sqlstate() == Some(&SqlState::UNDEFINED_FUNCTION) => {
                // An older pg_keyturn without sql/061. The transaction is
                // aborted: roll it back (no lease ever existed) and lease
                // the same jobs again with single calls from now on.
                drop(tx);
                if ctx.batch.swap(false, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "keyturn.begin_dispatch_many is not installed; using single begin_dispatch/complete calls");
                }
                return Ok(());
            }
            Err(e) => return Err(e),
        }
    };
    if let Err(e) = db::commit(tx).await {
        // It may or may not have committed: call nothing; `retry` for each
        // job that was to be begun (see `begin.rs`). Do not reuse this
        // connection.
        drop(deadpool_postgres::Object::take(client));
        tracing::warn!(error = %e, jobs = to_begin.len(), handed_back = handed_back.len(), "lease/begin_dispatch_many COMMIT unconfirmed; no provider is called, recording retry");
        unconfirmed(to_begin, deadline, &done);
        return Err(e);
    }
    // Back to the pool before the calls start.
    drop(client);
    for ((job, slot, _), status) in handed_back.into_iter().zip(statuses) {
        let span = tracing::info_span!("job", action_id = %job.action_id, tenant = %job.tenant, tool = %job.tool, provider = %job.provider, attempt = job.attempt);
        let _e = span.enter();
        tracing::info!(%status, "handed back");
        drop(slot);
    }
    dispatch_begun(&ctx, &tracker, to_begin, &answers, deadline, &done);
    Ok(())
}

/// A slot (one of KEYTURN_WORKERS) held by a job until its provider call has
/// ended (or it was not dispatched). Dropping it frees the slot and wakes the
/// lease loop; the job leaves the in-flight set unless its outcome was
/// queued for recording (the flusher removes it then).
pub(super) struct Slot {
    pub(super) ctx: Arc<Ctx>,
    action_id: Uuid,
    _permit: OwnedSemaphorePermit,
    pub(super) queued: bool,
}

impl Slot {
    fn new(ctx: &Arc<Ctx>, permit: OwnedSemaphorePermit, action_id: Uuid) -> Self {
        lock(&ctx.inflight).insert(action_id);
        Slot {
            ctx: ctx.clone(),
            action_id,
            _permit: permit,
            queued: false,
        }
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

//! The dispatch loop. keyturnd never decides whether an action may run:
//! it only carries out what the database has already moved forward, in the
//! order the contract fixes (CONTRACT.md §4 "Dispatcher", §7).
//!
//! ```text
//!  wake (NOTIFY keyturn_dispatch | poll every KEYTURN_POLL_MS | a job ended)
//!    └─ keyturn.lease(worker, n = free slots, lease, providers configured here)
//!         └─ per job, in its own task (≤ KEYTURN_WORKERS at once):
//!              provider unknown here?     → complete 'retry' (defence only; hand back, delayed)
//!              shutting down?             → complete 'retry' (hand back)
//!              lease left < call + margin → complete 'retry' (hand back)
//!              keyturn.begin_dispatch     (autocommit) false → stop: invalidated
//!              provider call, bounded by the lease left, Idempotency-Key
//!              keyturn.complete(outcome)  retried with backoff if the DB is away
//! ```
//!
//! **Batched path (sql/061, used whenever the database has it).** The checks
//! above run per job right after the lease; the jobs left get one
//! `keyturn.begin_dispatch_many` (one commit for the batch, in its own task so
//! the loop keeps leasing), and each job answered `dispatch` gets a provider
//! call task holding its slot. An element answered `dispatch = false` is never
//! called (invalidated, or refused with its `55000`). Outcomes go to a
//! completion queue that one task flushes with `keyturn.complete_many` every
//! [`FLUSH_EVERY`] or [`FLUSH_MAX`] outcomes (at once on shutdown), retrying
//! the same outcomes exactly as `complete` is retried below. The slot is
//! freed when the call ends; the job stays in the in-flight set until its
//! outcome is recorded, and shutdown waits for the queue to drain. A database
//! without the batch functions (`42883`) switches the process to the
//! single-call path above; nothing ran in that case.
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
//!
//! **A lost database never becomes a guessed outcome.** If `complete` cannot
//! be recorded, the worker retries recording the *same* outcome with backoff
//! until one lease length past the lease deadline (the database accepts a
//! known outcome past expiry until the sweep runs). If it still cannot, it
//! logs the outcome at ERROR for the operator; the sweep will call the action
//! `uncertain`. If `complete` answers `55000` (already `uncertain`), the
//! observed outcome is logged at WARN for the operator.
//!
//! **begin_dispatch that may or may not have committed** (the connection
//! broke around it): the provider is *not* called, and the worker records
//! `retry`, which is right in both cases — from `leased` it requeues without
//! counting an attempt, from `executing` it requeues counting one that did
//! nothing.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_postgres::Pool;
use futures_util::StreamExt;
use serde_json::json;
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::classify::Outcome;
use crate::config::{Config, Secret, LEASE_SAFETY_MARGIN};
use crate::db::{self, LeasedJob};
use crate::error::Error;
use crate::http::Health;
use crate::metrics::Metrics;
use crate::providers::{CallResult, Providers};

/// The channel keyturn's `approve` notifies.
pub const CHANNEL: &str = "keyturn_dispatch";

/// Delay asked for when handing back a job whose provider is not here.
pub const UNKNOWN_PROVIDER_DELAY: Duration = Duration::from_secs(60);

/// Extra time a provider gets past its own bound before the worker stops
/// waiting and records `unknown` (a provider that ignores its timeout).
const PROVIDER_GRACE: Duration = Duration::from_millis(500);

/// First and longest pause between retries of a database call.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Cap of the LISTEN reconnect backoff: one connection, cheap to retry,
/// and readiness waits on it.
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// The completion queue is flushed with one `keyturn.complete_many` this long
/// after its first outcome arrived, or as soon as it holds [`FLUSH_MAX`]
/// outcomes, or at once while shutting down.
const FLUSH_EVERY: Duration = Duration::from_millis(3);
/// Outcomes per `keyturn.complete_many` at most.
const FLUSH_MAX: usize = 64;

/// What the dispatch loop needs from the configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The `worker` argument of `keyturn.lease`.
    pub worker_name: String,
    /// Lease length.
    pub lease: Duration,
    /// Upper bound of one provider call.
    pub call_timeout: Duration,
    /// Poll period.
    pub poll: Duration,
    /// Sweep period.
    pub sweep_every: Duration,
    /// Calls in flight at most.
    pub workers: usize,
    /// Whether to `LISTEN`.
    pub listen_notify: bool,
    /// How long shutdown waits for calls in flight.
    pub drain: Duration,
    /// Connection string of the `LISTEN` connection.
    pub database_url: Secret,
}

impl Settings {
    /// Takes the dispatch settings from a validated [`Config`].
    pub fn from_config(config: &Config) -> Self {
        Settings {
            worker_name: config.worker_name(),
            lease: config.lease(),
            call_timeout: config.call_timeout(),
            poll: Duration::from_millis(config.poll_ms),
            sweep_every: Duration::from_secs(config.sweep_seconds),
            workers: config.workers,
            listen_notify: config.listen_notify,
            drain: Duration::from_secs(config.shutdown_seconds),
            database_url: config.database_url.clone(),
        }
    }
}

/// Shared by the loop and its job tasks.
struct Ctx {
    pool: Pool,
    providers: Providers,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    settings: Settings,
    wake: Notify,
    slots: Arc<Semaphore>,
    inflight: Mutex<HashSet<Uuid>>,
    /// The `providers` argument of `keyturn.lease`: what this process can
    /// carry out.
    provider_names: Vec<&'static str>,
    /// Whether the database has `begin_dispatch_many` / `complete_many`
    /// (sql/061). Cleared on `42883`; then every job takes the single-call
    /// path.
    batch: AtomicBool,
}

/// The dispatcher: the lease loop, the `LISTEN` connection and the sweeper.
pub struct Dispatcher {
    ctx: Arc<Ctx>,
}

impl Dispatcher {
    /// Wires a dispatcher; nothing runs until [`run`](Self::run).
    pub fn new(
        pool: Pool,
        providers: Providers,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
        settings: Settings,
    ) -> Self {
        let slots = Arc::new(Semaphore::new(settings.workers));
        let provider_names = providers.names();
        Dispatcher {
            ctx: Arc::new(Ctx {
                pool,
                providers,
                provider_names,
                metrics,
                health,
                settings,
                wake: Notify::new(),
                slots,
                inflight: Mutex::new(HashSet::new()),
                batch: AtomicBool::new(true),
            }),
        }
    }

    /// Dispatches until `shutdown` fires, then stops leasing, lets job tasks
    /// hand back what they have not begun, waits up to the drain time for
    /// calls in flight to be recorded, and returns.
    pub async fn run(self, shutdown: CancellationToken) {
        let ctx = self.ctx;
        let tracker = TaskTracker::new();
        let listener = ctx
            .settings
            .listen_notify
            .then(|| tokio::spawn(listen_loop(ctx.clone(), shutdown.clone())));
        let sweeper = tokio::spawn(sweep_loop(ctx.clone(), shutdown.clone()));
        // The completion queue: job tasks send observed outcomes, one task
        // records them in batches. It ends once every sender (the one here,
        // and each job task's) is gone and the queue is empty.
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let flusher = tokio::spawn(flush_loop(ctx.clone(), done_rx, shutdown.clone()));

        let mut lease_failing = false;
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = ctx.wake.notified() => {}
                _ = tokio::time::sleep(ctx.settings.poll) => {}
            }
            // Cancellable: a lease that committed but whose answer is
            // dropped here simply lapses back to `queued`, no attempt counted.
            lease_failing = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                failing = lease_batch(&ctx, &tracker, &shutdown, &done_tx, lease_failing) => failing,
            };
        }

        tracing::info!(
            in_flight = ctx.settings.workers - ctx.slots.available_permits(),
            "stopped leasing; waiting for calls in flight"
        );
        tracker.close();
        drop(done_tx);
        let drained = async {
            tracker.wait().await;
            // Every job task has ended, so every sender is gone: the flusher
            // records what is queued (at once, shutdown is set) and returns.
            let _ = flusher.await;
        };
        if tokio::time::timeout(ctx.settings.drain, drained)
            .await
            .is_err()
        {
            let left: Vec<Uuid> = lock(&ctx.inflight).iter().copied().collect();
            for action_id in &left {
                tracing::error!(%action_id, "still executing at exit: its outcome is not recorded; the sweep will mark it uncertain for an operator");
            }
        }
        for task in [Some(sweeper), listener].into_iter().flatten() {
            // They stop on the same token; their errors were logged.
            let _ = task.await;
        }
        tracing::info!("dispatcher stopped");
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere must not stop the bookkeeping.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Leases as many jobs as there are free slots and starts them. Returns
/// whether leasing is currently failing (to log the first failure loudly and
/// the rest quietly).
async fn lease_batch(
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
struct Slot {
    ctx: Arc<Ctx>,
    action_id: Uuid,
    permit: Option<OwnedSemaphorePermit>,
    queued: bool,
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
    fn into_permit(mut self) -> OwnedSemaphorePermit {
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

/// An observed outcome waiting in the completion queue.
struct Done {
    job: LeasedJob,
    result: CallResult,
    deadline: Instant,
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

/// One `keyturn.begin_dispatch_many` (one commit) for the jobs of a lease
/// batch, then a provider-call task for each job it answered `dispatch`.
async fn begin_batch(
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
            // right either way (see the module docs).
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

/// Queues an observed outcome for `complete_many`; the slot is freed (the
/// job stays in flight until the flusher has recorded it).
fn enqueue(
    done: &mpsc::UnboundedSender<Done>,
    job: LeasedJob,
    result: CallResult,
    deadline: Instant,
    mut slot: Slot,
) {
    slot.queued = true;
    if let Err(mpsc::error::SendError(d)) = done.send(Done {
        job,
        result,
        deadline,
    }) {
        // The flusher is gone (cannot happen before every sender is); record
        // it here rather than lose it.
        slot.queued = false;
        let ctx = slot.ctx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            record(&ctx, &d.job, &d.result, d.deadline).await;
        });
    }
}

/// The provider call of a begun job; its outcome goes to the completion
/// queue.
#[tracing::instrument(
    name = "job",
    skip_all,
    fields(action_id = %job.action_id, tenant = %job.tenant, tool = %job.tool, provider = %job.provider, attempt = job.attempt)
)]
async fn call_job(
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
async fn run_job(
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

/// Hands a job back before `begin_dispatch`: `complete 'retry'` from
/// `leased` requeues it without counting an attempt. One try: if it fails,
/// the lease lapses and the sweep requeues the job the same way.
async fn hand_back(ctx: &Ctx, job: &LeasedJob, delay: Option<Duration>) {
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

/// Records an observed outcome with `keyturn.complete`, retrying the same
/// outcome while the database is unreachable (see the module docs).
async fn record(ctx: &Ctx, job: &LeasedJob, result: &CallResult, deadline: Instant) {
    let outcome = result.outcome.word();
    let give_up_at = deadline + ctx.settings.lease;
    let mut backoff = BACKOFF_MIN;
    let mut tries: u32 = 0;
    loop {
        tries += 1;
        let recorded = async {
            let client = ctx.pool.get().await?;
            db::complete(
                &client,
                job.action_id,
                job.lease_id,
                outcome,
                &result.receipt,
                result.outcome.retry_after(),
            )
            .await
        }
        .await;
        let err = match recorded {
            Ok(status) => {
                tracing::info!(outcome, %status, tries, "outcome recorded");
                return;
            }
            Err(e) => e,
        };
        if err.is_object_not_in_state() {
            ctx.metrics.unrecorded.inc();
            tracing::warn!(
                observed_outcome = outcome,
                receipt = %result.receipt,
                error = %err,
                "complete refused: the action already left executing (likely swept to uncertain); operator: reconcile it with this observed outcome"
            );
            return;
        }
        if !err.is_transient() || Instant::now() + backoff > give_up_at {
            ctx.metrics.unrecorded.inc();
            tracing::error!(
                observed_outcome = outcome,
                receipt = %result.receipt,
                error = %err,
                tries,
                "COULD NOT RECORD the provider outcome; the sweep will mark the action uncertain; operator: reconcile it with this observed outcome"
            );
            return;
        }
        tracing::warn!(observed_outcome = outcome, error = %err, tries, "could not record the outcome yet; retrying the same outcome");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Drains the completion queue: waits for an outcome, gathers more for up to
/// [`FLUSH_EVERY`] (none while shutting down) or [`FLUSH_MAX`], records them
/// with one `keyturn.complete_many`, repeats. Returns once the queue is
/// closed and empty.
async fn flush_loop(
    ctx: Arc<Ctx>,
    mut rx: mpsc::UnboundedReceiver<Done>,
    shutdown: CancellationToken,
) {
    let mut buf: Vec<Done> = Vec::with_capacity(FLUSH_MAX);
    loop {
        match rx.recv().await {
            Some(d) => buf.push(d),
            None => break,
        }
        let until = Instant::now() + FLUSH_EVERY;
        while buf.len() < FLUSH_MAX {
            // What is already queued joins this flush either way.
            match rx.try_recv() {
                Ok(d) => {
                    buf.push(d);
                    continue;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            if shutdown.is_cancelled() {
                break;
            }
            tokio::select! {
                biased;
                d = rx.recv() => match d {
                    Some(d) => buf.push(d),
                    None => break,
                },
                _ = tokio::time::sleep_until(until) => break,
                _ = shutdown.cancelled() => {}
            }
        }
        flush(&ctx, std::mem::take(&mut buf)).await;
    }
}

/// Records a batch of outcomes with `keyturn.complete_many`, retrying the
/// same outcomes while the database is unreachable, exactly as [`record`]
/// does for one: each outcome until one lease length past its own lease
/// deadline, then logged at ERROR for the operator; a `55000` answer (already
/// `uncertain`) is logged at WARN. A batch the database refuses as a whole
/// for its content (not transient) is recorded one by one with [`record`].
async fn flush(ctx: &Ctx, mut items: Vec<Done>) {
    let mut backoff = BACKOFF_MIN;
    let mut tries: u32 = 0;
    while !items.is_empty() {
        tries += 1;
        if !ctx.batch.load(Ordering::Relaxed) {
            record_each(ctx, items).await;
            return;
        }
        let recorded = async {
            let client = ctx.pool.get().await?;
            let batch: Vec<db::Completion<'_>> = items
                .iter()
                .map(|d| db::Completion {
                    action_id: d.job.action_id,
                    lease_id: d.job.lease_id,
                    outcome: d.result.outcome.word(),
                    receipt: &d.result.receipt,
                    retry_after: d.result.outcome.retry_after(),
                })
                .collect();
            db::complete_many(&client, &batch).await
        }
        .await;
        let err = match recorded {
            Ok(answers) => {
                let mut unanswered = Vec::new();
                for (i, d) in items.into_iter().enumerate() {
                    match answers.get(i).filter(|a| a.action_id == d.job.action_id) {
                        Some(a) => {
                            log_recorded(ctx, &d, a, tries);
                            lock(&ctx.inflight).remove(&d.job.action_id);
                        }
                        None => unanswered.push(d),
                    }
                }
                if !unanswered.is_empty() {
                    tracing::error!(
                        count = unanswered.len(),
                        "complete_many gave no answer for some outcomes; recording them one by one"
                    );
                    record_each(ctx, unanswered).await;
                }
                return;
            }
            Err(e) => e,
        };
        if err.sqlstate() == Some(&SqlState::UNDEFINED_FUNCTION) {
            if ctx.batch.swap(false, Ordering::Relaxed) {
                tracing::warn!(error = %err, "keyturn.complete_many is not installed; using single complete calls");
            }
            continue;
        }
        if !err.is_transient() {
            tracing::warn!(error = %err, count = items.len(), "complete_many refused the batch; recording its outcomes one by one");
            record_each(ctx, items).await;
            return;
        }
        let now = Instant::now();
        items.retain(|d| {
            if now + backoff > d.deadline + ctx.settings.lease {
                ctx.metrics.unrecorded.inc();
                tracing::error!(
                    action_id = %d.job.action_id,
                    observed_outcome = d.result.outcome.word(),
                    receipt = %d.result.receipt,
                    error = %err,
                    tries,
                    "COULD NOT RECORD the provider outcome; the sweep will mark the action uncertain; operator: reconcile it with this observed outcome"
                );
                lock(&ctx.inflight).remove(&d.job.action_id);
                false
            } else {
                true
            }
        });
        if items.is_empty() {
            return;
        }
        tracing::warn!(error = %err, count = items.len(), tries, "could not record outcomes yet; retrying the same outcomes");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// One answer of `complete_many`, logged as [`record`] logs one `complete`.
fn log_recorded(ctx: &Ctx, d: &Done, a: &db::CompleteAnswer, tries: u32) {
    let outcome = d.result.outcome.word();
    let job = &d.job;
    let span = tracing::info_span!("job", action_id = %job.action_id, tenant = %job.tenant, tool = %job.tool, provider = %job.provider, attempt = job.attempt);
    let _e = span.enter();
    match (&a.status, a.sqlstate()) {
        (Some(status), None) => tracing::info!(outcome, %status, tries, "outcome recorded"),
        (_, Some("55000")) => {
            ctx.metrics.unrecorded.inc();
            tracing::warn!(
                observed_outcome = outcome,
                receipt = %d.result.receipt,
                error = a.error.as_deref().unwrap_or(""),
                "complete refused: the action already left executing (likely swept to uncertain); operator: reconcile it with this observed outcome"
            );
        }
        _ => {
            ctx.metrics.unrecorded.inc();
            tracing::error!(
                observed_outcome = outcome,
                receipt = %d.result.receipt,
                error = a.error.as_deref().unwrap_or("no status"),
                tries,
                "COULD NOT RECORD the provider outcome; the sweep will mark the action uncertain; operator: reconcile it with this observed outcome"
            );
        }
    }
}

/// The single-call path for queued outcomes, concurrently.
async fn record_each(ctx: &Ctx, items: Vec<Done>) {
    futures_util::future::join_all(items.iter().map(|d| async move {
        let span = tracing::info_span!("job", action_id = %d.job.action_id, tenant = %d.job.tenant, tool = %d.job.tool, provider = %d.job.provider, attempt = d.job.attempt);
        tracing::Instrument::instrument(record(ctx, &d.job, &d.result, d.deadline), span).await;
        lock(&ctx.inflight).remove(&d.job.action_id);
    }))
    .await;
}

/// Keeps one connection in `LISTEN keyturn_dispatch`, reconnecting with
/// backoff, and drives readiness from it.
async fn listen_loop(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let mut backoff = BACKOFF_MIN;
    let mut connected_before = false;
    let mut failing_logged = false;
    loop {
        if shutdown.is_cancelled() {
            break;
        }
        // Cancellable, so a database that does not answer cannot hold up
        // shutdown; dropping the future drops (closes) the connection.
        let ended = tokio::select! {
            _ = shutdown.cancelled() => Ok(()),
            ended = listen_once(&ctx, &shutdown, &mut connected_before) => ended,
        };
        // Still marked ready: the connection was up, so this is a fresh loss.
        let was_up = ctx.health.db_ready();
        ctx.health.set_db_ready(false);
        match ended {
            Ok(()) => break,
            Err(e) if was_up => {
                backoff = BACKOFF_MIN;
                failing_logged = false;
                tracing::warn!(error = %e, "LISTEN connection lost; reconnecting (polling continues)");
            }
            Err(e) => {
                if failing_logged {
                    tracing::debug!(error = %e, "LISTEN connection still unavailable");
                } else {
                    tracing::warn!(error = %e, "LISTEN connection unavailable; polling continues, reconnecting with backoff");
                    failing_logged = true;
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RECONNECT_MAX);
    }
}

/// One `LISTEN` connection's life: connect, listen, forward notifications
/// until the connection ends (an error) or shutdown (`Ok`).
async fn listen_once(
    ctx: &Arc<Ctx>,
    shutdown: &CancellationToken,
    connected_before: &mut bool,
) -> Result<(), Error> {
    let pg = db::pg_config(ctx.settings.database_url.expose())?;
    let (client, mut connection) =
        tokio::time::timeout(db::STATEMENT_TIMEOUT, pg.connect(tokio_postgres::NoTls))
            .await
            .map_err(|_| Error::DbTimeout(db::STATEMENT_TIMEOUT))??;
    // The connection has to be polled for anything to happen on it, the
    // LISTEN itself included; notifications arrive through the same poll.
    let notify_ctx = ctx.clone();
    let mut driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            if let AsyncMessage::Notification(n) = message? {
                tracing::debug!(
                    channel = n.channel(),
                    action_id = n.payload(),
                    "woken by notification"
                );
                notify_ctx.wake.notify_one();
            }
        }
        Ok::<(), tokio_postgres::Error>(())
    });
    let listen_sql = format!("LISTEN {CHANNEL}");
    match tokio::time::timeout(db::STATEMENT_TIMEOUT, client.batch_execute(&listen_sql)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            driver.abort();
            return Err(e.into());
        }
        Err(_) => {
            driver.abort();
            return Err(Error::DbTimeout(db::STATEMENT_TIMEOUT));
        }
    }
    if *connected_before {
        ctx.metrics.reconnect("listen");
        tracing::info!("LISTEN connection re-established");
    } else {
        tracing::info!(channel = CHANNEL, "listening");
    }
    *connected_before = true;
    ctx.health.set_db_ready(true);
    // Approvals notified while nobody listened are caught up right away.
    ctx.wake.notify_one();

    let ended = tokio::select! {
        _ = shutdown.cancelled() => {
            driver.abort();
            return Ok(());
        }
        ended = &mut driver => ended,
    };
    // Kept alive until here: dropping the client would close the connection.
    drop(client);
    let closed = || {
        Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "LISTEN connection closed",
        ))
    };
    match ended {
        Ok(Ok(())) | Err(_) => Err(closed()),
        Ok(Err(e)) => Err(e.into()),
    }
}

/// Runs `keyturn.sweep()` every sweep period and refreshes the uncertain
/// gauge.
async fn sweep_loop(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(ctx.settings.sweep_every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    let mut gauge_enabled = true;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let swept = tokio::select! {
            _ = shutdown.cancelled() => break,
            swept = async {
                let client = ctx.pool.get().await?;
                db::sweep(&client).await
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
        if gauge_enabled {
            let counted = async {
                let client = ctx.pool.get().await?;
                db::uncertain_count(&client).await
            }
            .await;
            match counted {
                Ok(n) => {
                    ctx.metrics.uncertain.set(n);
                }
                Err(e)
                    if e.sqlstate()
                        == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) =>
                {
                    gauge_enabled = false;
                    tracing::info!(
                        "this role lacks keyturn_operator; the keyturn_uncertain gauge is off"
                    );
                }
                Err(e) => tracing::debug!(error = %e, "could not count uncertain actions"),
            }
        }
    }
}

//! The dispatch loop. keyturnd never decides whether an action may run: it
//! carries out what the database has already moved forward.
//!
//! One lease step, each stage in its own file and each file importing only
//! the stages after it (and this one):
//!
//! ```text
//!  wake (NOTIFY keyturn_dispatch | poll every KEYTURN_POLL_MS | a slot freed)
//!    linger         while more than half the slots are busy: up to KEYTURN_LEASE_LINGER_MS for more to free
//!    lease.rs       BEGIN; keyturn.lease(free slots); hand-backs as complete 'retry'
//!                   (by tenant: keyturn.tenants_due, then this and the begin once per tenant)
//!    begin.rs       keyturn.begin_dispatch_many; COMMIT; only then, per job answered dispatch:
//!    call.rs        the provider call, bounded by the lease left
//!    completion.rs  the outcome journaled (one sync per group), then recorded with keyturn.complete_many
//! ```
//!
//! **Steps in flight.** Up to `KEYTURN_LEASE_STEPS` steps (default 2) run at
//! once, each in a task of its own: a wake-up while a step is still waiting
//! on its round trips starts the next, which leases the slots freed since
//! (a step frees the slots it leased no job for as soon as its lease is
//! answered). Under load the slots free one by one while a step runs, and
//! with one step at a time they would wait for it to end. Two steps never
//! lease the same job (`keyturn.lease` skips rows another transaction has
//! locked). A step that finds no slot free has spent a wake-up whose
//! approval the running step's lease may not have seen: the loop is woken
//! again when that step gives its unused slots back.
//!
//! Beside the step: `listen.rs` (the `LISTEN` connection: wake-ups and
//! readiness; by tenant, one more on every other node), `heartbeat.rs`
//! (whether notifications still arrive on it), `sweeper.rs`
//! (`keyturn.sweep()` on a timer) and `replay.rs` (at start, before anything
//! else: the outcomes an earlier process left in the journal, recorded).
//!
//! **By tenant.** Once keyturn's tables are distributed by tenant (Citus),
//! every call must name its tenant so that Citus runs it whole on the
//! tenant's worker. keyturnd asks the database which way it is
//! (`keyturn.dispatch_by_tenant()`, at start and after a lease step fails)
//! and [`Ctx::route`] gives each call its tenant, or none.
//!
//! This file holds the public surface ([`Dispatcher`], [`Settings`]), what
//! the stages share ([`Ctx`], [`Slot`], [`Done`]), and the loop with its
//! shutdown drain.

mod begin;
mod call;
mod completion;
mod heartbeat;
mod lease;
mod listen;
mod replay;
mod sweeper;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use self::completion::{flush_loop, journal_loop};
use self::lease::{lease_step, linger, HandBacks, Step};
use self::listen::{listen_loop, node_listen_loop};
use self::sweeper::sweep_loop;
use crate::config::{Config, Secret};
use crate::db::{self, LeasedJob};
use crate::error::Error;
use crate::journal::format::Entry;
use crate::journal::Journal;
use crate::metrics::Metrics;
use crate::providers::{CallResult, Providers};
use crate::state::Health;

/// The channel keyturn's `approve` notifies.
pub const CHANNEL: &str = "keyturn_dispatch";

/// Delay asked for when handing back a job whose provider is not here.
pub const UNKNOWN_PROVIDER_DELAY: Duration = Duration::from_secs(60);

/// First and longest pause between retries of a database call.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

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
    /// Longest wait for busy slots to free before a lease.
    pub linger: Duration,
    /// Lease steps in flight at most.
    pub lease_steps: usize,
    /// Sweep period.
    pub sweep_every: Duration,
    /// Calls in flight at most.
    pub workers: usize,
    /// Whether to `LISTEN`.
    pub listen_notify: bool,
    /// How long shutdown waits for calls in flight.
    pub drain: Duration,
    /// Connection string of the `LISTEN` connection
    /// (`KEYTURN_LISTEN_DATABASE_URL`, else `DATABASE_URL`).
    pub listen_database_url: Secret,
    /// Period of the heartbeat that checks notifications arrive; `None`: off.
    pub notify_heartbeat: Option<Duration>,
}

impl Settings {
    /// Takes the dispatch settings from a validated [`Config`].
    pub fn from_config(config: &Config) -> Self {
        Settings {
            worker_name: config.worker_name(),
            lease: config.lease(),
            call_timeout: config.call_timeout(),
            poll: Duration::from_millis(config.poll_ms),
            linger: Duration::from_millis(config.lease_linger_ms),
            lease_steps: config.lease_steps,
            sweep_every: Duration::from_secs(config.sweep_seconds),
            workers: config.workers,
            listen_notify: config.listen_notify,
            drain: Duration::from_secs(config.shutdown_seconds),
            listen_database_url: config.listen_url(),
            notify_heartbeat: config.notify_heartbeat(),
        }
    }
}

/// Shared by the loop and every stage.
struct Ctx {
    pool: Pool,
    providers: Providers,
    /// The `providers` argument of `keyturn.lease`: what this process can
    /// carry out.
    provider_names: Vec<&'static str>,
    /// The same without the notification channels: what a lease asks for
    /// once notifications hold their share of the slots ([`Ctx::lease_providers`]).
    effect_providers: Vec<&'static str>,
    /// Slots held by notifications.
    notifying: AtomicUsize,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    settings: Settings,
    wake: Notify,
    /// A step found no slot free: the next step to give slots back wakes
    /// the loop (lease.rs, `Unleased`).
    wake_owed: AtomicBool,
    slots: Arc<Semaphore>,
    inflight: Mutex<HashSet<Uuid>>,
    handbacks: Mutex<HandBacks>,
    journal: Arc<Journal>,
    /// Held by the flusher while it records a batch (retries included) and
    /// by the sweeper around `keyturn.sweep()`: this process never sweeps an
    /// action to `uncertain` whose observed outcome it is still recording.
    recording: tokio::sync::Mutex<()>,
    /// What `keyturn.dispatch_by_tenant()` last said.
    by_tenant: AtomicBool,
    /// Provider calls under way: what the shutdown log calls in flight (a
    /// slot is also held by a lease step that is still asking).
    calls_in_flight: InFlight,
}

/// A count of provider calls under way.
#[derive(Default)]
struct InFlight(AtomicUsize);

impl InFlight {
    /// Counts a call until the guard drops.
    fn enter(&self) -> InFlightGuard<'_> {
        self.0.fetch_add(1, Ordering::Relaxed);
        InFlightGuard(&self.0)
    }

    fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

struct InFlightGuard<'a>(&'a AtomicUsize);

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Ctx {
    /// Whether every call names its tenant (see the module's docs).
    fn by_tenant(&self) -> bool {
        self.by_tenant.load(Ordering::Relaxed)
    }

    /// The tenant a call about a job of `tenant` names: `None`, the plain
    /// call, unless dispatching by tenant.
    fn route<'a>(&self, tenant: &'a str) -> Option<&'a str> {
        self.by_tenant().then_some(tenant)
    }

    /// Asks the database whether to dispatch by tenant; keeps what it knew
    /// when it cannot ask.
    async fn refresh_routing(&self) {
        let asked = async {
            let client = self.pool.get().await?;
            db::dispatch_by_tenant(&client).await
        }
        .await;
        match asked {
            Ok(by_tenant) => {
                if self.by_tenant.swap(by_tenant, Ordering::Relaxed) != by_tenant {
                    tracing::info!(
                        by_tenant,
                        "keyturn's tables are {}: dispatching {}",
                        if by_tenant {
                            "distributed by tenant (Citus)"
                        } else {
                            "not distributed"
                        },
                        if by_tenant {
                            "tenant by tenant, with the _for calls"
                        } else {
                            "with the plain calls"
                        }
                    );
                }
            }
            Err(e) => tracing::debug!(error = %e, "could not ask keyturn.dispatch_by_tenant()"),
        }
    }
}

/// A slot (one of KEYTURN_WORKERS) held by a job until its provider call has
/// ended (or it was not dispatched). Dropping it frees the slot and wakes the
/// lease loop; the job leaves the in-flight set unless its outcome was
/// queued for recording (the flusher removes it then).
struct Slot {
    ctx: Arc<Ctx>,
    action_id: Uuid,
    _permit: OwnedSemaphorePermit,
    queued: bool,
    /// Counted in [`Ctx::notifying`].
    notification: bool,
}

impl Slot {
    fn new(ctx: &Arc<Ctx>, permit: OwnedSemaphorePermit, job: &LeasedJob) -> Self {
        lock(&ctx.inflight).insert(job.action_id);
        let notification = job.provider.starts_with(crate::providers::notify::PREFIX);
        if notification {
            ctx.notifying.fetch_add(1, Ordering::SeqCst);
        }
        Slot {
            ctx: ctx.clone(),
            action_id: job.action_id,
            _permit: permit,
            queued: false,
            notification,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.queued {
            lock(&self.ctx.inflight).remove(&self.action_id);
        }
        if self.notification {
            self.ctx.notifying.fetch_sub(1, Ordering::SeqCst);
        }
        self.ctx.wake.notify_one();
    }
}

impl Ctx {
    /// The `providers` of the next lease: without the notification channels
    /// while notifications hold half the slots or more. A person's endpoint
    /// that never answers holds its slot for a whole call timeout; the
    /// database gives notifications at most half of one lease's jobs and a
    /// tenant two in flight, and this keeps them from filling the slots
    /// lease by lease, so approved effects always have some (docs/security.md,
    /// row 136).
    fn lease_providers(&self) -> &[&'static str] {
        if notifications_may_lease(self.notifying.load(Ordering::SeqCst), self.settings.workers) {
            &self.provider_names
        } else {
            &self.effect_providers
        }
    }
}

/// Whether a lease may take notifications while `notifying` of `workers`
/// slots hold some: below half of them.
fn notifications_may_lease(notifying: usize, workers: usize) -> bool {
    notifying < workers.div_ceil(2)
}

/// An observed outcome waiting in the completion queue.
struct Done {
    job: LeasedJob,
    result: CallResult,
    /// The job's lease deadline: recording is retried until one lease
    /// length past it.
    deadline: Instant,
}

/// The span every log line about one job carries.
fn job_span(job: &LeasedJob) -> tracing::Span {
    tracing::info_span!("job", action_id = %job.action_id, tenant = %job.tenant, tool = %job.tool, provider = %job.provider, attempt = job.attempt)
}

/// The dispatcher: the lease loop, the `LISTEN` connection and the sweeper.
pub struct Dispatcher {
    ctx: Ctx,
    /// What the journal held at open, replayed before anything else runs.
    replay: Vec<Entry>,
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
        let effect_providers = provider_names
            .iter()
            .copied()
            .filter(|p| !p.starts_with(crate::providers::notify::PREFIX))
            .collect();
        let journal = Arc::new(Journal::disabled(metrics.clone()));
        Dispatcher {
            ctx: Ctx {
                pool,
                providers,
                provider_names,
                effect_providers,
                notifying: AtomicUsize::new(0),
                metrics,
                health,
                settings,
                wake: Notify::new(),
                wake_owed: AtomicBool::new(false),
                slots,
                inflight: Mutex::new(HashSet::new()),
                handbacks: Mutex::new(HandBacks::default()),
                journal,
                recording: tokio::sync::Mutex::new(()),
                by_tenant: AtomicBool::new(false),
                calls_in_flight: InFlight::default(),
            },
            replay: Vec::new(),
        }
    }

    /// Journals every observed outcome in `journal` until the database has
    /// it, and first records `replay`, what [`Journal::open`] found left by
    /// an earlier process. Without this, outcomes are not journaled.
    pub fn with_journal(mut self, journal: Arc<Journal>, replay: Vec<Entry>) -> Self {
        self.ctx.journal = journal;
        self.replay = replay;
        self
    }

    /// Waits for a database whose `pg_keyturn` this build speaks (see
    /// [`crate::compat`]), records what the journal held (see
    /// [`replay`](self::replay)), then dispatches until `shutdown` fires,
    /// stops leasing, waits up to the drain time for calls in flight to be
    /// recorded, and returns. `Err` only for an incompatible database, or a
    /// journal that holds another database's outcomes.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let ctx = Arc::new(self.ctx);
        if !crate::compat::wait_for_compatible_extension(&ctx.pool, &shutdown).await? {
            return Ok(());
        }
        ctx.refresh_routing().await;
        // Before the sweeper's first sweep, which would make the replayed
        // actions `uncertain` once their leases lapsed.
        if !replay::replay(&ctx, self.replay, &shutdown).await? {
            return Ok(());
        }
        let tracker = TaskTracker::new();
        let listener = ctx
            .settings
            .listen_notify
            .then(|| tokio::spawn(listen_loop(ctx.clone(), shutdown.clone())));
        let node_listeners = node_listeners(&ctx, &shutdown).await;
        let sweeper = tokio::spawn(sweep_loop(ctx.clone(), shutdown.clone()));
        // It ends once every sender (the one here, and each job task's) is
        // gone and the queue is empty.
        // Call tasks → journal_loop → flush_loop.
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let (journaled_tx, journaled_rx) = mpsc::unbounded_channel();
        let journaler = tokio::spawn(journal_loop(ctx.clone(), done_rx, journaled_tx));
        let flusher = tokio::spawn(flush_loop(ctx.clone(), journaled_rx, shutdown.clone()));

        // Each step runs in a tracked task of its own, so a shutdown never
        // drops its transaction between COMMIT and the provider calls: the
        // loop only stops awaiting it (`detach_all` below).
        let mut steps: JoinSet<Result<Step, Error>> = JoinSet::new();
        let mut lease_failing = false;
        let mut paused_until = None;
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(ended) = steps.join_next() => {
                    let (ok, pause) = step_ended(&ctx, ended, lease_failing).await;
                    if let Some(pause) = pause {
                        paused_until = Some(Instant::now() + pause);
                    }
                    lease_failing = !ok;
                    if !ctx.settings.listen_notify {
                        ctx.health.set_db_ready(ok);
                    }
                    continue;
                }
                _ = time_to_lease(&ctx, paused_until), if steps.len() < ctx.settings.lease_steps => {}
            }
            paused_until = None;
            if !linger(&ctx, &shutdown).await {
                break;
            }
            steps.spawn(tracker.track_future(lease_step(
                ctx.clone(),
                tracker.clone(),
                shutdown.clone(),
                done_tx.clone(),
            )));
        }
        steps.detach_all();

        tracing::info!(
            in_flight = ctx.calls_in_flight.get(),
            to_record = lock(&ctx.inflight).len(),
            "stopped leasing; waiting for calls in flight"
        );
        tracker.close();
        drop(done_tx);
        let drained = async {
            tracker.wait().await;
            // Every job task has ended, so every sender is gone: the journal
            // loop writes what is queued and returns, then the flusher
            // records it (at once, shutdown is set) and returns.
            let _ = journaler.await;
            let _ = flusher.await;
        };
        if tokio::time::timeout(ctx.settings.drain, drained)
            .await
            .is_err()
        {
            let left: Vec<Uuid> = lock(&ctx.inflight).iter().copied().collect();
            for action_id in &left {
                if ctx.journal.holds(*action_id) {
                    tracing::warn!(%action_id, "observed and journaled, not yet recorded at exit: the next keyturnd started on KEYTURN_JOURNAL_DIR records it");
                } else {
                    tracing::error!(%action_id, "still executing at exit: its outcome is not recorded; the sweep will mark it uncertain for an operator");
                }
            }
        }
        let unrecorded = ctx.journal.unacknowledged();
        if unrecorded > 0 {
            tracing::warn!(
                outcomes = unrecorded,
                "observed outcomes the database has not acknowledged stay in the journal; the next keyturnd started on KEYTURN_JOURNAL_DIR records them"
            );
        }
        for task in [Some(sweeper), listener]
            .into_iter()
            .flatten()
            .chain(node_listeners)
        {
            // They stop on the same token; their errors were logged.
            let _ = task.await;
        }
        tracing::info!("dispatcher stopped");
        Ok(())
    }
}

/// Resolves when the loop should start a step: a wake-up or the poll, or,
/// after a step that only handed back, the end of its pause (wake-ups
/// ignored until then).
async fn time_to_lease(ctx: &Ctx, paused_until: Option<Instant>) {
    match paused_until {
        Some(until) => tokio::time::sleep_until(until).await,
        None => tokio::select! {
            _ = ctx.wake.notified() => {}
            _ = tokio::time::sleep(ctx.settings.poll) => {}
        },
    }
}

/// What the loop learns from a step that ended: whether leasing worked, and
/// the pause a step that only handed back asks for.
async fn step_ended(
    ctx: &Ctx,
    ended: Result<Result<Step, Error>, tokio::task::JoinError>,
    already_failing: bool,
) -> (bool, Option<Duration>) {
    match ended {
        Ok(Ok(step)) => {
            if already_failing {
                tracing::info!("leasing works again");
            }
            let pause = match step {
                Step::OnlyHandedBack { pause } => Some(pause),
                Step::Done => None,
            };
            (true, pause)
        }
        Ok(Err(e)) => {
            log_lease_failure(&e, already_failing);
            // Distributed (or not) since: the next step calls the other form.
            ctx.refresh_routing().await;
            (false, None)
        }
        Err(e) => {
            tracing::error!(error = %e, "the lease step panicked; its transaction rolled back unless it had committed");
            (false, None)
        }
    }
}

/// By tenant, with notifications on: a `LISTEN` connection to each other
/// node (`keyturn.dispatch_nodes()`), asked once at start; a node added
/// later is heard after keyturnd restarts, and polled until then.
async fn node_listeners(
    ctx: &Arc<Ctx>,
    shutdown: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    if !ctx.settings.listen_notify || !ctx.by_tenant() {
        return Vec::new();
    }
    let nodes = async {
        let client = ctx.pool.get().await?;
        db::dispatch_nodes(&client).await
    }
    .await;
    match nodes {
        Ok(nodes) => nodes
            .into_iter()
            .map(|(host, port)| {
                tokio::spawn(node_listen_loop(ctx.clone(), host, port, shutdown.clone()))
            })
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "could not ask keyturn.dispatch_nodes(); the workers' wake-ups wait for the poll");
            Vec::new()
        }
    }
}

/// The first failure of a run loudly, the rest quietly.
fn log_lease_failure(e: &Error, already_failing: bool) {
    if already_failing {
        tracing::debug!(error = %e, "leasing failed again");
    } else {
        tracing::warn!(error = %e, "leasing failed (nothing was dispatched); will keep polling");
    }
}

/// A pooled connection whose state is not known (a statement on it failed
/// mid-transaction, or its COMMIT went unanswered) is closed instead of
/// going back to the pool.
fn discard(client: Object) {
    drop(Object::take(client));
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere must not stop the bookkeeping.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::notifications_may_lease;

    #[test]
    fn test_notifications_lease_only_while_they_hold_less_than_half_the_slots() {
        assert!(notifications_may_lease(0, 8));
        assert!(notifications_may_lease(3, 8));
        assert!(!notifications_may_lease(4, 8));
        assert!(!notifications_may_lease(8, 8));
        // One slot: a notification may take it when nothing else holds it.
        assert!(notifications_may_lease(0, 1));
        assert!(!notifications_may_lease(1, 1));
        assert!(notifications_may_lease(1, 3));
        assert!(!notifications_may_lease(2, 3));
    }
}

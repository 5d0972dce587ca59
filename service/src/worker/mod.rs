//! The dispatch loop. keyturnd never decides whether an action may run:
//! it only carries out what the database has already moved forward, in the
//! order the contract fixes (docs/sql-api.md, docs/keyturnd.md).
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
//! **Batched path (sql/061, used whenever the database has it).** One lease
//! step is one transaction on one pooled connection, in a task of its own
//! (see `lease.rs`): `BEGIN`; `keyturn.lease`; the checks above per job, the
//! hand-backs recorded right there with `complete 'retry'`;
//! `keyturn.begin_dispatch_many` for the jobs left; `COMMIT` — one durable
//! commit per batch. Only after the `COMMIT` succeeded does each job
//! answered `dispatch` get a provider call task holding its slot; an element
//! answered `dispatch = false` is never called (invalidated, or refused with
//! its `55000`). Anything failing before `COMMIT` rolls the transaction back
//! (the leases never existed; nothing is called); a `COMMIT` whose outcome is
//! unknown is an unconfirmed begin (nothing is called, `retry` recorded).
//! Outcomes go to a
//! completion queue that one task flushes with `keyturn.complete_many` every
//! `FLUSH_EVERY` or `FLUSH_MAX` outcomes (at once on shutdown), retrying the
//! same outcomes exactly as `complete` is retried. The slot is
//! freed when the call ends; the job stays in the in-flight set until its
//! outcome is recorded, and shutdown waits for the queue to drain. A database
//! without the batch functions (`42883`) switches the process to the
//! single-call path above; the transaction rolled back, so nothing ran and
//! the next step leases the same jobs again.
//!
//! One file per mechanism; the rules each one enforces are documented there:
//!
//! - `lease.rs`: leasing free slots, the lease-and-begin transaction, the
//!   deadline taken from the lease call, the checks before begin and the
//!   hand-backs (unknown provider: fail closed).
//! - `begin.rs`: after the transaction's `COMMIT` (or its unknown outcome):
//!   the provider calls for the jobs `begin_dispatch_many` answered.
//! - `job.rs`: the provider call, and the single-call path (`begin_dispatch`
//!   then `complete`) with its unconfirmed-begin rule.
//! - `completion.rs`: recording outcomes (`complete`, and the queue flushed
//!   with `complete_many`); a lost database never becomes a guessed outcome.
//! - `listen.rs`: the `LISTEN` connection that wakes the loop and drives
//!   readiness.
//! - `sweeper.rs`: the periodic `keyturn.sweep()`.
//!
//! This file holds the public surface ([`Dispatcher`], [`Settings`]), the
//! state shared by all of them, and the loop with its shutdown drain.

mod begin;
mod completion;
mod job;
mod lease;
mod listen;
mod sweeper;

use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use self::completion::flush_loop;
use self::lease::lease_batch;
use self::listen::listen_loop;
use self::sweeper::sweep_loop;
use crate::config::{Config, Secret};
use crate::http::Health;
use crate::metrics::Metrics;
use crate::providers::Providers;

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
            // Cancellable. Single-call path: a lease that committed but whose
            // answer is dropped here simply lapses back to `queued`, no
            // attempt counted. Batched path: the lease-and-begin transaction
            // runs in a tracked task, which this only stops awaiting.
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

//! The lease: the first stage of a step. Takes every free slot, opens the
//! step's transaction, asks `keyturn.lease` for that many jobs, and either
//! hands each one back (`complete 'retry'` from `leased`, in the same
//! transaction: requeued, no attempt counted) or passes it on to
//! [`super::begin`], which ends the transaction.
//!
//! **Deadlines.** `keyturn.lease` does not return its expiry, so the step
//! takes the instant before `BEGIN` plus the lease length: the database's own
//! `now()` is later, so the local deadline is never later than the real one.
//! A job is begun only while it has a whole call and the safety margin left
//! ([`config::enough_lease_left`]); the round trip to get here is what
//! [`config::LEASE_ROUND_TRIP_SLACK`] pays for, which is why every lease
//! `Config::validate` accepts passes this check.
//!
//! **Unknown provider: fail closed.** `keyturn.lease` is given the providers
//! configured here, so an action whose provider no running keyturnd has is
//! never leased: it stays `queued` until one starts or someone cancels it
//! (the human approved it; the fix is configuration). A leased job whose
//! provider is not here anyway (a database ignoring the filter) is handed
//! back, never begun.
//!
//! **No journal, no lease.** While the outcome journal cannot be written
//! (its failure is logged by [`crate::journal`]), nothing is leased.
//!
//! **By tenant** (keyturn's tables distributed by tenant, see
//! [`super`]): the step asks `keyturn.tenants_due` which tenants have jobs
//! due, oldest first, and runs the lease, the hand-backs and the begin once
//! per tenant, each in a transaction of its own (`lease_for`, …, which
//! Citus runs whole on that tenant's worker), until the free slots are
//! taken.
//!
//! **Linger.** A step costs the database a price of its own (three calls
//! and their checks) besides each job's: leasing, beginning and completing
//! one job at a time costs about twice per job what eight at a time do
//! (tests/bench/BENCHMARKS.md). Under load the slots free one by one, so
//! while more than half of them are busy a wake-up waits up to
//! `KEYTURN_LEASE_LINGER_MS` for more to free ([`linger`]). With most slots
//! free (an idle dispatcher, a single approval) it leases at once.
//!
//! **Hand-backs never spin.** A job handed back for a short lease asks for a
//! delay (`retry_after`) that doubles with every step that did nothing but
//! hand back, so the same job is not leased again at once; after such a
//! step the loop pauses, ignoring wake-ups, for a time that grows the same
//! way up to a second ([`Step::OnlyHandedBack`]); and each reason is logged
//! once, then at debug with a running count, until a job is begun again.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::begin::begin_and_commit;
use super::{discard, job_span, lock, Ctx, Done, Slot, UNKNOWN_PROVIDER_DELAY};
use crate::config;
use crate::db::{self, LeasedJob};
use crate::error::Error;

/// Delay of the first hand-back for a short lease; it doubles with every
/// step that only handed back, up to [`HANDBACK_DELAY_MAX`].
const HANDBACK_DELAY_MIN: Duration = Duration::from_secs(1);
const HANDBACK_DELAY_MAX: Duration = Duration::from_secs(60);

/// The loop's pause after a step that only handed back, growing the same
/// way; never longer than a second, the longest the loop may go without
/// polling.
const STEP_PAUSE_MIN: Duration = Duration::from_millis(100);
const STEP_PAUSE_MAX: Duration = Duration::from_secs(1);

/// Why a leased job goes back instead of on to begin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum HandBack {
    /// No provider of its name is configured here.
    UnknownProvider,
    /// Shutdown has begun: another keyturnd should take it at once.
    Shutdown,
    /// Less than a whole call and the safety margin is left of the lease.
    LeaseTooShort,
}

impl HandBack {
    fn reason(self) -> &'static str {
        match self {
            HandBack::UnknownProvider => "unknown_provider",
            HandBack::Shutdown => "shutdown",
            HandBack::LeaseTooShort => "lease_too_short",
        }
    }
}

/// Hand-backs since a step last began a job.
#[derive(Debug, Default)]
pub(super) struct HandBacks {
    /// Consecutive steps that leased jobs and began none.
    streak: u32,
    /// Jobs handed back, by reason.
    counts: BTreeMap<HandBack, u64>,
}

impl HandBacks {
    /// The `retry_after` of a job handed back for `why` in the next step.
    pub(super) fn delay(&self, why: HandBack) -> Option<Duration> {
        match why {
            HandBack::UnknownProvider => Some(UNKNOWN_PROVIDER_DELAY),
            HandBack::Shutdown => None,
            HandBack::LeaseTooShort => {
                Some(doubled(HANDBACK_DELAY_MIN, self.streak, HANDBACK_DELAY_MAX))
            }
        }
    }

    /// Counts a step's hand-backs; logs each reason the first time only.
    fn note(&mut self, why: HandBack, jobs: u64, ctx: &Ctx) {
        let count = self.counts.entry(why).or_insert(0);
        let first = *count == 0;
        *count += jobs;
        let total = *count;
        if !first {
            tracing::debug!(
                reason = why.reason(),
                jobs,
                total,
                "handing jobs back again"
            );
            return;
        }
        match why {
            HandBack::UnknownProvider => tracing::error!(
                configured = ?ctx.providers.names(),
                jobs,
                "leased jobs whose provider is not configured here; handing them back undispatched (configure it, or cancel the actions); repeats are logged at debug"
            ),
            HandBack::Shutdown => {
                tracing::info!(jobs, "shutting down; handing leased jobs back undispatched")
            }
            HandBack::LeaseTooShort => tracing::warn!(
                jobs,
                lease = ?ctx.settings.lease,
                call_timeout = ?ctx.settings.call_timeout,
                "too little lease left for a whole provider call (is the database slow to answer?); handing jobs back with a growing delay; repeats are logged at debug"
            ),
        }
    }

    /// After a step: `passed` jobs went on to be begun, `handed_back` came
    /// back. Returns the loop's pause when the step did nothing else.
    fn after_step(&mut self, passed: usize, handed_back: usize) -> Option<Duration> {
        if passed > 0 {
            if !self.counts.is_empty() {
                let total: u64 = self.counts.values().sum();
                tracing::info!(handed_back = total, "beginning jobs again");
            }
            *self = HandBacks::default();
            return None;
        }
        if handed_back == 0 {
            return None;
        }
        let pause = doubled(STEP_PAUSE_MIN, self.streak, STEP_PAUSE_MAX);
        self.streak = self.streak.saturating_add(1);
        Some(pause)
    }
}

/// `base · 2^n`, at most `max`.
fn doubled(base: Duration, n: u32, max: Duration) -> Duration {
    base.saturating_mul(2u32.saturating_pow(n)).min(max)
}

/// What a step did, for the loop.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Nothing to report: jobs were begun, none were due, or no slot was free.
    Done,
    /// Jobs were leased and every one was handed back: the loop pauses this
    /// long, ignoring wake-ups, before leasing again.
    OnlyHandedBack { pause: Duration },
}

/// Whether a leased job must go back instead of on to begin, checked in this
/// order.
pub(super) fn handback(
    has_provider: bool,
    shutting_down: bool,
    lease_left: Duration,
    call_timeout: Duration,
) -> Option<HandBack> {
    if !has_provider {
        Some(HandBack::UnknownProvider)
    } else if shutting_down {
        Some(HandBack::Shutdown)
    } else if !config::enough_lease_left(lease_left, call_timeout) {
        Some(HandBack::LeaseTooShort)
    } else {
        None
    }
}

/// Whether a wake-up should wait for slots before it leases: more than half
/// of the `workers` are busy.
fn wants_more_slots(free: usize, workers: usize) -> bool {
    free < workers.div_ceil(2)
}

/// Waits, before a step, up to the linger while more than half the slots are
/// busy (see the module's docs). False: shutdown began.
pub(super) async fn linger(ctx: &Ctx, shutdown: &CancellationToken) -> bool {
    wait_for_slots(
        &ctx.slots,
        ctx.settings.workers,
        &ctx.wake,
        ctx.settings.linger,
        shutdown,
    )
    .await
}

/// [`linger`] over its parts: `wake` is notified whenever a slot frees.
async fn wait_for_slots(
    slots: &Semaphore,
    workers: usize,
    wake: &Notify,
    longest: Duration,
    shutdown: &CancellationToken,
) -> bool {
    let until = Instant::now() + longest;
    while !longest.is_zero() && wants_more_slots(slots.available_permits(), workers) {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return false,
            _ = wake.notified() => {}
            _ = tokio::time::sleep_until(until) => break,
        }
    }
    !shutdown.is_cancelled()
}

/// One step: lease as many jobs as there are free slots, hand back what must
/// go back, and pass the rest to [`begin_and_commit`]; by tenant, that for
/// each tenant with jobs due until the slots are taken. `Err`: nothing more
/// was dispatched (what a tenant's step before it committed stands).
pub(super) async fn lease_step(
    ctx: Arc<Ctx>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    done: mpsc::UnboundedSender<Done>,
) -> Result<Step, Error> {
    let free = ctx.slots.available_permits();
    // `free` ≤ KEYTURN_WORKERS ≤ 1024 (validated), so both conversions hold.
    let (Ok(n_permits), Ok(max_tenants)) = (u32::try_from(free), i32::try_from(free)) else {
        return Ok(Step::Done);
    };
    // None free (calls hold them, or another step does): the wake-up that
    // started this step is owed until a step gives slots back (see
    // `Unleased`; a call that ends wakes the loop itself).
    let owe = || {
        ctx.wake_owed.store(true, Ordering::SeqCst);
        Ok(Step::Done)
    };
    if free == 0 {
        return owe();
    }
    // An outcome that cannot be journaled would be lost with the process:
    // take on no new call until the journal can be written again.
    if !ctx.journal.ready() {
        return Ok(Step::Done);
    }
    let Ok(permits) = ctx.slots.clone().try_acquire_many_owned(n_permits) else {
        return owe();
    };
    let mut permits = Unleased {
        permits,
        owed: &ctx.wake_owed,
        wake: &ctx.wake,
    };
    let tenants: Vec<Option<String>> = if ctx.by_tenant() {
        let client = ctx.pool.get().await?;
        db::tenants_due(&client, Some(&ctx.provider_names), max_tenants)
            .await?
            .into_iter()
            .filter(|t| t.to_lease > 0)
            .map(|t| Some(t.tenant))
            .collect()
    } else {
        vec![None]
    };
    let (mut passed, mut handed_back) = (0, 0);
    for (i, tenant) in tenants.iter().enumerate() {
        if permits.left() == 0 {
            break;
        }
        let (p, h) = lease_one(
            &ctx,
            &tracker,
            &shutdown,
            &done,
            tenant.as_deref(),
            &mut permits,
            i + 1 == tenants.len(),
        )
        .await?;
        passed += p;
        handed_back += h;
    }
    let pause = lock(&ctx.handbacks).after_step(passed, handed_back);
    Ok(match pause {
        Some(pause) => Step::OnlyHandedBack { pause },
        None => Step::Done,
    })
}

/// The slots a step took and has not yet given to a job. They go back when
/// it drops, or at [`free_rest`](Self::free_rest); and if a step started
/// meanwhile found none free (its wake-up spent for nothing: the approval
/// that sent it may not be in this step's lease), the loop is woken again,
/// as a slot freed by a call ending would.
struct Unleased<'a> {
    permits: OwnedSemaphorePermit,
    /// [`Ctx`]'s `wake_owed` and `wake`.
    owed: &'a AtomicBool,
    wake: &'a Notify,
}

impl Unleased<'_> {
    fn left(&self) -> usize {
        self.permits.num_permits()
    }

    /// One slot, for a leased job.
    fn take_one(&mut self) -> Option<OwnedSemaphorePermit> {
        self.permits.split(1)
    }

    fn free_rest(&mut self) {
        let n = self.permits.num_permits();
        drop(self.permits.split(n));
        if n > 0 && self.owed.swap(false, Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }
}

impl Drop for Unleased<'_> {
    fn drop(&mut self) {
        self.free_rest();
    }
}

/// The step's lease, hand-backs and begin in one transaction, for `tenant`
/// (`None`: every tenant, the plain calls), with at most as many jobs as
/// `permits` holds; each job takes one, and the `last` lease of the step
/// frees the rest as soon as it has its jobs. Returns how many jobs went on
/// to be begun and how many were handed back.
async fn lease_one(
    ctx: &Arc<Ctx>,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
    done: &mpsc::UnboundedSender<Done>,
    tenant: Option<&str>,
    permits: &mut Unleased<'_>,
    last: bool,
) -> Result<(usize, usize), Error> {
    let Ok(max_jobs) = i32::try_from(permits.left()) else {
        return Ok((0, 0));
    };
    let started = Instant::now();
    let mut client = ctx.pool.get().await?;
    // From here until COMMIT, any early return drops `tx`: rolled back, the
    // leases never existed.
    let tx = db::transaction(&mut client).await?;
    let jobs = db::lease(
        tx.client(),
        tenant,
        &ctx.settings.worker_name,
        max_jobs,
        ctx.settings.lease,
        ctx.lease_providers(),
    )
    .await?;
    if jobs.is_empty() {
        // Nothing was changed: dropping it queues a ROLLBACK, no wait.
        return Ok((0, 0));
    }
    ctx.metrics.lease_batch_size.observe(jobs.len() as f64);
    let deadline = started + ctx.settings.lease;

    let mut handed_back: Vec<(LeasedJob, HandBack)> = Vec::new();
    let mut to_begin: Vec<(LeasedJob, Slot)> = Vec::with_capacity(jobs.len());
    for job in jobs {
        // `max_jobs` permits were there and at most that many jobs came back.
        let Some(permit) = permits.take_one() else {
            tracing::error!(action_id = %job.action_id, "more jobs than slots; leaving it to lapse");
            continue;
        };
        let why = handback(
            ctx.providers.get(&job.provider).is_some(),
            shutdown.is_cancelled(),
            deadline.saturating_duration_since(Instant::now()),
            ctx.settings.call_timeout,
        );
        match why {
            // Its slot is free again as soon as the permit drops here.
            Some(why) => handed_back.push((job, why)),
            None => {
                let slot = Slot::new(ctx, permit, &job);
                to_begin.push((job, slot));
            }
        }
    }

    if last {
        // Slots this step leased no job for are free for the next step at
        // once, not when this one's begin and COMMIT are answered.
        permits.free_rest();
    }

    if !handed_back.is_empty() {
        let mut by_reason: BTreeMap<HandBack, u64> = BTreeMap::new();
        for (_, why) in &handed_back {
            *by_reason.entry(*why).or_insert(0) += 1;
            ctx.metrics.handback(why.reason());
        }
        let delays: BTreeMap<HandBack, Option<Duration>> = {
            let mut hb = lock(&ctx.handbacks);
            for (why, n) in &by_reason {
                hb.note(*why, *n, ctx);
            }
            by_reason.keys().map(|w| (*w, hb.delay(*w))).collect()
        };
        // If one fails, the whole transaction rolls back, which hands every
        // job back all the same (minus the delay).
        let receipt = json!({});
        for (job, why) in &handed_back {
            let status = db::complete(
                tx.client(),
                tenant,
                job.action_id,
                job.lease_id,
                "retry",
                &receipt,
                delays.get(why).copied().flatten(),
            )
            .await?;
            let _span = job_span(job).entered();
            tracing::debug!(%status, reason = why.reason(), "handed back");
        }
    }

    let passed = to_begin.len();
    if let Err(e) = begin_and_commit(ctx, tracker, tx, tenant, to_begin, deadline, done).await {
        discard(client);
        return Err(e);
    }
    Ok((passed, handed_back.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn test_lingers_only_while_more_than_half_the_slots_are_busy() {
        assert!(wants_more_slots(0, 8));
        assert!(wants_more_slots(3, 8));
        assert!(!wants_more_slots(4, 8));
        assert!(!wants_more_slots(8, 8));
        assert!(wants_more_slots(1, 3));
        assert!(!wants_more_slots(2, 3));
        // One worker: only when its slot is busy, when there is nothing to
        // lease anyway.
        assert!(wants_more_slots(0, 1));
        assert!(!wants_more_slots(1, 1));
    }

    /// Frees `n` of `slots`' permits, waking the loop as a [`Slot`] does.
    fn free(slots: &Semaphore, wake: &Notify, n: usize) {
        slots.add_permits(n);
        wake.notify_one();
    }

    #[tokio::test(start_paused = true)]
    async fn test_linger_waits_at_most_its_length_for_busy_slots() {
        let (slots, wake, shutdown) = (Semaphore::new(1), Notify::new(), CancellationToken::new());
        let t0 = Instant::now();
        assert!(wait_for_slots(&slots, 8, &wake, Duration::from_millis(2), &shutdown).await);
        assert_eq!(
            t0.elapsed(),
            Duration::from_millis(2),
            "7 of 8 busy: the whole linger"
        );

        let t0 = Instant::now();
        assert!(wait_for_slots(&slots, 8, &wake, Duration::ZERO, &shutdown).await);
        assert_eq!(t0.elapsed(), Duration::ZERO, "0 ms: no wait");

        slots.add_permits(3);
        let t0 = Instant::now();
        assert!(wait_for_slots(&slots, 8, &wake, Duration::from_millis(2), &shutdown).await);
        assert_eq!(t0.elapsed(), Duration::ZERO, "half free: leases at once");
    }

    #[tokio::test(start_paused = true)]
    async fn test_linger_ends_as_soon_as_half_the_slots_are_free() {
        let (slots, wake, shutdown) = (Semaphore::new(0), Notify::new(), CancellationToken::new());
        let t0 = Instant::now();
        let waiting = wait_for_slots(&slots, 8, &wake, Duration::from_millis(10), &shutdown);
        let freeing = async {
            for ms in [1, 2, 3, 4] {
                tokio::time::sleep_until(t0 + Duration::from_millis(ms)).await;
                free(&slots, &wake, 1);
            }
        };
        let (lingered, ()) = tokio::join!(waiting, freeing);
        assert!(lingered);
        assert_eq!(
            t0.elapsed(),
            Duration::from_millis(4),
            "the fourth free slot ends it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn test_linger_stops_at_shutdown() {
        let (slots, wake, shutdown) = (Semaphore::new(0), Notify::new(), CancellationToken::new());
        let t0 = Instant::now();
        let waiting = wait_for_slots(&slots, 8, &wake, Duration::from_millis(50), &shutdown);
        let stopping = async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            shutdown.cancel();
        };
        let (lingered, ()) = tokio::join!(waiting, stopping);
        assert!(!lingered, "shutdown ends the wait and the loop");
        assert_eq!(t0.elapsed(), Duration::from_millis(1));
    }

    /// Whether `wake` holds a wake-up, without waiting.
    async fn woken(wake: &Notify) -> bool {
        tokio::select! {
            biased;
            _ = wake.notified() => true,
            _ = std::future::ready(()) => false,
        }
    }

    #[tokio::test]
    async fn test_slots_given_back_pay_a_wake_up_a_step_spent_finding_none() {
        let slots = Arc::new(Semaphore::new(8));
        let (owed, wake) = (AtomicBool::new(false), Notify::new());
        let take = |n| Unleased {
            permits: slots.clone().try_acquire_many_owned(n).expect("free"),
            owed: &owed,
            wake: &wake,
        };

        // Nothing owed: slots go back quietly (no step was turned away).
        let mut unleased = take(4);
        unleased.free_rest();
        assert_eq!(slots.available_permits(), 8);
        assert!(!woken(&wake).await);

        // A step found none free meanwhile: giving slots back wakes the loop,
        // once, and the debt is paid.
        let mut unleased = take(8);
        let job = unleased.take_one().expect("one for a job");
        owed.store(true, Ordering::SeqCst);
        drop(unleased);
        assert_eq!(slots.available_permits(), 7, "the job keeps its slot");
        assert!(woken(&wake).await, "the spent wake-up is paid back");
        assert!(!owed.load(Ordering::SeqCst));
        assert!(!woken(&wake).await, "once");

        // Nothing to give back: the debt waits for slots that are.
        let mut unleased = take(7);
        let _jobs = unleased.permits.split(7).expect("all to jobs");
        owed.store(true, Ordering::SeqCst);
        unleased.free_rest();
        assert!(!woken(&wake).await);
        assert!(owed.load(Ordering::SeqCst), "still owed");
        drop(job);
    }

    #[test]
    fn test_checks_in_order() {
        let t = S(3);
        assert_eq!(
            handback(false, true, S(0), t),
            Some(HandBack::UnknownProvider)
        );
        assert_eq!(handback(true, true, S(60), t), Some(HandBack::Shutdown));
        assert_eq!(
            handback(true, false, S(4), t),
            Some(HandBack::LeaseTooShort)
        );
        assert_eq!(handback(true, false, S(5), t), None);
    }

    #[test]
    fn test_every_lease_validate_accepts_is_begun_after_a_slow_round_trip() {
        for timeout in 1..=120 {
            let t = S(timeout);
            let lease = config::min_lease(t);
            let round_trip = config::LEASE_ROUND_TRIP_SLACK - Duration::from_millis(1);
            assert_eq!(
                handback(true, false, lease - round_trip, t),
                None,
                "timeout {timeout} s, lease {lease:?}: accepted at start, so it must be begun"
            );
        }
    }

    #[test]
    fn test_handback_delay_and_pause_grow_and_reset_on_a_begun_job() {
        let mut hb = HandBacks::default();
        let mut delays = Vec::new();
        let mut pauses = Vec::new();
        for _ in 0..8 {
            delays.push(hb.delay(HandBack::LeaseTooShort).expect("a delay"));
            pauses.push(hb.after_step(0, 1).expect("a pause"));
        }
        assert_eq!(delays[..4], [S(1), S(2), S(4), S(8)]);
        assert_eq!(*delays.last().expect("some"), HANDBACK_DELAY_MAX);
        assert!(pauses.windows(2).all(|w| w[0] <= w[1]), "{pauses:?}");
        assert_eq!(*pauses.last().expect("some"), STEP_PAUSE_MAX);
        assert_eq!(hb.after_step(0, 0), None, "a step that leased nothing");
        assert_eq!(hb.delay(HandBack::LeaseTooShort), Some(S(60)), "kept");
        assert_eq!(hb.after_step(1, 3), None, "a begun job: no pause");
        assert_eq!(
            hb.delay(HandBack::LeaseTooShort),
            Some(S(1)),
            "and the delay starts over"
        );
        assert_eq!(hb.delay(HandBack::Shutdown), None);
        assert_eq!(
            hb.delay(HandBack::UnknownProvider),
            Some(UNKNOWN_PROVIDER_DELAY)
        );
    }
}

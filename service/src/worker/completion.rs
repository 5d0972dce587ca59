//! The completion: observed outcomes recorded. Call tasks queue them
//! ([`enqueue`]); one task ([`flush_loop`]) records them in batches with
//! `keyturn.complete_many`, and one by one with `keyturn.complete`
//! ([`record`]) when the database refuses a batch for its content.
//!
//! **A lost database never becomes a guessed outcome.** An outcome that
//! cannot be recorded is retried, the *same* outcome, with backoff until one
//! lease length past its lease deadline (the database accepts a known
//! outcome past expiry until the sweep runs). If it still cannot be, it is
//! logged at ERROR for the operator, and the sweep will call the action
//! `uncertain`. A `55000` answer (already `uncertain`) is logged at WARN with
//! the observed outcome, for the operator to reconcile.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{job_span, lock, Ctx, Done, Slot, BACKOFF_MAX, BACKOFF_MIN};
use crate::db::{self, LeasedJob};
use crate::providers::CallResult;

/// The completion queue is flushed with one `keyturn.complete_many` this long
/// after its first outcome arrived, or as soon as it holds [`FLUSH_MAX`]
/// outcomes, or at once while shutting down.
const FLUSH_EVERY: Duration = Duration::from_millis(3);
/// Outcomes per `keyturn.complete_many` at most.
const FLUSH_MAX: usize = 64;

/// Queues an observed outcome for `complete_many`; the slot is freed (the
/// job stays in flight until the flusher has recorded it).
pub(super) fn enqueue(
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
pub(super) async fn flush_loop(
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
    let _span = job_span(&d.job).entered();
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

/// Queued outcomes one `keyturn.complete` each, concurrently.
async fn record_each(ctx: &Ctx, items: Vec<Done>) {
    futures_util::future::join_all(items.iter().map(|d| async move {
        tracing::Instrument::instrument(
            record(ctx, &d.job, &d.result, d.deadline),
            job_span(&d.job),
        )
        .await;
        lock(&ctx.inflight).remove(&d.job.action_id);
    }))
    .await;
}

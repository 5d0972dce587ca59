//! The completion: observed outcomes journaled, then recorded. Call tasks
//! queue them ([`enqueue`]); one task journals them ([`journal_loop`]);
//! another ([`flush_loop`]) records them in batches with
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
//!
//! **Journaled first.** [`enqueue`] writes the outcome to the journal the
//! moment it is observed (no sync: it survives the process from then on);
//! [`journal_loop`] makes what has queued up durable with one `fdatasync`
//! (group commit: what arrives during one sync goes with the next) and only
//! then passes it on; it never waits for the database, so an outcome is on
//! disk within a sync of being observed however long recording takes
//! ([`crate::journal`]). It is acknowledged there once the database
//! answered for it; one whose recording was given up stays for the next
//! start. While a batch is being recorded this process does not sweep
//! (`Ctx::recording`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{job_span, lock, Ctx, Done, Slot, BACKOFF_MAX, BACKOFF_MIN};
use crate::db::{self, LeasedJob};
use crate::journal::format::Entry;
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
    let d = Done {
        job,
        result,
        deadline,
    };
    // A small write to the page cache, done here so that no scheduling
    // delay stands between the observation and the journal.
    slot.ctx.journal.write(&[entry(&d)]);
    if let Err(mpsc::error::SendError(d)) = done.send(d) {
        // The journal loop is gone (cannot happen before every sender is);
        // journal and record it here rather than lose it. `flush` takes it
        // out of the in-flight set once it is answered.
        let ctx = slot.ctx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            sync(&ctx).await;
            flush(&ctx, vec![d]).await;
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
                ctx.route(&job.tenant),
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
                acknowledge(ctx, &[(job.action_id, job.lease_id)]).await;
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
            if result.not_sent() {
                account_not_sent(
                    ctx,
                    Some(&job.tenant),
                    job.action_id,
                    job.lease_id,
                    &result.receipt,
                )
                .await;
            }
            acknowledge(ctx, &[(job.action_id, job.lease_id)]).await;
            return;
        }
        if !err.is_transient() {
            ctx.metrics.unrecorded.inc();
            tracing::error!(
                observed_outcome = outcome,
                receipt = %result.receipt,
                error = %err,
                tries,
                "COULD NOT RECORD the provider outcome: the database refused it; the sweep will mark the action uncertain; operator: reconcile it with this observed outcome"
            );
            // Refused for its content: replaying it would be refused again.
            acknowledge(ctx, &[(job.action_id, job.lease_id)]).await;
            return;
        }
        if Instant::now() + backoff > give_up_at {
            ctx.metrics.unrecorded.inc();
            tracing::error!(
                observed_outcome = outcome,
                receipt = %result.receipt,
                error = %err,
                tries,
                "COULD NOT RECORD the provider outcome; it stays in the journal for the next start; the sweep will mark the action uncertain; operator: reconcile it with this observed outcome"
            );
            return;
        }
        tracing::warn!(observed_outcome = outcome, error = %err, tries, "could not record the outcome yet; retrying the same outcome");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Makes the observed outcomes durable as they come, every group that queued
/// up during the previous sync with one sync, and passes them on to
/// [`flush_loop`]. Returns once the queue is closed and empty (and so
/// closes the flusher's).
pub(super) async fn journal_loop(
    ctx: Arc<Ctx>,
    mut rx: mpsc::UnboundedReceiver<Done>,
    tx: mpsc::UnboundedSender<Done>,
) {
    let mut group: Vec<Done> = Vec::new();
    while let Some(d) = rx.recv().await {
        group.push(d);
        while let Ok(d) = rx.try_recv() {
            group.push(d);
        }
        // Each was written when observed ([`enqueue`]): one sync for all.
        sync(&ctx).await;
        for d in group.drain(..) {
            if let Err(mpsc::error::SendError(d)) = tx.send(d) {
                // The flusher ends only after this loop: unreachable, but
                // an outcome is never dropped.
                let ctx = ctx.clone();
                tokio::spawn(async move { flush(&ctx, vec![d]).await });
            }
        }
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
/// By tenant, one `complete_many_for` per tenant of the batch.
async fn flush(ctx: &Ctx, items: Vec<Done>) {
    let _recording = ctx.recording.lock().await;
    if !ctx.by_tenant() {
        flush_group(ctx, None, items).await;
        return;
    }
    let mut by_tenant: std::collections::BTreeMap<String, Vec<Done>> = Default::default();
    for d in items {
        by_tenant.entry(d.job.tenant.clone()).or_default().push(d);
    }
    for (tenant, group) in by_tenant {
        flush_group(ctx, Some(&tenant), group).await;
    }
}

/// [`flush`] for outcomes of one tenant, or (`None`) of any.
async fn flush_group(ctx: &Ctx, tenant: Option<&str>, mut items: Vec<Done>) {
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
            db::complete_many(&client, tenant, &batch).await
        }
        .await;
        let err = match recorded {
            Ok(answers) => {
                let mut unanswered = Vec::new();
                let mut answered = Vec::with_capacity(items.len());
                let mut not_sent = Vec::new();
                for (i, d) in items.into_iter().enumerate() {
                    match answers.get(i).filter(|a| a.action_id == d.job.action_id) {
                        Some(a) => {
                            log_recorded(ctx, &d, a, tries);
                            answered.push((d.job.action_id, d.job.lease_id));
                            lock(&ctx.inflight).remove(&d.job.action_id);
                            if a.sqlstate() == Some("55000") && d.result.not_sent() {
                                not_sent.push(d);
                            }
                        }
                        None => unanswered.push(d),
                    }
                }
                for d in &not_sent {
                    account_not_sent(
                        ctx,
                        Some(&d.job.tenant),
                        d.job.action_id,
                        d.job.lease_id,
                        &d.result.receipt,
                    )
                    .await;
                }
                acknowledge(ctx, &answered).await;
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
                    "COULD NOT RECORD the provider outcome; it stays in the journal for the next start; the sweep will mark the action uncertain; operator: reconcile it with this observed outcome"
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

/// keyturnd knows the attempt under `lease_id` sent nothing (its receipt
/// says so: the call never started), but the database no longer takes its
/// `retry`: the sweep made the action `uncertain` first. Says so for the
/// operator, in the log and, where the database keeps it, in the action's
/// record (`keyturn.record_not_sent`), which `keyturnd uncertain` and the
/// console show. The status stays `uncertain`: the operator decides.
pub(super) async fn account_not_sent(
    ctx: &Ctx,
    tenant: Option<&str>,
    action_id: uuid::Uuid,
    lease_id: uuid::Uuid,
    receipt: &serde_json::Value,
) {
    tracing::warn!(
        %action_id,
        %lease_id,
        %receipt,
        "{}: the sweep made the action uncertain before keyturnd could record retry; operator: nothing of this attempt reached the provider",
        crate::operator::NOT_SENT
    );
    let route = tenant.and_then(|t| ctx.route(t));
    let taken = async {
        let client = ctx.pool.get().await?;
        db::record_not_sent(&client, route, action_id, lease_id, receipt).await
    }
    .await;
    match taken {
        Ok(true) => tracing::info!(%action_id, "keyturnd's account recorded on the action"),
        Ok(false) => {
            tracing::info!(%action_id, "the database did not take keyturnd's account (the action is no longer uncertain under that lease)")
        }
        Err(e) if e.sqlstate() == Some(&tokio_postgres::error::SqlState::UNDEFINED_FUNCTION) => {
            tracing::warn!(%action_id, "this pg_keyturn keeps no dispatcher account (keyturn.record_not_sent); the line above is the only record");
        }
        Err(e) => {
            tracing::warn!(%action_id, error = %e, "could not record keyturnd's account on the action; the line above is the only record")
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

/// The journal's entry for an observed outcome: what `complete` is given.
fn entry(d: &Done) -> Entry {
    Entry {
        action_id: d.job.action_id,
        tenant: Some(d.job.tenant.clone()),
        lease_id: d.job.lease_id,
        outcome: d.result.outcome.word().to_owned(),
        receipt: d.result.receipt.clone(),
        retry_after_ms: d
            .result
            .outcome
            .retry_after()
            .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
    }
}

/// Makes what was written to the journal durable, off the async threads.
async fn sync(ctx: &Ctx) {
    if !ctx.journal.enabled() {
        return;
    }
    let journal = ctx.journal.clone();
    // A failure is logged by the journal; the outcomes are recorded anyway.
    let _ = tokio::task::spawn_blocking(move || journal.sync()).await;
}

/// Tells the journal the database answered for these outcomes.
async fn acknowledge(ctx: &Ctx, keys: &[(uuid::Uuid, uuid::Uuid)]) {
    if !ctx.journal.enabled() || keys.is_empty() {
        return;
    }
    let journal = ctx.journal.clone();
    let keys = keys.to_vec();
    let _ = tokio::task::spawn_blocking(move || journal.ack(&keys)).await;
}

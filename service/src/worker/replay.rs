//! The start-up replay: the outcomes an earlier keyturnd observed and
//! journaled, but that the database may not have, are sent to
//! `keyturn.complete_many` before this process sweeps or leases anything.
//!
//! `complete` accepts a known outcome past the lease's expiry while the
//! action is still `executing` under that lease, so an outcome replayed
//! before any sweep is recorded as if the process had never died. Once a
//! sweep (another keyturnd's) made the action `uncertain`, or the outcome
//! was recorded after all, `complete` refuses it with `55000`: the entry is
//! dropped and logged with the observed outcome, for the operator. Nothing
//! else is ever done with an entry: it is an observation, not a decision.
//!
//! First, the journal is bound to this database
//! ([`db::database_identity`]): outcomes another database's keyturnd
//! observed are never sent here (keyturnd refuses to start instead).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::completion::account_not_sent;
use super::{Ctx, BACKOFF_MAX, BACKOFF_MIN};
use crate::db::{self, CompleteAnswer};
use crate::error::Error;
use crate::journal::format::Entry;
use crate::providers::receipt_says_not_sent;

/// Outcomes per `complete_many` of the replay.
const CHUNK: usize = 64;

/// Binds the journal to the database and records `entries`. `Ok(false)`:
/// shutdown came first (what was not answered stays in the journal).
pub(super) async fn replay(
    ctx: &Ctx,
    entries: Vec<Entry>,
    shutdown: &CancellationToken,
) -> Result<bool, Error> {
    if !ctx.journal.enabled() {
        return Ok(true);
    }
    let Some(id) = retrying(shutdown, "read the database identity", || async {
        let client = ctx.pool.get().await?;
        db::database_identity(&client).await
    })
    .await
    else {
        return Ok(false);
    };
    ctx.journal.bind_database(&id)?;
    if entries.is_empty() {
        return Ok(true);
    }
    tracing::info!(
        outcomes = entries.len(),
        "the journal holds outcomes an earlier keyturnd observed; recording them before sweeping or leasing"
    );
    for (tenant, entries) in by_route(ctx, entries) {
        if !replay_group(ctx, tenant.as_deref(), &entries, shutdown).await? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The entries in the groups they are recorded in: all together, or by
/// tenant when dispatching by tenant. An entry without a tenant (an older
/// keyturnd wrote it) cannot be routed then: it is logged for the operator
/// and stays in the journal.
fn by_route(ctx: &Ctx, entries: Vec<Entry>) -> Vec<(Option<String>, Vec<Entry>)> {
    if !ctx.by_tenant() {
        return vec![(None, entries)];
    }
    let mut groups: std::collections::BTreeMap<String, Vec<Entry>> = Default::default();
    for e in entries {
        match e.tenant.clone() {
            Some(t) => groups.entry(t).or_default().push(e),
            None => {
                ctx.metrics.unrecorded.inc();
                tracing::error!(
                    action_id = %e.action_id,
                    lease_id = %e.lease_id,
                    observed_outcome = %e.outcome,
                    receipt = %e.receipt,
                    "a journaled outcome without its tenant (an older keyturnd wrote it) cannot be recorded where keyturn's tables are distributed by tenant; it stays in the journal; operator: reconcile the action with this observed outcome"
                );
            }
        }
    }
    groups.into_iter().map(|(t, g)| (Some(t), g)).collect()
}

/// Records one group's entries, `CHUNK` at a time. `Ok(false)`: shutdown
/// came first.
async fn replay_group(
    ctx: &Ctx,
    tenant: Option<&str>,
    entries: &[Entry],
    shutdown: &CancellationToken,
) -> Result<bool, Error> {
    for chunk in entries.chunks(CHUNK) {
        let answers = retrying(shutdown, "replay journaled outcomes", || async {
            let client = ctx.pool.get().await?;
            let batch: Vec<db::Completion<'_>> = chunk
                .iter()
                .map(|e| db::Completion {
                    action_id: e.action_id,
                    lease_id: e.lease_id,
                    outcome: &e.outcome,
                    receipt: &e.receipt,
                    retry_after: e.retry_after_ms.map(Duration::from_millis),
                })
                .collect();
            db::complete_many(&client, tenant, &batch).await
        })
        .await;
        let Some(answers) = answers else {
            return Ok(false);
        };
        let mut answered = Vec::with_capacity(chunk.len());
        for (i, e) in chunk.iter().enumerate() {
            match answers.get(i).filter(|a| a.action_id == e.action_id) {
                Some(a) => {
                    log_answer(ctx, e, a);
                    if a.sqlstate() == Some("55000") && receipt_says_not_sent(&e.receipt) {
                        account_not_sent(
                            ctx,
                            e.tenant.as_deref(),
                            e.action_id,
                            e.lease_id,
                            &e.receipt,
                        )
                        .await;
                    }
                    answered.push(e.key());
                }
                None => tracing::error!(
                    action_id = %e.action_id,
                    observed_outcome = %e.outcome,
                    "complete_many gave no answer for a replayed outcome; it stays in the journal for the next start"
                ),
            }
        }
        let journal = ctx.journal.clone();
        let _ = tokio::task::spawn_blocking(move || journal.ack(&answered)).await;
    }
    Ok(true)
}

fn log_answer(ctx: &Ctx, e: &Entry, a: &CompleteAnswer) {
    match (&a.status, a.sqlstate()) {
        (Some(status), None) => {
            ctx.metrics.replayed("recorded");
            tracing::info!(action_id = %e.action_id, lease_id = %e.lease_id, observed_outcome = %e.outcome, %status, "journaled outcome recorded");
        }
        (_, Some("55000")) => {
            ctx.metrics.replayed("refused");
            ctx.metrics.unrecorded.inc();
            tracing::warn!(
                action_id = %e.action_id,
                lease_id = %e.lease_id,
                observed_outcome = %e.outcome,
                receipt = %e.receipt,
                error = a.error.as_deref().unwrap_or(""),
                "journaled outcome refused: the action is no longer executing under that lease (recorded already, or swept to uncertain); dropped from the journal; operator: if `keyturnd uncertain` lists it, reconcile it with this observed outcome"
            );
        }
        _ => {
            ctx.metrics.replayed("refused");
            ctx.metrics.unrecorded.inc();
            tracing::error!(
                action_id = %e.action_id,
                lease_id = %e.lease_id,
                observed_outcome = %e.outcome,
                receipt = %e.receipt,
                error = a.error.as_deref().unwrap_or("no status"),
                "journaled outcome refused by the database; dropped from the journal; operator: reconcile the action with this observed outcome"
            );
        }
    }
}

/// Runs `call` until it succeeds, backing off while the database is
/// unreachable; a refusal that is not transient is retried too, loudly,
/// since skipping the replay would let the sweep make the outcomes
/// `uncertain`. `None`: shutdown came first.
async fn retrying<T, F, Fut>(shutdown: &CancellationToken, what: &str, mut call: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut backoff = BACKOFF_MIN;
    let mut logged = false;
    loop {
        let result = tokio::select! {
            _ = shutdown.cancelled() => return None,
            r = call() => r,
        };
        match result {
            Ok(v) => return Some(v),
            Err(e) if e.is_transient() && logged => {
                tracing::debug!(error = %e, what, "still failing")
            }
            Err(e) if e.is_transient() => {
                logged = true;
                tracing::warn!(error = %e, what, "cannot reach the database; retrying before dispatching anything");
            }
            Err(e) => {
                tracing::error!(error = %e, what, "the database refused the replay; retrying (nothing is dispatched until it succeeds)");
                logged = true;
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

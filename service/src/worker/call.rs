//! The call: one provider attempt for a job the database has committed
//! `executing`, bounded by the lease left (never by more than the configured
//! timeout); its outcome goes to the completion queue.
//!
//! **Attachments.** When the params may name files, the database says which
//! (`keyturn.attachments`), and their bytes are read here, after
//! `begin_dispatch` committed and before the provider is called, with
//! `keyturn.file_content` (the dispatcher's only way to them, and only while
//! the action is `executing` under this lease), checked against their
//! approved size and SHA-256, and handed to the provider in memory. If any
//! cannot be had, the provider is not called: a file the database does not
//! hold for the action, or metadata it cannot read (SQLSTATE class 22), is
//! `failed`; a refusal for the lease or status, a
//! lost connection, or reads slow enough to squeeze the call are `retry`
//! (nothing was sent; the attempt is counted). Only their number and total
//! size are logged.
//!
//! **Notifications.** For a notification provider the database's message
//! takes the place of the files: `keyturn.notification_message`, read at the
//! same point with the same bounds ([`read_message`]), never logged.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::completion::enqueue;
use super::{Ctx, Done, Slot};
use crate::classify::Outcome;
use crate::config::LEASE_SAFETY_MARGIN;
use crate::db::{self, LeasedJob};
use crate::error::Error;
use crate::providers::attachments::{self, Attachment, AttachmentMeta};
use crate::providers::notify::Message;
use crate::providers::{not_sent, BoxFuture, CallResult, Provider, NOT_SENT};

/// Extra time a provider gets past its own bound before the worker stops
/// waiting and records `unknown` (a provider that ignores its timeout).
const PROVIDER_GRACE: Duration = Duration::from_millis(500);

/// The provider call of a begun job; its outcome goes to the completion
/// queue.
#[tracing::instrument(
    name = "job",
    skip_all,
    fields(action_id = %job.action_id, tenant = %job.tenant, tool = %job.tool, provider = %job.provider, attempt = job.attempt)
)]
pub(super) async fn call_job(
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
    let provider = provider.as_ref();
    let prepared = if provider.notifies() {
        read_message(&ctx, &job, deadline)
            .await
            .map(|m| Payload::Message(Box::new(m)))
    } else {
        match read_attachments(&ctx, provider, &job, deadline).await {
            Ok(files) => match live_check(&ctx, provider, &job, deadline).await {
                Ok(true) => Ok(Payload::Files(files)),
                // The database invalidated the action: nothing to call,
                // nothing to record.
                Ok(false) => return,
                Err(result) => Err(result),
            },
            Err(result) => Err(result),
        }
    };
    let result = match prepared {
        Ok(payload) => {
            call_provider(&ctx, provider, deadline, |by| match &payload {
                Payload::Files(files) => provider.call(&job, files, by),
                Payload::Message(message) => provider.notify(&job, message, by),
            })
            .await
        }
        Err(result) => {
            ctx.metrics.action(result.outcome.word());
            result
        }
    };
    enqueue(&done, job, result, deadline, slot);
}

/// What a provider is given besides the job: an action's files, or a
/// notification's message.
enum Payload {
    Files(Vec<Attachment>),
    Message(Box<Message>),
}

/// A notification's message (`keyturn.notification_message`), read after
/// `begin_dispatch` committed, as attachments are: the database writes what
/// it says and mints its link code now. `Err` is the outcome to record
/// instead of sending: nothing to send after all (its action stopped
/// waiting since the begin) is `failed`, a message that cannot be read or
/// leaves too little of the lease `retry`; nothing was sent either way.
async fn read_message(
    ctx: &Ctx,
    job: &LeasedJob,
    deadline: Instant,
) -> Result<Message, CallResult> {
    let read = async {
        let client = ctx.pool.get().await.map_err(Error::from)?;
        db::notification_message(&client, ctx.route(&job.tenant), job.action_id, job.lease_id).await
    };
    let reads_by = deadline
        .checked_sub(LEASE_SAFETY_MARGIN)
        .unwrap_or_else(Instant::now);
    let message = match tokio::time::timeout_at(reads_by, read).await {
        Ok(Ok(message)) => message,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not read the notification's message; nothing sent, recording retry");
            return Err(not_sent(
                Outcome::Retry { after: None },
                "the notification's message could not be read; nothing sent",
            ));
        }
        Err(_) => return Err(too_slow()),
    };
    if !message.send {
        tracing::info!(
            reason = message.reason.as_deref().unwrap_or(""),
            "the notification has nothing to send any more; failed, nothing sent"
        );
        let mut result = not_sent(
            Outcome::Failed,
            "nothing to send: the action stopped waiting for the person",
        );
        result.receipt["reason"] = json!(message.reason);
        return Err(result);
    }
    // As for attachments: a call squeezed below half its timeout would read
    // a slow connect as a timeout after sending.
    if budget(ctx, deadline) < ctx.settings.call_timeout / 2 {
        return Err(too_slow());
    }
    Ok(message)
}

/// When the provider's call must have ended (and after which it may not
/// start): the lease deadline less the margin, at most the configured call
/// timeout from now. Monotonic, so a process paused meanwhile (SIGSTOP, a
/// stalled VM) finds it passed when it resumes.
fn call_by(ctx: &Ctx, deadline: Instant) -> Instant {
    let now = Instant::now();
    deadline
        .checked_sub(LEASE_SAFETY_MARGIN)
        .unwrap_or(now)
        .min(now + ctx.settings.call_timeout)
}

/// The provider's time left before [`call_by`].
fn budget(ctx: &Ctx, deadline: Instant) -> Duration {
    call_by(ctx, deadline).saturating_duration_since(Instant::now())
}

/// The files the job's params name, read and verified; `Err` is the outcome
/// to record instead of calling the provider.
async fn read_attachments(
    ctx: &Ctx,
    provider: &dyn Provider,
    job: &LeasedJob,
    deadline: Instant,
) -> Result<Vec<Attachment>, CallResult> {
    if !attachments::may_name_files(&job.params) {
        return Ok(Vec::new());
    }
    let reads = async {
        let client = ctx.pool.get().await.map_err(|e| unread(&e.into()))?;
        let listed = db::attachments(&client, ctx.route(&job.tenant), job.action_id, job.lease_id)
            .await
            .map_err(|e| unread(&e))?;
        if listed.is_empty() {
            return Ok(Vec::new());
        }
        if !provider.takes_attachments() {
            tracing::error!(
                attachments = listed.len(),
                "the action has attachments and this provider sends none; failed, provider not called"
            );
            return Err(not_sent(
                Outcome::Failed,
                "this provider does not send attachments",
            ));
        }
        let mut files = Vec::with_capacity(listed.len());
        for f in listed {
            let meta = AttachmentMeta {
                file_id: f.file_id,
                sha256: f.sha256,
                filename: f.filename,
                content_type: f.content_type,
                size: u64::try_from(f.size).unwrap_or(u64::MAX),
            };
            let bytes = db::file_content(
                &client,
                ctx.route(&job.tenant),
                job.action_id,
                job.lease_id,
                meta.file_id,
            )
            .await
            .map_err(|e| unread(&e))?;
            let file = Attachment::verified(f.param, meta, bytes).map_err(|m| {
                tracing::error!(file_id = %m.file_id, "attachment bytes differ from their approved size or SHA-256; failed, provider not called");
                not_sent(
                    Outcome::Failed,
                    "attachment bytes do not match their approved metadata; provider not called",
                )
            })?;
            files.push(file);
        }
        Ok(files)
    };
    // A slow read must not eat the lease the call needs.
    let reads_by = deadline
        .checked_sub(LEASE_SAFETY_MARGIN)
        .unwrap_or_else(Instant::now);
    let files = tokio::time::timeout_at(reads_by, reads)
        .await
        .unwrap_or_else(|_| Err(too_slow()))?;
    if files.is_empty() {
        return Ok(files);
    }
    // Below half the call timeout the webhook adapter's connect phase no
    // longer fits, and a slow connect would read as a timeout after sending
    // (`unknown`) instead of a refused one (`retry`).
    if budget(ctx, deadline) < ctx.settings.call_timeout / 2 {
        return Err(too_slow());
    }
    let (count, bytes) = attachments::totals(&files);
    tracing::info!(
        attachments = count,
        attachment_bytes = bytes,
        "attachments read; calling the provider"
    );
    Ok(files)
}

/// For a provider with something live to compare (the `mcp` provider's
/// upstream tool definition), the database's word on it, right before the
/// call: `Ok(true)` call, `Ok(false)` the action is invalidated (nothing is
/// sent), `Err` the outcome to record instead (nothing was sent).
async fn live_check(
    ctx: &Ctx,
    provider: &dyn Provider,
    job: &LeasedJob,
    deadline: Instant,
) -> Result<bool, CallResult> {
    let by = call_by(ctx, deadline);
    let Some(mut definition) = provider.live_definition(job, by).await? else {
        return Ok(true);
    };
    // No definition keyturn registered holds a NUL (U+0000), which jsonb
    // cannot store and whose error would quote the rest into the server log
    // (docs/security.md, row 131): one that does is another definition,
    // which the database is asked about as such.
    if keyturn_core::text::holds_nul(&definition) {
        definition = serde_json::json!({"keyturnd": "the live definition holds U+0000"});
    }
    let asked = async {
        let client = ctx.pool.get().await?;
        db::mcp::check_upstream_tool(
            &client,
            ctx.route(&job.tenant),
            job.action_id,
            job.lease_id,
            &definition,
        )
        .await
    };
    match tokio::time::timeout_at(by, asked).await {
        Ok(Ok(true)) => Ok(true),
        Ok(Ok(false)) => {
            tracing::warn!("the upstream's live tool definition is not the approved one: the action is invalidated, nothing sent");
            ctx.metrics.action("invalidated");
            ctx.metrics.mcp_call("upstream", "invalidated");
            Ok(false)
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not check the upstream's tool definition; nothing sent, recording retry");
            Err(not_sent(
                Outcome::Retry { after: None },
                "the upstream's tool definition could not be checked; provider not called",
            ))
        }
        Err(_) => Err(not_sent(
            Outcome::Retry { after: None },
            "checking the upstream's tool definition took the call's time; provider not called",
        )),
    }
}

fn too_slow() -> CallResult {
    tracing::warn!("reading the attachments left too little of the lease for the call; provider not called, recording retry");
    not_sent(
        Outcome::Retry { after: None },
        "attachments took too long to read; provider not called",
    )
}

/// The outcome of a `file_content` that failed: nothing was sent.
fn unread(e: &Error) -> CallResult {
    if db::is_missing_file(e) {
        tracing::error!(error = %e, "an attachment the params name is not stored for this action; failed, provider not called");
        return not_sent(
            Outcome::Failed,
            "an attachment is missing from storage; provider not called",
        );
    }
    // A data exception (class 22) reading the approved metadata is the
    // same answer on every attempt: a retry would only come back to it.
    if e.sqlstate().is_some_and(|c| c.code().starts_with("22")) {
        tracing::error!(error = %e, "the approved attachments' metadata cannot be read; failed, provider not called");
        return not_sent(
            Outcome::Failed,
            "the approved attachments' metadata cannot be read; provider not called",
        );
    }
    tracing::warn!(error = %e, "could not read the attachments; provider not called, recording retry");
    CallResult {
        outcome: Outcome::Retry { after: None },
        receipt: json!({
            "error": "attachments could not be read; provider not called",
            "sqlstate": e.sqlstate().map(|c| c.code()),
            NOT_SENT: false,
        }),
    }
}

/// One provider attempt, `call` given the instant it must end by, bounded,
/// timed and counted.
async fn call_provider<'a>(
    ctx: &Ctx,
    provider: &dyn Provider,
    deadline: Instant,
    call: impl FnOnce(Instant) -> BoxFuture<'a, CallResult>,
) -> CallResult {
    let by = call_by(ctx, deadline);
    let t0 = Instant::now();
    let _in_flight = ctx.calls_in_flight.enter();
    // The adapter checks `by` again immediately before its first byte.
    let call = call(by);
    let result = match tokio::time::timeout_at(by + PROVIDER_GRACE, call).await {
        Ok(result) => result,
        Err(_) => {
            tracing::error!(
                budget = ?by.saturating_duration_since(t0),
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
    if provider.name() == "mcp" {
        ctx.metrics.mcp_call("upstream", result.outcome.word());
    }
    result
}

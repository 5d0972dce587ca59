//! Whether notifications still arrive on the `LISTEN` connection.
//!
//! A `LISTEN` behind a transaction-mode pooler (PgBouncer with
//! `pool_mode = transaction`, Supavisor, RDS Proxy) succeeds and then hears
//! nothing: the pooler gives the server connection that ran it to other
//! clients, and the notifications go with it. Nothing fails, so nothing would
//! say so, and every wake-up would silently wait for the next poll.
//!
//! So every period keyturnd sends `pg_notify(<its channel>, <n>)` through the
//! pool, the way approvals notify, and expects `n` on the `LISTEN` connection
//! before the next heartbeat is due. A heartbeat that misses marks
//! notifications stalled (`keyturn_notify_stalled` 1, `/readyz` 503, one
//! warning saying what to do) until one arrives again. Polling goes on
//! throughout: a stall costs latency, never an action.
//!
//! The channel is this process's own, so heartbeats wake no other keyturnd.
//! Any role may `NOTIFY` it, which is harmless: a forged heartbeat can only
//! hide a stall, never dispatch anything.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use uuid::Uuid;

use super::Ctx;
use crate::db;
use crate::error::Error;

/// What the warning tells the operator; kept in one place so the log and
/// `/readyz` say the same.
const STALL_HINT: &str = "LISTEN behind a transaction-mode pooler? set \
    KEYTURN_LISTEN_DATABASE_URL to a direct connection";

/// One process's heartbeat: its channel, the highest heartbeat seen on the
/// `LISTEN` connection, and whether notifications count as stalled. It
/// outlives reconnections of the `LISTEN` connection, so a stall is
/// reported once, not once per connection.
pub(super) struct Heartbeat {
    channel: String,
    period: Duration,
    seen: watch::Sender<u64>,
    sent: AtomicU64,
    stalled: AtomicBool,
}

impl Heartbeat {
    pub(super) fn new(period: Duration) -> Arc<Self> {
        Arc::new(Heartbeat {
            // 19 + 32 characters: within PostgreSQL's 63 for a channel name,
            // and a plain identifier, so LISTEN needs no quoting.
            channel: format!("keyturnd_heartbeat_{}", Uuid::new_v4().simple()),
            period,
            seen: watch::Sender::new(0),
            sent: AtomicU64::new(0),
            stalled: AtomicBool::new(false),
        })
    }

    pub(super) fn channel(&self) -> &str {
        &self.channel
    }

    /// A notification on [`channel`](Self::channel) arrived. Only a number
    /// higher than any seen counts; anything else is ignored.
    pub(super) fn arrived(&self, payload: &str) {
        if let Ok(n) = payload.parse::<u64>() {
            self.seen.send_if_modified(|seen| {
                let newer = n > *seen;
                if newer {
                    *seen = n;
                }
                newer
            });
        }
    }

    /// Sends a heartbeat every period and judges each one, for as long as
    /// the `LISTEN` connection lives (the caller drops this future with it).
    pub(super) async fn beat(&self, ctx: &Ctx) -> Infallible {
        let mut ticker = tokio::time::interval(self.period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen = self.seen.subscribe();
        loop {
            ticker.tick().await;
            let n = self.sent.fetch_add(1, Ordering::Relaxed) + 1;
            if let Err(e) = send(ctx, &self.channel, n).await {
                // The pool's trouble is leasing's to report; without a sent
                // heartbeat there is nothing to judge.
                ctx.metrics.heartbeat("unsent");
                tracing::debug!(error = %e, "heartbeat NOTIFY not sent");
                continue;
            }
            let arrived = tokio::time::timeout(self.period, seen.wait_for(|&s| s >= n)).await;
            if matches!(arrived, Ok(Ok(_))) {
                ctx.metrics.heartbeat("received");
                self.set_stalled(ctx, false);
            } else {
                ctx.metrics.heartbeat("missed");
                self.set_stalled(ctx, true);
            }
        }
    }

    fn set_stalled(&self, ctx: &Ctx, stalled: bool) {
        if self.stalled.swap(stalled, Ordering::AcqRel) == stalled {
            return;
        }
        ctx.health.set_notify_stalled(stalled);
        ctx.metrics.notify_stalled.set(i64::from(stalled));
        if stalled {
            tracing::warn!(
                bound_seconds = self.period.as_secs_f64(),
                poll_ms = u64::try_from(ctx.settings.poll.as_millis()).unwrap_or(u64::MAX),
                "notifications stalled: a heartbeat NOTIFY sent through the pool did not reach \
                 the LISTEN connection in time, so wake-ups now wait for the next poll. \
                 {STALL_HINT}"
            );
        } else {
            tracing::info!("notifications arrive on the LISTEN connection again");
        }
    }
}

async fn send(ctx: &Ctx, channel: &str, n: u64) -> Result<(), Error> {
    let client = ctx.pool.get().await?;
    db::notify(&client, channel, &n.to_string()).await
}

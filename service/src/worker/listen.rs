//! The `LISTEN keyturn_dispatch` connection: it wakes the lease loop as soon
//! as an approval notifies, and drives readiness (`/readyz`). It is a
//! connection of its own, outside the pool, because a `LISTEN` lasts only as
//! long as its session and notifications arrive only while the connection is
//! polled. Losing it costs latency, never correctness: the loop still polls
//! every `KEYTURN_POLL_MS`, so it is reconnected with a short capped backoff
//! ([`RECONNECT_MAX`]), and each (re)connect wakes the loop once to catch up
//! on what was notified while nobody listened.
//!
//! **A notification is a wake-up, nothing more.** Any role may `LISTEN
//! keyturn_dispatch`, so keyturn sends no action in the payload (it may be
//! empty or opaque), and keyturnd never reads it: what to do is always
//! asked of the database with `keyturn.lease`. A notification with any
//! payload, or none, wakes the loop the same way.
//!
//! It is the one connection opened with `KEYTURN_LISTEN_DATABASE_URL`
//! (default `DATABASE_URL`): a transaction-mode pooler cannot keep a
//! `LISTEN`, so behind one it must reach PostgreSQL directly. Whether it
//! still hears anything is [`super::heartbeat`]'s question; its own channel
//! is listened to here, and its notifications never wake the loop.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use super::heartbeat::Heartbeat;
use super::{Ctx, BACKOFF_MIN, CHANNEL};
use crate::db;
use crate::error::Error;

/// Cap of the LISTEN reconnect backoff: one connection, cheap to retry,
/// and readiness waits on it.
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// Keeps one connection in `LISTEN keyturn_dispatch`, reconnecting with
/// backoff, and drives readiness from it.
pub(super) async fn listen_loop(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let mut backoff = BACKOFF_MIN;
    let mut connected_before = false;
    let mut failing_logged = false;
    let heartbeat = ctx.settings.notify_heartbeat.map(Heartbeat::new);
    loop {
        if shutdown.is_cancelled() {
            break;
        }
        // Cancellable, so a database that does not answer cannot hold up
        // shutdown; dropping the future drops (closes) the connection.
        let ended = tokio::select! {
            _ = shutdown.cancelled() => Ok(()),
            ended = listen_once(&ctx, &shutdown, &mut connected_before, heartbeat.as_ref()) => ended,
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
    heartbeat: Option<&Arc<Heartbeat>>,
) -> Result<(), Error> {
    let pg = db::pg_config(ctx.settings.listen_database_url.expose())?;
    let (client, mut connection) =
        tokio::time::timeout(db::STATEMENT_TIMEOUT, pg.connect(tokio_postgres::NoTls))
            .await
            .map_err(|_| Error::DbTimeout(db::STATEMENT_TIMEOUT))??;
    // The connection has to be polled for anything to happen on it, the
    // LISTEN itself included; notifications arrive through the same poll.
    let notify_ctx = ctx.clone();
    let beats = heartbeat.cloned();
    let mut driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            if let AsyncMessage::Notification(n) = message? {
                if let Some(beats) = beats.as_ref().filter(|b| n.channel() == b.channel()) {
                    beats.arrived(n.payload());
                    continue;
                }
                tracing::debug!(
                    channel = n.channel(),
                    payload_bytes = n.payload().len(),
                    "woken by notification"
                );
                notify_ctx.wake.notify_one();
            }
        }
        Ok::<(), tokio_postgres::Error>(())
    });
    let heartbeat_channel = heartbeat.as_ref().map(|beats| beats.channel().to_owned());
    let channels: Vec<&str> = std::iter::once(CHANNEL)
        .chain(heartbeat_channel.as_deref())
        .collect();
    start_listening(&client, &channels, &driver).await?;
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

    let beating = async {
        match heartbeat {
            Some(beats) => beats.beat(ctx).await,
            None => std::future::pending().await,
        }
    };
    let ended = tokio::select! {
        _ = shutdown.cancelled() => {
            driver.abort();
            return Ok(());
        }
        ended = &mut driver => ended,
        never = beating => match never {},
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

/// `LISTEN`s on `channels` on a connection whose messages `driver` polls;
/// on failure or timeout stops the driver (closing the connection).
async fn start_listening<T>(
    client: &tokio_postgres::Client,
    channels: &[&str],
    driver: &tokio::task::JoinHandle<T>,
) -> Result<(), Error> {
    let listened = db::listen(client, channels).await;
    if listened.is_err() {
        driver.abort();
    }
    listened
}

/// When dispatching by tenant, one more `LISTEN keyturn_dispatch`
/// connection per other node (`keyturn.dispatch_nodes()`): an approval that
/// Citus ran on the tenant's worker notifies there, and a notification is
/// heard only on the node that sent it. Wake-ups only: readiness and the
/// heartbeat stay with the main `LISTEN` connection, and losing this one
/// costs latency (the loop still polls), never an action. It connects as
/// `KEYTURN_LISTEN_DATABASE_URL` does, to that node's host and port.
pub(super) async fn node_listen_loop(
    ctx: Arc<Ctx>,
    host: String,
    port: u16,
    shutdown: CancellationToken,
) {
    let mut backoff = BACKOFF_MIN;
    let mut connected_before = false;
    let mut failing_logged = false;
    loop {
        let ended = tokio::select! {
            _ = shutdown.cancelled() => break,
            ended = listen_node_once(&ctx, &host, port, &mut connected_before) => ended,
        };
        match ended {
            Ok(()) => break,
            Err(e) if !failing_logged => {
                failing_logged = true;
                tracing::warn!(error = %e, node = %format!("{host}:{port}"), "LISTEN connection to a worker lost or unavailable; its wake-ups wait for the poll; reconnecting");
            }
            Err(e) => {
                tracing::debug!(error = %e, node = %format!("{host}:{port}"), "LISTEN connection to a worker still unavailable")
            }
        }
        if connected_before {
            backoff = BACKOFF_MIN;
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RECONNECT_MAX);
    }
}

/// The connection settings of the `LISTEN` connection, at another node.
fn node_config(base: &tokio_postgres::Config, host: &str, port: u16) -> tokio_postgres::Config {
    let mut pg = tokio_postgres::Config::new();
    if let Some(user) = base.get_user() {
        pg.user(user);
    }
    if let Some(password) = base.get_password() {
        pg.password(password);
    }
    if let Some(dbname) = base.get_dbname() {
        pg.dbname(dbname);
    }
    if let Some(options) = base.get_options() {
        pg.options(options);
    }
    pg.application_name(base.get_application_name().unwrap_or("keyturnd"));
    if let Some(timeout) = base.get_connect_timeout() {
        pg.connect_timeout(*timeout);
    }
    pg.keepalives(true)
        .keepalives_idle(base.get_keepalives_idle())
        .host(host)
        .port(port);
    pg
}

/// One worker's `LISTEN` connection: connect, listen, wake the loop on each
/// notification until the connection ends (an error).
async fn listen_node_once(
    ctx: &Arc<Ctx>,
    host: &str,
    port: u16,
    connected_before: &mut bool,
) -> Result<(), Error> {
    let pg = node_config(
        &db::pg_config(ctx.settings.listen_database_url.expose())?,
        host,
        port,
    );
    let (client, mut connection) =
        tokio::time::timeout(db::STATEMENT_TIMEOUT, pg.connect(tokio_postgres::NoTls))
            .await
            .map_err(|_| Error::DbTimeout(db::STATEMENT_TIMEOUT))??;
    let notify_ctx = ctx.clone();
    let node = format!("{host}:{port}");
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            if let AsyncMessage::Notification(n) = message? {
                if n.channel() == CHANNEL {
                    tracing::debug!(%node, "woken by a worker's notification");
                    notify_ctx.wake.notify_one();
                }
            }
        }
        Ok::<(), tokio_postgres::Error>(())
    });
    start_listening(&client, &[CHANNEL], &driver).await?;
    if *connected_before {
        ctx.metrics.reconnect("listen");
        tracing::info!(node = %format!("{host}:{port}"), "LISTEN connection to a worker re-established");
    } else {
        tracing::info!(node = %format!("{host}:{port}"), channel = CHANNEL, "listening on a worker");
    }
    *connected_before = true;
    // What was notified there while nobody listened.
    ctx.wake.notify_one();
    let ended = driver.await;
    drop(client);
    match ended {
        Ok(Ok(())) | Err(_) => Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "LISTEN connection to a worker closed",
        ))),
        Ok(Err(e)) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::node_config;

    #[test]
    fn test_a_node_is_reached_as_the_listen_connection_at_its_own_address() {
        let base = tokio_postgres::Config::from_str(
            "postgres://app_dispatcher:s3cret@coordinator.internal:6432/keyturn?application_name=kt&options=-c%20x%3D1",
        )
        .expect("a url");
        let pg = node_config(&base, "10.0.0.7", 5433);
        assert_eq!(pg.get_user(), Some("app_dispatcher"));
        assert_eq!(pg.get_password(), Some(&b"s3cret"[..]));
        assert_eq!(pg.get_dbname(), Some("keyturn"));
        assert_eq!(pg.get_application_name(), Some("kt"));
        assert_eq!(pg.get_options(), Some("-c x=1"));
        assert_eq!(
            pg.get_hosts(),
            &[tokio_postgres::config::Host::Tcp("10.0.0.7".into())]
        );
        assert_eq!(pg.get_ports(), &[5433]);
    }
}

//! Signal handling: SIGTERM or SIGINT starts a graceful shutdown.
//!
//! The handlers are installed synchronously at start-up (before the HTTP
//! listener answers), so a signal sent as soon as `/healthz` says 200 is
//! never lost to the default action, which would kill the process mid-call.
//!
//! On the signal: `/readyz` turns 503 and the shared [`CancellationToken`]
//! fires; the dispatcher stops leasing, hands back jobs it has not begun,
//! waits for calls in flight, and only then does the HTTP server stop.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::state::Health;

/// Installed signal handlers.
pub struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the SIGTERM and SIGINT handlers. Needs a Tokio runtime.
    pub fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Signals {})
        }
    }

    /// Waits for the first signal and returns its name.
    pub async fn recv(mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => "SIGTERM",
                _ = self.int.recv() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = &mut self;
            match tokio::signal::ctrl_c().await {
                Ok(()) => "ctrl-c",
                Err(_) => std::future::pending().await,
            }
        }
    }

    /// Spawns the task that turns the first signal into a shutdown.
    pub fn spawn(self, shutdown: CancellationToken, health: Arc<Health>) {
        tokio::spawn(async move {
            let which = tokio::select! {
                which = self.recv() => which,
                // Shut down for another reason (a fatal error): stop waiting.
                _ = shutdown.cancelled() => return,
            };
            tracing::info!(
                signal = which,
                "shutting down: readyz is 503, no new leases, draining calls in flight"
            );
            health.set_shutting_down();
            shutdown.cancel();
        });
    }
}

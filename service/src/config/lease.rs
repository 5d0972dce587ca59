//! The bounds a lease puts on a provider call, which the settings are
//! checked against ([`super::Config::validate`]) and the worker keeps to.

use std::time::Duration;

/// Time kept free at the end of every lease: a provider call must end this
/// long before the lease does, so that `complete` reaches the database before
/// the sweep can call the action `uncertain`.
pub const LEASE_SAFETY_MARGIN: Duration = Duration::from_secs(2);

/// What the lease round trip may take out of a lease before its jobs are
/// checked. The worker's deadline runs from before it asks for the lease, so
/// by the time a job is checked the pool, `BEGIN` and `keyturn.lease` have
/// already used some of it; a lease with no room for that would hand back
/// every job it got.
pub const LEASE_ROUND_TRIP_SLACK: Duration = Duration::from_secs(1);

/// Whether a leased job with `left` of its lease may be begun: a whole call
/// and the [`LEASE_SAFETY_MARGIN`] must fit.
pub fn enough_lease_left(left: Duration, call_timeout: Duration) -> bool {
    left >= call_timeout + LEASE_SAFETY_MARGIN
}

/// The shortest lease accepted: what [`enough_lease_left`] wants plus the
/// [`LEASE_ROUND_TRIP_SLACK`]. So every accepted configuration dispatches
/// whenever a lease round trip takes less than the slack; one that takes
/// longer is handed back with a growing delay, never in a loop.
pub fn min_lease(call_timeout: Duration) -> Duration {
    call_timeout + LEASE_SAFETY_MARGIN + LEASE_ROUND_TRIP_SLACK
}

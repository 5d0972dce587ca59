//! Backend state that must not outlive a transaction (the acting role, a
//! business statement under way) is forgotten when every transaction ends,
//! committed or aborted, whatever path the code took.

use pgrx::pg_sys;

use crate::{actor, privilege};

/// Registers the callback; once per backend, from `_PG_init`.
pub fn register() {
    // SAFETY: registering a plain function pointer with no argument.
    unsafe { pg_sys::RegisterXactCallback(Some(at_end), std::ptr::null_mut()) }
}

unsafe extern "C-unwind" fn at_end(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    if matches!(
        event,
        XACT_EVENT_COMMIT
            | XACT_EVENT_ABORT
            | XACT_EVENT_PREPARE
            | XACT_EVENT_PARALLEL_COMMIT
            | XACT_EVENT_PARALLEL_ABORT
    ) {
        actor::clear();
        privilege::reset_business();
    }
}

//! Switching the effective role, the way PostgreSQL's own SECURITY DEFINER
//! machinery and RI triggers do (SetUserIdAndSecContext).
//!
//! Why not SECURITY DEFINER functions: approve must (a) see `current_user` as the
//! caller to enforce separation of duties, (b) write keyturn tables, which only
//! the extension owner may, and (c) run the business UPDATE as the caller again,
//! under the caller's row-level security. PostgreSQL forbids SET ROLE inside a
//! SECURITY DEFINER function, so the gate functions are SECURITY INVOKER and
//! switch explicitly, for exactly as long as needed, restoring on every exit
//! path (including errors, which unwind through `RoleSwitch::drop`).

use pgrx::prelude::*;

use crate::error::KeyturnError;

/// The effective role for the lifetime of this value; the previous one on drop.
pub struct RoleSwitch {
    saved_user: pg_sys::Oid,
    saved_context: i32,
}

impl RoleSwitch {
    pub fn to(role: pg_sys::Oid) -> Self {
        let mut saved_user = pg_sys::Oid::INVALID;
        let mut saved_context = 0;
        // SAFETY: plain reads and writes of the backend's current-user state;
        // SECURITY_LOCAL_USERID_CHANGE makes PostgreSQL refuse SET ROLE and
        // SET SESSION AUTHORIZATION until we switch back.
        unsafe {
            pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
            pg_sys::SetUserIdAndSecContext(
                role,
                saved_context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
            );
        }
        RoleSwitch {
            saved_user,
            saved_context,
        }
    }
}

impl Drop for RoleSwitch {
    fn drop(&mut self) {
        // SAFETY: restores exactly what `to` saved.
        unsafe { pg_sys::SetUserIdAndSecContext(self.saved_user, self.saved_context) }
    }
}

/// `current_user`: the role this function was called as.
pub fn current_user() -> pg_sys::Oid {
    // SAFETY: reads backend state.
    unsafe { pg_sys::GetUserId() }
}

/// The role in effect after SET ROLE (or the session user): unlike
/// `current_user`, it is not changed by SECURITY DEFINER functions, so an
/// application wrapper cannot hide the agent role behind its own.
pub fn outer_user() -> pg_sys::Oid {
    // SAFETY: reads backend state.
    unsafe { pg_sys::GetOuterUserId() }
}

thread_local! {
    // (extension oid, its owner), per backend: the owner only changes when the
    // extension is dropped and created again, which changes its oid too.
    static OWNER: std::cell::Cell<Option<(pg_sys::Oid, pg_sys::Oid)>> = const { std::cell::Cell::new(None) };
}

/// The owner of pg_keyturn: the role keyturn's own writes run as.
pub fn extension_owner() -> pg_sys::Oid {
    // SAFETY: a catalog lookup that returns InvalidOid when missing.
    let extension = unsafe { pg_sys::get_extension_oid(c"pg_keyturn".as_ptr(), true) };
    if extension == pg_sys::Oid::INVALID {
        KeyturnError::NotReady("the pg_keyturn extension is not installed in this database".into())
            .raise();
    }
    if let Some((cached, owner)) = OWNER.get() {
        if cached == extension {
            return owner;
        }
    }
    let owner = Spi::get_one_with_args::<pg_sys::Oid>(
        "SELECT extowner FROM pg_catalog.pg_extension WHERE oid = $1",
        &[extension.into()],
    );
    match owner {
        Ok(Some(owner)) => {
            OWNER.set(Some((extension, owner)));
            owner
        }
        _ => KeyturnError::NotReady("the pg_keyturn extension row is missing".into()).raise(),
    }
}

/// Separation of duties (docs/sql-api.md): a caller whose `current_user` or outer
/// role is a member of keyturn_agent never approves, previews or rejects.
/// Superusers are members of every role, so they are refused too.
pub fn refuse_agents(what: &str) {
    // SAFETY: get_role_oid with missing_ok returns InvalidOid instead of raising.
    let agent = unsafe { pg_sys::get_role_oid(c"keyturn_agent".as_ptr(), true) };
    for (label, role) in [
        ("current_user", current_user()),
        ("the outer role", outer_user()),
    ] {
        // A missing keyturn_agent role means a broken install: fail closed.
        // SAFETY: is_member_of_role only reads the catalog cache.
        if agent == pg_sys::Oid::INVALID || unsafe { pg_sys::is_member_of_role(role, agent) } {
            KeyturnError::Forbidden {
                message: format!(
                    "{label} is a member of keyturn_agent (or a superuser) and may not {what}"
                ),
                hint: "Separation of duties: the process that proposes never approves. Call from a role that is not in keyturn_agent.",
            }
            .raise();
        }
    }
}

/// Refuses roles that would not be bound by row-level security.
pub fn refuse_rls_bypass(role: pg_sys::Oid) {
    // SAFETY: catalog lookups only.
    let bypasses = unsafe { pg_sys::superuser_arg(role) || pg_sys::has_bypassrls_privilege(role) };
    if bypasses {
        KeyturnError::Forbidden {
            message: "this role bypasses row-level security; keyturn runs business reads and writes only under RLS".into(),
            hint: "Use a role without SUPERUSER or BYPASSRLS.",
        }
        .raise();
    }
}

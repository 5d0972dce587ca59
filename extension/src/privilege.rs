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
    business: bool,
    /// The GUC nest level of a search_path pinned for the owner's statements.
    pinned_path: Option<i32>,
}

/// The search_path keyturn's own statements run under, as its SECURITY
/// DEFINER functions pin it.
const PINNED_PATH: &std::ffi::CStr = c"pg_catalog, pg_temp";

thread_local! {
    // How many business statements (run as a caller through `_exec_as`) are
    // under way in this backend. While one runs, every gate function refuses:
    // a trigger on a gated table must not approve, propose or dispatch
    // anything in the approver's name.
    static IN_BUSINESS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    // Whether a keyturn entry point ran in this transaction (each passes
    // refuse_inside_business_statement first): such a transaction is never
    // prepared (crate::xact).
    static ENTERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl RoleSwitch {
    /// Elevates to `role` (the extension owner) for keyturn's own statements,
    /// under `search_path = pg_catalog, pg_temp`. The caller's path must not
    /// reach them: the row triggers and the commit run in the caller's
    /// session, where a temporary type named like one a statement names, or
    /// an operator in a schema put before pg_catalog, would otherwise run
    /// the caller's code as the owner (red-team finding, docs/security.md).
    /// Inside keyturn's functions, which pin the same path, nothing is set.
    pub fn to(role: pg_sys::Oid) -> Self {
        let mut switch = Self::switch(role, pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32, false);
        switch.pinned_path = pin_search_path();
        switch
    }

    /// Drops to the caller's `role` for a business statement: as PostgreSQL
    /// does for maintenance commands, the statement is a security-restricted
    /// operation (no SET ROLE, no temporary objects, no session changes),
    /// and keyturn's gate functions refuse until it ends.
    pub fn to_caller(role: pg_sys::Oid) -> Self {
        Self::switch(
            role,
            (pg_sys::SECURITY_LOCAL_USERID_CHANGE | pg_sys::SECURITY_RESTRICTED_OPERATION) as i32,
            true,
        )
    }

    fn switch(role: pg_sys::Oid, flags: i32, business: bool) -> Self {
        let mut saved_user = pg_sys::Oid::INVALID;
        let mut saved_context = 0;
        // SAFETY: plain reads and writes of the backend's current-user state;
        // SECURITY_LOCAL_USERID_CHANGE makes PostgreSQL refuse SET ROLE and
        // SET SESSION AUTHORIZATION until we switch back.
        unsafe {
            pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
            pg_sys::SetUserIdAndSecContext(role, saved_context | flags);
        }
        if business {
            IN_BUSINESS.set(IN_BUSINESS.get() + 1);
        }
        RoleSwitch {
            saved_user,
            saved_context,
            business,
            pinned_path: None,
        }
    }
}

/// Sets search_path to PINNED_PATH (crate::guc::set_for_now) unless it is
/// that already; the level to restore, if one was pushed.
fn pin_search_path() -> Option<i32> {
    // SAFETY: namespace_search_path is the GUC's NUL-terminated value, or
    // NULL before the GUCs exist.
    let current = unsafe { pg_sys::namespace_search_path };
    // SAFETY: as above; read before anything can change it.
    if !current.is_null() && unsafe { std::ffi::CStr::from_ptr(current) } == PINNED_PATH {
        return None;
    }
    Some(crate::guc::set_for_now(c"search_path", PINNED_PATH))
}

impl Drop for RoleSwitch {
    fn drop(&mut self) {
        if self.business {
            IN_BUSINESS.set(IN_BUSINESS.get().saturating_sub(1));
        }
        // The path pinned is put back, unless an error is unwinding, whose
        // abort pops it.
        if let Some(level) = self.pinned_path {
            if !std::thread::panicking() {
                crate::guc::restore(level);
            }
        }
        // SAFETY: restores exactly what `switch` saved.
        unsafe { pg_sys::SetUserIdAndSecContext(self.saved_user, self.saved_context) }
    }
}

/// At the end of every transaction: forgets any business statement (an
/// aborted transaction may have left the count behind if an error skipped a
/// drop) and that keyturn was entered.
pub fn reset_business() {
    let _ = IN_BUSINESS.try_with(|n| n.set(0));
    let _ = ENTERED.try_with(|e| e.set(false));
}

/// Whether a keyturn entry point ran in this transaction.
pub fn entered() -> bool {
    ENTERED.try_with(std::cell::Cell::get).unwrap_or(false)
}

/// Refuses (42501) while a business statement runs as a caller: a trigger, a
/// default or a policy function on a gated table reaching back into keyturn.
/// Every entry point of keyturn's asks first, so it also notes that keyturn
/// was entered in this transaction.
pub fn refuse_inside_business_statement(what: &str) {
    ENTERED.set(true);
    if IN_BUSINESS.get() > 0 {
        KeyturnError::Forbidden {
            message: format!("{what} cannot be called while an approved business statement runs"),
            hint: "Code that runs inside an approved write (a trigger, a default, a policy) may not reach keyturn's gate; keyturn calls are refused until the statement ends.",
        }
        .raise();
    }
}

/// `keyturn._refuse_nested(what)`: the check above, for keyturn's SQL entry points.
#[pgrx::pg_extern(name = "_refuse_nested", volatile, parallel_unsafe)]
fn refuse_nested(what: &str) {
    refuse_inside_business_statement(what);
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
    // (installation, its owner), per backend: the owner only changes when the
    // extension is dropped and created again, which makes a new installation.
    static OWNER: std::cell::Cell<Option<(pg_sys::Oid, pg_sys::Oid)>> = const { std::cell::Cell::new(None) };
}

/// The installation of pg_keyturn this backend sees, as the key of what it
/// keeps per backend (the owner, the approval key): the oid of
/// `keyturn.action`, which a DROP and CREATE EXTENSION makes anew; None
/// while there is none. Two syscache lookups, where `get_extension_oid`
/// scans `pg_extension` (it has no syscache) under a lock: asked three times
/// a dispatched action, that scan was 3.5 % of the database's CPU in a drain
/// (tests/bench/BENCHMARKS.md, section 22).
pub fn installation() -> Option<pg_sys::Oid> {
    keyturn_relid(c"action")
}

/// The OID of keyturn's relation `name` (schema keyturn), or None while
/// there is none: two syscache lookups.
pub fn keyturn_relid(name: &std::ffi::CStr) -> Option<pg_sys::Oid> {
    // SAFETY: syscache lookups that return InvalidOid when missing.
    let oid = unsafe {
        let schema = pg_sys::get_namespace_oid(c"keyturn".as_ptr(), true);
        if schema == pg_sys::Oid::INVALID {
            return None;
        }
        pg_sys::get_relname_relid(name.as_ptr(), schema)
    };
    (oid != pg_sys::Oid::INVALID).then_some(oid)
}

/// The owner of pg_keyturn: the role keyturn's own writes run as.
pub fn extension_owner() -> pg_sys::Oid {
    let installation = installation();
    if let (Some(installation), Some((cached, owner))) = (installation, OWNER.get()) {
        if cached == installation {
            return owner;
        }
    }
    // SAFETY: a catalog lookup that returns InvalidOid when missing.
    let extension = unsafe { pg_sys::get_extension_oid(c"pg_keyturn".as_ptr(), true) };
    if extension == pg_sys::Oid::INVALID {
        KeyturnError::NotReady("the pg_keyturn extension is not installed in this database".into())
            .raise();
    }
    let owner = Spi::get_one_with_args::<pg_sys::Oid>(
        "SELECT extowner FROM pg_catalog.pg_extension WHERE oid OPERATOR(pg_catalog.=) $1",
        &[extension.into()],
    );
    match owner {
        Ok(Some(owner)) => {
            OWNER.set(installation.map(|i| (i, owner)));
            owner
        }
        _ => KeyturnError::NotReady("the pg_keyturn extension row is missing".into()).raise(),
    }
}

/// Separation of duties (docs/sql-api.md): the process that proposes never
/// approves. Refused when `current_user`, or the outer role (the one in
/// effect after SET ROLE, which an application SECURITY DEFINER wrapper does
/// not hide), is a member of keyturn_agent, and when the session's login
/// has the privileges of keyturn_agent (an inheriting member): such a login
/// proposes, `SET ROLE`s into an approver role and approves. A login that
/// serves both sides (a PostgREST authenticator) must be NOINHERIT.
/// Superusers are members of every role, so they are refused too.
pub fn refuse_agents(what: &str) {
    refuse_inside_business_statement(what);
    let agent = agent_role();
    let refused = |label: &str| -> ! {
        KeyturnError::Forbidden {
            message: format!(
                "{label} is a member of keyturn_agent (or a superuser) and may not {what}"
            ),
            hint: "Separation of duties: the process that proposes never approves. Call from a role that is not in keyturn_agent; a login that switches to both sides (a PostgREST authenticator) must be NOINHERIT.",
        }
        .raise()
    };
    for (label, role) in [
        ("current_user", current_user()),
        ("the outer role", outer_user()),
    ] {
        if is_agent(role, agent) {
            refused(label);
        }
    }
    // SAFETY: GetSessionUserId reads backend state; has_privs_of_role reads the catalog cache.
    if unsafe { pg_sys::has_privs_of_role(pg_sys::GetSessionUserId(), agent) } {
        refused("the session's login role (it inherits keyturn_agent)");
    }
}

/// Whether the outer role (the one in effect after SET ROLE, which no
/// SECURITY DEFINER function changes) is an agent's: what an event's
/// detail may not take from a setting an agent can make.
pub fn outer_is_agent() -> bool {
    is_agent(outer_user(), agent_role())
}

/// The owner of relation `relid` and whether it has partitions or
/// inheritance children (`relhassubclass`, which may stay set after they
/// are gone); None for an oid that names no relation. A syscache lookup.
fn owner_and_children(relid: pg_sys::Oid) -> Option<(pg_sys::Oid, bool)> {
    // SAFETY: a syscache lookup, null for an oid that names no relation,
    // released before anything else runs.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::RELOID as _,
            pg_sys::Datum::from(relid),
        );
        if tuple.is_null() {
            return None;
        }
        let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_class>(tuple);
        let found = ((*form).relowner, (*form).relhassubclass);
        pg_sys::ReleaseSysCache(tuple);
        Some(found)
    }
}

/// Whether the owner of relation `relid` is an agent's role (a member of
/// keyturn_agent that is no superuser). Such an owner's triggers run inside
/// an approved write, as the approver, and it reads past row-level security;
/// and a table put in the place of a registered one (its schema's owner may
/// drop and create tables there) is its creator's (thirty-third red-team
/// pass, docs/security.md row 143). False for an oid that names nothing.
pub fn owned_by_agent(relid: pg_sys::Oid) -> bool {
    owner_and_children(relid).is_some_and(|(owner, _)| is_agent_role(owner))
}

/// Whether `role` is an agent's role: a member of keyturn_agent that is no
/// superuser (a superuser is a member of every role). What an agent's role
/// may own or do is decided by this one definition, in Rust and in SQL
/// (`keyturn._is_agent_role`: register_tool's and check_deployment's checks).
pub fn is_agent_role(role: pg_sys::Oid) -> bool {
    // SAFETY: catalog lookups only.
    !unsafe { pg_sys::superuser_arg(role) } && is_agent(role, agent_role())
}

/// [`is_agent_role`] for SQL.
#[pgrx::pg_extern(name = "_is_agent_role", stable, strict, parallel_safe)]
pub fn is_agent_role_sql(role: pg_sys::Oid) -> bool {
    is_agent_role(role)
}

/// `keyturn._owned_by_agent(relid)`: [`owned_by_agent`], for the
/// partitions and children of a tool's table (keyturn._tool_table).
#[pgrx::pg_extern(name = "_owned_by_agent", stable, strict, parallel_safe)]
fn owned_by_agent_sql(relid: pg_sys::Oid) -> bool {
    owned_by_agent(relid)
}

/// `keyturn._has_children(relid)`: whether the relation may have partitions
/// or inheritance children, read from the catalog cache, so that a tool's
/// table without any costs no scan of `pg_inherits`.
#[pgrx::pg_extern(name = "_has_children", stable, strict, parallel_safe)]
fn has_children(relid: pg_sys::Oid) -> bool {
    owner_and_children(relid).is_some_and(|(_, children)| children)
}

/// `keyturn_agent`'s oid; InvalidOid when the role is missing.
fn agent_role() -> pg_sys::Oid {
    // SAFETY: get_role_oid with missing_ok returns InvalidOid instead of raising.
    unsafe { pg_sys::get_role_oid(c"keyturn_agent".as_ptr(), true) }
}

/// Whether `role` is a member of `agent` (a missing keyturn_agent, a broken
/// install, counts as yes: fail closed; superusers are members of every
/// role).
fn is_agent(role: pg_sys::Oid, agent: pg_sys::Oid) -> bool {
    // SAFETY: is_member_of_role only reads the catalog cache.
    agent == pg_sys::Oid::INVALID || unsafe { pg_sys::is_member_of_role(role, agent) }
}

/// `keyturn._refuse_rls_bypass(role)`: the check below, for approve to make
/// before the claim (inside the business write it would be an outcome).
/// Returns '', so that plpgsql assigns it rather than PERFORM a statement.
#[pgrx::pg_extern(name = "_refuse_rls_bypass", stable, strict, parallel_safe)]
fn refuse_rls_bypass_sql(role: pg_sys::Oid) -> String {
    refuse_rls_bypass(role);
    String::new()
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

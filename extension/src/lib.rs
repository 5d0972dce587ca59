//! pg_keyturn: a human-approval gate for AI-agent writes, enforced inside PostgreSQL.
//!
//! This file is the table of contents. The data model, the state machine and the
//! privileges are hand-written SQL under `sql/` (read them in file order); the
//! Rust modules below are the mechanisms SQL cannot do well or safely.

::pgrx::pg_module_magic!(name, version);

/// Runs once per backend, when the library is loaded.
#[pgrx::pg_guard]
pub extern "C-unwind" fn _PG_init() {
    error::keep_backtraces_out();
    guc::register();
    xact::register();
    durable::register();
    route_guard::register();
}

mod error;
mod jsonb_text;

mod actor; // who is acting, for the audit log: backend state, never a setting
mod approval; // the approval binding: MAC under a key only the owner reads
mod args; // arguments checked before anything is read: names, lease's, a batch's
mod audit; // the audit events of a transaction, written into their tenant's hash chain at commit
mod canonical; // canonical_json, params_hash (RFC 8785 + SHA-256), written values
mod citus; // whether Citus is here; identity re-asserted for its workers before a business statement
mod committed; // admission on committed data under every isolation level; the commit's recheck
mod durable; // a commit that wrote events: its chains released at its commit record, COMMIT returned at its flush
mod exec_as; // _exec_as: run a statement as the caller, under RLS
mod fence; // fence: projected, neutralized, marked reference blocks
mod form; // an sql tool's form: what is wrong with it for the tool's columns
mod gate; // propose and the person's calls: separation of duties + owner elevation
mod guc; // keyturn's settings; how long a setting's value lasts
mod identity; // current_tenant, current_principal, current_session
mod ids; // time-ordered action and notification ids
mod lifecycle; // the action row triggers: the status guard, the lifecycle side effects
mod loose_type; // an sql tool's values read in its columns' types without their sizes, so none is cut or rounded
mod mcp; // tools discovered on upstream MCP servers: kind (fail closed), params schema, definition hash
mod plans; // SPI plans kept per backend
mod privilege; // switching between the caller and the extension owner
mod recheck_locks; // the commit's recheck ordered against the changes it rechecks
mod route_guard; // a tenant-explicit call's tenant: required, and never NULL where Citus routes it
mod token; // one-time tokens: mint, digest, binding, constant-time compare
mod validation; // credentials, receipts, summaries, params schemas, notification targets
mod xact; // what is forgotten at the end of every transaction

#[cfg(any(test, feature = "pg_test"))]
mod tests;

// The hand-written SQL, in the order it must run. Rust functions named in a
// `requires` list are created before that file.
//
// Two kinds, and sql/make-upgrade reads the line between them: the data model
// (roles, types, tables: an upgrade changes it by hand, in
// sql/upgrade/<from>--<to>.pre.sql) and the code (functions, triggers,
// policies, grants: every upgrade script recreates all of it from these files).
// ---- the data model ----
::pgrx::extension_sql_file!("../../sql/000_roles.sql", name = "roles", bootstrap);
::pgrx::extension_sql_file!(
    "../../sql/005_status.sql",
    name = "status",
    requires = ["roles"]
);
::pgrx::extension_sql_file!(
    "../../sql/010_tables.sql",
    name = "tables",
    requires = ["status"]
);
// ---- the code ----
::pgrx::extension_sql_file!(
    "../../sql/011_status_rules.sql",
    name = "status_rules",
    requires = ["tables"]
);
::pgrx::extension_sql_file!(
    "../../sql/012_citus_catalog.sql",
    name = "citus_catalog",
    requires = ["status_rules", citus::citus_present]
);
::pgrx::extension_sql_file!(
    "../../sql/020_guards.sql",
    name = "guards",
    requires = [
        "citus_catalog",
        lifecycle::_guard_status,
        lifecycle::_action_lifecycle
    ]
);
::pgrx::extension_sql_file!(
    "../../sql/030_access.sql",
    name = "access",
    requires = [
        "guards",
        identity::current_tenant,
        identity::current_principal,
        identity::current_session,
        privilege::refuse_nested
    ]
);
::pgrx::extension_sql_file!(
    "../../sql/040_admin.sql",
    name = "admin",
    requires = ["access", args::require_text_sql]
);
::pgrx::extension_sql_file!(
    "../../sql/041_register.sql",
    name = "register",
    requires = ["admin", privilege::is_agent_role_sql]
);
::pgrx::extension_sql_file!(
    "../../sql/050_propose.sql",
    name = "propose",
    requires = [
        "register",
        exec_as::exec_as,
        form::form_problem,
        form::form_fit,
        form::where_clause,
        form::value_expr
    ]
);
::pgrx::extension_sql_file!(
    "../../sql/051_approve.sql",
    name = "approve",
    requires = ["propose"]
);
::pgrx::extension_sql_file!(
    "../../sql/052_session.sql",
    name = "session",
    requires = ["approve"]
);
::pgrx::extension_sql_file!(
    "../../sql/053_ceremony.sql",
    name = "ceremony",
    requires = ["session"]
);
::pgrx::extension_sql_file!(
    "../../sql/054_delegation.sql",
    name = "delegation",
    requires = ["ceremony"]
);
::pgrx::extension_sql_file!(
    "../../sql/055_task.sql",
    name = "task",
    requires = ["delegation"]
);
::pgrx::extension_sql_file!(
    "../../sql/056_files.sql",
    name = "files",
    requires = ["task"]
);
::pgrx::extension_sql_file!(
    "../../sql/057_fence.sql",
    name = "fence",
    requires = ["files"]
);
::pgrx::extension_sql_file!(
    "../../sql/058_links.sql",
    name = "links",
    requires = ["fence", identity::card_claims, identity::in_card_session]
);
::pgrx::extension_sql_file!(
    "../../sql/059_audit.sql",
    name = "audit",
    requires = ["links", audit::event_hash_sql]
);
::pgrx::extension_sql_file!(
    "../../sql/060_dispatch.sql",
    name = "dispatch",
    requires = ["audit", args::check_lease_args]
);
::pgrx::extension_sql_file!(
    "../../sql/061_dispatch_batch.sql",
    name = "dispatch_batch",
    requires = ["dispatch", args::batch_check_arrays, args::batch_rounds]
);
::pgrx::extension_sql_file!(
    "../../sql/062_dispatch_for.sql",
    name = "dispatch_for",
    requires = ["dispatch_batch", route_guard::require_tenant_sql]
);
::pgrx::extension_sql_file!(
    "../../sql/063_mcp.sql",
    name = "mcp",
    requires = ["dispatch_for", mcp::upstream_tool]
);
::pgrx::extension_sql_file!(
    "../../sql/064_notify.sql",
    name = "notify",
    requires = [
        "mcp",
        ids::notification_id,
        validation::notify_target,
        validation::notify_target_hint,
        validation::check_webhook_secret
    ]
);
::pgrx::extension_sql_file!(
    "../../sql/068_console.sql",
    name = "console",
    requires = ["notify"]
);
::pgrx::extension_sql_file!(
    "../../sql/070_deployment.sql",
    name = "deployment",
    requires = ["console"]
);
::pgrx::extension_sql_file!(
    "../../sql/071_citus.sql",
    name = "citus",
    requires = ["deployment", approval::ensure_approval_key]
);
::pgrx::extension_sql_file!(
    "../../sql/080_comments.sql",
    name = "comments",
    requires = [
        "citus",
        identity::current_tenant,
        identity::current_principal,
        identity::current_session,
        canonical::canonical_json,
        canonical::params_hash,
        gate::agent::propose,
        gate::human::approve,
        gate::human::approve_many,
        gate::human::preview,
        gate::human::preview_checking,
        gate::human::preview_for,
        gate::human::preview_for_checking,
        gate::human::reject,
        gate::human::revise,
        gate::human::pending,
        gate::human::delegate,
        gate::human::revoke_delegation,
        gate::human::delegations,
        gate::human::record_request,
        gate::human::issue_token,
        gate::human::link_code,
        gate::human::record_evidence,
        gate::human::set_notify,
        gate::human::notify_channels,
        gate::human::remove_notify,
        gate::human::revoke_links
    ]
);
::pgrx::extension_sql_file!(
    "../../sql/090_privileges.sql",
    name = "privileges",
    finalize
);

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}

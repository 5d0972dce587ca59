//! docs/sql-api.md: who may call what, and that nobody but a superuser writes
//! keyturn tables directly.

use std::collections::BTreeSet;

use keyturn_tests::*;

const LOGINS: &[&str] = &[
    "app_agent",
    "app_human",
    "app_admin",
    "app_dispatcher",
    "app_operator",
    "app_bypass",
    "app_nobody",
];

const PUBLIC_FNS: &[&str] = &[
    "canonical_json",
    "current_principal",
    "current_session",
    "current_tenant",
    "params_hash",
];

/// The public (non-underscore) functions of schema keyturn `role` may execute.
async fn executable(su: &tokio_postgres::Client, role: &str) -> BTreeSet<String> {
    su.query(
        "SELECT DISTINCT p.proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE n.nspname = 'keyturn' AND p.proname !~ '^_' AND has_function_privilege($1, p.oid, 'EXECUTE')",
        &[&role],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

fn set(base: &[&str], extra: &[&str]) -> BTreeSet<String> {
    base.iter().chain(extra).map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn test_each_role_executes_exactly_its_functions() {
    let su = connect("postgres").await;
    // What every identity-bearing part may do besides its own calls.
    let both = [
        "cancel_origin",
        "archive_conversation",
        "end_session",
        "cancel_origin_for",
        "archive_conversation_for",
        "end_session_for",
        "action_status",
        "audit",
        "stage_file",
        "fence",
        "revoke_evidence",
        "classify",
        "dispatch_by_tenant",
    ];
    let human = [
        "approve",
        "approve_for",
        "approve_many",
        "approve_many_for",
        "preview",
        "preview_for",
        "reject",
        "reject_for",
        "revise",
        "revise_for",
        "pending",
        "delegate",
        "revoke_delegation",
        "delegations",
        "record_request",
        "issue_token",
        "link_code",
        "record_evidence",
        // where the person is reached (sql/064_notify.sql)
        "set_notify",
        "notify_channels",
        "remove_notify",
        "revoke_links",
        // never membership or grants: keyturn_admin alone
    ];
    let expected = [
        ("app_nobody", set(PUBLIC_FNS, &[])),
        (
            "app_agent",
            set(
                PUBLIC_FNS,
                &[
                    &["propose", "propose_for"][..],
                    // over MCP (sql/063_mcp.sql)
                    &[
                        "mcp_tools",
                        "read",
                        "upstream_read",
                        "mcp_action_status",
                        "mcp_resume",
                        "mcp_task",
                    ][..],
                    &both,
                ]
                .concat(),
            ),
        ),
        ("app_human", set(PUBLIC_FNS, &[&human[..], &both].concat())),
        ("app_bypass", set(PUBLIC_FNS, &[&human[..], &both].concat())),
        (
            "app_dispatcher",
            set(
                PUBLIC_FNS,
                &[
                    "lease",
                    "begin_dispatch",
                    "begin_dispatch_many",
                    "complete",
                    "complete_many",
                    "file_content",
                    "attachments",
                    "sweep",
                    "classify",
                    "dispatch_by_tenant",
                    // card links and sessions (sql/058_links.sql)
                    "link_code",
                    "redeem_link_code",
                    "card_session",
                    // keyturnd's account of an attempt it never sent
                    "record_not_sent",
                    "record_not_sent_for",
                    // what a notification says (sql/064_notify.sql)
                    "notification_message",
                    "notification_message_for",
                    // tenant by tenant (sql/062_dispatch_for.sql)
                    "dispatch_nodes",
                    "tenants_due",
                    "lease_for",
                    "begin_dispatch_for",
                    "begin_dispatch_many_for",
                    "complete_for",
                    "complete_many_for",
                    "sweep_for",
                    "attachments_for",
                    "file_content_for",
                    // upstream MCP servers (sql/063_mcp.sql)
                    "register_discovered_tool",
                    "check_upstream_tool",
                    "check_upstream_tool_for",
                ],
            ),
        ),
        (
            "app_operator",
            set(
                PUBLIC_FNS,
                &[
                    "reconcile",
                    "uncertain_actions",
                    "attempts",
                    "sweep",
                    "audit",
                    "classify",
                    "dispatch_by_tenant",
                    "reconcile_for",
                    "sweep_for",
                    "notifications",
                    "verify_audit",
                    "audit_export",
                    "audit_head",
                    "action_counts",
                    "find_actions",
                    "tools",
                    "standing_approvals",
                ],
            ),
        ),
        (
            "app_admin",
            set(
                PUBLIC_FNS,
                &[
                    "register_tool",
                    "register_projection",
                    "set_tool_enabled",
                    "add_member",
                    "remove_member",
                    "grant_tool",
                    "revoke_tool",
                    "check_deployment",
                    "classify",
                    "dispatch_by_tenant",
                    "verify_audit",
                    "audit_export",
                    "audit_head",
                    "action_counts",
                    "find_actions",
                    "tools",
                    "standing_approvals",
                ],
            ),
        ),
    ];
    for (role, want) in expected {
        assert_eq!(
            executable(&su, role).await,
            want,
            "functions executable by {role}"
        );
    }
}

#[tokio::test]
async fn test_no_login_role_executes_internal_functions() {
    let su = connect("postgres").await;
    for role in LOGINS {
        let internal: Vec<String> = su
            .query(
                "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
                 WHERE n.nspname = 'keyturn' AND p.proname ~ '^_' AND p.proname <> '_sees' \
                   AND has_function_privilege($1, p.oid, 'EXECUTE')",
                &[role],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(
            internal.is_empty(),
            "{role} may execute internal functions {internal:?}"
        );
    }
}

#[tokio::test]
async fn test_public_calls_identity_and_hash_functions_only() {
    let nobody = Conn::connect("app_nobody", Identity::gucs("t", "p", "s")).await;
    let row = nobody
        .query_one(
            "SELECT keyturn.current_tenant(), keyturn.current_principal(), keyturn.current_session(), \
             keyturn.canonical_json('{\"b\":1,\"a\":2}'), keyturn.params_hash('x', '{}')",
            &[],
        )
        .await
        .expect("PUBLIC may call the identity functions, canonical_json and params_hash");
    assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some("t"));
    assert_eq!(row.get::<_, String>(3), r#"{"a":2,"b":1}"#);
    assert_eq!(row.get::<_, String>(4).len(), 64);

    let id = uuid::Uuid::new_v4();
    let refused = [
        "SELECT * FROM keyturn.propose('x', '{}')".to_string(),
        format!("SELECT * FROM keyturn.approve('{id}', 't')"),
        format!("SELECT keyturn.preview('{id}', 't')"),
        format!("SELECT keyturn.reject('{id}', 't')"),
        "SELECT * FROM keyturn.lease('w')".into(),
        format!("SELECT keyturn.begin_dispatch('{id}', '{id}')"),
        format!("SELECT keyturn.complete('{id}', '{id}', 'succeeded')"),
        "SELECT * FROM keyturn.sweep()".into(),
        format!("SELECT keyturn.reconcile('{id}', 'failed', 'n')"),
        "SELECT * FROM keyturn.uncertain_actions()".into(),
        "SELECT keyturn.register_tool('x', '{}')".into(),
        "SELECT keyturn.set_tool_enabled('x', false)".into(),
        "SELECT keyturn.add_member('t', 'p', 'admin')".into(),
        "SELECT keyturn.remove_member('t', 'p')".into(),
        "SELECT keyturn.grant_tool('t', 'p', 'x')".into(),
        "SELECT keyturn.revoke_tool('t', 'p', 'x')".into(),
        "SELECT keyturn.classify('x')".into(),
        "SELECT keyturn.dispatch_by_tenant()".into(),
        format!("SELECT * FROM keyturn.action_status('{id}')"),
        format!("SELECT * FROM keyturn.audit('{id}')"),
        "SELECT keyturn.end_session()".into(),
        "SELECT keyturn.cancel_origin('c')".into(),
        "SELECT count(*) FROM keyturn.action".into(),
        "SELECT count(*) FROM keyturn.member".into(),
    ];
    for sql in refused {
        assert_eq!(
            sqlstate(nobody.query(sql.as_str(), &[]).await),
            "42501",
            "app_nobody: {sql}"
        );
    }
}

#[tokio::test]
async fn test_group_roles_are_refused_other_parts_calls() {
    let id = uuid::Uuid::new_v4();
    let cases: &[(&str, String)] = &[
        (
            "app_agent",
            format!("SELECT * FROM keyturn.approve('{id}', 't')"),
        ),
        ("app_agent", format!("SELECT keyturn.preview('{id}', 't')")),
        ("app_agent", format!("SELECT keyturn.reject('{id}', 't')")),
        ("app_agent", "SELECT * FROM keyturn.lease('w')".into()),
        (
            "app_agent",
            "SELECT keyturn.register_tool('x', '{}')".into(),
        ),
        (
            "app_agent",
            "SELECT keyturn.grant_tool('t', 'p', 'x')".into(),
        ),
        (
            "app_agent",
            format!("SELECT keyturn.reconcile('{id}', 'failed', 'n')"),
        ),
        (
            "app_human",
            "SELECT * FROM keyturn.propose('x', '{}')".into(),
        ),
        ("app_human", "SELECT * FROM keyturn.lease('w')".into()),
        (
            "app_human",
            "SELECT keyturn.add_member('t', 'p', 'admin')".into(),
        ),
        (
            "app_dispatcher",
            format!("SELECT keyturn.reconcile('{id}', 'failed', 'n')"),
        ),
        (
            "app_dispatcher",
            "SELECT * FROM keyturn.propose('x', '{}')".into(),
        ),
        (
            "app_dispatcher",
            format!("SELECT * FROM keyturn.approve('{id}', 't')"),
        ),
        ("app_operator", "SELECT * FROM keyturn.lease('w')".into()),
        (
            "app_operator",
            format!("SELECT keyturn.complete('{id}', '{id}', 'succeeded')"),
        ),
        (
            "app_operator",
            format!("SELECT * FROM keyturn.approve('{id}', 't')"),
        ),
        (
            "app_admin",
            "SELECT * FROM keyturn.propose('x', '{}')".into(),
        ),
        (
            "app_admin",
            format!("SELECT * FROM keyturn.approve('{id}', 't')"),
        ),
        ("app_admin", "SELECT * FROM keyturn.lease('w')".into()),
    ];
    for (role, sql) in cases {
        let c = connect(role).await;
        assert_eq!(
            sqlstate(c.query(sql.as_str(), &[]).await),
            "42501",
            "{role}: {sql}"
        );
    }
}

#[tokio::test]
async fn test_no_login_role_may_write_keyturn_tables() {
    let su = connect("postgres").await;
    for role in LOGINS {
        let writable: Vec<String> = su
            .query(
                "SELECT c.relname || ':' || p FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 CROSS JOIN unnest(ARRAY['INSERT','UPDATE','DELETE','TRUNCATE','REFERENCES','TRIGGER']) p \
                 WHERE n.nspname = 'keyturn' AND c.relkind IN ('r','p') AND has_table_privilege($1, c.oid, p)",
                &[role],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(
            writable.is_empty(),
            "{role} holds write privileges {writable:?}"
        );
    }
    // And for real: each part's own role tries its own tables.
    let tries = [
        ("app_admin", "INSERT INTO keyturn.member (tenant, principal, role) VALUES ('t', 'p', 'admin')"),
        ("app_admin", "UPDATE keyturn.tool SET enabled = true"),
        ("app_human", "UPDATE keyturn.action SET status = 'succeeded'"),
        ("app_agent", "INSERT INTO keyturn.cancelled_origin (tenant, principal, conversation_id) VALUES ('t','p','c')"),
        ("app_dispatcher", "UPDATE keyturn.action SET lease_expires_at = now() + interval '1 day'"),
        ("app_operator", "DELETE FROM keyturn.event"),
        ("app_operator", "DELETE FROM keyturn.usage"),
        ("app_admin", "TRUNCATE keyturn.tool_grant"),
    ];
    for (role, sql) in tries {
        let c = connect(role).await;
        assert_eq!(
            sqlstate(c.execute(sql, &[]).await),
            "42501",
            "{role}: {sql}"
        );
    }
}

#[tokio::test]
async fn test_security_definer_functions_pin_search_path() {
    let su = connect("postgres").await;
    let unpinned: Vec<String> = su
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = 'keyturn' AND p.prosecdef \
               AND NOT EXISTS (SELECT 1 FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%')",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        unpinned.is_empty(),
        "SECURITY DEFINER without a pinned search_path: {unpinned:?}"
    );
}

#[tokio::test]
async fn test_group_roles_exist_and_cannot_log_in() {
    let su = connect("postgres").await;
    let n = count(
        &su,
        "SELECT count(*) FROM pg_roles WHERE rolname = ANY ($1) AND NOT rolcanlogin",
        &[&vec![
            "keyturn_agent",
            "keyturn_approver",
            "keyturn_dispatcher",
            "keyturn_operator",
            "keyturn_admin",
        ]],
    )
    .await;
    assert_eq!(n, 5);
    // PUBLIC has USAGE on the schema but no table rights.
    let nobody = connect("app_nobody").await;
    let usage: bool = nobody
        .query_one("SELECT has_schema_privilege('keyturn', 'USAGE')", &[])
        .await
        .unwrap()
        .get(0);
    assert!(usage);
}

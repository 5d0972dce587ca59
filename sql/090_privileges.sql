-- Who may call what (docs/sql-api.md, "Roles"). Runs last, and is the one
-- place where privileges are given.
--
-- PUBLIC: USAGE on the schema, EXECUTE on the three identity functions,
-- canonical_json and params_hash; nothing else. Each group role gets exactly
-- the calls of its part. Agents and approvers may also SELECT keyturn's
-- tables, where row-level security shows them their own tenant's rows; the
-- dispatcher, operator and admin roles read nothing directly: since identity
-- is only asserted, a role that could set any tenant and SELECT would read
-- every tenant's params. Nobody but a superuser writes a keyturn table.

-- Revoked from every keyturn role first, so that running this file again (an
-- upgrade does) leaves exactly the privileges below.
REVOKE ALL ON ALL TABLES IN SCHEMA keyturn
    FROM keyturn_agent, keyturn_approver, keyturn_dispatcher, keyturn_operator, keyturn_admin;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA keyturn
    FROM keyturn_agent, keyturn_approver, keyturn_dispatcher, keyturn_operator, keyturn_admin;
REVOKE ALL ON SCHEMA keyturn FROM PUBLIC;
GRANT USAGE ON SCHEMA keyturn TO PUBLIC;

REVOKE ALL ON ALL TABLES IN SCHEMA keyturn FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA keyturn FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA keyturn FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA keyturn_secret FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
    keyturn.current_tenant(), keyturn.current_principal(), keyturn.current_session(),
    keyturn.canonical_json(jsonb), keyturn.params_hash(text, jsonb)
TO PUBLIC;
-- Whether keyturn's tables are distributed decides which form of a call
-- keyturnd runs (/rpc, /mcp, the dispatcher), as whichever of keyturn's
-- roles it serves; PUBLIC gets nothing beyond the five above.
GRANT EXECUTE ON FUNCTION keyturn.dispatch_by_tenant()
TO keyturn_agent, keyturn_approver, keyturn_dispatcher, keyturn_operator, keyturn_admin;

GRANT SELECT ON ALL TABLES IN SCHEMA keyturn TO keyturn_agent, keyturn_approver;
-- Except the bytes of staged files and the params of digest actions: only
-- the dispatcher reads them, through a lease (keyturn.file_content, lease).
-- The other columns stay readable, under row-level security.
REVOKE SELECT ON keyturn.staged_file, keyturn.staged_payload FROM keyturn_agent, keyturn_approver;
GRANT SELECT (id, tenant, principal, filename, content_type, size, sha256, staged_at, action_id)
    ON keyturn.staged_file TO keyturn_agent, keyturn_approver;
GRANT SELECT (action_id, tenant, principal, staged_at) ON keyturn.staged_payload TO keyturn_agent, keyturn_approver;

GRANT EXECUTE ON FUNCTION keyturn.classify(text)
TO keyturn_agent, keyturn_approver, keyturn_dispatcher, keyturn_operator, keyturn_admin;

-- Agent.
GRANT EXECUTE ON FUNCTION keyturn.propose(text, jsonb, jsonb), keyturn.propose_for(text, text, jsonb, jsonb)
TO keyturn_agent;

-- Agent, over MCP (sql/063_mcp.sql).
GRANT EXECUTE ON FUNCTION
    keyturn.mcp_tools(), keyturn.read(text, jsonb), keyturn.upstream_read(text, jsonb),
    keyturn.mcp_action_status(uuid), keyturn.mcp_resume(uuid, text, jsonb),
    keyturn.mcp_task(uuid)
TO keyturn_agent;

-- Agent and human.
GRANT EXECUTE ON FUNCTION
    keyturn.action_status(uuid), keyturn.audit(uuid), keyturn.end_session(text),
    keyturn.cancel_origin(text), keyturn.archive_conversation(text),
    keyturn.end_session_for(text, text), keyturn.cancel_origin_for(text, text),
    keyturn.archive_conversation_for(text, text),
    keyturn.stage_file(bytea, text, text), keyturn.fence(text, jsonb), keyturn.revoke_evidence(uuid)
TO keyturn_agent, keyturn_approver;

-- Human. (Membership and grants are not here: keyturn_admin alone.)
GRANT EXECUTE ON FUNCTION
    keyturn.approve(uuid, text, jsonb), keyturn.approve_for(text, uuid, text, jsonb),
    keyturn.preview(uuid, text), keyturn.preview(uuid, text, jsonb),
    keyturn.preview_for(text, uuid, text), keyturn.preview_for(text, uuid, text, jsonb), keyturn.reject(uuid, text, text),
    keyturn.reject_for(text, uuid, text, text),
    keyturn.approve_many(jsonb), keyturn.approve_many_for(text, jsonb), keyturn.revise(uuid, text, jsonb),
    keyturn.revise_for(text, uuid, text, jsonb), keyturn.pending(int),
    keyturn.delegate(text, jsonb, int, interval), keyturn.revoke_delegation(uuid),
    keyturn.delegations(), keyturn.record_request(text, text, text, text),
    keyturn.issue_token(uuid), keyturn.record_evidence(text, text, text),
    keyturn.set_notify(text, text, jsonb), keyturn.notify_channels(), keyturn.remove_notify(text),
    keyturn.revoke_links()
TO keyturn_approver;

-- Human and dispatcher: a card link's one-time code (for notifications, the
-- dispatcher asserts the person it writes to).
GRANT EXECUTE ON FUNCTION keyturn.link_code(uuid[], interval) TO keyturn_approver, keyturn_dispatcher;

-- Dispatcher.
GRANT EXECUTE ON FUNCTION
    keyturn.lease(text, int, interval), keyturn.lease(text, int, interval, text[]), keyturn.begin_dispatch(uuid, uuid),
    keyturn.complete(uuid, uuid, text, jsonb, interval), keyturn.sweep(),
    keyturn.begin_dispatch_many(uuid[], uuid[]),
    keyturn.complete_many(uuid[], uuid[], text[], jsonb[], interval[]),
    keyturn.file_content(uuid, uuid, uuid),
    keyturn.attachments(uuid, uuid),
    keyturn.redeem_link_code(text, uuid[]), keyturn.card_session(text),
    keyturn.record_not_sent(uuid, uuid, jsonb), keyturn.notification_message(uuid, uuid)
TO keyturn_dispatcher;

-- Dispatcher, tenant by tenant (sql/062_dispatch_for.sql).
GRANT EXECUTE ON FUNCTION
    keyturn.dispatch_nodes(), keyturn.tenants_due(text[], int),
    keyturn.lease_for(text, text, int, interval, text[]), keyturn.begin_dispatch_for(text, uuid, uuid),
    keyturn.begin_dispatch_many_for(text, uuid[], uuid[]),
    keyturn.complete_for(text, uuid, uuid, text, jsonb, interval),
    keyturn.complete_many_for(text, uuid[], uuid[], text[], jsonb[], interval[]),
    keyturn.sweep_for(text), keyturn.attachments_for(text, uuid, uuid),
    keyturn.file_content_for(text, uuid, uuid, uuid), keyturn.record_not_sent_for(text, uuid, uuid, jsonb),
    keyturn.notification_message_for(text, uuid, uuid)
TO keyturn_dispatcher;

-- Dispatcher, for upstream MCP servers (sql/063_mcp.sql).
GRANT EXECUTE ON FUNCTION
    keyturn.register_discovered_tool(text, jsonb, boolean), keyturn.check_upstream_tool(uuid, uuid, jsonb),
    keyturn.check_upstream_tool_for(text, uuid, uuid, jsonb)
TO keyturn_dispatcher;

-- Operator.
GRANT EXECUTE ON FUNCTION
    keyturn.reconcile(uuid, text, text), keyturn.uncertain_actions(), keyturn.sweep(), keyturn.audit(uuid),
    keyturn.attempts(uuid), keyturn.reconcile_for(text, uuid, text, text), keyturn.sweep_for(text),
    keyturn.notifications(uuid)
TO keyturn_operator;

-- Platform administrator.
GRANT EXECUTE ON FUNCTION
    keyturn.register_tool(text, jsonb), keyturn.set_tool_enabled(text, boolean),
    keyturn.add_member(text, text, text), keyturn.remove_member(text, text),
    keyturn.grant_tool(text, text, text, jsonb, timestamptz, int), keyturn.revoke_tool(text, text, text),
    keyturn.check_deployment(), keyturn.register_projection(text, jsonb)
TO keyturn_admin;

-- Operator and platform administrator: the audit's chain, and what the
-- operator console reads (sql/068_console.sql).
GRANT EXECUTE ON FUNCTION
    keyturn.verify_audit(text), keyturn.audit_export(text, timestamptz), keyturn.audit_head(text),
    keyturn.action_counts(text, text, timestamptz, timestamptz),
    keyturn.find_actions(text, text, text, timestamptz, timestamptz, uuid, int),
    keyturn.tools(), keyturn.standing_approvals(text)
TO keyturn_operator, keyturn_admin;

-- The RLS helper runs inside policies as the querying role.
GRANT EXECUTE ON FUNCTION keyturn._sees(text, text)
TO keyturn_agent, keyturn_approver;

-- keyturn 0.1.0: who may call what (docs/sql-api.md). Runs last.
--
-- PUBLIC: USAGE on the schema, EXECUTE on the three identity functions,
-- canonical_json and params_hash; nothing else. Each group role gets exactly the
-- calls of its part, and SELECT on the tables (row-level security decides which
-- rows). Nobody but a superuser may write a keyturn table directly.

REVOKE ALL ON SCHEMA keyturn FROM PUBLIC;
GRANT USAGE ON SCHEMA keyturn TO PUBLIC;

REVOKE ALL ON ALL TABLES IN SCHEMA keyturn FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA keyturn FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA keyturn FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
    keyturn.current_tenant(), keyturn.current_principal(), keyturn.current_session(),
    keyturn.canonical_json(jsonb), keyturn.params_hash(text, jsonb)
TO PUBLIC;

GRANT SELECT ON ALL TABLES IN SCHEMA keyturn
TO keyturn_agent, keyturn_approver, keyturn_dispatcher, keyturn_operator, keyturn_admin;

GRANT EXECUTE ON FUNCTION keyturn.classify(text)
TO keyturn_agent, keyturn_approver, keyturn_dispatcher, keyturn_operator, keyturn_admin;

GRANT EXECUTE ON FUNCTION keyturn.action_status(uuid), keyturn.audit(uuid), keyturn.end_session(text)
TO keyturn_agent, keyturn_approver;

GRANT EXECUTE ON FUNCTION keyturn.propose(text, jsonb, jsonb)
TO keyturn_agent;

GRANT EXECUTE ON FUNCTION keyturn.cancel_origin(text)
TO keyturn_agent, keyturn_approver;

GRANT EXECUTE ON FUNCTION
    keyturn.approve(uuid, text, jsonb), keyturn.preview(uuid, text), keyturn.reject(uuid, text, text)
TO keyturn_approver;

GRANT EXECUTE ON FUNCTION
    keyturn.lease(text, int, interval, text[]), keyturn.begin_dispatch(uuid, uuid),
    keyturn.complete(uuid, uuid, text, jsonb, interval), keyturn.sweep()
TO keyturn_dispatcher;

GRANT EXECUTE ON FUNCTION
    keyturn.reconcile(uuid, text, text), keyturn.uncertain_actions(), keyturn.sweep(), keyturn.audit(uuid)
TO keyturn_operator;

GRANT EXECUTE ON FUNCTION
    keyturn.register_tool(text, jsonb), keyturn.set_tool_enabled(text, boolean),
    keyturn.add_member(text, text, text), keyturn.remove_member(text, text),
    keyturn.grant_tool(text, text, text), keyturn.revoke_tool(text, text, text)
TO keyturn_admin;

-- The RLS helper runs inside policies as the querying role.
GRANT EXECUTE ON FUNCTION keyturn._sees(text, text)
TO keyturn_agent, keyturn_approver, keyturn_dispatcher, keyturn_operator, keyturn_admin;

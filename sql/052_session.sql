-- Logout, conversation cancellation, status and audit (docs/sql-api.md).

-- Logout: cancels the caller's pending, queued and leased actions of a
-- session (its own, or p_session). For end_session and end_session_for
-- (p_what names the call).
CREATE FUNCTION keyturn._end_session(p_what text, p_session text)
RETURNS int
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_session   text := keyturn.current_session();
    v_target    text;
    v_n         int;
    v_now       timestamptz := clock_timestamp();
BEGIN
    PERFORM keyturn._refuse_nested(p_what);
    PERFORM keyturn._set_actor(keyturn._calling_role(), v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, v_session);
    v_target := coalesce(p_session, v_session);
    PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'session ended'));
    UPDATE keyturn.action a
       SET updated_at = v_now, status = 'cancelled', result = jsonb_build_object('reason', 'the session ended'),
           lease_id = NULL, leased_by = NULL, lease_expires_at = NULL
     WHERE a.id IN (SELECT o.action_id FROM keyturn.open_action o
                     WHERE o.tenant = v_tenant AND o.principal = v_principal AND o.session = v_target)
       AND a.tenant = v_tenant AND a.principal = v_principal AND a.session = v_target
       AND a.status IN ('pending', 'queued', 'leased');
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

CREATE FUNCTION keyturn.end_session(session text DEFAULT NULL)
RETURNS int
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._end_session('end_session', end_session.session)
$$;

-- Ends a conversation for the caller's principal: cancelled (it was stopped)
-- or archived (it ended normally). Either way it starts no new actions, and
-- its pending, queued and leased actions are cancelled; calls already
-- executing finish. A conversation ends once: the first word stays.
CREATE FUNCTION keyturn._end_conversation(p_conversation text, p_how text, p_what text)
RETURNS int
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_n         int;
    v_now       timestamptz := clock_timestamp();
BEGIN
    PERFORM keyturn._refuse_nested(p_what);
    PERFORM keyturn._set_actor(keyturn._calling_role(), v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    PERFORM keyturn._require_text(p_conversation, 'conversation_id');

    INSERT INTO keyturn.cancelled_origin (tenant, principal, conversation_id, how)
    VALUES (v_tenant, v_principal, p_conversation, p_how)
    ON CONFLICT ON CONSTRAINT cancelled_origin_pkey DO NOTHING;

    PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'conversation ' || p_how));
    UPDATE keyturn.action a
       SET updated_at = v_now, status = 'cancelled',
           result = jsonb_build_object('reason', 'the conversation was ' || p_how),
           lease_id = NULL, leased_by = NULL, lease_expires_at = NULL
     WHERE a.id IN (SELECT o.action_id FROM keyturn.open_action o
                     WHERE o.tenant = v_tenant AND o.principal = v_principal
                       AND o.conversation_id = p_conversation)
       AND a.tenant = v_tenant AND a.principal = v_principal
       AND a.conversation_id = p_conversation
       AND a.status IN ('pending', 'queued', 'leased');
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

CREATE FUNCTION keyturn.cancel_origin(conversation_id text)
RETURNS int
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._end_conversation(cancel_origin.conversation_id, 'cancelled', 'cancel_origin')
$$;

CREATE FUNCTION keyturn.archive_conversation(conversation_id text)
RETURNS int
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._end_conversation(archive_conversation.conversation_id, 'archived', 'archive_conversation')
$$;

-- 55000 when the conversation a proposal comes from has ended for its
-- principal, as committed (keyturn._ended_how reads past a REPEATABLE READ
-- snapshot: an archive committed after it still ends the conversation).
CREATE FUNCTION keyturn._refuse_ended_conversation(p_tenant text, p_principal text, p_conversation text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_how text;
BEGIN
    IF p_conversation IS NULL THEN
        RETURN;
    END IF;
    v_how := keyturn._ended_how(p_tenant, p_principal, p_conversation);
    IF v_how IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: conversation % was %; it can start no new actions', keyturn._quoted(p_conversation), v_how
            USING ERRCODE = '55000';
    END IF;
END
$$;

CREATE FUNCTION keyturn._action_status(p_id uuid)
RETURNS TABLE (o_action_id uuid, o_tool text, o_status text, o_summary text, o_attempts int, o_result jsonb,
               o_created_at timestamptz, o_expires_at timestamptz, o_updated_at timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_role      text;
BEGIN
    v_role := keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    RETURN QUERY
        SELECT a.id, a.tool, a.status::text, coalesce(a.summary, a.tool), a.attempts, a.result,
               a.created_at, a.expires_at, a.updated_at
          FROM keyturn.action a
         WHERE a.id = p_id AND a.tenant = v_tenant
           AND (v_role IN ('approver', 'admin') OR a.principal = v_principal);
END
$$;

-- Visible rows only: the same rule as RLS (own tenant; a member its own actions).
CREATE FUNCTION keyturn.action_status(action_id uuid)
RETURNS TABLE (action_id uuid, tool text, status text, summary text, attempts int, result jsonb,
               created_at timestamptz, expires_at timestamptz, updated_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._refuse_nested('action_status');
    SELECT * FROM keyturn._action_status($1)
$$;

-- What the caller may see of an action's history: superusers and operators
-- (who reconcile across tenants by role; events hold no param values) see
-- every event; anyone else what row-level security on keyturn.event would
-- show its identity (nothing without identity).
CREATE FUNCTION keyturn.audit(action_id uuid)
RETURNS TABLE (at timestamptz, db_role text, principal text, from_status text, to_status text, detail jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_all       boolean;
    v_tenant    text;
    v_principal text;
BEGIN
    PERFORM keyturn._refuse_nested('audit');
    v_all := pg_has_role(keyturn._calling_role(), 'keyturn_operator', 'USAGE');
    -- Whether the caller may see it is decided once, here, not per event: on
    -- Citus the events are read on the tenant's shard, where a function may
    -- not query distributed tables again.
    SELECT a.tenant, a.principal INTO v_tenant, v_principal
      FROM keyturn.action a WHERE a.id = audit.action_id;  -- by id alone: operators audit across tenants
    IF NOT FOUND OR NOT (v_all OR keyturn._sees(v_tenant, v_principal)) THEN
        RETURN;
    END IF;
    RETURN QUERY
        SELECT e.at, e.db_role, e.principal, e.from_status::text, e.to_status::text, e.detail
          FROM keyturn.event e
         WHERE e.action_id = audit.action_id AND e.tenant = v_tenant
         ORDER BY e.id;
    -- Then the events of this transaction, written into the chain at its
    -- commit (docs/audit.md): a transaction sees its own, as it sees its
    -- own status changes.
    RETURN QUERY
        SELECT n.at, n.db_role, n.principal, n.from_status, n.to_status, n.detail::jsonb
          FROM keyturn._noted_events(audit.action_id) n;
END
$$;

-- The session and conversation calls with the caller's tenant named (another
-- tenant: 42501; none: 22023), the forms Citus can send whole to the
-- tenant's worker (docs/scale-out.md, layout B), as propose_for and
-- approve_for.
CREATE FUNCTION keyturn.end_session_for(tenant text, session text DEFAULT NULL)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_other_tenant('end_session_for', end_session_for.tenant);
    RETURN keyturn._end_session('end_session_for', end_session_for.session);
END
$$;

CREATE FUNCTION keyturn.cancel_origin_for(tenant text, conversation_id text)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_other_tenant('cancel_origin_for', cancel_origin_for.tenant);
    RETURN keyturn._end_conversation(cancel_origin_for.conversation_id, 'cancelled', 'cancel_origin_for');
END
$$;

CREATE FUNCTION keyturn.archive_conversation_for(tenant text, conversation_id text)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_other_tenant('archive_conversation_for', archive_conversation_for.tenant);
    RETURN keyturn._end_conversation(archive_conversation_for.conversation_id, 'archived',
                                     'archive_conversation_for');
END
$$;

-- keyturn 0.1.0: approve, preview and reject (docs/sql-api.md).
--
-- keyturn.approve / preview / reject are Rust functions (extension/src/gate.rs):
-- they refuse callers that are keyturn_agent members (separation of duties),
-- note the calling role, and run the functions below as the extension owner.

-- approve's pre-claim checks, shared by preview and reject. Raises and changes
-- nothing: 42501 for identity, membership, grant and bound context; 55000 when
-- there is no usable proposal (unknown, invisible, wrong token).
CREATE FUNCTION keyturn._usable_action(p_id uuid, p_token text, p_need_grant boolean)
RETURNS keyturn.action
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_session   text := keyturn.current_session();
    v_role      text;
    a           keyturn.action;
BEGIN
    v_role := keyturn._require_member(v_tenant, v_principal, v_session);

    SELECT x.* INTO a FROM keyturn.action x WHERE x.id = p_id;
    IF NOT FOUND OR a.tenant IS DISTINCT FROM v_tenant
       OR (v_role = 'member' AND a.principal IS DISTINCT FROM v_principal) THEN
        RAISE EXCEPTION 'keyturn: no usable proposal %', coalesce(p_id::text, 'NULL')
            USING ERRCODE = '55000',
                  DETAIL = 'It does not exist, or it is not visible to this identity.';
    END IF;
    IF p_need_grant AND NOT keyturn._has_grant(v_tenant, v_principal, a.tool) THEN
        RAISE EXCEPTION 'keyturn: principal % holds no grant for tool %', v_principal, a.tool
            USING ERRCODE = '42501',
                  HINT = 'An admin grants tools with keyturn.grant_tool(tenant, principal, tool).';
    END IF;
    IF a.approval = 'self' AND (a.principal IS DISTINCT FROM v_principal OR a.session IS DISTINCT FROM v_session) THEN
        RAISE EXCEPTION 'keyturn: action % is approved by the principal it was proposed for, in the same session', p_id
            USING ERRCODE = '42501';
    END IF;
    IF a.approval = 'independent' AND (a.principal = v_principal OR v_role NOT IN ('approver', 'admin')) THEN
        RAISE EXCEPTION 'keyturn: action % needs an independent approver: a different principal with role approver or admin', p_id
            USING ERRCODE = '42501';
    END IF;
    IF p_token IS NULL OR NOT keyturn._ct_eq(a.token_digest, keyturn._token_digest(p_token)) THEN
        RAISE EXCEPTION 'keyturn: wrong token for this action'
            USING ERRCODE = '55000',
                  DETAIL = format('action %s', p_id),
                  HINT = 'Use the token propose returned for this action. A wrong token does not use the proposal up.';
    END IF;
    RETURN a;
END
$$;

-- Why a claimed proposal may no longer run, or NULL. Locks the tool row and the
-- proposer's epoch row FOR SHARE, so a concurrent revoke, remove_member,
-- register_tool or set_tool_enabled either commits first (and is seen here) or
-- waits until this transaction has finished.
CREATE FUNCTION keyturn._invalid_reason(a keyturn.action)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_tool  keyturn.tool;
    v_epoch bigint;
BEGIN
    SELECT t.* INTO v_tool FROM keyturn.tool t WHERE t.name = a.tool FOR SHARE;
    IF NOT FOUND OR NOT v_tool.enabled THEN
        RETURN format('tool %s is disabled', a.tool);
    END IF;
    IF v_tool.version <> a.tool_version THEN
        RETURN format('tool %s changed from version %s to %s', a.tool, a.tool_version, v_tool.version);
    END IF;
    SELECT e.epoch INTO v_epoch FROM keyturn.auth_epoch e
     WHERE e.tenant = a.tenant AND e.principal = a.principal FOR SHARE;
    IF coalesce(v_epoch, 0) <> a.epoch THEN
        RETURN format('the authorization of principal %s changed (epoch %s, now %s)', a.principal, a.epoch, coalesce(v_epoch, 0));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM keyturn.member m WHERE m.tenant = a.tenant AND m.principal = a.principal) THEN
        RETURN format('principal %s is no longer a member of tenant %s', a.principal, a.tenant);
    END IF;
    IF NOT keyturn._has_grant(a.tenant, a.principal, a.tool) THEN
        RETURN format('principal %s no longer holds a grant for tool %s', a.principal, a.tool);
    END IF;
    IF a.conversation_id IS NOT NULL AND EXISTS (
           SELECT 1 FROM keyturn.cancelled_origin c
            WHERE c.tenant = a.tenant AND c.principal = a.principal AND c.conversation_id = a.conversation_id) THEN
        RETURN format('conversation %s was cancelled', a.conversation_id);
    END IF;
    RETURN NULL;
END
$$;

-- Persists a terminal outcome and returns it: after the claim, failures are
-- answers, not errors.
CREATE FUNCTION keyturn._settle(p_id uuid, p_status text, p_result jsonb, p_detail jsonb)
RETURNS TABLE (o_action_id uuid, o_status text, o_result jsonb)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM keyturn._set_event_detail(p_detail);
    UPDATE keyturn.action a SET updated_at = clock_timestamp(), status = p_status, result = p_result WHERE a.id = p_id;
    RETURN QUERY SELECT p_id, p_status, p_result;
END
$$;

-- Runs the business UPDATE of an sql tool as the approving role, under RLS, on
-- the stored targets at their stored versions, in a subtransaction.
CREATE FUNCTION keyturn._execute_sql(p_caller oid, a keyturn.action, p_ver keyturn.tool_version)
RETURNS TABLE (o_action_id uuid, o_status text, o_result jsonb)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_arg     jsonb;
    v_sets    text;
    v_checks  text;
    v_sql     text;
    v_rows    jsonb;
    v_n       int := -1;
    v_bad     jsonb;
BEGIN
    v_arg := jsonb_build_object(
        'where', a.params -> 'where', 'set', a.params -> 'set',
        'targets', (SELECT jsonb_agg(jsonb_build_object('k', t.key, 'v', t.version) ORDER BY t.ord)
                      FROM keyturn.action_target t WHERE t.action_id = a.id));

    SELECT string_agg(format('%I = %s', s.key, keyturn._set_value(p_ver, s.key)), ', ' ORDER BY s.key),
           string_agg(format('(t.%I IS NOT DISTINCT FROM %s)', s.key, keyturn._set_value(p_ver, s.key)), ' AND ' ORDER BY s.key)
      INTO v_sets, v_checks
      FROM jsonb_object_keys(a.params -> 'set') AS s (key);

    v_sql := format(
        'UPDATE %s AS t SET %s FROM jsonb_to_recordset($1->''targets'') AS x (k text, v text) '
        'WHERE t.%I = x.k::%s AND %s::text = x.v AND %s '
        'RETURNING jsonb_build_object(''key'', t.%I::text, ''ok'', %s)',
        p_ver.sql_relid::regclass, v_sets,
        p_ver.sql_key, p_ver.sql_types ->> p_ver.sql_key, keyturn._version_expr(p_ver),
        keyturn._form_where(p_ver, a.params), p_ver.sql_key, v_checks);

    BEGIN
        v_rows := keyturn._exec_as(p_caller, v_sql, v_arg);
        v_n := jsonb_array_length(v_rows);
        IF v_n <> a.target_count THEN
            RAISE EXCEPTION 'target count mismatch' USING ERRCODE = 'KT409';
        END IF;
        SELECT jsonb_agg(r -> 'key') INTO v_bad FROM jsonb_array_elements(v_rows) r
         WHERE NOT (r ->> 'ok')::boolean;
        IF v_bad IS NOT NULL THEN
            RAISE EXCEPTION 'postcondition failed' USING ERRCODE = 'KT417';
        END IF;
    EXCEPTION
        WHEN serialization_failure OR deadlock_detected THEN
            RAISE;
        WHEN SQLSTATE 'KT409' THEN
            RETURN QUERY SELECT * FROM keyturn._settle(a.id, 'conflict',
                jsonb_build_object('reason', 'targets changed since the proposal; propose again to see the new state',
                                   'expected', a.target_count, 'matched', v_n),
                jsonb_build_object('expected', a.target_count, 'matched', v_n));
            RETURN;
        WHEN SQLSTATE 'KT417' THEN
            RETURN QUERY SELECT * FROM keyturn._settle(a.id, 'failed',
                jsonb_build_object('reason', 'postcondition failed: targets do not hold the approved values after the write (a trigger changed them?); rolled back',
                                   'keys', v_bad),
                jsonb_build_object('reason', 'postcondition failed'));
            RETURN;
        WHEN OTHERS THEN
            RETURN QUERY SELECT * FROM keyturn._settle(a.id, 'failed',
                jsonb_build_object('reason', 'the business write failed and was rolled back',
                                   'sqlstate', SQLSTATE, 'message', SQLERRM),
                jsonb_build_object('reason', 'business write failed', 'sqlstate', SQLSTATE));
            RETURN;
    END;

    RETURN QUERY SELECT * FROM keyturn._settle(a.id, 'succeeded',
        jsonb_build_object('rows', v_n, 'keys', (SELECT jsonb_agg(r -> 'key') FROM jsonb_array_elements(v_rows) r)),
        jsonb_build_object('rows', v_n));
END
$$;

-- The value expression that assigns params.set.<column> in the column's type.
CREATE FUNCTION keyturn._set_value(p_ver keyturn.tool_version, p_column text)
RETURNS text
LANGUAGE sql STABLE  -- as format(): STABLE, and no SET clause, so it is inlined
AS $$
    SELECT CASE WHEN p_ver.sql_types ->> p_column IN ('json', 'jsonb')
                THEN format('($1->''set''->%L)::%s', p_column, p_ver.sql_types ->> p_column)
                ELSE format('($1->''set''->>%L)::%s', p_column, p_ver.sql_types ->> p_column) END
$$;

CREATE FUNCTION keyturn._approve(p_caller oid, p_id uuid, p_token text, p_params jsonb)
RETURNS TABLE (o_action_id uuid, o_status text, o_result jsonb)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_principal text := keyturn.current_principal();
    a           keyturn.action;
    v_ver       keyturn.tool_version;
    v_params    jsonb;
    v_given     text;
    v_reason    text;
    v_err       text;
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    a := keyturn._usable_action(p_id, p_token, true);

    IF a.status <> 'pending' THEN
        -- A replay: the stored outcome, nothing run or charged twice.
        RETURN QUERY SELECT a.id, a.status, a.result;
        RETURN;
    END IF;
    IF a.retain = 'digest' AND p_params IS NULL THEN
        RAISE EXCEPTION 'keyturn: action % keeps only a digest; approve must resubmit the reviewed params', p_id
            USING ERRCODE = '22023';
    END IF;
    IF a.executor = 'sql' AND (SELECT r.rolbypassrls FROM pg_roles r WHERE r.oid = p_caller) THEN
        RAISE EXCEPTION 'keyturn: role % bypasses row-level security and may not run sql tools', p_caller::regrole
            USING ERRCODE = '42501',
                  HINT = 'Approve from a role without BYPASSRLS: keyturn runs business writes under RLS.';
    END IF;
    IF p_params IS NOT NULL THEN
        -- Hash before the claim: an unhashable payload raises and changes nothing.
        v_given := keyturn.params_hash(a.tool, p_params);
    END IF;

    -- The claim: one conditional UPDATE. Of N concurrent approvals one gets the
    -- row; the rest wait for it, find it no longer pending, and report its outcome.
    UPDATE keyturn.action x
       SET updated_at = clock_timestamp(), approved_by = v_principal, approved_role = p_caller::regrole::text, approved_at = clock_timestamp()
     WHERE x.id = p_id AND x.status = 'pending'
       AND keyturn._ct_eq(x.token_digest, keyturn._token_digest(p_token))
    RETURNING x.* INTO a;
    IF NOT FOUND THEN
        SELECT x.* INTO a FROM keyturn.action x WHERE x.id = p_id;
        RETURN QUERY SELECT a.id, a.status, a.result;
        RETURN;
    END IF;

    IF clock_timestamp() > a.expires_at THEN
        RETURN QUERY SELECT * FROM keyturn._settle(a.id, 'expired',
            jsonb_build_object('reason', format('the proposal expired at %s', a.expires_at)),
            jsonb_build_object('reason', 'expired'));
        RETURN;
    END IF;
    IF NOT keyturn._token_binds(p_token, a.id, a.params_hash, a.expires_at, a.token_binding) THEN
        RETURN QUERY SELECT * FROM keyturn._settle(a.id, 'rejected_tampered',
            jsonb_build_object('reason', 'the stored proposal no longer matches what the token was issued for'),
            jsonb_build_object('reason', 'token binding mismatch'));
        RETURN;
    END IF;
    v_reason := keyturn._invalid_reason(a);
    IF v_reason IS NOT NULL THEN
        RETURN QUERY SELECT * FROM keyturn._settle(a.id, 'invalidated',
            jsonb_build_object('reason', v_reason), jsonb_build_object('reason', v_reason));
        RETURN;
    END IF;

    IF a.retain = 'full' THEN
        IF keyturn.params_hash(a.tool, a.params) <> a.params_hash THEN
            RETURN QUERY SELECT * FROM keyturn._settle(a.id, 'rejected_tampered',
                jsonb_build_object('reason', 'the stored params no longer match the proposal hash'),
                jsonb_build_object('reason', 'stored params hash mismatch'));
            RETURN;
        END IF;
        v_params := a.params;
    ELSE
        v_params := p_params;
    END IF;
    IF v_given IS NOT NULL AND v_given <> a.params_hash THEN
        RETURN QUERY SELECT * FROM keyturn._settle(a.id, 'rejected_tampered',
            jsonb_build_object('reason', 'the resubmitted params differ from what was proposed'),
            jsonb_build_object('reason', 'resubmitted params hash mismatch'));
        RETURN;
    END IF;

    SELECT v.* INTO v_ver FROM keyturn.tool_version v WHERE v.tool = a.tool AND v.version = a.tool_version;
    IF a.executor = 'external' THEN
        v_err := keyturn._params_errors(v_ver.params_schema, v_params);
    ELSE
        v_err := keyturn._form_error(v_ver, v_params);
    END IF;
    IF v_err IS NOT NULL THEN
        RETURN QUERY SELECT * FROM keyturn._settle(a.id, 'invalidated',
            -- Validator messages quote the offending values: never store them for
            -- digest actions (docs/concepts.md).
            jsonb_build_object('reason', 'params no longer pass the tool''s schema: '
                               || CASE WHEN a.retain = 'digest' THEN '(details withheld: digest retention)'
                                       ELSE v_err END),
            jsonb_build_object('reason', 'schema revalidation failed'));
        RETURN;
    END IF;

    IF a.executor = 'sql' THEN
        RETURN QUERY SELECT * FROM keyturn._execute_sql(p_caller, a, v_ver);
        RETURN;
    END IF;

    IF a.retain = 'digest' THEN
        INSERT INTO keyturn.staged_payload (action_id, tenant, principal, params)
        VALUES (a.id, a.tenant, a.principal, v_params);
    END IF;
    PERFORM keyturn._set_event_detail('{}');
    UPDATE keyturn.action x SET updated_at = clock_timestamp(), status = 'queued', next_attempt_at = clock_timestamp()
     WHERE x.id = a.id;
    RETURN QUERY SELECT a.id, 'queued'::text, NULL::jsonb;
END
$$;

CREATE FUNCTION keyturn._preview(p_caller oid, p_id uuid, p_token text)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a         keyturn.action;
    v_ver     keyturn.tool_version;
    v_sql     text;
    v_rows    jsonb := '[]';
    v_targets jsonb;
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, keyturn.current_principal());
    a := keyturn._usable_action(p_id, p_token, false);
    SELECT v.* INTO v_ver FROM keyturn.tool_version v WHERE v.tool = a.tool AND v.version = a.tool_version;

    IF a.executor = 'sql' THEN
        -- Current values of the columns to be set, read as the approver (RLS applies).
        v_sql := format(
            'SELECT jsonb_build_object(''key'', t.%I::text, ''before'', jsonb_build_object(%s)) '
            'FROM %s AS t WHERE t.%I = ANY (ARRAY(SELECT jsonb_array_elements_text($1->''keys''))::%s[])',
            v_ver.sql_key,
            (SELECT string_agg(format('%L, to_jsonb(t.%I)', s.key, s.key), ', ' ORDER BY s.key)
               FROM jsonb_object_keys(a.params -> 'set') s (key)),
            v_ver.sql_relid::regclass, v_ver.sql_key, v_ver.sql_types ->> v_ver.sql_key);
        v_rows := keyturn._exec_as(p_caller, v_sql, jsonb_build_object('keys',
            (SELECT jsonb_agg(t.key) FROM keyturn.action_target t WHERE t.action_id = a.id)));
        SELECT jsonb_agg(jsonb_build_object(
                   'key', t.key,
                   'before', (SELECT r -> 'before' FROM jsonb_array_elements(v_rows) r WHERE r ->> 'key' = t.key LIMIT 1),
                   'after', a.params -> 'set') ORDER BY t.ord)
          INTO v_targets
          FROM keyturn.action_target t WHERE t.action_id = a.id;
    END IF;

    RETURN jsonb_strip_nulls(jsonb_build_object(
        'action_id', a.id,
        'summary', coalesce(a.summary, a.tool),
        'tool', a.tool,
        'effect', v_ver.effect,
        'status', a.status,
        'expires_at', a.expires_at,
        'retain', a.retain,
        'param_keys', to_jsonb(a.param_keys),
        'params', a.params,
        'params_hash', a.params_hash,
        'origin', a.origin,
        'targets', v_targets));
END
$$;

CREATE FUNCTION keyturn._reject(p_caller oid, p_id uuid, p_token text, p_reason text)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a        keyturn.action;
    v_status text;
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, keyturn.current_principal());
    a := keyturn._usable_action(p_id, p_token, false);
    PERFORM keyturn._set_event_detail(jsonb_strip_nulls(jsonb_build_object('reason', p_reason)));
    UPDATE keyturn.action x
       SET updated_at = clock_timestamp(), status = 'rejected',
           result = jsonb_strip_nulls(jsonb_build_object('reason', coalesce(p_reason, 'rejected by the approver')))
     WHERE x.id = p_id AND x.status = 'pending'
    RETURNING x.status INTO v_status;
    IF NOT FOUND THEN
        SELECT x.status INTO v_status FROM keyturn.action x WHERE x.id = p_id;
    END IF;
    RETURN v_status;
END
$$;

-- approve, preview and reject (docs/sql-api.md, "Human").
--
-- keyturn.approve / preview / reject are Rust functions (extension/src/gate.rs):
-- they refuse callers that are keyturn_agent members (separation of duties),
-- note the calling role, and run the functions below as the extension owner.
--
-- approve is three steps, each its own function so that standing approvals
-- and task requests (which approve inside propose) share them exactly:
-- the pre-claim checks (_usable_action), the claim (_claim: the row locked
-- while pending, and the approval binding made), and everything after it
-- (_after_claim: expiry, bindings, grants, hash, schema, then the write or the
-- queue), where every failure is a persisted answer, not an error, written
-- with the binding in one UPDATE.

-- approve's pre-claim checks, shared by revise, preview and reject (p_for
-- says which: the grant is needed to approve and to revise). Raises and
-- changes nothing: 42501 for identity, membership, grant and bound context;
-- 55000 when there is no usable proposal (unknown, invisible, wrong token).
-- Why this identity (principal, session, member role) may not act on
-- action a (p_for: approve, revise, reject, preview), or NULL: the approval
-- rule of the tool, in one place for approve and the calls around it, and
-- for issue_token and link_code (which ask as 'approve'). All 42501.
-- p_granted: whether p_principal holds a grant for a's tool, when the
-- caller read it already (keyturn._usable_action, in the statement that
-- reads the action); NULL, and it is read here.
CREATE FUNCTION keyturn._decide_problem(a keyturn.action, p_principal text, p_session text, p_role text,
                                        p_for text, p_granted boolean DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_for IN ('approve', 'revise')
       AND NOT coalesce(p_granted, keyturn._has_grant(a.tenant, p_principal, a.tool)) THEN
        RETURN format('principal %s holds no grant for tool %s (an admin grants tools with keyturn.grant_tool)',
                      p_principal, a.tool);
    END IF;
    IF a.approval = 'self' AND (a.principal IS DISTINCT FROM p_principal OR a.session IS DISTINCT FROM p_session) THEN
        RETURN format('action %s is approved by the principal it was proposed for, in the same session', a.id);
    END IF;
    IF a.approval = 'independent' AND (a.principal = p_principal OR p_role NOT IN ('approver', 'admin')) THEN
        RETURN format('action %s needs an independent approver: a different principal with role approver or admin', a.id);
    END IF;
    -- Whoever wrote any version of it does not also approve it: a revision
    -- of a revision keeps every earlier author (keyturn.action.authors).
    IF a.approval = 'independent' AND p_for = 'approve' AND p_principal = ANY (a.authors) THEN
        RETURN format('%s wrote a version of action %s; an independent approver who wrote none of it must approve it',
                      p_principal, a.id);
    END IF;
    -- Task actions are approved by the request that admitted them, never by a token.
    IF a.approval = 'task' AND p_for IN ('approve', 'revise') THEN
        RETURN format('action %s is a task action, approved by the request that admitted it', a.id);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION keyturn._usable_action(p_id uuid, p_token text, p_for text)
RETURNS keyturn.action
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_session   text := keyturn.current_session();
    v_read      record;
    v_role      text;
    v_problem   text;
    v_noted     text;
    a           keyturn.action;
BEGIN
    -- One statement: the caller's membership (role and epoch, as
    -- keyturn._membership reads them), the action, and whether the caller
    -- holds a grant for its tool. No row: no full identity, or not a member,
    -- and keyturn._membership_missing raises (42501).
    -- (Every table filtered by v_tenant itself, never by m.tenant: Citus
    -- pins each statement of a delegated call by its distribution argument.)
    SELECT m.role, coalesce((SELECT e.epoch FROM keyturn.auth_epoch e
                              WHERE e.tenant = v_tenant AND e.principal = v_principal), 0) AS epoch,
           -- ROW(x.*), not x: on Citus, in a call delegated to a worker,
           -- x's row type would be its shard's (as in sql/063_mcp.sql).
           ROW(x.*)::keyturn.action AS action,
           CASE WHEN p_for IN ('approve', 'revise') THEN
               (SELECT coalesce(g.valid_until, 'infinity') FROM keyturn.tool_grant g
                 WHERE g.tenant = v_tenant AND g.principal = v_principal AND g.tool = x.tool
                   AND keyturn._grant_live(g.valid_until)) END AS granted_until
      INTO v_read
      FROM keyturn.member m
      LEFT JOIN keyturn.action x ON x.id = p_id AND x.tenant = v_tenant
     WHERE m.tenant = v_tenant AND m.principal = v_principal AND v_session IS NOT NULL;
    IF v_read.role IS NULL THEN
        PERFORM keyturn._membership_missing(v_tenant, v_principal, v_session);
    END IF;
    v_role := v_read.role;
    a := v_read.action;
    IF a.id IS NULL OR a.tenant IS DISTINCT FROM v_tenant
       OR (v_role = 'member' AND a.principal IS DISTINCT FROM v_principal) THEN
        RAISE EXCEPTION 'keyturn: no usable proposal %', coalesce(p_id::text, 'NULL')
            USING ERRCODE = '55000',
                  DETAIL = 'It does not exist, or it is not visible to this identity.';
    END IF;
    v_problem := keyturn._decide_problem(a, v_principal, v_session, v_role, p_for,
                                         v_read.granted_until IS NOT NULL);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: %', v_problem
            USING ERRCODE = '42501',
                  HINT = 'approve, reject, revise and preview follow the tool''s approval rule: the proposer in its session (self), or an approver or admin who wrote none of it (independent).';
    END IF;
    IF p_token IS NULL OR NOT keyturn._ct_eq(a.token_digest, keyturn._token_digest(p_token)) THEN
        RAISE EXCEPTION 'keyturn: wrong token for this action'
            USING ERRCODE = '55000',
                  DETAIL = format('action %s', p_id),
                  HINT = 'Use the token propose returned for this action. A wrong token does not use the proposal up.';
    END IF;
    -- The caller's own membership, role and grant were read on this
    -- transaction's snapshot; a decision (not a preview) commits only if
    -- the caller's authorization is unchanged then (each of those changes
    -- moves the epoch): under REPEATABLE READ a member removed after the
    -- snapshot decides nothing.
    IF p_for <> 'preview' THEN
        v_noted := keyturn._recheck_epoch_at_commit(v_tenant, v_principal, v_read.epoch);
    END IF;
    -- And an approval commits only while the approver's grant lasts
    -- (fourteenth red-team pass, docs/security.md row 108).
    IF p_for = 'approve' AND v_read.granted_until < 'infinity' THEN
        v_noted := keyturn._ends_at_commit(v_read.granted_until,
            format('the grant of tool %s to approver %s (valid until %s)', a.tool, v_principal,
                   keyturn._utc(v_read.granted_until)));
    END IF;
    RETURN a;
END
$$;

-- Why a claimed proposal may no longer run, or NULL. Reads the tool row and
-- the proposer's authorization without a row lock. What must not outlive a
-- change of them is the commit, and the commit reads them again:
-- keyturn._recheck_at_commit notes the tool version and epoch this decision
-- read (and the conversation and the evidence it checked: the commit also
-- fails if the one was cancelled or the other revoked meanwhile,
-- docs/security.md row 104), and the commit, ordered
-- against every change of the tool or epoch by its share
-- lock (docs/security.md, row 95), fails (40001) if either has moved (on
-- Citus, the tool row of this node's placement: keyturn._local_placement).
-- So nothing here waits: no transaction left open stalls a decision or the
-- kill switch, and no decision rests on a read taken before a wait (tenth
-- red-team pass, F1). Under READ COMMITTED each statement reads what is
-- committed when it starts; under REPEATABLE READ or SERIALIZABLE,
-- keyturn._read_as_committed fails the call (40001) if what the snapshot
-- showed is no longer what is committed, before anything is decided or
-- written. (Until row 97 both rows were read FOR KEY SHARE: with one tool
-- approved by many at once, each approval's lock of its one row made a new
-- MultiXact, which every later reader looked up; and the lock never failed
-- on a change of a column outside the key.)
CREATE FUNCTION keyturn._invalid_reason(a keyturn.action)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_enabled boolean;
    v_version int;
    v_epoch   bigint;
    v_member  boolean;
    v_until   timestamptz;
    v_how     text;
    v_local   regclass;
    v_noted   text;
    v_cited   text[];
BEGIN
    -- Asked first, in Rust: without Citus, approve and begin_dispatch pay
    -- for no call of the plpgsql function per action.
    IF keyturn._citus_present() THEN
        v_local := keyturn._local_placement('keyturn.tool');
    END IF;
    IF v_local IS NULL THEN
        SELECT t.enabled, t.version INTO v_enabled, v_version
          FROM keyturn.tool t WHERE t.name = a.tool;
    ELSE
        -- Citus: this node's placement, which register_tool and
        -- set_tool_enabled change with every other, and which the commit
        -- reads again (keyturn._local_placement).
        EXECUTE format('SELECT t.enabled, t.version FROM %s t WHERE t.name = $1', v_local)
           INTO v_enabled, v_version USING a.tool;
    END IF;
    -- The rest in one statement of its own: the tool tables are reference
    -- tables on Citus, which a worker does not join with a tenant's in a
    -- delegated call.
    SELECT (SELECT e.epoch FROM keyturn.auth_epoch e
             WHERE e.tenant = a.tenant AND e.principal = a.principal),
           EXISTS (SELECT 1 FROM keyturn.member m WHERE m.tenant = a.tenant AND m.principal = a.principal),
           (SELECT coalesce(g.valid_until, 'infinity') FROM keyturn.tool_grant g
             WHERE g.tenant = a.tenant AND g.principal = a.principal AND g.tool = a.tool
               AND keyturn._grant_live(g.valid_until))
      INTO v_epoch, v_member, v_until;
    -- Under REPEATABLE READ or SERIALIZABLE, what was just read is the
    -- snapshot's: 40001 unless it is still what is committed (a no-op at
    -- READ COMMITTED; an expression, not a statement).
    v_noted := keyturn._read_as_committed(a.tool, v_enabled, v_version, a.tenant, a.principal,
                                          coalesce(v_epoch, 0));
    IF v_enabled IS NOT TRUE THEN
        RETURN format('tool %s is disabled', a.tool);
    END IF;
    IF v_version <> a.tool_version THEN
        RETURN format('tool %s changed from version %s to %s', a.tool, a.tool_version, v_version);
    END IF;
    IF coalesce(v_epoch, 0) <> a.epoch THEN
        RETURN format('the authorization of principal %s changed (epoch %s, now %s)', a.principal, a.epoch, coalesce(v_epoch, 0));
    END IF;
    IF NOT v_member THEN
        RETURN format('principal %s is no longer a member of tenant %s', a.principal, a.tenant);
    END IF;
    IF v_until IS NULL THEN
        RETURN format('principal %s no longer holds a grant for tool %s', a.principal, a.tool);
    END IF;
    -- A grant that ends by time ends what it admitted at its end: this
    -- transaction does not commit past it (keyturn._ends_at_commit).
    IF v_until <> 'infinity' THEN
        v_noted := keyturn._ends_at_commit(v_until,
            format('the grant of tool %s to principal %s (valid until %s)', a.tool, a.principal,
                   keyturn._utc(v_until)));
    END IF;
    IF a.conversation_id IS NOT NULL THEN
        v_how := keyturn._ended_how(a.tenant, a.principal, a.conversation_id);
        IF v_how IS NOT NULL THEN
            RETURN format('conversation %s was %s', a.conversation_id, v_how);
        END IF;
    END IF;
    -- Evidence revoked since: whatever propose admitted, nothing runs on it
    -- (revoke_evidence invalidates what is pending; this covers what was
    -- approved meanwhile, and a revocation that raced the proposal).
    IF a.origin ? 'evidence' THEN
        v_cited := ARRAY(SELECT jsonb_array_elements_text(a.origin -> 'evidence'));
        v_how := keyturn._evidence_revoked(a.tenant, v_cited);
        IF v_how IS NOT NULL THEN
            RETURN format('the evidence it cites (%s) was revoked', v_how);
        END IF;
    END IF;
    -- A call with plain arguments (no subquery): plpgsql evaluates it
    -- without a statement of its own.
    v_noted := keyturn._recheck_at_commit(a.tool, a.tool_version, a.tenant, a.principal, a.epoch,
                                          a.conversation_id, v_cited);
    RETURN NULL;
END
$$;

-- Persists a terminal outcome and returns it: after the claim, failures are
-- answers, not errors. The claim's approval binding (a, made by _claim) is
-- written with the outcome: one row version per approve.
--
-- The steps of approve and propose return keyturn._outcome (and
-- keyturn._proposed), one row as a composite, and call one another in
-- expressions (RETURN keyturn._settle(...)), and the Rust functions that
-- return '' are assigned, not PERFORMed: an expression is evaluated without
-- the executor, where each RETURN QUERY, PERFORM and SELECT INTO is a
-- statement it starts and ends (docs/benchmarks.md, statements per flow).
CREATE FUNCTION keyturn._settle(a keyturn.action, p_status keyturn.status, p_result jsonb, p_detail jsonb)
RETURNS keyturn._outcome
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now   timestamptz := clock_timestamp();
    v_noted text;
BEGIN
    v_noted := keyturn._set_event_detail(p_detail);
    UPDATE keyturn.action x
       SET updated_at = v_now, status = p_status, result = p_result,
           approved_by = a.approved_by, approved_role = a.approved_role, approved_at = a.approved_at,
           approved_via = a.approved_via, approval_mac = a.approval_mac
     WHERE x.id = a.id AND x.tenant = a.tenant;
    RETURN ROW(a.id, p_status::text, p_result)::keyturn._outcome;
END
$$;

-- A time as keyturn's own messages print it, whatever the session's
-- DateStyle and TimeZone: ISO 8601 in UTC.
CREATE FUNCTION keyturn._utc(p_at timestamptz)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE  -- as to_char() is: inlined
AS $$
    SELECT to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

-- Runs the business UPDATE of an sql tool as p_runas (the approving role,
-- under its RLS), on the stored targets at their stored versions, in a
-- subtransaction. Keys and versions compare in the columns' own types, and
-- every value written is the canonical text of what was hashed.
CREATE FUNCTION keyturn._execute_sql(p_runas oid, a keyturn.action, p_ver keyturn.tool_version)
RETURNS keyturn._outcome
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_arg     jsonb;
    v_set     text[];
    v_sql     text;
    v_rows    jsonb;
    v_n       int := -1;
    v_bad     jsonb;
BEGIN
    v_arg := keyturn._form_arg(a.params, p_ver.sql_types) || jsonb_build_object(
        'targets', (SELECT jsonb_agg(jsonb_build_object('k', t.key, 'v', t.version) ORDER BY t.ord)
                      FROM keyturn.action_target t WHERE t.action_id = a.id AND t.tenant = a.tenant));

    -- {the SET list, the postcondition over u, the columns RETURNING names}
    v_set := keyturn._set_clauses(p_ver.sql_types, a.params);

    -- RETURNING names plain columns only, and the checks and the jsonb are
    -- built over the CTE: Citus refuses any non-IMMUTABLE function in the
    -- RETURNING clause of a write to a distributed table (docs/scale-out.md).
    -- The key is never in set, so the column names cannot collide.
    v_sql := format(
        'WITH u AS (UPDATE %s AS t SET %s FROM jsonb_to_recordset($1->''targets'') AS x (k text, v text) '
        'WHERE t.%I = x.k::%s AND %s = x.v::%s AND %s '
        'RETURNING t.%I, %s) '
        'SELECT jsonb_build_object(''key'', u.%I::text, ''ok'', %s) FROM u',
        keyturn._tool_table(p_ver), v_set[1],
        p_ver.sql_key, p_ver.sql_types ->> p_ver.sql_key,
        keyturn._version_expr(p_ver), p_ver.sql_types ->> p_ver.sql_version,
        keyturn._form_where(p_ver, a.params), p_ver.sql_key, v_set[3], p_ver.sql_key, v_set[2]);

    BEGIN
        v_rows := keyturn._exec_as(p_runas, v_sql, v_arg);
        v_n := jsonb_array_length(v_rows);
        IF v_n <> a.target_count THEN
            RAISE EXCEPTION 'target count mismatch' USING ERRCODE = 'KT409';
        END IF;
        v_bad := keyturn._written_keys(v_rows, true);
        IF v_bad IS NOT NULL THEN
            RAISE EXCEPTION 'postcondition failed' USING ERRCODE = 'KT417';
        END IF;
    EXCEPTION
        -- Transient failures are raised, never persisted: the claim rolls back
        -- with them and the proposal stays pending for another try. Only a
        -- definite failure of the write (a constraint, an RLS check, a
        -- trigger's error) uses the approval up.
        WHEN transaction_rollback OR lock_not_available OR query_canceled
             OR insufficient_resources OR operator_intervention OR system_error
             OR internal_error THEN
            RAISE;
        WHEN SQLSTATE 'KT409' THEN
            RETURN keyturn._settle(a, 'conflict',
                jsonb_build_object('reason', 'targets changed since the proposal; propose again to see the new state',
                                   'expected', a.target_count, 'matched', v_n),
                jsonb_build_object('expected', a.target_count, 'matched', v_n));
        WHEN SQLSTATE 'KT417' THEN
            RETURN keyturn._settle(a, 'failed',
                jsonb_build_object('reason', 'postcondition failed: targets do not hold the approved values after the write (a trigger changed them?); rolled back',
                                   'keys', v_bad),
                jsonb_build_object('reason', 'postcondition failed'));
        WHEN OTHERS THEN
            RETURN keyturn._settle(a, 'failed',
                jsonb_build_object('reason', 'the business write failed and was rolled back',
                                   'sqlstate', SQLSTATE, 'message', SQLERRM),
                jsonb_build_object('reason', 'business write failed', 'sqlstate', SQLSTATE));
    END;

    RETURN keyturn._settle(a, 'succeeded',
        jsonb_build_object('rows', v_n, 'keys', keyturn._written_keys(v_rows, false)),
        jsonb_build_object('rows', v_n));
END
$$;

-- The claim: the proposal row, locked on (id, pending, the token's digest),
-- with the approval binding made in memory: who approved, as which role,
-- when and how, under a MAC with the approval key. _settle writes it with
-- the outcome, in the one UPDATE that moves the status. Of N concurrent
-- claims one gets the row; the others wait for its transaction, find the
-- row no longer pending, and get NULL (all columns). NULL also for a wrong
-- token (the caller checked it already; a race with a revise or a reject
-- lands here too).
CREATE FUNCTION keyturn._claim(p_tenant text, p_id uuid, p_token text, p_by text, p_role text, p_via text)
RETURNS keyturn.action
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_at timestamptz := clock_timestamp();
    a    keyturn.action;
BEGIN
    SELECT x.* INTO a FROM keyturn.action x
     WHERE x.id = p_id AND x.tenant = p_tenant AND x.status = 'pending'
       AND keyturn._ct_eq(x.token_digest, keyturn._token_digest(p_token))
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN a;
    END IF;
    a.approved_by := p_by;
    a.approved_role := p_role;
    a.approved_at := v_at;
    a.approved_via := p_via;
    a.approval_mac := keyturn._approval_mac(a.id, a.params_hash, p_by, p_role, v_at, p_via);
    RETURN a;
END
$$;

-- Everything after the claim, in order, each failure persisted and returned:
-- expiry, the token binding, what invalidates (tool, membership, grant,
-- epoch, origin), the params hash (of the stored params, and of resubmitted
-- ones), the schema; then the sql write as p_runas, or the queue. p_ver:
-- the action's tool version when the caller read it already (a version never
-- changes once a proposal can name it), else it is read here.
CREATE FUNCTION keyturn._after_claim(p_runas oid, a keyturn.action, p_token text, p_params jsonb,
                                     p_given_hash text, p_ver keyturn.tool_version DEFAULT NULL)
RETURNS keyturn._outcome
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_ver    keyturn.tool_version;
    v_params jsonb;
    v_reason text;
    v_err    text;
    v_now    timestamptz;
    v_plain  text;
    v_noted  text;
BEGIN
    IF clock_timestamp() > a.expires_at THEN
        RETURN keyturn._settle(a, 'expired',
            jsonb_build_object('reason', format('the proposal expired at %s', keyturn._utc(a.expires_at))),
            jsonb_build_object('reason', 'expired'));
    END IF;
    -- An approval is one when it commits: not after the proposal expired
    -- (fourteenth red-team pass, docs/security.md row 108).
    v_noted := keyturn._ends_at_commit(a.expires_at,
        format('proposal %s (it expired at %s)', a.id, keyturn._utc(a.expires_at)));
    -- A digest action stores only a MAC of its params hash: the params
    -- resubmitted now (or proposed in this call: a task request, a standing
    -- approval) must be the ones it was made of, checked where a changed
    -- hash is (after the token's binding and the invalidations).
    IF a.retain = 'digest' THEN
        v_plain := coalesce(p_given_hash, keyturn.params_hash(a.tool, p_params));
    END IF;
    -- The token is bound to the stored params hash and origin (the
    -- conversation column is the origin's, read from it at propose); a digest
    -- proposal made by 0.2.0 bound it to the plain hash, which v_plain now is.
    IF (NOT keyturn._token_binds(p_token, a.id, a.params_hash, a.expires_at, a.origin, a.token_binding)
        AND NOT (a.retain = 'digest'
                 AND keyturn._token_binds(p_token, a.id, v_plain, a.expires_at, a.origin, a.token_binding)))
       OR a.conversation_id IS DISTINCT FROM a.origin ->> 'conversation_id' THEN
        RETURN keyturn._settle(a, 'rejected_tampered',
            jsonb_build_object('reason', 'the stored proposal no longer matches what the token was issued for'),
            jsonb_build_object('reason', 'token binding mismatch'));
    END IF;
    v_reason := keyturn._invalid_reason(a);
    IF v_reason IS NOT NULL THEN
        RETURN keyturn._settle(a, 'invalidated',
            jsonb_build_object('reason', v_reason), jsonb_build_object('reason', v_reason));
    END IF;

    IF a.retain = 'digest' AND NOT keyturn._params_hash_matches(a.retain, a.params_hash, v_plain) THEN
        RETURN keyturn._settle(a, 'rejected_tampered',
            jsonb_build_object('reason', 'the resubmitted params differ from what was proposed'),
            jsonb_build_object('reason', 'resubmitted params hash mismatch'));
    END IF;
    IF a.retain = 'full' THEN
        IF keyturn.params_hash(a.tool, a.params) <> a.params_hash THEN
            RETURN keyturn._settle(a, 'rejected_tampered',
                jsonb_build_object('reason', 'the stored params no longer match the proposal hash'),
                jsonb_build_object('reason', 'stored params hash mismatch'));
        END IF;
        v_params := a.params;
    ELSE
        v_params := p_params;
    END IF;
    IF p_given_hash IS NOT NULL AND NOT keyturn._params_hash_matches(a.retain, a.params_hash, p_given_hash) THEN
        RETURN keyturn._settle(a, 'rejected_tampered',
            jsonb_build_object('reason', 'the resubmitted params differ from what was proposed'),
            jsonb_build_object('reason', 'resubmitted params hash mismatch'));
    END IF;

    IF p_ver.tool IS NULL THEN
        SELECT v.* INTO v_ver FROM keyturn.tool_version v WHERE v.tool = a.tool AND v.version = a.tool_version;
    ELSE
        v_ver := p_ver;
    END IF;
    IF a.executor = 'external' THEN
        v_err := coalesce(keyturn._params_errors(v_ver.params_schema, v_params),
                          keyturn._undeclared_recipient(v_ver, v_params));
    ELSE
        v_err := keyturn._form_error(v_ver, v_params);
    END IF;
    IF v_err IS NOT NULL THEN
        RETURN keyturn._settle(a, 'invalidated',
            -- Validator messages quote the offending values: never store them for
            -- digest actions (docs/concepts.md, "Digest retention").
            jsonb_build_object('reason', 'params no longer pass the tool''s schema: '
                               || CASE WHEN a.retain = 'digest' THEN '(details withheld: digest retention)'
                                       ELSE v_err END),
            jsonb_build_object('reason', 'schema revalidation failed'));
    END IF;

    IF a.executor = 'sql' THEN
        RETURN keyturn._execute_sql(p_runas, a, v_ver);
    END IF;

    IF a.retain = 'digest' THEN
        INSERT INTO keyturn.staged_payload (action_id, tenant, principal, params)
        VALUES (a.id, a.tenant, a.principal, v_params);
    END IF;
    v_noted := keyturn._set_event_detail('{}');
    v_now := clock_timestamp();
    UPDATE keyturn.action x
       SET updated_at = v_now, status = 'queued', next_attempt_at = v_now,
           approved_by = a.approved_by, approved_role = a.approved_role, approved_at = a.approved_at,
           approved_via = a.approved_via, approval_mac = a.approval_mac
     WHERE x.id = a.id AND x.tenant = a.tenant;
    RETURN ROW(a.id, 'queued', NULL)::keyturn._outcome;
END
$$;

CREATE FUNCTION keyturn._approve(p_caller oid, p_id uuid, p_token text, p_params jsonb)
RETURNS keyturn._outcome
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_principal text := keyturn.current_principal();
    a           keyturn.action;
    v_claimed   keyturn.action;
    v_given     text;
    v_ver       keyturn.tool_version;
    v_noted     text;
BEGIN
    v_noted := keyturn._set_actor(p_caller::regrole::text, v_principal);
    a := keyturn._usable_action(p_id, p_token, 'approve');

    IF a.status <> 'pending' THEN
        -- A replay: the stored outcome, nothing run or charged twice.
        RETURN ROW(a.id, a.status::text, a.result)::keyturn._outcome;
    END IF;
    IF a.retain = 'digest' AND p_params IS NULL THEN
        RAISE EXCEPTION 'keyturn: action % keeps only a digest; approve must resubmit the reviewed params', p_id
            USING ERRCODE = '22023';
    END IF;
    IF a.executor = 'sql' THEN
        v_noted := keyturn._refuse_rls_bypass(p_caller);
    END IF;
    IF p_params IS NOT NULL THEN
        -- Hash before the claim: an unhashable payload raises and changes nothing.
        v_given := keyturn.params_hash(a.tool, p_params);
    END IF;

    SELECT v.* INTO v_ver FROM keyturn.tool_version v
     WHERE v.tool = a.tool AND v.version = a.tool_version;
    IF v_ver.quorum > 1 THEN
        RETURN keyturn._vote(p_caller, a, p_token, p_params, v_given, v_ver.quorum);
    END IF;

    v_claimed := keyturn._claim(a.tenant, p_id, p_token, v_principal, p_caller::regrole::text, 'approve');
    IF v_claimed.id IS NULL THEN
        SELECT x.* INTO a FROM keyturn.action x WHERE x.id = p_id AND x.tenant = a.tenant;
        RETURN ROW(a.id, a.status::text, a.result)::keyturn._outcome;
    END IF;
    RETURN keyturn._after_claim(p_caller, v_claimed, p_token, p_params, v_given, v_ver);
END
$$;

-- With p_params (a digest action's reviewed fields, which the link brings
-- and the card cannot hash against a stored MAC), also whether they are the
-- proposed ones, while it is pending; fields that are not end it
-- rejected_tampered, as approving with them would: the token's holder gets
-- one guess, as from approve, never an oracle. (A caller on the human side's
-- own SQL connection could roll the penalty back with a savepoint, as it
-- could approve's: that connection is the application, which is trusted to
-- assert identities and holds the params it proposed. Over HTTP each call
-- commits.)
-- How revision a was written: 'card_session' when in a card opened from a
-- link (its creation event says so: sql/050_propose.sql), else NULL.
CREATE FUNCTION keyturn._revised_via(a keyturn.action)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN (SELECT e.detail ->> 'via' FROM keyturn.event e
             WHERE e.action_id = a.id AND e.tenant = a.tenant AND e.from_status IS NULL
             ORDER BY e.id LIMIT 1);
END
$$;

-- p's members whose value is not JSON null; what is inside them is left as
-- it is.
CREATE FUNCTION keyturn._without_null_members(p jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}'::jsonb)
              FROM jsonb_each(p) e WHERE e.value <> 'null'::jsonb);
END
$$;

CREATE FUNCTION keyturn._preview(p_caller oid, p_id uuid, p_token text, p_params jsonb)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a         keyturn.action;
    v_ver     keyturn.tool_version;
    v_sql     text;
    v_rows    jsonb := '[]';
    v_after   jsonb;
    v_targets jsonb;
    v_route   text := '';
    v_match   boolean;
    v_now     timestamptz;
    v_result  jsonb := jsonb_build_object('reason', 'the params shown for review differ from what was proposed');
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, keyturn.current_principal());
    a := keyturn._usable_action(p_id, p_token, 'preview');
    -- Only while it waits for a decision, where a wrong guess ends it: on a
    -- decided action a check would cost nothing and could be repeated.
    IF p_params IS NOT NULL AND a.status = 'pending' THEN
        v_match := keyturn._params_hash_matches(a.retain, a.params_hash, keyturn.params_hash(a.tool, p_params));
        IF NOT v_match AND a.status = 'pending' THEN
            PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'previewed params hash mismatch'));
            -- Computed first: Citus refuses a volatile function in an UPDATE.
            v_now := clock_timestamp();
            UPDATE keyturn.action x
               SET updated_at = v_now, status = 'rejected_tampered',
                   result = v_result
             WHERE x.id = a.id AND x.tenant = a.tenant AND x.status = 'pending'
            RETURNING x.* INTO a;
            IF NOT FOUND THEN
                SELECT x.* INTO a FROM keyturn.action x WHERE x.id = p_id AND x.tenant = a.tenant;
            END IF;
        END IF;
    END IF;
    SELECT v.* INTO v_ver FROM keyturn.tool_version v WHERE v.tool = a.tool AND v.version = a.tool_version;

    IF a.executor = 'sql' THEN
        -- On a table Citus distributes, the form's value of its distribution
        -- column too, when the form names one: the read then stays on the
        -- shard that holds the targets, as the write does (on one node, and
        -- for a form that names none, nothing is added).
        SELECT format(' AND t.%I = %s', c.dist_column, keyturn._form_value(v_ver, 'where', c.dist_column))
          INTO v_route
          FROM keyturn._citus_table(keyturn._tool_table(v_ver)::regclass) c
         WHERE c.dist_column IS NOT NULL AND jsonb_typeof(a.params -> 'where' -> c.dist_column) IN ('string', 'number');
        -- Current values of the columns to be set, read as the approver (RLS
        -- applies), beside the values the write would store.
        v_sql := format(
            'SELECT jsonb_build_object(''key'', t.%I::text, ''before'', jsonb_build_object(%s)) '
            'FROM %s AS t WHERE t.%I = ANY (ARRAY(SELECT jsonb_array_elements_text($1->''keys''))::%s[])%s',
            v_ver.sql_key,
            (SELECT string_agg(format('%L, to_jsonb(t.%I)', s.key, s.key), ', ' ORDER BY s.key)
               FROM jsonb_object_keys(a.params -> 'set') s (key)),
            keyturn._tool_table(v_ver), v_ver.sql_key, v_ver.sql_types ->> v_ver.sql_key, coalesce(v_route, ''));
        v_rows := keyturn._exec_as(p_caller, v_sql, jsonb_build_object('keys',
            (SELECT jsonb_agg(t.key) FROM keyturn.action_target t WHERE t.action_id = a.id AND t.tenant = a.tenant),
            'where', a.params -> 'where'));
        v_after := keyturn._form_arg(a.params, v_ver.sql_types) -> 'set';
        SELECT jsonb_agg(jsonb_build_object(
                   'key', t.key,
                   'before', (SELECT r -> 'before' FROM jsonb_array_elements(v_rows) r WHERE r ->> 'key' = t.key LIMIT 1),
                   'after', v_after) ORDER BY t.ord)
          INTO v_targets
          FROM keyturn.action_target t WHERE t.action_id = a.id AND t.tenant = a.tenant;
    END IF;

    -- Only the card's own absent members are left out: jsonb_strip_nulls
    -- would reach into params and targets and hide a write's NULL
    -- (docs/security.md, row 78).
    RETURN keyturn._without_null_members(jsonb_build_object(
        'action_id', a.id,
        'summary', coalesce(a.summary, a.tool),
        'tool', a.tool,
        'effect', v_ver.effect,
        'executor', a.executor,
        'approval', a.approval,
        'status', a.status,
        'expires_at', a.expires_at,
        'retain', a.retain,
        'target_count', a.target_count,
        'param_keys', to_jsonb(a.param_keys),
        'params', a.params,
        'params_hash', a.params_hash,
        'params_match', v_match,
        'origin', a.origin,
        'evidence', CASE WHEN a.origin ? 'evidence' THEN keyturn._cited_evidence(a.tenant, a.origin) END,
        'result', a.result,
        'revised_from', a.revised_from,
        'revised_via', CASE WHEN a.revised_from IS NOT NULL THEN keyturn._revised_via(a) END,
        'quorum', CASE WHEN v_ver.quorum > 1 THEN v_ver.quorum END,
        'votes', CASE WHEN v_ver.quorum > 1 THEN keyturn._votes(a.id, a.tenant, a.tool) END,
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
    v_status keyturn.status;
    v_now    timestamptz := clock_timestamp();
    -- Computed first: Citus refuses a COALESCE beside a function that is
    -- not immutable in a distributed UPDATE.
    v_result jsonb := jsonb_strip_nulls(jsonb_build_object('reason', coalesce(p_reason, 'rejected by the approver')));
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, keyturn.current_principal());
    a := keyturn._usable_action(p_id, p_token, 'reject');
    PERFORM keyturn._set_event_detail(jsonb_strip_nulls(jsonb_build_object('reason', p_reason)));
    UPDATE keyturn.action x
       SET updated_at = v_now, status = 'rejected', result = v_result
     WHERE x.id = p_id AND x.tenant = a.tenant AND x.status = 'pending'
    RETURNING x.status INTO v_status;
    IF NOT FOUND THEN
        SELECT x.status INTO v_status FROM keyturn.action x WHERE x.id = p_id AND x.tenant = a.tenant;
    END IF;
    RETURN v_status::text;
END
$$;

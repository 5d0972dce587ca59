-- The approval ceremony (docs/sql-api.md, "The approval ceremony"): the
-- queue, batch approval, M-of-N quorum, edit before approve.
--
-- keyturn.pending, keyturn.approve_many and keyturn.revise are Rust entry
-- points (extension/src/gate/human.rs) that refuse agents and run the
-- functions below as the extension owner, like approve.

-- The caller's queue: the visible pending actions (a member its own, an
-- approver or admin the tenant's), soonest expiry first. Never a token. A
-- quorum action's votes are counted for each row by a statement of its own:
-- on Citus the query runs on the tenant's shards, where a function may not
-- query distributed tables again.
CREATE FUNCTION keyturn._pending(p_caller oid, p_max_rows int)
RETURNS TABLE (o_action_id uuid, o_tool text, o_summary text, o_effect text, o_approval text,
               o_principal text, o_created_at timestamptz, o_expires_at timestamptz,
               o_votes int, o_quorum int)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_role      text;
    v_now       timestamptz := clock_timestamp();
BEGIN
    v_role := keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    IF p_max_rows IS NULL OR p_max_rows NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'keyturn: max_rows must be from 1 to 1000, not %', p_max_rows
            USING ERRCODE = '22023';
    END IF;
    FOR o_action_id, o_tool, o_summary, o_effect, o_approval, o_principal, o_created_at, o_expires_at, o_quorum IN
        SELECT a.id, a.tool, coalesce(a.summary, a.tool), v.effect, a.approval, a.principal,
               a.created_at, a.expires_at, v.quorum
          FROM keyturn.open_action o
          JOIN keyturn.action a ON a.id = o.action_id AND a.tenant = o.tenant
          JOIN keyturn.tool_version v ON v.tool = a.tool AND v.version = a.tool_version
         WHERE o.status = 'pending' AND o.tenant = v_tenant
           AND (v_role IN ('approver', 'admin') OR o.principal = v_principal)
           AND a.status = 'pending' AND o.expires_at > v_now
         ORDER BY o.expires_at, o.action_id
         LIMIT p_max_rows
    LOOP
        o_votes := CASE WHEN o_quorum > 1 THEN keyturn._votes(o_action_id, v_tenant, o_tool) ELSE 0 END;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The votes that count for a quorum action: one per principal, from voters
-- who are still approvers or admins of its tenant, still hold the tool's
-- grant (o_until: its end, 'infinity' for none), and whose authorization
-- has not changed since they voted.
-- plpgsql, not sql: Citus cannot plan an SQL function's parameter in a
-- statement on distributed tables (layout B, docs/scale-out.md).
CREATE FUNCTION keyturn._counted_votes(p_id uuid, p_tenant text, p_tool text)
RETURNS TABLE (o_principal text, o_epoch bigint, o_until timestamptz)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
        SELECT v.principal, v.epoch, v.until
          FROM (SELECT x.principal, x.epoch,
                       (SELECT coalesce(g.valid_until, 'infinity') FROM keyturn.tool_grant g
                         WHERE g.tenant = p_tenant AND g.principal = x.principal AND g.tool = p_tool
                           AND keyturn._grant_live(g.valid_until)) AS until
                  FROM keyturn.vote x
                  JOIN keyturn.member m ON m.tenant = p_tenant AND m.principal = x.principal
                 WHERE x.action_id = p_id AND x.tenant = p_tenant AND m.role IN ('approver', 'admin')
                   AND keyturn._epoch(p_tenant, x.principal) = x.epoch) v
         WHERE v.until IS NOT NULL;
END
$$;

CREATE FUNCTION keyturn._votes(p_id uuid, p_tenant text, p_tool text)
RETURNS int
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN (SELECT count(*)::int FROM keyturn._counted_votes(p_id, p_tenant, p_tool));
END
$$;

-- approve for a tool with quorum > 1: the caller's vote (already past
-- approve's pre-claim checks). The action row is locked first, so votes,
-- vetoes and claims of one action happen one at a time: of two last votes
-- at once, the second sees the first and performs the claim exactly once.
-- A vote that cannot stand -- past the expiry, or for other params than
-- were proposed -- performs the claim at once, and the claim's checks answer
-- it (expired, rejected_tampered).
CREATE FUNCTION keyturn._vote(p_caller oid, a keyturn.action, p_token text, p_params jsonb,
                              p_given_hash text, p_quorum int)
RETURNS keyturn._outcome
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_principal text := keyturn.current_principal();
    v_claimed   keyturn.action;
    v_new       boolean;
    v_votes     int;
    v_voter     text;
    v_epoch     bigint;
    v_until     timestamptz;
    v_noted     text;
    v_now       timestamptz;
    v_out       keyturn._outcome;
BEGIN
    SELECT x.* INTO a FROM keyturn.action x WHERE x.id = a.id AND x.tenant = a.tenant FOR NO KEY UPDATE;
    IF a.status <> 'pending' THEN
        RETURN ROW(a.id, a.status::text, a.result)::keyturn._outcome;
    END IF;
    -- The token was checked before this lock: one replaced while the vote
    -- waited for it (issue_token from the queue) is the wrong token now,
    -- and counts for nothing (docs/security.md, row 134).
    IF NOT keyturn._ct_eq(a.token_digest, keyturn._token_digest(p_token)) THEN
        RAISE EXCEPTION 'keyturn: wrong token for this action'
            USING ERRCODE = '55000',
                  DETAIL = format('action %s: its token was replaced while this vote waited', a.id),
                  HINT = 'Take the action''s current token (the card or the queue gives a fresh one) and vote again.';
    END IF;
    IF clock_timestamp() <= a.expires_at
       AND (p_given_hash IS NULL OR keyturn._params_hash_matches(a.retain, a.params_hash, p_given_hash)) THEN
        INSERT INTO keyturn.vote (action_id, principal, tenant, action_principal, epoch, db_role)
        VALUES (a.id, v_principal, a.tenant, a.principal, keyturn._epoch(a.tenant, v_principal),
                p_caller::regrole::text)
        ON CONFLICT ON CONSTRAINT vote_pkey DO NOTHING;
        v_new := FOUND;
        -- A vote changes the action row, not only locks it: a concurrent
        -- voter whose REPEATABLE READ snapshot predates this vote then fails
        -- to serialize (40001) instead of counting without it, which left a
        -- met quorum pending (twelfth red-team pass; isolation spec quorum-rr).
        IF v_new THEN
            v_now := clock_timestamp();
            UPDATE keyturn.action x SET updated_at = v_now
             WHERE x.id = a.id AND x.tenant = a.tenant;
        END IF;
        v_votes := keyturn._votes(a.id, a.tenant, a.tool);
        IF v_new THEN
            PERFORM keyturn._append_event(a.id, a.tenant, a.principal, p_caller::regrole::text, v_principal,
                                          'pending', 'pending', jsonb_build_object('vote', v_votes, 'quorum', p_quorum)
                                                                || coalesce(keyturn._event_detail()::jsonb, '{}'));
        END IF;
        IF v_votes < p_quorum THEN
            RETURN ROW(a.id, 'pending', jsonb_build_object('votes', v_votes, 'quorum', p_quorum))::keyturn._outcome;
        END IF;
    END IF;
    -- The votes that met the quorum were counted on this transaction's
    -- snapshot: it commits only if each voter's authorization is unchanged
    -- then (a voter removed since, under REPEATABLE READ, counts for nothing).
    IF v_votes >= p_quorum THEN
        FOR v_voter, v_epoch, v_until IN
            SELECT c.o_principal, c.o_epoch, c.o_until FROM keyturn._counted_votes(a.id, a.tenant, a.tool) c
        LOOP
            v_noted := keyturn._recheck_epoch_at_commit(a.tenant, v_voter, v_epoch);
            IF v_until < 'infinity' THEN
                v_noted := keyturn._ends_at_commit(v_until,
                    format('the grant of tool %s to voter %s (valid until %s)', a.tool, v_voter, keyturn._utc(v_until)));
            END IF;
        END LOOP;
    END IF;
    -- The quorum is this claim's context alone: taken off once it settled.
    PERFORM keyturn._set_event_context(jsonb_build_object('quorum', p_quorum));
    v_claimed := keyturn._claim(a.tenant, a.id, p_token, v_principal, p_caller::regrole::text, 'quorum');
    v_out := keyturn._after_claim(p_caller, v_claimed, p_token, p_params, p_given_hash);
    PERFORM keyturn._set_event_context(NULL);
    RETURN v_out;
END
$$;

-- items: a JSON array of 1 to 100 {"action_id", "token", "params"?}; 22023
-- for anything else, before anything is done.
CREATE FUNCTION keyturn._check_batch_items(p_items jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    e jsonb;
    i int := 0;
BEGIN
    IF p_items IS NULL OR jsonb_typeof(p_items) <> 'array'
       OR jsonb_array_length(p_items) NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'keyturn: items must be a JSON array of 1 to 100 {"action_id", "token", "params"?} objects'
            USING ERRCODE = '22023';
    END IF;
    FOR e IN SELECT jsonb_array_elements(p_items) LOOP
        IF jsonb_typeof(e) <> 'object' OR NOT (e ?& ARRAY['action_id', 'token'])
           OR EXISTS (SELECT 1 FROM jsonb_object_keys(e) k WHERE k NOT IN ('action_id', 'token', 'params'))
           OR jsonb_typeof(e -> 'action_id') <> 'string' OR jsonb_typeof(e -> 'token') <> 'string'
           OR (e ? 'params' AND jsonb_typeof(e -> 'params') NOT IN ('object', 'null'))
           OR (e ->> 'action_id') !~ '^[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}$' THEN
            RAISE EXCEPTION 'keyturn: items[%] must be {"action_id": "<uuid>", "token": "<token>", "params"?: {...}}', i
                USING ERRCODE = '22023';
        END IF;
        i := i + 1;
    END LOOP;
END
$$;

-- One card for several proposals: each element is exactly approve, with its
-- own claim, in the order given, in its own subtransaction, so one element
-- never changes another's outcome. A refusal before the claim is answered
-- (status 'refused', result {"sqlstate", "message"}) and leaves that
-- proposal pending; so is a transient failure of its write (it rolled back
-- with the element). A cancel or statement timeout still ends the call.
CREATE FUNCTION keyturn._approve_many(p_caller oid, p_items jsonb)
RETURNS TABLE (o_action_id uuid, o_status text, o_result jsonb)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    e        jsonb;
    v_id     uuid;
    v_status text;
    v_result jsonb;
    v_state  text;
    v_msg    text;
BEGIN
    PERFORM keyturn._check_batch_items(p_items);
    PERFORM keyturn._require_member(keyturn.current_tenant(), keyturn.current_principal(),
                                    keyturn.current_session());
    PERFORM keyturn._set_event_context(jsonb_build_object('batch', gen_random_uuid()));
    FOR e IN SELECT x FROM jsonb_array_elements(p_items) x LOOP
        v_id := (e ->> 'action_id')::uuid;
        BEGIN
            SELECT r.o_status, r.o_result INTO v_status, v_result
              FROM keyturn._approve(p_caller, v_id, e ->> 'token', nullif(e -> 'params', 'null')) r;
        EXCEPTION
            WHEN query_canceled OR internal_error THEN
                RAISE;
            WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;
                v_status := 'refused';
                v_result := jsonb_build_object('sqlstate', v_state, 'message', v_msg);
        END;
        RETURN QUERY SELECT v_id, v_status, v_result;
    END LOOP;
    PERFORM keyturn._set_event_context(NULL);
END
$$;

-- Edit before approve: the pending proposal becomes 'superseded' and a new
-- one, with the same tool, principal, session and origin and the edited
-- params, takes its place -- validated exactly as propose validates, with
-- its sql targets resolved as the reviser, under its RLS, and its own hash,
-- token and expiry. What the person approves next is exactly what runs.
-- Only from pending (else 55000); a racing approve or revise waits on the
-- row lock and then finds it no longer pending.
CREATE FUNCTION keyturn._revise(p_caller oid, p_id uuid, p_token text, p_params jsonb)
RETURNS TABLE (o_action_id uuid, o_token text, o_summary text, o_params_hash text, o_expires_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_principal text := keyturn.current_principal();
    a           keyturn.action;
    v_new       record;
    v_now       timestamptz;
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    a := keyturn._usable_action(p_id, p_token, 'revise');
    SELECT x.* INTO a FROM keyturn.action x WHERE x.id = p_id AND x.tenant = a.tenant FOR NO KEY UPDATE;
    IF a.status <> 'pending' THEN
        RAISE EXCEPTION 'keyturn: only a pending proposal can be revised; % is %', p_id, a.status
            USING ERRCODE = '55000';
    END IF;
    SELECT * INTO v_new
      FROM keyturn._propose_for(p_caller, a.tenant, a.principal, a.session, a.tool, p_params,
                                a.origin, a.id, v_principal);
    PERFORM keyturn._set_event_detail(jsonb_build_object('superseded_by', v_new.o_action_id,
                                                         'revised_by', v_principal));
    v_now := clock_timestamp();
    UPDATE keyturn.action x
       SET updated_at = v_now, status = 'superseded',
           result = jsonb_build_object('superseded_by', v_new.o_action_id)
     WHERE x.id = a.id AND x.tenant = a.tenant;
    RETURN QUERY SELECT v_new.o_action_id, v_new.o_token, v_new.o_summary, v_new.o_params_hash,
                        v_new.o_expires_at;
END
$$;

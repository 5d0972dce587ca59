-- Task-only effects (docs/sql-api.md, "Task-only effects"): for a tool with
-- approval = 'task', the owner's explicit request in the chat is the
-- approval. The human side records the person's message
-- (keyturn.record_request, a Rust entry point that refuses agents: an agent
-- cannot record a human request); propose admits a task call only for the
-- latest recorded turn of a live conversation of the same principal and
-- session, and approves it at once. Before execution the origin, grants,
-- tool version, epoch and schema are checked again.

CREATE FUNCTION keyturn._record_request(p_caller oid, p_conversation text, p_turn text, p_message text,
                                        p_text_sha256 text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_session   text := keyturn.current_session();
    r           keyturn.request;
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, v_session);
    PERFORM keyturn._check_origin(jsonb_build_object('conversation_id', p_conversation,
                                                     'turn_id', p_turn, 'message_id', p_message));
    IF p_conversation IS NULL OR p_turn IS NULL OR p_message IS NULL THEN
        RAISE EXCEPTION 'keyturn: conversation_id, turn_id and message_id are required' USING ERRCODE = '22023';
    END IF;
    IF p_text_sha256 IS NULL OR p_text_sha256 !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'keyturn: text_sha256 must be the lowercase hex SHA-256 of the message text'
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO keyturn.request (tenant, principal, message_id, session, conversation_id, turn_id,
                                 text_sha256, recorded_role)
    VALUES (v_tenant, v_principal, p_message, v_session, p_conversation, p_turn, p_text_sha256,
            p_caller::regrole::text)
    ON CONFLICT ON CONSTRAINT request_pkey DO NOTHING;
    IF FOUND THEN
        RETURN true;
    END IF;
    SELECT x.* INTO r FROM keyturn.request x
     WHERE x.tenant = v_tenant AND x.principal = v_principal AND x.message_id = p_message;
    IF (r.session, r.conversation_id, r.turn_id, r.text_sha256)
       IS DISTINCT FROM (v_session, p_conversation, p_turn, p_text_sha256) THEN
        RAISE EXCEPTION 'keyturn: message % was already recorded with other values', p_message
            USING ERRCODE = '22023',
                  HINT = 'A message is recorded once; a new message needs a new message_id.';
    END IF;
    RETURN false;
END
$$;

-- The recorded request a task proposal cites as its approval, with a new
-- row version written (so the admissions of one request happen one at a
-- time, under any isolation level). 42501 without a human
-- source: no origin message, or one not recorded for this tenant, principal
-- and session, in this conversation and turn; 55000 when the turn is not the
-- conversation's latest (the person has moved on). The conversation being
-- live was checked before, as for every proposal.
CREATE FUNCTION keyturn._task_request(p_tenant text, p_principal text, p_session text, p_origin jsonb)
RETURNS keyturn.request
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r        keyturn.request;
    v_latest text;
BEGIN
    IF NOT (p_origin ?& ARRAY['conversation_id', 'turn_id', 'message_id']) THEN
        RAISE EXCEPTION 'keyturn: no human source: a task tool needs origin conversation_id, turn_id and message_id of the person''s request'
            USING ERRCODE = '42501';
    END IF;
    IF NOT p_origin ? 'assistant_message_id' THEN
        RAISE EXCEPTION 'keyturn: a task tool needs origin assistant_message_id, the reply that carries the call'
            USING ERRCODE = '22023';
    END IF;
    -- An UPDATE, not FOR NO KEY UPDATE: a REPEATABLE READ admission whose
    -- snapshot predates a concurrent admission of the same request waits for
    -- a mere lock and then goes on without seeing that admission's action
    -- (a second action for the same call, an eleventh for the request). A
    -- row version written after its snapshot makes it fail to serialize
    -- (40001) instead; READ COMMITTED waits and reads the new state.
    UPDATE keyturn.request x SET recorded_at = x.recorded_at
     WHERE x.tenant = p_tenant AND x.principal = p_principal AND x.message_id = p_origin ->> 'message_id'
    RETURNING x.* INTO r;
    IF NOT FOUND OR r.session IS DISTINCT FROM p_session
       OR r.conversation_id IS DISTINCT FROM p_origin ->> 'conversation_id'
       OR r.turn_id IS DISTINCT FROM p_origin ->> 'turn_id' THEN
        RAISE EXCEPTION 'keyturn: no human source: message % was not recorded for this principal and session in conversation %, turn %',
                keyturn._quoted(p_origin ->> 'message_id'), keyturn._quoted(p_origin ->> 'conversation_id'), keyturn._quoted(p_origin ->> 'turn_id')
            USING ERRCODE = '42501',
                  HINT = 'The human side records the person''s message with keyturn.record_request before the agent proposes.';
    END IF;
    IF to_regrole(r.recorded_role) IS NULL THEN
        RAISE EXCEPTION 'keyturn: the role % that recorded message % no longer exists', r.recorded_role, r.message_id
            USING ERRCODE = '42501';
    END IF;
    -- Separation of duties when the request is used, not only when it was
    -- recorded: a role that has since become an agent records nothing.
    IF pg_has_role(r.recorded_role, 'keyturn_agent', 'MEMBER') THEN
        RAISE EXCEPTION 'keyturn: the role % that recorded message % is now a member of keyturn_agent; its requests admit nothing', r.recorded_role, r.message_id
            USING ERRCODE = '42501',
                  HINT = 'The person records the request again through a role that is not an agent.';
    END IF;
    -- What is committed, whatever the snapshot: a turn recorded after a
    -- REPEATABLE READ snapshot still makes this one stale.
    v_latest := keyturn._latest_turn(p_tenant, p_principal, r.conversation_id);
    IF v_latest IS DISTINCT FROM r.turn_id THEN
        RAISE EXCEPTION 'keyturn: turn % is no longer the latest of conversation % (now %)', r.turn_id, r.conversation_id, v_latest
            USING ERRCODE = '55000',
                  HINT = 'A request admits effects only while it is the conversation''s latest turn.';
    END IF;
    RETURN r;
END
$$;

-- The action this request already admitted for the same call (tool and
-- params hash), which propose returns instead of a second one; NULL when
-- there is none. 54000 beyond 10 task actions for one request.
CREATE FUNCTION keyturn._task_replay(p_tenant text, p_principal text, r keyturn.request, p_tool text,
                                     p_hash text)
RETURNS keyturn.action
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    a   keyturn.action;
    v_n int;
BEGIN
    SELECT x.* INTO a FROM keyturn.action x
     WHERE x.tenant = p_tenant AND x.principal = p_principal AND x.approval = 'task'
       AND x.origin ->> 'message_id' = r.message_id AND x.tool = p_tool
       AND keyturn._params_hash_matches(x.retain, x.params_hash, p_hash)
     ORDER BY x.created_at LIMIT 1;
    IF FOUND THEN
        RETURN a;
    END IF;
    SELECT count(*) INTO v_n FROM keyturn.action x
     WHERE x.tenant = p_tenant AND x.principal = p_principal AND x.approval = 'task'
       AND x.origin ->> 'message_id' = r.message_id;
    IF v_n >= 10 THEN
        RAISE EXCEPTION 'keyturn: request % has admitted % task actions, the most one request may', r.message_id, v_n
            USING ERRCODE = '54000',
                  HINT = 'A request in the chat starts at most 10 effects; the person can ask again.';
    END IF;
    RETURN NULL;
END
$$;

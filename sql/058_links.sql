-- Links that carry no credential (docs/http.md, "Card links"), and fresh
-- tokens for the person's queue.
--
-- A link to the approval card used to carry the token, and keyturnd's card
-- took the person's JWT from it too: browsers keep every URL they open in
-- their history database, its sync and the address bar's suggestions, so
-- anyone who read those could act as the person until the JWT expired. A
-- link now carries a one-time code instead: keyturn.link_code makes it for a
-- person who may decide every action it names, keyturnd redeems it once
-- (keyturn.redeem_link_code) for a card session of at most 15 minutes scoped
-- to those actions, with a fresh token for each, and after that the URL
-- holds nothing that works. keyturn.issue_token gives a person a fresh
-- token for a pending action from the queue (pending) or the console,
-- without any link. Only SHA-256 digests of codes and sessions are stored.
--
-- keyturn.link_code and keyturn.issue_token are Rust entry points
-- (extension/src/gate/human.rs) that refuse agents, like approve.

-- A fresh token for a pending proposal, bound like the first (to the
-- stored params hash); the previous token stops working. NULL when the
-- proposal is no longer pending.
CREATE FUNCTION keyturn._fresh_token(a keyturn.action)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_token   text := keyturn._token_new();
    v_digest  bytea;
    v_binding bytea;
BEGIN
    v_digest := keyturn._token_digest(v_token);
    v_binding := keyturn._token_binding(v_token, a.id, a.params_hash, a.expires_at, a.origin);
    UPDATE keyturn.action x SET token_digest = v_digest, token_binding = v_binding
     WHERE x.id = a.id AND x.tenant = a.tenant AND x.status = 'pending';
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN v_token;
END
$$;

-- The pending action p_id of the caller's tenant, locked, for an identity
-- that may decide it (the approval rule of keyturn._decide_problem). Unknown,
-- invisible or not to be decided by this identity: 42501, the same answer
-- for each (a link or a token reveals nothing of an action the caller may
-- not decide); decided already: 55000.
CREATE FUNCTION keyturn._decidable(p_tenant text, p_principal text, p_session text, p_role text, p_id uuid,
                                   p_what text)
RETURNS keyturn.action
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    a         keyturn.action;
    v_problem text;
BEGIN
    SELECT x.* INTO a FROM keyturn.action x WHERE x.id = p_id AND x.tenant = p_tenant FOR NO KEY UPDATE;
    IF FOUND AND NOT (p_role = 'member' AND a.principal IS DISTINCT FROM p_principal) THEN
        v_problem := keyturn._decide_problem(a, p_principal, p_session, p_role, 'approve');
    END IF;
    IF NOT FOUND OR (p_role = 'member' AND a.principal IS DISTINCT FROM p_principal) OR v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: % may not decide action %', p_principal, coalesce(p_id::text, 'NULL')
            USING ERRCODE = '42501',
                  DETAIL = coalesce(v_problem, 'It does not exist, or it is not visible to this identity.'),
                  HINT = format('%s is for a person who may approve the action: the proposer in its session (self), or an approver or admin who wrote none of it (independent).', p_what);
    END IF;
    IF a.status <> 'pending' THEN
        RAISE EXCEPTION 'keyturn: action % is %, not pending; there is nothing left to decide', p_id, a.status
            USING ERRCODE = '55000';
    END IF;
    RETURN a;
END
$$;

CREATE FUNCTION keyturn._issue_token(p_caller oid, p_id uuid)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_session   text := keyturn.current_session();
    v_role      text;
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    v_role := keyturn._require_member(v_tenant, v_principal, v_session);
    RETURN keyturn._fresh_token(keyturn._decidable(v_tenant, v_principal, v_session, v_role, p_id, 'issue_token'));
END
$$;

-- A one-time code for a link to these actions, for the calling identity
-- (the human side for its own principal; the dispatcher, for the person it
-- asserts: keyturnd's MCP elicitation, the agent's person). It expires at
-- the earliest of its ttl and the actions' expiry. The card session it is
-- redeemed for runs as the caller's role; a code the dispatcher made, as
-- keyturnd's card role.
--
-- The dispatcher asserts whatever identity it likes, and keyturnd redeems
-- codes for anyone who brings one to POST /card/session: so whoever holds
-- the dispatcher's login can make a code for any person who may decide an
-- action, and decide it as them (twelfth red-team pass, docs/security.md
-- row 52). By default that is the dispatcher's remit, as a mail server
-- carrying a notification's link holds its card. With
-- keyturn.strict_dispatcher_links on, a dispatcher's code is only what the
-- elicitation needs: for one action, its proposer, in the session it
-- proposed in (a self decision), once (card_link_elicits_idx, so no
-- isolation level makes a second), within keyturn._elicit_window() of the
-- proposal. (A notification's code is minted by the database from its own
-- row, for the person it waits for: sql/064_notify.sql.)
--
-- In either mode the dispatcher makes no code for a revision written in a
-- card session: the session could have been opened from a code of the
-- dispatcher's own, so its login alone would write the params and then
-- decide them (fourteenth red-team pass, docs/security.md row 106; the
-- class of row 75, below: such a revision is decided where the person is
-- signed in). With the strict setting, no code for any revision: a
-- revision is never a fresh proposal of the agent's.

-- How long after a proposal keyturnd's MCP elicitation may still make its
-- card link: the elicitation follows the propose at once.
CREATE FUNCTION keyturn._elicit_window()
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT interval '2 minutes' $$;

CREATE FUNCTION keyturn._link_code(p_caller oid, p_ids uuid[], p_ttl interval)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_session   text := keyturn.current_session();
    v_role      text;
    v_id        uuid;
    a           keyturn.action;
    v_now       timestamptz := clock_timestamp();
    v_expires   timestamptz;
    v_dispatcher boolean;
    v_strict    boolean;
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    v_role := keyturn._require_member(v_tenant, v_principal, v_session);
    IF p_ids IS NULL OR cardinality(p_ids) NOT BETWEEN 1 AND 100 OR array_position(p_ids, NULL) IS NOT NULL
       OR (SELECT count(DISTINCT x) FROM unnest(p_ids) x) <> cardinality(p_ids) THEN
        RAISE EXCEPTION 'keyturn: action_ids must list 1 to 100 distinct action ids'
            USING ERRCODE = '22023';
    END IF;
    IF keyturn._interval_within(p_ttl, interval '1 day') IS NOT TRUE THEN
        RAISE EXCEPTION 'keyturn: ttl must be more than 0 and at most 1 day, without months or years, not %', p_ttl
            USING ERRCODE = '22023',
                  HINT = 'A link is opened soon or not at all; the person can ask for a new one from the queue.';
    END IF;
    v_expires := v_now + p_ttl;
    v_dispatcher := pg_has_role(p_caller, 'keyturn_dispatcher', 'MEMBER');
    v_strict := v_dispatcher AND keyturn._strict_dispatcher_links();
    FOREACH v_id IN ARRAY p_ids LOOP
        a := keyturn._decidable(v_tenant, v_principal, v_session, v_role, v_id, 'link_code');
        IF v_strict AND (cardinality(p_ids) <> 1
                             OR a.principal IS DISTINCT FROM v_principal OR a.session IS DISTINCT FROM v_session
                             OR a.created_at < v_now - keyturn._elicit_window()
                             OR a.revised_from IS NOT NULL) THEN
            PERFORM keyturn._refuse_dispatcher_link(v_id);
        END IF;
        IF v_dispatcher AND a.revised_from IS NOT NULL AND EXISTS (
               SELECT 1 FROM keyturn.event e
                WHERE e.action_id = a.id AND e.tenant = a.tenant AND e.from_status IS NULL
                  AND e.detail ->> 'via' = 'card_session') THEN
            RAISE EXCEPTION 'keyturn: the dispatcher may not make a link to action %, a revision written in a card session', v_id
                USING ERRCODE = '42501',
                      DETAIL = 'A card session''s holder may not be its person, and what it wrote is not its to decide.',
                      HINT = 'The person decides it where they are signed in: the queue, the console, their app.';
        END IF;
        v_expires := least(v_expires, a.expires_at);
    END LOOP;
    IF NOT v_dispatcher THEN
        RETURN keyturn._mint_link(v_tenant, v_principal, v_session, p_caller::regrole::text, p_ids, v_now,
                                  v_expires);
    END IF;
    IF NOT v_strict THEN
        RETURN keyturn._mint_link(v_tenant, v_principal, v_session, NULL, p_ids, v_now, v_expires);
    END IF;
    BEGIN
        RETURN keyturn._mint_link(v_tenant, v_principal, v_session, NULL, p_ids, v_now, v_expires, p_ids[1]);
    EXCEPTION WHEN unique_violation OR serialization_failure THEN
        PERFORM keyturn._refuse_dispatcher_link(p_ids[1]);
    END;
END
$$;

CREATE FUNCTION keyturn._refuse_dispatcher_link(p_id uuid)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RAISE EXCEPTION 'keyturn: the dispatcher may not make a link to action %', p_id
        USING ERRCODE = '42501',
              DETAIL = 'With keyturn.strict_dispatcher_links on, a dispatcher''s code is for one action, its proposer in its session, once, within '
                       || keyturn._elicit_window() || ' of the proposal, never a revision (keyturnd''s MCP elicitation).',
              HINT = 'The person asks for a link (keyturn.link_code) or opens the action from their queue.';
END
$$;

-- A new one-time code for a card link to p_ids, for that identity, until
-- p_expires; only its digest is stored. The callers have checked that the
-- person may decide every action: keyturn._link_code, and a notification's
-- message (sql/064_notify.sql), whose card runs as the role its person set
-- the channel as.
CREATE FUNCTION keyturn._mint_link(p_tenant text, p_principal text, p_session text, p_db_role text, p_ids uuid[],
                                   p_now timestamptz, p_expires timestamptz, p_elicits uuid DEFAULT NULL,
                                   p_notification uuid DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_code   text := keyturn._token_new();
    v_digest bytea;
BEGIN
    v_digest := keyturn._token_digest(v_code);
    INSERT INTO keyturn.card_link (code_digest, tenant, principal, session, db_role, action_ids, created_at,
                                   expires_at, elicits, notification)
    VALUES (v_digest, p_tenant, p_principal, p_session, p_db_role, p_ids, p_now, p_expires, p_elicits,
            p_notification);
    RETURN v_code;
END
$$;

-- A card session's calls assert the link's person with claims marked as a
-- card session's (keyturn._card_claims and keyturn._in_card_session, in
-- extension/src/identity.rs, which reads request.jwt.claims for everything
-- else).
--
-- A link travels through mail servers, a team's chat channel, push services
-- and a locked phone's notification shade, so its holder may not be its
-- person. It may decide what the link names, as shown; it must not write
-- what it then decides. A card session may revise its actions, but the
-- revision is not the session's to approve (card_session lists the link's
-- actions alone) and no notification, so no new link, is made for it
-- (keyturn._propose): the person decides it where they are signed in (the
-- queue, the console, their app). Before this, a link's holder revised a
-- self action to any params and approved the revision in the same session
-- (docs/security.md, row 75).

-- keyturnd's POST /card/session: the code's card session, once. No rows for
-- a code that is unknown, used or expired, or for action ids other than the
-- code's (in any order): nothing changes then. Otherwise the code is used
-- up, and the answer is the session's bearer (stored only as a digest), its
-- end (15 minutes at most), a fresh token for each action that is still
-- pending and the person may still decide, the role the session's calls run
-- as (NULL: keyturnd's card role), and the claims that assert the person.
CREATE FUNCTION keyturn.redeem_link_code(code text, action_ids uuid[])
RETURNS TABLE (session text, expires_at timestamptz, tokens jsonb, db_role text, claims jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    l         keyturn.card_link;
    a         keyturn.action;
    v_role    text;
    v_now     timestamptz := clock_timestamp();
    v_bearer  text := 'kts_' || keyturn._token_new();
    v_digest  bytea;
    v_until   timestamptz;
    v_tokens  jsonb := '{}';
    v_token   text;
    v_id      uuid;
BEGIN
    PERFORM keyturn._refuse_nested('redeem_link_code');
    IF redeem_link_code.code IS NULL OR redeem_link_code.action_ids IS NULL THEN
        RETURN;
    END IF;
    v_digest := keyturn._token_digest(redeem_link_code.code);
    SELECT x.* INTO l FROM keyturn.card_link x
     WHERE x.code_digest = v_digest  -- by code alone: the code is the one thing the link holds
       FOR UPDATE;
    IF NOT FOUND OR l.redeemed_at IS NOT NULL OR l.expires_at <= v_now
       OR ARRAY(SELECT DISTINCT x FROM unnest(redeem_link_code.action_ids) x ORDER BY 1)
          IS DISTINCT FROM ARRAY(SELECT x FROM unnest(l.action_ids) x ORDER BY 1) THEN
        RETURN;
    END IF;
    SELECT m.role INTO v_role FROM keyturn.member m WHERE m.tenant = l.tenant AND m.principal = l.principal;
    FOREACH v_id IN ARRAY l.action_ids LOOP
        SELECT x.* INTO a FROM keyturn.action x WHERE x.id = v_id AND x.tenant = l.tenant FOR NO KEY UPDATE;
        CONTINUE WHEN NOT FOUND OR a.status <> 'pending' OR v_role IS NULL
                      OR keyturn._decide_problem(a, l.principal, l.session, v_role, 'approve') IS NOT NULL;
        v_token := keyturn._fresh_token(a);
        v_tokens := v_tokens || jsonb_build_object(v_id::text, v_token);
    END LOOP;
    v_until := v_now + interval '15 minutes';
    v_digest := keyturn._token_digest(v_bearer);
    UPDATE keyturn.card_link x
       SET redeemed_at = v_now, session_digest = v_digest, session_expires_at = v_until
     WHERE x.code_digest = l.code_digest AND x.tenant = l.tenant;
    RETURN QUERY SELECT v_bearer, v_until, v_tokens, l.db_role, keyturn._card_claims(l.tenant, l.principal, l.session);
END
$$;

-- keyturnd's check of a card session's bearer, on every /rpc call that
-- carries one: the role its calls run as (NULL: keyturnd's card role), the
-- claims that assert the person, and the actions it is for; no rows once
-- it has ended or for any other bearer.
CREATE FUNCTION keyturn.card_session(bearer text)
RETURNS TABLE (db_role text, claims jsonb, action_ids uuid[], expires_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_digest bytea;
BEGIN
    IF card_session.bearer IS NULL OR left(card_session.bearer, 4) <> 'kts_' THEN
        RETURN;
    END IF;
    v_digest := keyturn._token_digest(card_session.bearer);
    -- The link's actions alone: never a revision made in the session (see
    -- keyturn._card_claims).
    RETURN QUERY
        SELECT l.db_role, keyturn._card_claims(l.tenant, l.principal, l.session), l.action_ids, l.session_expires_at
          FROM keyturn.card_link l
         WHERE l.session_digest = v_digest  -- by digest alone: the bearer is all keyturnd has
           AND l.session_expires_at > clock_timestamp();
END
$$;

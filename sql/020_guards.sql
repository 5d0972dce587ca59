-- keyturn 0.1.0: the guards the database keeps whoever writes.
--
-- Triggers refuse illegal status transitions and any change to proposal columns,
-- keep the event log and usage append-only, and perform the lifecycle side
-- effects (event row, usage row, staged-payload deletion, NOTIFY) in the same
-- transaction as the status change, so no code path can forget them.

-- The status graph (docs/concepts.md).
CREATE FUNCTION keyturn._legal_transition(from_status text, to_status text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE from_status
        WHEN 'pending'   THEN to_status IN ('expired', 'invalidated', 'rejected_tampered',
                                             'succeeded', 'conflict', 'failed', 'queued',
                                             'rejected', 'cancelled')
        WHEN 'queued'    THEN to_status IN ('leased', 'cancelled', 'invalidated')
        WHEN 'leased'    THEN to_status IN ('executing', 'queued', 'cancelled', 'invalidated')
        WHEN 'executing' THEN to_status IN ('succeeded', 'failed', 'uncertain', 'queued')
        WHEN 'uncertain' THEN to_status IN ('succeeded', 'failed')
        ELSE false
    END
$$;

-- Final: terminal for everyone. 'uncertain' is terminal for automation only.
CREATE FUNCTION keyturn._is_final(status text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT status IN ('succeeded', 'failed', 'rejected', 'rejected_tampered', 'expired',
                      'cancelled', 'conflict', 'invalidated')
$$;

-- Who is acting, for the event log. The gate functions set this first thing;
-- it is transaction-local and overwritten by every call, so a caller cannot
-- make an event lie by setting it beforehand.
-- (One expression returning text, no SET clause: the planner inlines it into
-- the caller, so no call parses and plans it again. The result means nothing.)
CREATE FUNCTION keyturn._set_actor(p_role text, p_principal text)
RETURNS text
LANGUAGE sql VOLATILE
AS $$
    SELECT pg_catalog.concat(
               pg_catalog.set_config('keyturn.actor_role', coalesce(p_role, ''), true),
               pg_catalog.set_config('keyturn.actor_principal', coalesce(p_principal, ''), true),
               pg_catalog.set_config('keyturn.event_detail', '', true))
$$;

-- Detail for the next event row (never param values).
CREATE FUNCTION keyturn._set_event_detail(p_detail jsonb)
RETURNS text
LANGUAGE sql VOLATILE
AS $$
    SELECT pg_catalog.set_config('keyturn.event_detail', coalesce(p_detail::text, ''), true)
$$;

-- The guards are WHEN conditions, evaluated by the executor: an update that
-- keeps the rules runs no trigger function at all, and one that breaks them
-- runs only the function that raises. The conditions are parsed here, once,
-- with pg_catalog's operators; no caller's search_path is ever consulted.
CREATE FUNCTION keyturn._refuse_proposal_change()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'proposal columns of action % are immutable', OLD.id
        USING ERRCODE = '55000',
              HINT = 'Propose a new action instead of changing this one.';
END
$$;

CREATE FUNCTION keyturn._refuse_transition()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'illegal status transition % -> % for action %', OLD.status, NEW.status, OLD.id
        USING ERRCODE = '55000',
              HINT = 'The status graph is in docs/concepts.md, "The state machine".';
END
$$;

-- The column list comes first: an UPDATE that sets none of these columns (every
-- keyturn function's) skips the trigger on a bitmap test, before the WHEN
-- condition is even loaded; one that sets them to their own values passes.
CREATE TRIGGER action_proposal_immutable
    BEFORE UPDATE OF id, tenant, principal, session, tool, tool_version, executor, approval,
                     retain, params, param_keys, params_hash, summary, origin, conversation_id,
                     epoch, target_count, token_digest, token_binding, idempotency_key,
                     created_at, expires_at
    ON keyturn.action
    FOR EACH ROW
    WHEN ((NEW.id, NEW.tenant, NEW.principal, NEW.session, NEW.tool, NEW.tool_version,
           NEW.executor, NEW.approval, NEW.retain, NEW.params, NEW.param_keys, NEW.params_hash,
           NEW.summary, NEW.origin, NEW.conversation_id, NEW.epoch, NEW.target_count,
           NEW.token_digest, NEW.token_binding, NEW.idempotency_key, NEW.created_at,
           NEW.expires_at)
          IS DISTINCT FROM
          (OLD.id, OLD.tenant, OLD.principal, OLD.session, OLD.tool, OLD.tool_version,
           OLD.executor, OLD.approval, OLD.retain, OLD.params, OLD.param_keys, OLD.params_hash,
           OLD.summary, OLD.origin, OLD.conversation_id, OLD.epoch, OLD.target_count,
           OLD.token_digest, OLD.token_binding, OLD.idempotency_key, OLD.created_at,
           OLD.expires_at))
    EXECUTE FUNCTION keyturn._refuse_proposal_change();

-- The same graph as keyturn._legal_transition, spelled out so that no function
-- is called per row.
CREATE TRIGGER action_status_graph
    BEFORE UPDATE OF status ON keyturn.action
    FOR EACH ROW
    WHEN (NEW.status IS DISTINCT FROM OLD.status AND NOT coalesce(CASE OLD.status
        WHEN 'pending'   THEN NEW.status IN ('expired', 'invalidated', 'rejected_tampered',
                                             'succeeded', 'conflict', 'failed', 'queued',
                                             'rejected', 'cancelled')
        WHEN 'queued'    THEN NEW.status IN ('leased', 'cancelled', 'invalidated')
        WHEN 'leased'    THEN NEW.status IN ('executing', 'queued', 'cancelled', 'invalidated')
        WHEN 'executing' THEN NEW.status IN ('succeeded', 'failed', 'uncertain', 'queued')
        WHEN 'uncertain' THEN NEW.status IN ('succeeded', 'failed')
        ELSE false
    END, false))
    EXECUTE FUNCTION keyturn._refuse_transition();

-- Everything a status change implies, in the same transaction: the work list
-- (keyturn.open_action), the event, the usage row, the staged payload, the NOTIFY.
CREATE FUNCTION keyturn._action_lifecycle()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_final boolean := NEW.status IN ('succeeded', 'failed', 'rejected', 'rejected_tampered',
                                      'expired', 'cancelled', 'conflict', 'invalidated');
    v_from  text;
    v_role  text;
    v_detail text;
BEGIN
    -- The work list. (keyturn._is_final spelled out: no function call per row.)
    IF TG_OP = 'INSERT' THEN
        IF NOT v_final THEN
            INSERT INTO keyturn.open_action (action_id, tenant, principal, session, conversation_id,
                                             status, expires_at, next_attempt_at, lease_expires_at,
                                             dispatched_at)
            VALUES (NEW.id, NEW.tenant, NEW.principal, NEW.session, NEW.conversation_id,
                    NEW.status, NEW.expires_at, NEW.next_attempt_at, NEW.lease_expires_at,
                    NEW.dispatched_at);
        END IF;
    ELSIF v_final THEN
        -- Every status a final one can be reached from is open.
        DELETE FROM keyturn.open_action o WHERE o.action_id = NEW.id;
    ELSIF (NEW.status, NEW.next_attempt_at, NEW.lease_expires_at, NEW.dispatched_at)
          IS DISTINCT FROM (OLD.status, OLD.next_attempt_at, OLD.lease_expires_at, OLD.dispatched_at) THEN
        UPDATE keyturn.open_action o
           SET status = NEW.status, next_attempt_at = NEW.next_attempt_at,
               lease_expires_at = NEW.lease_expires_at, dispatched_at = NEW.dispatched_at
         WHERE o.action_id = NEW.id;
    END IF;

    IF TG_OP = 'UPDATE' THEN
        IF NEW.status IS NOT DISTINCT FROM OLD.status THEN
            RETURN NULL;
        END IF;
        v_from := OLD.status;
    END IF;

    v_role := nullif(current_setting('keyturn.actor_role', true), '');
    v_detail := nullif(current_setting('keyturn.event_detail', true), '');
    INSERT INTO keyturn.event (action_id, tenant, action_principal, db_role, principal,
                               from_status, to_status, detail)
    VALUES (NEW.id, NEW.tenant, NEW.principal,
            coalesce(v_role, CASE WHEN current_setting('role') = 'none' THEN session_user::text
                                  ELSE current_setting('role') END),
            nullif(current_setting('keyturn.actor_principal', true), ''),
            v_from, NEW.status, coalesce(v_detail::jsonb, '{}'));
    -- The detail is left in place: one statement may move many rows (lease,
    -- sweep) and each gets it. Every keyturn function clears it on entry.

    IF NEW.status = 'succeeded' THEN
        INSERT INTO keyturn.usage (action_id, tenant, principal, tool, executor, attempts)
        VALUES (NEW.id, NEW.tenant, NEW.principal, NEW.tool, NEW.executor, NEW.attempts);
    END IF;

    -- Only digest-retained external actions ever stage a payload.
    IF v_final AND NEW.retain = 'digest' AND NEW.executor = 'external' THEN
        DELETE FROM keyturn.staged_payload WHERE action_id = NEW.id;
    END IF;

    IF NEW.status = 'queued' AND NEW.next_attempt_at <= clock_timestamp()
       AND coalesce(current_setting('keyturn.notify', true), 'on') <> 'off' THEN
        PERFORM pg_catalog.pg_notify('keyturn_dispatch', NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER action_lifecycle
    AFTER INSERT OR UPDATE OF status, next_attempt_at, lease_expires_at, dispatched_at ON keyturn.action
    FOR EACH ROW EXECUTE FUNCTION keyturn._action_lifecycle();

-- Append-only tables refuse UPDATE, DELETE and TRUNCATE even to their owner.
CREATE FUNCTION keyturn._append_only()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'keyturn.% does not allow %', TG_TABLE_NAME, TG_OP
        USING ERRCODE = '42501',
              HINT = 'Audit and metering rows are never changed. Archive with triggers disabled, as a superuser.';
END
$$;

-- Statement-level, so even an UPDATE or DELETE that matches no row is refused.
CREATE TRIGGER event_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON keyturn.event
    FOR EACH STATEMENT EXECUTE FUNCTION keyturn._append_only();
CREATE TRIGGER usage_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON keyturn.usage
    FOR EACH STATEMENT EXECUTE FUNCTION keyturn._append_only();
CREATE TRIGGER action_target_immutable
    BEFORE UPDATE OR DELETE OR TRUNCATE ON keyturn.action_target
    FOR EACH STATEMENT EXECUTE FUNCTION keyturn._append_only();
CREATE TRIGGER action_never_deleted
    BEFORE DELETE OR TRUNCATE ON keyturn.action
    FOR EACH STATEMENT EXECUTE FUNCTION keyturn._append_only();

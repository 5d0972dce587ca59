-- The guards the database keeps whoever writes.
--
-- Triggers refuse illegal status transitions, any change to proposal columns,
-- and an approval-only status without an approval; keep the event log and
-- usage append-only; and perform the lifecycle side effects (work list, event
-- row, usage row, staged-payload deletion, NOTIFY) in the same transaction as
-- the status change, so no code path can forget them.

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
              HINT = 'keyturn.transition lists every legal status change (docs/concepts.md, "The state machine").';
END
$$;

-- The guards are WHEN conditions, evaluated by the executor: an update that
-- keeps the rules runs no trigger function at all, and one that breaks them
-- runs only the function that raises. The conditions are parsed here, once,
-- with pg_catalog's operators; no caller's search_path is ever consulted.
--
-- The column list comes first: an UPDATE that sets none of these columns (every
-- keyturn function's) skips the trigger on a bitmap test, before the WHEN
-- condition is even loaded; one that sets them to their own values passes.
CREATE TRIGGER action_proposal_immutable
    BEFORE UPDATE OF id, tenant, principal, session, tool, tool_version, executor, approval,
                     retain, params, param_keys, params_hash, summary, origin, conversation_id,
                     epoch, target_count, token_digest, token_binding, idempotency_key,
                     revised_from, revised_by, created_at, expires_at
    ON keyturn.action
    FOR EACH ROW
    WHEN ((NEW.id, NEW.tenant, NEW.principal, NEW.session, NEW.tool, NEW.tool_version,
           NEW.executor, NEW.approval, NEW.retain, NEW.params, NEW.param_keys, NEW.params_hash,
           NEW.summary, NEW.origin, NEW.conversation_id, NEW.epoch, NEW.target_count,
           NEW.token_digest, NEW.token_binding, NEW.idempotency_key, NEW.revised_from,
           NEW.revised_by, NEW.created_at, NEW.expires_at)
          IS DISTINCT FROM
          (OLD.id, OLD.tenant, OLD.principal, OLD.session, OLD.tool, OLD.tool_version,
           OLD.executor, OLD.approval, OLD.retain, OLD.params, OLD.param_keys, OLD.params_hash,
           OLD.summary, OLD.origin, OLD.conversation_id, OLD.epoch, OLD.target_count,
           OLD.token_digest, OLD.token_binding, OLD.idempotency_key, OLD.revised_from,
           OLD.revised_by, OLD.created_at, OLD.expires_at))
    EXECUTE FUNCTION keyturn._refuse_proposal_change();

-- The status graph, keyturn.transition, as a trigger condition generated from
-- its rows: a trigger's WHEN cannot read a table, and a function call per
-- row is what the condition exists to avoid.
DO $do$
BEGIN
    EXECUTE pg_catalog.format(
        $t$CREATE TRIGGER action_status_graph
               BEFORE UPDATE OF status ON keyturn.action
               FOR EACH ROW
               WHEN (NEW.status IS DISTINCT FROM OLD.status
                     AND NOT coalesce(CASE OLD.status %s ELSE false END, false))
               EXECUTE FUNCTION keyturn._refuse_transition()$t$,
        (SELECT pg_catalog.string_agg(
                    pg_catalog.format('WHEN %L THEN NEW.status IN (%s)', f.from_status,
                        (SELECT pg_catalog.string_agg(pg_catalog.quote_literal(t.to_status::text), ', '
                                                      ORDER BY t.to_status)
                           FROM keyturn.transition t WHERE t.from_status = f.from_status)),
                    ' ' ORDER BY f.from_status)
           FROM (SELECT DISTINCT from_status FROM keyturn.transition) f));
END
$do$;

-- A status only an approval can give needs an approval: whoever writes the
-- row (a role that was granted UPDATE, one with BYPASSRLS) cannot move a
-- proposal to queued or an outcome without the approval MAC that only
-- keyturn's approve, standing approvals and task admission can compute.
-- lease and begin_dispatch check the MAC again, for rows that reached
-- 'queued' with the triggers off.
CREATE FUNCTION keyturn._require_approval()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT keyturn._approval_valid(NEW.id, NEW.params_hash, NEW.approved_by, NEW.approved_role,
                                   NEW.approved_at, NEW.approved_via, NEW.approval_mac) THEN
        RAISE EXCEPTION 'action % cannot become % without an approval', NEW.id, NEW.status
            USING ERRCODE = '42501',
                  HINT = 'Only keyturn.approve (or a standing approval, or a task request) gives this status; a table write cannot.';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER action_requires_approval
    BEFORE UPDATE OF status ON keyturn.action
    FOR EACH ROW
    WHEN (OLD.status = 'pending' AND NEW.status IN ('queued', 'succeeded', 'conflict', 'failed'))
    EXECUTE FUNCTION keyturn._require_approval();

-- Everything a status change implies, in the same transaction: the work list
-- (keyturn.open_action), the event, the usage row, the staged payload, the
-- NOTIFY. The acting role and principal come from keyturn's own backend state
-- (extension/src/actor.rs), never from a setting a caller can write; a change
-- keyturn's functions did not make is logged as the session's role, marked
-- direct_write. A row inserted by anything but keyturn's propose (a restore
-- from a dump, which brings its own events and work list) implies nothing.
-- SECURITY DEFINER: the side effects are keyturn's to write whoever changed
-- the row, so a direct write (by a role someone granted UPDATE) is logged,
-- not failed for want of privileges on keyturn's internals.
CREATE FUNCTION keyturn._action_lifecycle()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_final  boolean := keyturn._is_final(NEW.status);
    v_acting boolean := keyturn._acting();
    v_from   keyturn.status;
    v_detail jsonb;
BEGIN
    IF TG_OP = 'INSERT' AND NOT v_acting THEN
        RETURN NULL;
    END IF;

    -- The work list.
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

    v_detail := coalesce(keyturn._event_detail()::jsonb, '{}');
    IF NOT v_acting THEN
        v_detail := v_detail || '{"direct_write": true}';
    END IF;
    INSERT INTO keyturn.event (action_id, tenant, action_principal, db_role, principal,
                               from_status, to_status, detail)
    VALUES (NEW.id, NEW.tenant, NEW.principal,
            coalesce(keyturn._actor_role(),
                     CASE WHEN current_setting('role') = 'none' THEN session_user::text
                          ELSE current_setting('role') END),
            keyturn._actor_principal(), v_from, NEW.status, v_detail);
    -- The detail stays in place: one statement may move many rows (lease,
    -- sweep) and each gets it. Every keyturn function sets it afresh.

    IF NEW.status = 'succeeded' THEN
        INSERT INTO keyturn.usage (action_id, tenant, principal, tool, executor, attempts)
        VALUES (NEW.id, NEW.tenant, NEW.principal, NEW.tool, NEW.executor, NEW.attempts);
    END IF;

    -- Only external actions ever stage a payload or files; both go with the
    -- final status, in its transaction, and stay while any outcome is open
    -- (uncertain included).
    IF v_final AND NEW.executor = 'external' THEN
        IF NEW.retain = 'digest' THEN
            DELETE FROM keyturn.staged_payload WHERE action_id = NEW.id;
        END IF;
        DELETE FROM keyturn.staged_file WHERE action_id = NEW.id;
    END IF;

    -- The payload names nothing: any role may LISTEN on this channel.
    IF NEW.status = 'queued' AND NEW.next_attempt_at <= clock_timestamp()
       AND coalesce(current_setting('keyturn.notify', true), 'on') <> 'off' THEN
        PERFORM pg_catalog.pg_notify('keyturn_dispatch', '');
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

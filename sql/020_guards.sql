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

-- Proposal columns never change (the token excepted: keyturn.issue_token and
-- a redeemed card link give a pending proposal a fresh one, and the binding,
-- an HMAC keyed by the token over the proposal, is what approve trusts): a
-- WHEN condition, parsed here with
-- pg_catalog's operators (no caller's search_path is ever consulted), that
-- runs the raising function only when they do. The column list comes first:
-- an UPDATE that sets none of these columns (every keyturn function's) skips
-- the trigger on a bitmap test, before the condition is even loaded; one that
-- sets them to their own values passes.
CREATE TRIGGER action_proposal_immutable
    BEFORE UPDATE OF id, tenant, principal, session, tool, tool_version, executor, approval,
                     retain, params, param_keys, params_hash, summary, origin, conversation_id,
                     epoch, target_count, idempotency_key,
                     revised_from, revised_by, authors, created_at, expires_at
    ON keyturn.action
    FOR EACH ROW
    WHEN ((NEW.id, NEW.tenant, NEW.principal, NEW.session, NEW.tool, NEW.tool_version,
           NEW.executor, NEW.approval, NEW.retain, NEW.params, NEW.param_keys, NEW.params_hash,
           NEW.summary, NEW.origin, NEW.conversation_id, NEW.epoch, NEW.target_count,
           NEW.idempotency_key, NEW.revised_from,
           NEW.revised_by, NEW.authors, NEW.created_at, NEW.expires_at)
          IS DISTINCT FROM
          (OLD.id, OLD.tenant, OLD.principal, OLD.session, OLD.tool, OLD.tool_version,
           OLD.executor, OLD.approval, OLD.retain, OLD.params, OLD.param_keys, OLD.params_hash,
           OLD.summary, OLD.origin, OLD.conversation_id, OLD.epoch, OLD.target_count,
           OLD.idempotency_key, OLD.revised_from,
           OLD.revised_by, OLD.authors, OLD.created_at, OLD.expires_at))
    EXECUTE FUNCTION keyturn._refuse_proposal_change();

-- The status graph (keyturn.transition), and a status only an approval can
-- give: whoever writes the row (a role that was granted UPDATE, one with
-- BYPASSRLS) cannot move an action along a step the graph does not have, nor
-- a proposal to queued or an outcome without the approval MAC that only
-- keyturn's approve, standing approvals and task admission can compute
-- (lease and begin_dispatch check the MAC again, for rows that reached
-- 'queued' with the triggers off). keyturn._guard_status() is Rust
-- (extension/src/lifecycle.rs): it reads the graph once per backend, where
-- a WHEN condition is parsed again by every statement, and verifies the
-- binding with the key only the extension owner reads.
CREATE TRIGGER action_status_guard
    BEFORE UPDATE OF status ON keyturn.action
    FOR EACH ROW EXECUTE FUNCTION keyturn._guard_status();

-- Everything a status change implies, in the same transaction: the work list
-- (keyturn.open_action), the event, the usage row, the staged payload, the
-- NOTIFY. The acting role and principal come from keyturn's own backend state
-- (extension/src/actor.rs), never from a setting a caller can write; a change
-- keyturn's functions did not make is logged as the session's role, marked
-- direct_write. A row inserted by anything but keyturn's propose (a restore
-- from a dump, which brings its own events and work list) implies nothing.
-- keyturn._action_lifecycle() is Rust (extension/src/lifecycle.rs), for
-- speed: it fires for every status change. It runs its statements as the
-- extension owner: the side effects are keyturn's to write whoever changed
-- the row, so a direct write (by a role someone granted UPDATE) is logged,
-- not failed for want of privileges on keyturn's internals.
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

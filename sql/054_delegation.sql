-- Standing approvals (docs/sql-api.md, "Scoped grants and standing
-- approvals"): a person says once "approve these for me" -- this tool,
-- within this scope, this many times, for this long -- and propose approves
-- what the standing approval covers in the same transaction. The database
-- counts the uses: one conditional UPDATE spends each, so no concurrency,
-- retry or second process ever approves more than max_uses.
--
-- keyturn.delegate, keyturn.revoke_delegation and keyturn.delegations are
-- Rust entry points (extension/src/gate/human.rs): the separation of duties
-- of approve applies, since a standing approval is an approval.

-- Why a tool version may not be approved by a standing approval, or NULL.
-- STABLE, as format() is, so that it is inlined: declared IMMUTABLE it was
-- not, and every propose parsed and planned its body again (~0.07 ms, a tenth
-- of a propose; tests/dba/catalog.sql holds every SQL function to this).
CREATE FUNCTION keyturn._not_delegable(p_ver keyturn.tool_version)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN p_ver.approval = 'independent' THEN 'it needs an independent approver'
        WHEN p_ver.quorum > 1 THEN format('it needs %s approvers', p_ver.quorum)
        WHEN p_ver.approval = 'task' THEN 'its approval is the request in the chat'
        WHEN p_ver.effect = 'irreversible' AND NOT p_ver.delegable
            THEN 'its effect is irreversible (a tool may allow it with "delegable": true)'
    END
$$;

CREATE FUNCTION keyturn._delegate(p_caller oid, p_tool text, p_scope jsonb, p_max_uses int,
                                  p_valid_for interval)
RETURNS uuid
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_ver       keyturn.tool_version;
    v_why       text;
    v_scope     jsonb;
    v_id        uuid := keyturn._uuid_v7();
    v_now       timestamptz;
    v_epoch     bigint;
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    PERFORM keyturn._require_tool(p_tool);
    SELECT v.* INTO v_ver FROM keyturn.tool t
      JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
     WHERE t.name = p_tool;
    IF NOT keyturn._has_grant(v_tenant, v_principal, p_tool) THEN
        RAISE EXCEPTION 'keyturn: principal % holds no grant for tool % in tenant %', v_principal, p_tool, v_tenant
            USING ERRCODE = '42501',
                  HINT = 'A standing approval covers only what its principal may itself approve.';
    END IF;
    IF p_max_uses IS NULL OR p_max_uses NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'keyturn: max_uses must be from 1 to 1000, not %', p_max_uses USING ERRCODE = '22023';
    END IF;
    IF keyturn._interval_within(p_valid_for, interval '7 days') IS NOT TRUE THEN
        RAISE EXCEPTION 'keyturn: valid_for must be more than 0 and at most 7 days, without months or years, not %', p_valid_for
            USING ERRCODE = '22023';
    END IF;
    v_why := keyturn._not_delegable(v_ver);
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: tool % cannot be approved by a standing approval: %', p_tool, v_why
            USING ERRCODE = '22023';
    END IF;
    IF p_scope IS NULL THEN
        RAISE EXCEPTION 'keyturn: scope is required' USING ERRCODE = '22023',
            HINT = 'A standing approval covers a call only when its scope names every params path the call carries, e.g. {"params": {"set.stage": {"eq": "won"}, "where.id": {"any": true}}}.';
    END IF;
    v_scope := keyturn._check_scope(p_scope);
    IF v_ver.executor = 'sql' THEN
        -- Its writes will run as this role, under its RLS.
        PERFORM keyturn._refuse_rls_bypass(p_caller);
    END IF;
    v_now := clock_timestamp();
    v_epoch := keyturn._epoch(v_tenant, v_principal);
    INSERT INTO keyturn.delegation (id, tenant, principal, tool, tool_version, scope, max_uses, epoch, db_role,
                                    created_at, expires_at)
    VALUES (v_id, v_tenant, v_principal, p_tool, v_ver.version, v_scope, p_max_uses, v_epoch,
            p_caller::regrole::text, v_now, v_now + p_valid_for);
    RETURN v_id;
END
$$;

-- Ends a standing approval: its own principal, or an admin of its tenant.
-- False when it is unknown, invisible, or already revoked.
--
-- It never waits long for the one who uses it: a covered proposal holds the
-- row (its use) until its transaction ends, and an agent that leaves that
-- transaction open would hold the person's revocation (twelfth red-team
-- pass). Past lock_timeout the principal's authorization epoch moves
-- instead, which nobody holds: every standing approval of the principal
-- ends with it (each is bound to the epoch it was given under), its pending
-- proposals are invalidated, and the open transaction's covered write
-- cannot commit (its commit rechecks the epoch). Broader than asked, never
-- later.
CREATE FUNCTION keyturn._revoke_delegation(p_caller oid, p_id uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '2s'
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_role      text;
    d           keyturn.delegation;
    v_now       timestamptz := clock_timestamp();
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    v_role := keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    SELECT x.* INTO d FROM keyturn.delegation x
     WHERE x.id = p_id AND x.tenant = v_tenant
       AND (v_role IN ('approver', 'admin') OR x.principal = v_principal);
    IF NOT FOUND OR d.revoked_at IS NOT NULL THEN
        RETURN false;
    END IF;
    IF d.principal <> v_principal AND v_role <> 'admin' THEN
        RAISE EXCEPTION 'keyturn: only its principal or an admin of tenant % may revoke standing approval %', v_tenant, p_id
            USING ERRCODE = '42501';
    END IF;
    BEGIN
        UPDATE keyturn.delegation x SET revoked_at = v_now
         WHERE x.id = p_id AND x.tenant = v_tenant AND x.revoked_at IS NULL;
        RETURN FOUND;
    EXCEPTION WHEN lock_not_available THEN
        PERFORM keyturn._bump_epoch(d.tenant, d.principal);
        RETURN true;
    END;
END
$$;

-- Why a standing approval covers nothing any more, or NULL while it is
-- live: the one statement of what "live" means, for _spend_delegation's
-- choice and for delegations()' answer. p_tool_version is the tool's
-- current version (read by the caller: on Citus keyturn.tool is a reference
-- table, read in a statement of its own).
CREATE FUNCTION keyturn._delegation_ended(d keyturn.delegation, p_tool_version int, p_epoch bigint,
                                          p_at timestamptz)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN CASE
        WHEN d.revoked_at IS NOT NULL THEN 'revoked'
        WHEN d.expires_at <= p_at THEN 'expired'
        WHEN d.uses >= d.max_uses THEN 'its uses are spent'
        WHEN p_tool_version IS DISTINCT FROM d.tool_version
            THEN format('the tool changed from version %s to %s; a new version needs a new standing approval',
                        d.tool_version, coalesce(p_tool_version::text, 'none'))
        WHEN p_epoch IS DISTINCT FROM d.epoch THEN 'the authorization of its principal changed'
        WHEN to_regrole(d.db_role) IS NULL THEN format('its role %s no longer exists', d.db_role)
        WHEN pg_has_role(d.db_role, 'keyturn_agent', 'MEMBER')
            THEN format('its role %s is now a member of keyturn_agent', d.db_role)
    END;
END
$$;

CREATE FUNCTION keyturn._delegations()
RETURNS TABLE (o_delegation_id uuid, o_principal text, o_tool text, o_scope jsonb, o_max_uses int,
               o_uses int, o_expires_at timestamptz, o_revoked boolean, o_tool_version int, o_ended text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_role      text;
    v_now       timestamptz := clock_timestamp();
    d           keyturn.delegation;
    v_version   int;
BEGIN
    v_role := keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    FOR d IN
        SELECT x.* FROM keyturn.delegation x
         WHERE x.tenant = v_tenant AND (v_role IN ('approver', 'admin') OR x.principal = v_principal)
         ORDER BY x.created_at, x.id
    LOOP
        SELECT t.version INTO v_version FROM keyturn.tool t WHERE t.name = d.tool;
        RETURN QUERY SELECT d.id, d.principal, d.tool, d.scope, d.max_uses, d.uses, d.expires_at,
                            d.revoked_at IS NOT NULL, d.tool_version,
                            keyturn._delegation_ended(d, v_version, keyturn._epoch(d.tenant, d.principal), v_now);
    END LOOP;
END
$$;

-- The live standing approval of the proposing principal that covers a new
-- proposal, with one of its uses spent, or NULL. Live: as
-- keyturn._delegation_ended says (not revoked, not past its end, uses left,
-- given for this tool version, the delegator's authorization unchanged, its
-- role still there and still no agent), and the tool version one a standing
-- approval may approve. Covers: its scope names every path the params carry
-- (keyturn._scope_uncovered). The use is spent by one conditional UPDATE:
-- concurrent proposals wait on the row, and the one that finds the uses gone
-- is simply not covered (under REPEATABLE READ: fails to serialize).
CREATE FUNCTION keyturn._spend_delegation(p_tenant text, p_principal text, p_epoch bigint,
                                          p_ver keyturn.tool_version, p_params jsonb, p_count int)
RETURNS keyturn.delegation
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    c     keyturn.delegation;
    d     keyturn.delegation;
    v_now timestamptz;
BEGIN
    IF keyturn._not_delegable(p_ver) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    v_now := clock_timestamp();
    FOR c IN
        SELECT x.* FROM keyturn.delegation x
         WHERE x.tenant = p_tenant AND x.principal = p_principal AND x.tool = p_ver.tool
           AND x.tool_version = p_ver.version AND x.revoked_at IS NULL AND x.expires_at > v_now
           AND x.uses < x.max_uses AND x.epoch = p_epoch
         ORDER BY x.expires_at, x.id
    LOOP
        CONTINUE WHEN keyturn._delegation_ended(c, p_ver.version, p_epoch, v_now) IS NOT NULL;
        CONTINUE WHEN keyturn._scope_uncovered(c.scope, p_params, p_count) IS NOT NULL;
        v_now := clock_timestamp();
        UPDATE keyturn.delegation x SET uses = x.uses + 1
         WHERE x.id = c.id AND x.tenant = c.tenant AND x.uses < x.max_uses AND x.revoked_at IS NULL
           AND x.expires_at > v_now
        RETURNING x.* INTO d;
        IF FOUND THEN
            RETURN d;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

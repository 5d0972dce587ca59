-- Administration: members, grants, tools (docs/sql-api.md, "Administration").
--
-- Two kinds of administrator. The keyturn_admin database role is the
-- platform's: it registers tools (which are global) and manages every
-- tenant, naming the tenant as an argument. A tenant's own `admin` member,
-- calling through the human-facing connection (keyturn_approver) with its
-- identity, manages that one tenant's members and grants, and no other.
-- Every membership or grant change that changes something bumps the
-- principal's authorization epoch.

CREATE FUNCTION keyturn._require_tool(p_tool text)
RETURNS keyturn.tool
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v keyturn.tool;
BEGIN
    SELECT t.* INTO v FROM keyturn.tool t WHERE t.name = p_tool;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'keyturn: unknown tool %', coalesce(keyturn._quoted(p_tool), 'NULL')
            USING ERRCODE = '42704',
                  HINT = 'Register it first with keyturn.register_tool(name, spec).';
    END IF;
    RETURN v;
END
$$;

-- Raises 42501 unless the caller holds the platform's keyturn_admin role.
-- Membership and grants are authorized by that role alone, never by an
-- identity the caller asserts: a tenant's `admin` member decides and sees
-- the tenant's actions, and administers nothing (an identity is a setting
-- any connection may make, a role is the database's own grant). The
-- refusal names an agent as one (separation of duties).
CREATE FUNCTION keyturn._require_admin(p_tenant text, p_what text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_caller text := keyturn._calling_role();
BEGIN
    PERFORM keyturn._refuse_nested(p_what);
    IF pg_catalog.pg_has_role(v_caller, 'keyturn_admin', 'USAGE') THEN
        RETURN;
    END IF;
    IF pg_catalog.pg_has_role(v_caller, 'keyturn_agent', 'MEMBER')
       OR pg_catalog.pg_has_role(session_user, 'keyturn_agent', 'USAGE') THEN
        RAISE EXCEPTION 'keyturn: % may not be called by an agent role', p_what
            USING ERRCODE = '42501';
    ELSE
        RAISE EXCEPTION 'keyturn: % needs the keyturn_admin role (tenant %)', p_what, coalesce(keyturn._quoted(p_tenant), 'NULL')
            USING ERRCODE = '42501',
                  HINT = 'Membership and grants are the platform admin''s: call them on a login granted keyturn_admin, never through a person''s identity.';
    END IF;
END
$$;

CREATE FUNCTION keyturn.add_member(tenant text, principal text, role text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_changed boolean;
BEGIN
    PERFORM keyturn._require_admin(add_member.tenant, 'add_member');
    PERFORM keyturn._require_text(add_member.tenant, 'tenant'),
            keyturn._require_text(add_member.principal, 'principal');
    -- One that would print as another could never act (identity refuses
    -- it) and would read as someone else in every list.
    PERFORM keyturn._require_identity_text(add_member.tenant, 'tenant'),
            keyturn._require_identity_text(add_member.principal, 'principal');
    IF add_member.role IS NULL OR add_member.role NOT IN ('member', 'approver', 'admin') THEN
        RAISE EXCEPTION 'keyturn: role must be member, approver or admin, not %',
                coalesce(keyturn._quoted(add_member.role), 'NULL')
            USING ERRCODE = '22023';
    END IF;

    INSERT INTO keyturn.member AS m (tenant, principal, role)
    VALUES (add_member.tenant, add_member.principal, add_member.role)
    ON CONFLICT ON CONSTRAINT member_pkey
    DO UPDATE SET role = EXCLUDED.role, updated_at = EXCLUDED.updated_at
       WHERE m.role IS DISTINCT FROM EXCLUDED.role;
    v_changed := FOUND;

    IF v_changed THEN
        PERFORM keyturn._bump_epoch(add_member.tenant, add_member.principal);
    END IF;
    RETURN v_changed;
END
$$;

CREATE FUNCTION keyturn.remove_member(tenant text, principal text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_members int;
    v_grants  int;
BEGIN
    PERFORM keyturn._require_admin(remove_member.tenant, 'remove_member');
    DELETE FROM keyturn.tool_grant g
     WHERE g.tenant = remove_member.tenant AND g.principal = remove_member.principal;
    GET DIAGNOSTICS v_grants = ROW_COUNT;
    DELETE FROM keyturn.member m
     WHERE m.tenant = remove_member.tenant AND m.principal = remove_member.principal;
    GET DIAGNOSTICS v_members = ROW_COUNT;
    -- Where the person was reached goes with them: a principal id added
    -- again (shared, handed on) must not bring back the old person's email,
    -- webhook or device. What they left queued is cancelled when it is due.
    DELETE FROM keyturn.notify_channel c
     WHERE c.tenant = remove_member.tenant AND c.principal = remove_member.principal;

    IF v_members + v_grants > 0 THEN
        PERFORM keyturn._bump_epoch(remove_member.tenant, remove_member.principal);
    END IF;
    RETURN v_members + v_grants > 0;
END
$$;

-- Sets the (tenant, principal, tool) grant to exactly the given scope,
-- valid_until and max_uses, with its use count at zero (counted in
-- keyturn.grant_use against the grant's granted_at); the plain
-- three-argument call is a grant without scope or limits. A call that changes
-- none of them changes nothing (and keeps the count); any real change bumps
-- the epoch, so proposals made under the old terms are invalidated.
CREATE FUNCTION keyturn.grant_tool(tenant text, principal text, tool text, scope jsonb DEFAULT NULL,
                                   valid_until timestamptz DEFAULT NULL, max_uses int DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_scope    jsonb;
    v_changed  boolean;
    v_at       timestamptz;
    v_read     boolean;
    v_upstream boolean;
BEGIN
    PERFORM keyturn._require_admin(grant_tool.tenant, 'grant_tool');
    PERFORM keyturn._require_text(grant_tool.tenant, 'tenant'),
            keyturn._require_text(grant_tool.principal, 'principal');
    PERFORM keyturn._require_tool(grant_tool.tool);
    IF grant_tool.scope IS NOT NULL THEN
        v_scope := keyturn._check_scope(grant_tool.scope);
    END IF;
    IF grant_tool.max_uses IS NOT NULL AND grant_tool.max_uses < 1 THEN
        RAISE EXCEPTION 'keyturn: max_uses must be at least 1, not %', grant_tool.max_uses USING ERRCODE = '22023';
    END IF;
    -- What a read's grant can honor (keyturn._read_grant): a params scope,
    -- and max_targets for an sql read (the rows it answers with); a read is
    -- not counted, and an upstream read resolves no targets.
    SELECT v.kind = 'read', v.executor IS DISTINCT FROM 'sql' INTO v_read, v_upstream
      FROM keyturn.tool t JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
     WHERE t.name = grant_tool.tool;
    IF v_read AND grant_tool.max_uses IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: % is a read tool: a read is not counted, so its grant cannot limit uses (max_uses)', grant_tool.tool
            USING ERRCODE = '22023',
                  HINT = 'Grant it with a scope and valid_until only; max_uses counts proposals of write tools.';
    END IF;
    IF v_read AND v_upstream AND v_scope ? 'max_targets' THEN
        RAISE EXCEPTION 'keyturn: % is an upstream read tool: it resolves no targets, so its grant cannot bound them (max_targets)', grant_tool.tool
            USING ERRCODE = '22023',
                  HINT = 'A params scope bounds an upstream read''s arguments.';
    END IF;

    -- granted_at names the terms the uses count against, so each new terms
    -- get their own, also within one transaction (whose now() stands
    -- still): the clock's, and always later than the terms before. Worked
    -- out here: Citus takes only immutable functions in an upsert's DO
    -- UPDATE, and adding to a timestamptz is not one.
    SELECT greatest(clock_timestamp(), max(g.granted_at) + interval '1 microsecond') INTO v_at
      FROM keyturn.tool_grant g
     WHERE g.tenant = grant_tool.tenant AND g.principal = grant_tool.principal AND g.tool = grant_tool.tool;
    INSERT INTO keyturn.tool_grant AS g (tenant, principal, tool, scope, valid_until, max_uses, granted_at)
    VALUES (grant_tool.tenant, grant_tool.principal, grant_tool.tool, v_scope, grant_tool.valid_until,
            grant_tool.max_uses, v_at)
    ON CONFLICT ON CONSTRAINT tool_grant_pkey
    DO UPDATE SET scope = EXCLUDED.scope, valid_until = EXCLUDED.valid_until, max_uses = EXCLUDED.max_uses,
                  granted_at = EXCLUDED.granted_at
       WHERE (g.scope, g.valid_until, g.max_uses)
             IS DISTINCT FROM (EXCLUDED.scope, EXCLUDED.valid_until, EXCLUDED.max_uses);
    v_changed := FOUND;
    -- The uses are counted in the proposer's row (keyturn.grant_use),
    -- against the grant's granted_at: new terms count from zero. Made here
    -- when there is none, so that proposals find it (a REPEATABLE READ one
    -- could not make it after its snapshot without failing to serialize),
    -- and never touched when there is: an INSERT ... ON CONFLICT DO NOTHING
    -- waits for the row's open updater, a proposal left open (thirteenth
    -- red-team pass).
    PERFORM FROM keyturn.grant_use u
      WHERE u.tenant = grant_tool.tenant AND u.principal = grant_tool.principal AND u.tool = grant_tool.tool;
    IF NOT FOUND THEN
        INSERT INTO keyturn.grant_use (tenant, principal, tool)
        VALUES (grant_tool.tenant, grant_tool.principal, grant_tool.tool)
        ON CONFLICT ON CONSTRAINT grant_use_pkey DO NOTHING;
    END IF;

    IF v_changed THEN
        PERFORM keyturn._bump_epoch(grant_tool.tenant, grant_tool.principal);
    END IF;
    RETURN v_changed;
END
$$;

CREATE FUNCTION keyturn.revoke_tool(tenant text, principal text, tool text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_changed boolean;
BEGIN
    PERFORM keyturn._require_admin(revoke_tool.tenant, 'revoke_tool');
    PERFORM keyturn._require_tool(revoke_tool.tool);

    DELETE FROM keyturn.tool_grant g
     WHERE g.tenant = revoke_tool.tenant AND g.principal = revoke_tool.principal
       AND g.tool = revoke_tool.tool;
    v_changed := FOUND;

    IF v_changed THEN
        PERFORM keyturn._bump_epoch(revoke_tool.tenant, revoke_tool.principal);
    END IF;
    RETURN v_changed;
END
$$;

CREATE FUNCTION keyturn.set_tool_enabled(name text, enabled boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('set_tool_enabled');
    PERFORM keyturn._require_tool(set_tool_enabled.name);
    IF set_tool_enabled.enabled IS NULL THEN
        RAISE EXCEPTION 'keyturn: enabled must be true or false' USING ERRCODE = '22023';
    END IF;
    UPDATE keyturn.tool t SET enabled = set_tool_enabled.enabled, updated_at = now()
     WHERE t.name = set_tool_enabled.name AND t.enabled IS DISTINCT FROM set_tool_enabled.enabled;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- A commit that has read the tool enabled (its recheck passed) ends before
    -- this change commits, so none commits after the kill switch returned
    -- (docs/security.md, row 95); one that has not waits for it and fails.
    PERFORM keyturn._await_rechecks(set_tool_enabled.name, NULL, NULL);
    RETURN true;
END
$$;

-- Never errors: anything unknown, disabled or ambiguous is 'unsupported'.
CREATE FUNCTION keyturn.classify(tool text)
RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(
        (SELECT CASE WHEN t.enabled THEN v.kind::text ELSE 'unsupported' END
           FROM keyturn.tool t
           JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
          WHERE t.name = classify.tool),
        'unsupported')
$$;

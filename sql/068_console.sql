-- What the operator console reads (docs/card.md, "The operator console"):
-- actions by status with counts, a filtered list of actions, the tools with
-- their versions and enabled state, and the standing approvals, for the
-- operator and the platform administrator, across tenants as
-- uncertain_actions is.
--
-- None returns a param value or a summary: a summary is written from the
-- params, and an operator reconciles by role across tenants without seeing
-- what the people of a tenant proposed (the events, attempts and receipts
-- they already read hold no values either). A person's own queue is
-- keyturn.pending, with the card.
--
-- The filters are plain arguments, each NULL for "any"; the time range is on
-- created_at, half-open [since, until).

-- The checks every console read makes first: not nested in another keyturn
-- call, the operator or the platform administrator (others: 42501), and
-- filters that make sense (22023). The reads are SQL functions, whose
-- arguments may share the names of the columns they return; each makes
-- this call as its first statement, before its query runs.
CREATE FUNCTION keyturn._console(p_what text, p_status text, p_since timestamptz, p_until timestamptz,
                                 p_max_rows int)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_role text := keyturn._calling_role();
BEGIN
    PERFORM keyturn._refuse_nested(p_what);
    IF NOT (pg_has_role(v_role, 'keyturn_operator', 'USAGE') OR pg_has_role(v_role, 'keyturn_admin', 'USAGE')) THEN
        RAISE EXCEPTION 'keyturn: % is for the operator console', p_what
            USING ERRCODE = '42501',
                  HINT = 'Call it as a role in keyturn_operator or keyturn_admin.';
    END IF;
    IF p_since IS NOT NULL AND p_until IS NOT NULL AND p_since >= p_until THEN
        RAISE EXCEPTION 'keyturn: since (%) must be before until (%)', p_since, p_until
            USING ERRCODE = '22023';
    END IF;
    IF p_max_rows IS NULL OR p_max_rows NOT BETWEEN 1 AND 500 THEN
        RAISE EXCEPTION 'keyturn: max_rows must be 1 to 500, not %', coalesce(p_max_rows::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_status IS NOT NULL AND NOT p_status = ANY (enum_range(NULL::keyturn.status)::text[]) THEN
        RAISE EXCEPTION 'keyturn: % is not a status', keyturn._quoted(p_status)
            USING ERRCODE = '22023',
                  HINT = format('One of %s.', array_to_string(enum_range(NULL::keyturn.status)::text[], ', '));
    END IF;
END
$$;

-- How many actions are in each status (every status, zeros included), of
-- the actions that match the filters.
CREATE FUNCTION keyturn.action_counts(tenant text DEFAULT NULL, tool text DEFAULT NULL,
                                      since timestamptz DEFAULT NULL, until timestamptz DEFAULT NULL)
RETURNS TABLE (status text, actions bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._console('action_counts', NULL, action_counts.since, action_counts.until, 1);
    WITH counted AS (
        SELECT a.status, count(*) AS n
          FROM keyturn.action a
         WHERE (action_counts.tenant IS NULL OR a.tenant = action_counts.tenant)
           AND (action_counts.tool IS NULL OR a.tool = action_counts.tool)
           AND (action_counts.since IS NULL OR a.created_at >= action_counts.since)
           AND (action_counts.until IS NULL OR a.created_at < action_counts.until)
         GROUP BY a.status)
    SELECT s::text, coalesce(c.n, 0)
      FROM unnest(enum_range(NULL::keyturn.status)) WITH ORDINALITY AS e (s, ord)
      LEFT JOIN counted c ON c.status = e.s
     ORDER BY e.ord
$$;

-- The actions that match, newest first, at most max_rows (1 to 500); one
-- action by its id with id.
CREATE FUNCTION keyturn.find_actions(status text DEFAULT NULL, tenant text DEFAULT NULL, tool text DEFAULT NULL,
                                     since timestamptz DEFAULT NULL, until timestamptz DEFAULT NULL,
                                     id uuid DEFAULT NULL, max_rows int DEFAULT 50)
RETURNS TABLE (action_id uuid, tenant text, tool text, tool_version int, status text, principal text,
               session text, approval text, retain text, attempts int, created_at timestamptz,
               updated_at timestamptz, expires_at timestamptz, approved_by text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._console('find_actions', find_actions.status, find_actions.since, find_actions.until,
                            find_actions.max_rows);
    SELECT a.id, a.tenant, a.tool, a.tool_version, a.status::text, a.principal, a.session,
           a.approval::text, a.retain::text, a.attempts, a.created_at, a.updated_at, a.expires_at,
           a.approved_by
      FROM keyturn.action a
     WHERE (find_actions.id IS NULL OR a.id = find_actions.id)
       AND (find_actions.status IS NULL OR a.status = find_actions.status::keyturn.status)
       AND (find_actions.tenant IS NULL OR a.tenant = find_actions.tenant)
       AND (find_actions.tool IS NULL OR a.tool = find_actions.tool)
       AND (find_actions.since IS NULL OR a.created_at >= find_actions.since)
       AND (find_actions.until IS NULL OR a.created_at < find_actions.until)
     ORDER BY a.created_at DESC, a.id
     LIMIT find_actions.max_rows
$$;

-- Every tool with its current version's class, whether it is enabled, and
-- whether the caller may throw the kill switch (keyturn.set_tool_enabled,
-- the platform administrator's), so the console offers it only then.
CREATE FUNCTION keyturn.tools()
RETURNS TABLE (tool text, version int, enabled boolean, kind text, executor text, effect text,
               approval text, quorum int, retain text, delegable boolean, expires_in interval,
               updated_at timestamptz, may_switch boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._console('tools', NULL, NULL, NULL, 1);
    SELECT t.name, t.version, t.enabled, v.kind::text, v.executor::text, v.effect::text,
           v.approval::text, v.quorum, v.retain::text, v.delegable, v.expires_in, t.updated_at,
           has_function_privilege(keyturn._calling_role(), 'keyturn.set_tool_enabled(text, boolean)', 'EXECUTE')
      FROM keyturn.tool t
      JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
     ORDER BY t.name
$$;

-- Every standing approval (of one tenant with tenant), newest first, with
-- why it no longer covers anything (ended, NULL while it is live). Scopes
-- are shown: they are what a person allowed, not what an agent proposed.
CREATE FUNCTION keyturn.standing_approvals(tenant text DEFAULT NULL)
RETURNS TABLE (delegation_id uuid, tenant text, principal text, tool text, tool_version int, scope jsonb,
               uses int, max_uses int, created_at timestamptz, expires_at timestamptz,
               revoked_at timestamptz, ended text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._console('standing_approvals', NULL, NULL, NULL, 1);
    SELECT d.id, d.tenant, d.principal, d.tool, d.tool_version, d.scope, d.uses, d.max_uses,
           d.created_at, d.expires_at, d.revoked_at,
           keyturn._delegation_ended(d, t.version, keyturn._epoch(d.tenant, d.principal), clock_timestamp())
      FROM keyturn.delegation d
      LEFT JOIN keyturn.tool t ON t.name = d.tool
     WHERE standing_approvals.tenant IS NULL OR d.tenant = standing_approvals.tenant
     ORDER BY d.created_at DESC, d.id
$$;

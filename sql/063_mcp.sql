-- keyturn over MCP (docs/mcp.md): what keyturnd's /mcp asks the database.
--
-- keyturnd decides nothing here either. Which tools an agent sees and how
-- they are described (keyturn.mcp_tools), what a read tool returns
-- (keyturn.read: selected as the agent, under its RLS, fenced), whether an
-- upstream read may run (keyturn.upstream_read), what an action's status
-- tells its agent (keyturn.mcp_action_status) and whether a client's retry
-- is the call it proposed (keyturn.mcp_resume) and what its task is
-- (keyturn.mcp_task), how a tool discovered on an
-- upstream MCP server is registered (keyturn.register_discovered_tool:
-- disabled, classified fail-closed, its definition hashed) and what a
-- changed upstream definition does to an approved call
-- (keyturn.check_upstream_tool: nothing is sent, the action is invalidated)
-- are all answered here.

-- The sql part of a read tool's spec: {"table", "key", "select": [columns],
-- "where": [columns], "max_rows": n}, checked against the catalog like a
-- write form's. Returns what keyturn._spec_sql returns, with select and
-- max_rows and without set and version.
CREATE FUNCTION keyturn._spec_sql_read(p_tool text, p_sql jsonb)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    c        jsonb;
    v_relid  oid;
    v_key    text;
    v_select text[] := '{}';
    v_where  text[] := '{}';
    v_types  jsonb;
    v_max    int := 50;
    v_bad    text;
BEGIN
    IF p_sql IS NULL OR jsonb_typeof(p_sql) <> 'object' THEN
        RAISE EXCEPTION 'keyturn: sql read tool % needs spec.sql = {"table", "key", "select", "where", "max_rows"}', p_tool
            USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._spec_keys(p_sql, 'spec.sql of a read tool', ARRAY['table', 'key', 'select', 'where', 'max_rows']);
    -- A table, as for a write: a view selects with its owner's rights, past
    -- the caller's row-level security, and a materialized view has none.
    v_relid := keyturn._spec_table(p_sql -> 'table', '{r,p}');
    v_bad := (SELECT string_agg(p, '; ') FROM keyturn._agent_table_problems(v_relid, true) p);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: agents could read % past its row-level security: %', v_relid::regclass, v_bad
            USING ERRCODE = '22023',
                  HINT = 'Make a role that is no agent the table''s owner, and take BYPASSRLS from agent roles, then register again.';
    END IF;
    v_key := p_sql ->> 'key';
    v_types := jsonb_build_object(v_key, keyturn._spec_column(v_relid, p_sql -> 'key', 'spec.sql.key'));
    IF jsonb_typeof(p_sql -> 'select') IS DISTINCT FROM 'array' OR jsonb_array_length(p_sql -> 'select') = 0 THEN
        RAISE EXCEPTION 'keyturn: spec.sql.select must be a non-empty array of column names' USING ERRCODE = '22023';
    END IF;
    FOR c IN SELECT jsonb_array_elements(p_sql -> 'select') LOOP
        v_types := v_types || jsonb_build_object(c #>> '{}', keyturn._spec_column(v_relid, c, 'spec.sql.select'));
        IF c #>> '{}' = ANY (v_select) THEN
            RAISE EXCEPTION 'keyturn: spec.sql.select names % twice', c USING ERRCODE = '22023';
        END IF;
        v_select := v_select || (c #>> '{}');
    END LOOP;
    -- A read form may have no filter: it reads the first max_rows rows the
    -- agent can see, by key.
    SELECT w.p_types, w.o_where INTO v_types, v_where FROM keyturn._spec_where(v_relid, p_sql, v_types) w;
    IF p_sql ? 'max_rows' THEN
        v_max := keyturn._spec_positive_int(p_sql -> 'max_rows', 'spec.sql.max_rows', 1000);
    END IF;
    RETURN (SELECT jsonb_build_object(
                'schema', n.nspname, 'table', r.relname, 'key', v_key,
                'select', to_jsonb(v_select), 'where', to_jsonb(v_where), 'types', v_types,
                'max_rows', v_max)
              FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace
             WHERE r.oid = v_relid);
END
$$;

-- The JSON Schema of one value of a column of type p_type, for an agent:
-- what it should send (keyturn casts text to the column's type either way).
CREATE FUNCTION keyturn._mcp_value_schema(p_type text)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE
        WHEN p_type IN ('smallint', 'integer', 'bigint') THEN '{"type": "integer"}'::jsonb
        WHEN p_type IN ('real', 'double precision') OR p_type LIKE 'numeric%' THEN '{"type": "number"}'::jsonb
        WHEN p_type = 'boolean' THEN '{"type": "boolean"}'::jsonb
        WHEN p_type IN ('json', 'jsonb') THEN '{}'::jsonb
        ELSE '{"type": "string"}'::jsonb END
$$;

-- A form's where part: each column one value or a list of 1 to 1000.
CREATE FUNCTION keyturn._mcp_where_schema(v keyturn.tool_version)
RETURNS jsonb
-- plpgsql: a SQL function of a row type with subqueries is never inlined.
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RETURN jsonb_build_object(
            'type', 'object',
            'properties', coalesce((
                SELECT jsonb_object_agg(c, jsonb_build_object('anyOf', jsonb_build_array(
                           keyturn._mcp_value_schema(v.sql_types ->> c),
                           jsonb_build_object('type', 'array', 'items', keyturn._mcp_value_schema(v.sql_types ->> c),
                                              'minItems', 1, 'maxItems', 1000))))
                  FROM unnest(v.sql_where) AS c), '{}'),
            'additionalProperties', false);
END
$$;

-- What tools/list gives as a tool's inputSchema: an external tool's
-- params_schema; an sql write tool's form {"where", "set"} with the columns
-- it may filter on and set; an sql read tool's {"where"}.
CREATE FUNCTION keyturn._mcp_input_schema(v keyturn.tool_version)
RETURNS jsonb
-- plpgsql: a SQL function of a row type with subqueries is never inlined.
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RETURN CASE
            WHEN v.executor = 'external' THEN v.params_schema
            -- A read tool for agents' own queries: listed, but it reads
            -- nothing over MCP (keyturn._readable).
            WHEN v.kind = 'read' AND v.executor IS NULL THEN coalesce(v.params_schema, '{"type": "object"}')
            WHEN v.kind = 'read' THEN jsonb_build_object(
                'type', 'object',
                'properties', jsonb_build_object('where', keyturn._mcp_where_schema(v)),
                'additionalProperties', false)
            ELSE jsonb_build_object(
                'type', 'object',
                'properties', jsonb_build_object(
                    'where', keyturn._mcp_where_schema(v) || '{"minProperties": 1}',
                    'set', jsonb_build_object(
                        'type', 'object',
                        'properties', coalesce((SELECT jsonb_object_agg(c, keyturn._mcp_value_schema(v.sql_types ->> c))
                                                  FROM unnest(v.sql_set) AS c), '{}'),
                        'additionalProperties', false, 'minProperties', 1)),
                'required', '["where", "set"]'::jsonb,
                'additionalProperties', false) END;
END
$$;

-- A tool's MCP annotations: readOnlyHint true only for a read tool; a write
-- tool is destructive unless its effect is reversible, and never
-- idempotent (each call is a new proposal); open world when keyturnd
-- carries it out beyond the database.
CREATE FUNCTION keyturn._mcp_annotations(v keyturn.tool_version)
RETURNS jsonb
-- plpgsql: a SQL function of a row type with subqueries is never inlined.
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RETURN CASE WHEN v.kind = 'read'
                    THEN jsonb_build_object('readOnlyHint', true, 'openWorldHint', v.executor IS NOT DISTINCT FROM 'external')
                    ELSE jsonb_build_object('readOnlyHint', false, 'destructiveHint', v.effect <> 'reversible',
                                            'idempotentHint', false, 'openWorldHint', v.executor = 'external') END;
END
$$;

-- Agent: the tools the calling principal may call over MCP, by name:
-- enabled and granted to it (a grant that has not ended); upstream names
-- the upstream MCP server of a discovered tool. A read tool without an
-- executor is listed too, as every granted tool is, and a call of it
-- answers that it reads nothing (keyturn._readable).
CREATE FUNCTION keyturn.mcp_tools()
RETURNS TABLE (name text, kind text, description text, input_schema jsonb, annotations jsonb, upstream text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
BEGIN
    PERFORM keyturn._refuse_nested('mcp_tools');
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    RETURN QUERY
    -- ROW(v.*), not v: on layout B (Citus) this query runs on the worker
    -- that holds the tenant's tool_grant shard, rewritten to the shards,
    -- where v's row type would be the shard's and neither function takes it.
    SELECT t.name, v.kind::text, coalesce(v.description, v.summary),
           keyturn._mcp_input_schema(ROW(v.*)::keyturn.tool_version),
           keyturn._mcp_annotations(ROW(v.*)::keyturn.tool_version), v.upstream
      FROM keyturn.tool_grant g
      JOIN keyturn.tool t ON t.name = g.tool
      JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
     WHERE g.tenant = v_tenant AND g.principal = v_principal
       AND keyturn._grant_live(g.valid_until)
       AND t.enabled
     ORDER BY t.name;
END
$$;

-- The enabled read tool p_tool for a read by the calling identity, with its
-- current version: 42704 unknown, disabled or not a read tool; 42501 no
-- identity, membership or grant; 22023 it has no executor (a read tool for
-- the agent's own queries) or its projection is not registered (nothing is
-- read).
CREATE FUNCTION keyturn._readable(p_tenant text, p_principal text, p_tool text)
RETURNS keyturn.tool_version
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v keyturn.tool_version;
BEGIN
    PERFORM keyturn._require_member(p_tenant, p_principal, keyturn.current_session());
    SELECT x.* INTO v FROM keyturn.tool t
      JOIN keyturn.tool_version x ON x.tool = t.name AND x.version = t.version
     WHERE t.name = p_tool AND t.enabled AND x.kind = 'read';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'keyturn: % is no enabled read tool', coalesce(keyturn._quoted(p_tool), 'NULL')
            USING ERRCODE = '42704',
                  HINT = 'keyturn.mcp_tools() lists the tools this principal may call.';
    END IF;
    IF NOT keyturn._has_grant(p_tenant, p_principal, v.tool) THEN
        RAISE EXCEPTION 'keyturn: principal % holds no grant for tool % in tenant %', p_principal, p_tool, p_tenant
            USING ERRCODE = '42501',
                  HINT = 'An admin grants tools with keyturn.grant_tool(tenant, principal, tool).';
    END IF;
    IF v.executor IS NULL THEN
        RAISE EXCEPTION 'keyturn: read tool % has no executor: keyturn reads nothing for it', p_tool
            USING ERRCODE = '22023',
                  HINT = 'It marks reads the agent makes with its own queries. An admin registers a version with an sql read spec (executor sql, projection, sql) for it to read over MCP.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM keyturn.projection p WHERE p.provider = v.projection) THEN
        RAISE EXCEPTION 'keyturn: no projection is registered for provider %, the projection of read tool %',
                keyturn._quoted(v.projection), p_tool
            USING ERRCODE = '22023',
                  HINT = 'An unreviewed integration contributes nothing: an admin registers the fields it may contribute with keyturn.register_projection(provider, spec).';
    END IF;
    RETURN v;
END
$$;

-- The grant of read tool v held to what a read can honor, with arguments
-- p_args (and, once known, the rows p_rows it answers with): its params scope
-- holds for the arguments, as propose holds a write's params to it, and its
-- max_targets bounds the rows one sql read may answer with. A read changes
-- nothing and is not counted, so a grant that limits uses, or targets of an
-- upstream read (which resolves none), cannot be honored: it fails closed
-- (keyturn.grant_tool refuses to make one, but a tool granted as a write
-- may become a read in a later version). Returns the scope's max_targets.
-- 42501 for each, naming what failed.
CREATE FUNCTION keyturn._read_grant(p_tenant text, p_principal text, v keyturn.tool_version,
                                    p_args jsonb, p_rows int DEFAULT NULL)
RETURNS int
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    g     keyturn.tool_grant;
    v_err text;
BEGIN
    SELECT x.* INTO g FROM keyturn.tool_grant x
     WHERE x.tenant = p_tenant AND x.principal = p_principal AND x.tool = v.tool;
    IF g.max_uses IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: the grant of read tool % to principal % limits its uses (max_uses %), which a read cannot honor: reads are not counted',
                v.tool, p_principal, g.max_uses
            USING ERRCODE = '42501',
                  HINT = 'An admin grants it again without max_uses: keyturn.grant_tool(tenant, principal, tool, scope, valid_until).';
    END IF;
    IF g.scope ? 'max_targets' AND v.executor IS DISTINCT FROM 'sql' THEN
        RAISE EXCEPTION 'keyturn: the grant of read tool % to principal % bounds its targets (max_targets), which an upstream read cannot honor: it resolves none',
                v.tool, p_principal
            USING ERRCODE = '42501',
                  HINT = 'An admin grants it again without max_targets; a params scope bounds an upstream read''s arguments.';
    END IF;
    v_err := keyturn._scope_violation(g.scope, p_args, p_rows);
    IF v_err IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: outside the scope of the grant of tool % to principal %: %', v.tool, p_principal, v_err
            USING ERRCODE = '42501',
                  HINT = 'Read within the grant''s scope, or ask an admin to widen it.';
    END IF;
    RETURN (g.scope ->> 'max_targets')::int;
END
$$;

-- What is wrong with a read form {"where": {col: value | [values]}}, or NULL.
CREATE FUNCTION keyturn._read_form_error(v keyturn.tool_version, p_args jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    k text;
    x jsonb;
BEGIN
    IF p_args IS NULL OR jsonb_typeof(p_args) <> 'object'
       OR EXISTS (SELECT 1 FROM jsonb_object_keys(p_args) j WHERE j <> 'where')
       OR (p_args ? 'where' AND jsonb_typeof(p_args -> 'where') <> 'object') THEN
        RETURN format('arguments of read tool %s must be {"where": {...}} or {}', v.tool);
    END IF;
    FOR k, x IN SELECT e.key, e.value FROM jsonb_each(coalesce(p_args -> 'where', '{}')) e LOOP
        IF NOT k = ANY (v.sql_where) THEN
            RETURN format('tool %s may not filter on %s (filterable columns: %s)',
                          v.tool, keyturn._quoted(k), coalesce(nullif(array_to_string(v.sql_where, ', '), ''), 'none'));
        END IF;
        IF jsonb_typeof(x) = 'array' THEN
            IF jsonb_array_length(x) NOT BETWEEN 1 AND 1000
               OR EXISTS (SELECT 1 FROM jsonb_array_elements(x) y
                           WHERE jsonb_typeof(y) NOT IN ('string', 'number', 'boolean')) THEN
                RETURN format('where.%s must list 1 to 1000 strings, numbers or booleans', k);
            END IF;
        ELSIF jsonb_typeof(x) NOT IN ('string', 'number', 'boolean') THEN
            RETURN format('where.%s must be a string, number, boolean or a list of them', k);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- Agent: runs the sql read tool p_tool with its form as the caller (its
-- role, under its row-level security: keyturn._exec_as), at most max_rows
-- rows by key, and returns exactly what keyturn.fence gives for the tool's
-- projection and {"rows": [{column: value}, ...]} (the evidence it records
-- included). No approval: a read changes nothing.
CREATE FUNCTION keyturn.read(tool text, arguments jsonb DEFAULT '{}')
RETURNS TABLE (guard text, reference text, marker text, evidence_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_caller    oid := keyturn._calling_role()::regrole::oid;
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v           keyturn.tool_version;
    v_args      jsonb := coalesce(read.arguments, '{}');
    v_err       text;
    v_sql       text;
    v_rows      jsonb;
    v_max       int;
    v_table     text;
BEGIN
    PERFORM keyturn._refuse_nested('read');
    v := keyturn._readable(v_tenant, v_principal, read.tool);
    IF v.executor IS DISTINCT FROM 'sql' THEN
        RAISE EXCEPTION 'keyturn: % is an upstream read tool; keyturnd calls it (keyturn.upstream_read)', read.tool
            USING ERRCODE = '22023';
    END IF;
    v_err := keyturn._read_form_error(v, v_args);
    IF v_err IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: %', v_err USING ERRCODE = '22023';
    END IF;
    v_max := keyturn._read_grant(v_tenant, v_principal, v, v_args);
    -- Its owner reads past row-level security that is not forced, and may
    -- turn it off: a table an agent's role owns serves nothing
    -- (keyturn._tool_table), nor does one whose owner's role the caller is
    -- a member of (thirty-second red-team pass, docs/security.md row 143).
    v_table := keyturn._tool_table(v);
    IF pg_has_role(v_caller, (SELECT c.relowner FROM pg_class c WHERE c.oid = v_table::regclass), 'MEMBER') THEN
        RAISE EXCEPTION 'keyturn: the caller owns % or is a member of its owner, and would read it past its row-level security', v_table
            USING ERRCODE = '42501',
                  HINT = 'An admin makes a role that is no agent the table''s owner.';
    END IF;
    -- Column names only from the tool's registered lists; values only from
    -- the parameter (keyturn._form_where), never spliced in.
    v_sql := format('SELECT jsonb_build_object(%s) FROM %s AS t WHERE %s ORDER BY t.%I LIMIT %s',
                    (SELECT string_agg(format('%L, t.%I', c, c), ', ' ORDER BY o)
                       FROM unnest(v.sql_select) WITH ORDINALITY AS s (c, o)),
                    v_table,
                    coalesce(nullif(keyturn._form_where(v, jsonb_build_object('where', coalesce(v_args -> 'where', '{}'))), ''), 'true'),
                    v.sql_key, v.max_rows);
    BEGIN
        v_rows := keyturn._exec_as(v_caller, v_sql,
                                   keyturn._form_arg(jsonb_build_object('where', coalesce(v_args -> 'where', '{}')),
                                                     v.sql_types));
    EXCEPTION WHEN data_exception THEN
        -- Not SQLERRM, which quotes the value into the server log (row 133).
        RAISE EXCEPTION 'keyturn: where holds a value its column in % cannot read (SQLSTATE %)',
                format('%I.%I', v.sql_schema, v.sql_table), SQLSTATE
            USING ERRCODE = '22023';
    END;
    -- More rows than the grant's max_targets: refused, not cut (as a write
    -- that resolves too many targets is).
    IF jsonb_array_length(v_rows) > v_max THEN
        PERFORM keyturn._read_grant(v_tenant, v_principal, v, v_args, jsonb_array_length(v_rows));
    END IF;
    RETURN QUERY SELECT f.guard, f.reference, f.marker, f.evidence_id
                   FROM keyturn.fence(v.projection, jsonb_build_object('rows', v_rows)) f;
END
$$;

-- Agent: whether the calling identity may call the upstream read tool
-- p_tool with these arguments (checked against its params schema, and for
-- credential material), and what keyturnd calls: the upstream, the tool's
-- name there, and the projection that fences what comes back
-- (keyturn.fence).
CREATE FUNCTION keyturn.upstream_read(tool text, arguments jsonb DEFAULT '{}')
RETURNS TABLE (upstream text, upstream_tool text, projection text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v       keyturn.tool_version;
    v_path  text;
    v_err   text;
BEGIN
    PERFORM keyturn._refuse_nested('upstream_read');
    v := keyturn._readable(keyturn.current_tenant(), keyturn.current_principal(), upstream_read.tool);
    IF v.upstream IS NULL OR v.executor IS DISTINCT FROM 'external' THEN
        RAISE EXCEPTION 'keyturn: % is not an upstream read tool (keyturn.read runs sql read tools)', upstream_read.tool
            USING ERRCODE = '22023';
    END IF;
    IF upstream_read.arguments IS NULL OR jsonb_typeof(upstream_read.arguments) <> 'object' THEN
        RAISE EXCEPTION 'keyturn: arguments must be a JSON object' USING ERRCODE = '22023';
    END IF;
    SELECT i.credential_path, i.schema_errors INTO v_path, v_err
      FROM keyturn._inspect_params(v.tool, upstream_read.arguments, v.params_schema) i;
    IF v_path IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: arguments hold credential material at %', keyturn._quoted(v_path)
            USING ERRCODE = '22023',
                  HINT = 'Credentials never go through keyturn: keyturnd holds the upstream''s.';
    END IF;
    IF v_err IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: arguments do not match the schema of %: %', upstream_read.tool, v_err
            USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._read_grant(keyturn.current_tenant(), keyturn.current_principal(), v, upstream_read.arguments);
    RETURN QUERY SELECT v.upstream, v.upstream_tool, v.projection;
END
$$;

-- Agent: the status of an action of the calling principal (and, once final,
-- its result); no row for an action of another principal or tenant, or
-- none at all, so that an agent learns nothing of what is not its own.
CREATE FUNCTION keyturn.mcp_action_status(action_id uuid)
RETURNS TABLE (status text, result jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('mcp_action_status');
    RETURN QUERY SELECT o.status, o.result FROM keyturn._mcp_own_action(mcp_action_status.action_id, NULL, NULL) o;
END
$$;

-- Agent: the action a write call proposed, for the client's retry of that
-- call (a 2026-07-28 client answering keyturn's input_required with the
-- request state it was given, the action's id): a row only when the retry
-- is the same call, by the same principal: the same tool and the params
-- proposed (for a digest action, whose params are not kept: the same tool
-- in the session that proposed it). Anything else (a forged or stale
-- state, other arguments) gets no row, and keyturnd refuses the retry;
-- nothing is proposed again.
CREATE FUNCTION keyturn.mcp_resume(action_id uuid, tool text, params jsonb)
RETURNS SETOF keyturn.mcp_action
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('mcp_resume');
    RETURN QUERY SELECT * FROM keyturn._mcp_own_action(action_id, tool, params);
END
$$;

-- Agent: an action the calling principal proposed as an MCP task (a client
-- that declared the Tasks extension): what tasks/get, tasks/update and
-- tasks/cancel ask of it. No row for anything else.
CREATE FUNCTION keyturn.mcp_task(action_id uuid)
RETURNS SETOF keyturn.mcp_action
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('mcp_task');
    RETURN QUERY SELECT * FROM keyturn._mcp_own_action(action_id, NULL, NULL);
END
$$;

-- The calling principal's own action (with p_tool, only if it is of that
-- tool and p_params are its params). A digest action's params are kept only
-- as a MAC, so an answer that depended on them would confirm guesses of
-- them to any session of the principal, as many as it liked (twelfth
-- red-team pass, docs/security.md row 103): a digest action is matched by
-- its tool and the session that proposed it, never by params, and named by
-- its tool alone.
CREATE FUNCTION keyturn._mcp_own_action(p_id uuid, p_tool text, p_params jsonb)
RETURNS SETOF keyturn.mcp_action
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
BEGIN
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    RETURN QUERY
    SELECT a.status::text, CASE WHEN keyturn._is_final(a.status) THEN a.result END,
           -- A digest action keeps no summary: only its tool is named.
           coalesce(a.summary, a.tool),
           a.expires_at, a.created_at, a.updated_at, a.session = keyturn.current_session()
      FROM keyturn.action a
     WHERE a.id = p_id AND a.tenant = v_tenant AND a.principal = v_principal
       AND (p_tool IS NULL
            OR (a.tool = p_tool
                AND CASE WHEN a.retain = 'digest' THEN a.session = keyturn.current_session()
                         ELSE keyturn._params_hash_matches(a.retain, a.params_hash,
                                                           keyturn.params_hash(p_tool, p_params)) END));
END
$$;

-- Dispatcher: registers one tool of the upstream MCP server p_upstream, the
-- JSON object of that tool as the upstream's tools/list gave it, as
-- <upstream>.<tool>: executor external, provider mcp, its inputSchema as
-- params schema (keyturn._upstream_tool), a read tool only when
-- p_trust_annotations and its definition says readOnlyHint: true (its
-- projection then named like the tool). The SHA-256 of the RFC 8785 form of
-- the definition is stored with the version. An unchanged definition
-- changes nothing; a new tool or a changed definition is a new version,
-- registered disabled: an admin reviews and enables it (a changed
-- definition could have turned a write into a read). A tool of that name
-- that was not discovered on this upstream is never replaced (42501).
-- Returns the tool's current version.
CREATE FUNCTION keyturn.register_discovered_tool(upstream text, definition jsonb, trust_annotations boolean)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_up      text := register_discovered_tool.upstream;
    v_info    jsonb;
    v_name    text;
    v_cur     keyturn.tool_version;
    v_version int;
    v_known   boolean;
BEGIN
    PERFORM keyturn._refuse_nested('register_discovered_tool');
    IF keyturn._name_ok(v_up, 30) IS NOT TRUE OR strpos(v_up, '.') > 0 THEN
        RAISE EXCEPTION 'keyturn: upstream name % is not allowed', coalesce(keyturn._quoted(v_up), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'Use 1 to 30 ASCII letters, digits, underscores and hyphens, starting with a letter.';
    END IF;
    IF definition IS NULL OR jsonb_typeof(definition) <> 'object' OR trust_annotations IS NULL THEN
        RAISE EXCEPTION 'keyturn: definition must be the JSON object of one tool, and trust_annotations true or false'
            USING ERRCODE = '22023';
    END IF;
    v_info := keyturn._upstream_tool(definition, trust_annotations);
    v_name := v_up || '.' || (v_info ->> 'tool');
    IF NOT keyturn._name_ok(v_name, 63) THEN
        RAISE EXCEPTION 'keyturn: upstream tool % cannot be named % in keyturn', keyturn._quoted(v_info ->> 'tool'), keyturn._quoted(v_name)
            USING ERRCODE = '22023',
                  HINT = 'keyturn tool names are ASCII letters, digits, underscores and hyphens in dot-separated parts that each start with a letter, at most 63 characters.';
    END IF;
    SELECT x.* INTO v_cur FROM keyturn.tool t
      JOIN keyturn.tool_version x ON x.tool = t.name AND x.version = t.version
     WHERE t.name = v_name;
    v_known := FOUND;
    IF FOUND AND v_cur.upstream IS DISTINCT FROM v_up THEN
        RAISE EXCEPTION 'keyturn: tool % exists and was not discovered on upstream %; it is left as it is', v_name, v_up
            USING ERRCODE = '42501';
    END IF;
    IF FOUND AND v_cur.upstream_schema_sha256 = v_info ->> 'sha256' AND v_cur.kind::text = v_info ->> 'kind' THEN
        RETURN v_cur.version;
    END IF;
    -- An upstream lists as many tools as it likes, under new names or with
    -- new definitions at every discovery if it wants, and each is a row of
    -- the catalog every tenant reads and no one can remove: at most 1,000
    -- tools an upstream, and 2,000 versions an hour (thirtieth and
    -- thirty-first red-team passes, docs/security.md row 142).
    IF NOT v_known AND (SELECT count(*) FROM keyturn.tool t
                          JOIN keyturn.tool_version x ON x.tool = t.name AND x.version = t.version
                         WHERE x.upstream = v_up) >= 1000 THEN
        RAISE EXCEPTION 'keyturn: upstream % has 1000 tools registered, the most an upstream may; % is not registered',
                v_up, keyturn._quoted(v_name)
            USING ERRCODE = '54000',
                  HINT = 'An upstream that lists this many tools, or new names at every discovery, is misbehaving: remove it from keyturnd''s configuration.';
    END IF;
    -- And as many bytes: a definition is at most 64 KiB, an upstream's
    -- versions of the last hour 16 MiB as stored (thirty-second pass).
    IF octet_length(definition::text) > 65536 THEN
        RAISE EXCEPTION 'keyturn: the definition of % is % bytes, over the 65536 a tool may have; it is not registered',
                keyturn._quoted(v_name), octet_length(definition::text)
            USING ERRCODE = '54000';
    END IF;
    IF (SELECT count(*) >= 2000
               OR coalesce(sum(pg_column_size(x.spec) + pg_column_size(x.params_schema)
                               + coalesce(pg_column_size(x.description), 0)), 0) > 16777216
          FROM keyturn.tool_version x
         WHERE x.upstream = v_up AND x.created_at > now() - interval '1 hour') THEN
        RAISE EXCEPTION 'keyturn: upstream % registered 2000 tool versions or 16 MiB of them in the last hour, the most an upstream may; % is left as it is',
                v_up, keyturn._quoted(v_name)
            USING ERRCODE = '54000',
                  HINT = 'An upstream whose definitions change this often is misbehaving: remove it from keyturnd''s configuration. Until a new version is registered, calls of the changed tool are invalidated, nothing sent.';
    END IF;
    v_version := keyturn.register_tool(v_name, jsonb_strip_nulls(jsonb_build_object(
        'kind', v_info ->> 'kind', 'executor', 'external', 'provider', 'mcp',
        'params_schema', v_info -> 'params_schema',
        'summary', format('Call %s on %s', v_info ->> 'tool', v_up),
        'description', v_info ->> 'description',
        'projection', CASE WHEN v_info ->> 'kind' = 'read' THEN v_name END)));
    UPDATE keyturn.tool_version x
       SET upstream = v_up, upstream_tool = v_info ->> 'tool', upstream_schema_sha256 = v_info ->> 'sha256'
     WHERE x.tool = v_name AND x.version = v_version;
    -- A new tool waits for an admin. A changed one keeps its enabled flag,
    -- as register_tool keeps it, while it stays a write (every call still
    -- waits for a person, who sees the new version's summary); a read, which
    -- runs without anyone's approval, is disabled again, so a changed
    -- description or a flip to read-only is reviewed before an agent reads
    -- through it.
    IF NOT v_known OR v_info ->> 'kind' = 'read' THEN
        UPDATE keyturn.tool t SET enabled = false WHERE t.name = v_name;
        PERFORM keyturn._await_rechecks(v_name, NULL, NULL); -- row 95, as set_tool_enabled
    END IF;
    RETURN v_version;
END
$$;

-- The lowercase hex SHA-256 of the RFC 8785 form of a definition; NULL for
-- one that has none (a number without an exact form), which matches nothing.
CREATE FUNCTION keyturn._definition_sha256(p_definition jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RETURN encode(sha256(convert_to(keyturn.canonical_json(p_definition), 'UTF8')), 'hex');
EXCEPTION WHEN invalid_parameter_value THEN
    RETURN NULL;
END
$$;

-- keyturn.check_upstream_tool(_for): p_tenant NULL for the plain call.
CREATE FUNCTION keyturn._check_upstream_tool(p_what text, p_tenant text, p_id uuid, p_lease uuid,
                                             p_definition jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    a        keyturn.action;
    v        keyturn.tool_version;
    v_live   text := keyturn._definition_sha256(p_definition);
    v_now    timestamptz;
    v_rcpt   jsonb;
BEGIN
    PERFORM keyturn._refuse_nested(p_what);
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    SELECT x.* INTO a FROM keyturn.action x
     WHERE x.id = p_id AND (p_tenant IS NULL OR x.tenant = p_tenant)  -- the plain call: by id alone, as complete
       FOR UPDATE;
    -- Accepted past the lease's expiry, as complete: nothing was sent yet.
    PERFORM keyturn._raise_lease_problem(keyturn._lease_problem(a, p_id, p_lease, '{executing}', false));
    SELECT x.* INTO v FROM keyturn.tool_version x WHERE x.tool = a.tool AND x.version = a.tool_version;
    IF v.upstream_schema_sha256 IS NOT NULL AND v.upstream_schema_sha256 = v_live
       AND p_definition ->> 'name' = v.upstream_tool THEN
        RETURN true;
    END IF;
    v_now := clock_timestamp();
    v_rcpt := jsonb_build_object('error', 'the upstream tool''s live definition differs from the approved one; nothing was sent',
                                 'sent', false, 'approved_schema_sha256', v.upstream_schema_sha256,
                                 'live_schema_sha256', v_live);
    UPDATE keyturn.attempt t SET finished_at = v_now, outcome = 'failed', receipt = v_rcpt
     WHERE t.action_id = a.id AND t.tenant = a.tenant AND t.attempt = a.attempts;
    PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'upstream tool definition changed',
                                                         'attempt', a.attempts));
    UPDATE keyturn.action x
       SET updated_at = v_now, status = 'invalidated', receipt = v_rcpt,
           result = jsonb_build_object('reason', 'the upstream tool''s definition changed since the version this action was approved for; nothing was sent')
     WHERE x.id = a.id AND x.tenant = a.tenant;
    RETURN false;
END
$$;

-- Dispatcher, right before an upstream MCP call: whether the upstream's
-- live definition of the tool (the JSON object its tools/list gives now) is
-- the one the action's tool version was registered from. If not, nothing
-- may be sent: the action becomes invalidated (its attempt failed, not
-- sent) and the answer is false. 55000 unless the action is executing under
-- that lease.
CREATE FUNCTION keyturn.check_upstream_tool(action_id uuid, lease_id uuid, definition jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN keyturn._check_upstream_tool('check_upstream_tool', NULL, check_upstream_tool.action_id,
                                        check_upstream_tool.lease_id, check_upstream_tool.definition);
END
$$;

-- Dispatcher: check_upstream_tool for the tenant named, the form Citus
-- delegates to the tenant's worker (docs/scale-out.md, layout B).
CREATE FUNCTION keyturn.check_upstream_tool_for(tenant text, action_id uuid, lease_id uuid, definition jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(check_upstream_tool_for.tenant, 'check_upstream_tool_for');
    RETURN keyturn._check_upstream_tool('check_upstream_tool_for', check_upstream_tool_for.tenant,
                                        check_upstream_tool_for.action_id, check_upstream_tool_for.lease_id,
                                        check_upstream_tool_for.definition);
END
$$;

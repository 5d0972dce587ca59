-- keyturn.check_deployment(): what a live database gets wrong (docs/operations.md,
-- "Checking a deployment").
--
-- keyturn's rules hold inside its functions; some depend on how the
-- database around them is set up. This lists every such problem it can see,
-- one row each: 'error' breaks a guarantee keyturn states, 'warning' weakens
-- one or needs a person to confirm it is intended.

-- The tables the current version of some sql tool writes. plpgsql, not sql:
-- an SQL function would be inlined into check_deployment's query, and Citus
-- refuses a query whose distributed tables (keyturn's, on layout B) appear
-- only once the planner has inlined it.
CREATE FUNCTION keyturn._gated_tables()
RETURNS TABLE (relid oid, kind keyturn.tool_kind, tools text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT to_regclass(format('%I.%I', v.sql_schema, v.sql_table))::oid, v.kind,
           string_agg(v.tool, ', ' ORDER BY v.tool)
      FROM keyturn.tool t
      JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
     WHERE v.executor = 'sql' AND to_regclass(format('%I.%I', v.sql_schema, v.sql_table)) IS NOT NULL
     GROUP BY 1, 2;
END
$$;

CREATE FUNCTION keyturn.check_deployment()
RETURNS TABLE (severity text, object text, problem text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET quote_all_identifiers = off  -- types compared as register_tool printed them
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('check_deployment');
    IF NOT pg_has_role(keyturn._calling_role(), 'keyturn_admin', 'USAGE') THEN
        RAISE EXCEPTION 'keyturn: check_deployment needs a superuser or the keyturn_admin role'
            USING ERRCODE = '42501';
    END IF;
    RETURN QUERY
    WITH problems (severity, object, problem) AS (
        -- Agents that can change a gated table other than through the form,
        -- or attach code that runs inside an approved write.
        SELECT 'error', g.relid::regclass::text,
               p || ' (gated by ' || g.tools || '); an agent could run code as the approver inside an approved write'
          FROM keyturn._gated_tables() g, keyturn._agent_table_problems(g.relid) p
         WHERE g.kind = 'write'
        UNION ALL
        -- Agents that read a read tool's table past its row-level security,
        -- and tables read without any.
        SELECT 'error', g.relid::regclass::text,
               p || ' (read by ' || g.tools || '); an agent reads it past its row-level security'
          FROM keyturn._gated_tables() g, keyturn._agent_table_problems(g.relid, true) p
         WHERE g.kind = 'read'
        UNION ALL
        SELECT 'warning', g.relid::regclass::text,
               format('row-level security is off on %s (read by %s): an agent reads every tenant''s rows of it',
                      g.relid::regclass, g.tools)
          FROM keyturn._gated_tables() g
          JOIN pg_class c ON c.oid = g.relid
         WHERE g.kind = 'read' AND NOT c.relrowsecurity
        UNION ALL
        -- An agent that may create roles may, on PostgreSQL 15 and earlier,
        -- grant itself any role that is not a superuser, an approver's too.
        SELECT 'error', r.rolname::text,
               'agent role has CREATEROLE: it can make itself or a new login a member of an approver role, and approve its own proposals'
          FROM pg_roles r
         WHERE r.rolcreaterole AND keyturn._is_agent_role(r.oid)
        UNION ALL
        -- Code on gated tables.
        SELECT CASE WHEN n.nspname LIKE 'pg\_temp\_%' OR keyturn._is_agent_role(f.proowner)
                    THEN 'error' ELSE 'warning' END,
               f.oid::regprocedure::text,
               CASE WHEN n.nspname LIKE 'pg\_temp\_%'
                        THEN format('trigger %s on %s calls a function in a temporary schema', tg.tgname, tree.relid::regclass)
                    WHEN keyturn._is_agent_role(f.proowner)
                        THEN format('trigger %s on %s calls a function owned by agent role %s', tg.tgname, tree.relid::regclass, f.proowner::regrole)
                    ELSE format('trigger function of %s on %s is SECURITY DEFINER without a pinned search_path', tg.tgname, tree.relid::regclass)
               END
          FROM keyturn._gated_tables() g
         CROSS JOIN keyturn._table_tree(g.relid) AS tree (relid)
          JOIN pg_trigger tg ON tg.tgrelid = tree.relid AND NOT tg.tgisinternal
          JOIN pg_proc f ON f.oid = tg.tgfoid
          JOIN pg_namespace n ON n.oid = f.pronamespace
         WHERE g.kind = 'write'
           AND (n.nspname LIKE 'pg\_temp\_%'
                OR keyturn._is_agent_role(f.proowner)
                OR (f.prosecdef AND NOT coalesce(array_to_string(f.proconfig, ',') LIKE '%search_path=%', false)))
        UNION ALL
        -- What an agent owns that a gated table's policies, column defaults,
        -- constraints, indexes, rules and column types use: it runs inside
        -- the approved write, as the approver, as a trigger's function
        -- would (thirty-third and thirty-fourth red-team passes).
        SELECT 'error', u.obj,
               format('%s on %s uses %s, owned by agent role %s', u.what, tree.relid::regclass, u.obj, u.owner::regrole)
          FROM keyturn._gated_tables() g
         CROSS JOIN keyturn._table_tree(g.relid) AS tree (relid)
         CROSS JOIN LATERAL keyturn._agent_owned_uses(tree.relid) u
         WHERE g.kind = 'write'
        UNION ALL
        -- Keys that can name two rows (a unique index dropped since).
        SELECT 'error', format('tool %s', v.tool), k
          FROM keyturn.tool t
          JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
         CROSS JOIN LATERAL keyturn._key_problem(to_regclass(format('%I.%I', v.sql_schema, v.sql_table)), v.sql_key) k
         WHERE v.executor = 'sql' AND to_regclass(format('%I.%I', v.sql_schema, v.sql_table)) IS NOT NULL
           AND k IS NOT NULL
        UNION ALL
        -- Columns whose type changed since the tool was registered: its
        -- checks read the type it was registered with (docs/security.md,
        -- row 126).
        SELECT 'error', format('tool %s', v.tool),
               format('column %s of %I.%I is %s now, and was %s when the tool was registered, whose checks read that type',
                      quote_ident(c.col), v.sql_schema, v.sql_table,
                      coalesce(format_type(a.atttypid, a.atttypmod), 'gone'), c.registered)
          FROM keyturn.tool t
          JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
         CROSS JOIN LATERAL jsonb_each_text(v.sql_types) AS c (col, registered)
          LEFT JOIN pg_attribute a ON a.attrelid = to_regclass(format('%I.%I', v.sql_schema, v.sql_table))
                                  AND a.attname = c.col AND a.attnum > 0 AND NOT a.attisdropped
         WHERE v.executor = 'sql' AND to_regclass(format('%I.%I', v.sql_schema, v.sql_table)) IS NOT NULL
           AND c.col <> 'xmin'
           AND format_type(a.atttypid, a.atttypmod) IS DISTINCT FROM c.registered
        UNION ALL
        -- Version columns nothing maintains.
        SELECT 'warning', format('tool %s', v.tool),
               format('version column %s of %I.%I is not changed by any BEFORE UPDATE trigger, so a conflicting edit may go unseen',
                      v.sql_version, v.sql_schema, v.sql_table)
          FROM keyturn.tool t
          JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
         WHERE v.executor = 'sql' AND v.sql_version <> 'xmin'
           AND NOT EXISTS (SELECT 1 FROM pg_trigger tg
                            WHERE tg.tgrelid = to_regclass(format('%I.%I', v.sql_schema, v.sql_table))
                              AND NOT tg.tgisinternal AND (tg.tgtype & 2) <> 0 AND (tg.tgtype & 16) <> 0
                              AND (tg.tgtype & 1) <> 0)
        UNION ALL
        -- Logins that serve both sides.
        SELECT 'error', r.rolname::text,
               'login inherits both keyturn_agent and keyturn_approver: a process holding it proposes and approves; make it NOINHERIT or split it'
          FROM pg_roles r
         WHERE r.rolcanlogin AND NOT r.rolsuper
           AND pg_has_role(r.oid, 'keyturn_agent', 'USAGE') AND pg_has_role(r.oid, 'keyturn_approver', 'USAGE')
        UNION ALL
        SELECT 'warning', r.rolname::text,
               'login may SET ROLE to both an agent and an approver role (NOINHERIT, as a PostgREST authenticator): make sure the agent''s process can never choose the approver role'
          FROM pg_roles r
         WHERE r.rolcanlogin AND NOT r.rolsuper
           AND pg_has_role(r.oid, 'keyturn_agent', 'MEMBER') AND pg_has_role(r.oid, 'keyturn_approver', 'MEMBER')
           AND NOT (pg_has_role(r.oid, 'keyturn_agent', 'USAGE') AND pg_has_role(r.oid, 'keyturn_approver', 'USAGE'))
        UNION ALL
        -- Roles that bypass row-level security on keyturn's side.
        SELECT 'warning', r.rolname::text,
               format('role bypasses row-level security and is a member of %s: it sees every tenant''s rows in keyturn''s tables it may read',
                      CASE WHEN pg_has_role(r.oid, 'keyturn_agent', 'MEMBER') THEN 'keyturn_agent' ELSE 'keyturn_approver' END)
          FROM pg_roles r
         WHERE r.rolbypassrls AND NOT r.rolsuper
           AND (pg_has_role(r.oid, 'keyturn_agent', 'MEMBER') OR pg_has_role(r.oid, 'keyturn_approver', 'MEMBER'))
        UNION ALL
        -- Identity that is not transaction-local by default.
        SELECT 'error',
               format('setting %s', split_part(cfg, '=', 1)),
               format('set by ALTER %s ... SET: every connection of %s starts with this identity, and a pooler hands it to the next client',
                      CASE WHEN s.setrole = 0 THEN 'DATABASE' ELSE 'ROLE' END,
                      CASE WHEN s.setrole = 0 THEN coalesce((SELECT datname FROM pg_database WHERE oid = s.setdatabase)::text, 'every database')
                           ELSE s.setrole::regrole::text END)
          FROM pg_db_role_setting s, unnest(s.setconfig) cfg
         WHERE split_part(cfg, '=', 1) IN ('keyturn.tenant', 'keyturn.principal', 'keyturn.session', 'request.jwt.claims')
           AND (s.setdatabase = 0 OR s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database()))
        UNION ALL
        SELECT 'error', format('setting %s', c.name),
               format('set in %s: every connection starts with this identity', coalesce(c.sourcefile, c.source))
          FROM pg_settings c
         WHERE c.name IN ('keyturn.tenant', 'keyturn.principal', 'keyturn.session', 'request.jwt.claims')
           AND c.source IN ('configuration file', 'command line', 'environment variable')
           AND coalesce(c.reset_val, '') <> ''
        UNION ALL
        -- A claim path into what the signed-in user may edit (Supabase's
        -- user_metadata) lets the caller choose its own identity.
        SELECT 'error', format('setting %s', p.name),
               format('points into %s, which the user may edit: a caller would choose this identity; use a claim only the issuer sets (app_metadata)',
                      current_setting(p.name, true))
          FROM (VALUES ('keyturn.claim_tenant'), ('keyturn.claim_principal'), ('keyturn.claim_session')) p (name)
         WHERE coalesce(current_setting(p.name, true), '') ~ '^user_metadata(\.|$)'
        UNION ALL
        SELECT 'warning', 'setting keyturn.allow_session_identity',
               'session-level identity is accepted: only safe while no connection is ever shared (no pooler, no reused connection)'
         WHERE coalesce(current_setting('keyturn.allow_session_identity', true), 'off') = 'on'
           OR EXISTS (SELECT 1 FROM pg_db_role_setting s, unnest(s.setconfig) cfg
                       WHERE cfg = 'keyturn.allow_session_identity=on')
        UNION ALL
        -- Statement logging that writes the bound parameters of keyturn's
        -- calls, which carry one-time tokens, link codes and card sessions
        -- (fifth red-team pass, docs/security.md row 86). The settings of
        -- this session: the server's, unless a role or database sets its own.
        SELECT 'warning', format('setting %s', l.name),
               format('%s = %s writes the bound parameters of keyturn''s calls (one-time tokens, link codes, card sessions) to the server log; set log_parameter_max_length = 0, server-wide or for the logins of keyturnd and the application',
                      l.name, l.setting)
          FROM pg_settings l
         WHERE ((l.name = 'log_statement' AND l.setting = 'all')
                OR (l.name = 'log_min_duration_statement' AND l.setting::int >= 0))
           AND (SELECT setting::int FROM pg_settings WHERE name = 'log_parameter_max_length') <> 0
        UNION ALL
        SELECT 'warning', 'setting log_parameter_max_length_on_error',
               'a failed statement''s bound parameters (one-time tokens, link codes, card sessions of keyturn''s calls) go to the server log; set it to 0'
         WHERE (SELECT setting::int FROM pg_settings WHERE name = 'log_parameter_max_length_on_error') <> 0
        UNION ALL
        -- Writes to keyturn's own tables, and reads of its secret.
        SELECT 'error', format('%I.%I', t.table_schema, t.table_name),
               format('role %s holds %s on it: only keyturn''s functions may change keyturn''s tables', t.grantee, t.privilege_type)
          FROM information_schema.role_table_grants t
         WHERE t.table_schema IN ('keyturn', 'keyturn_secret')
           AND t.privilege_type IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'TRIGGER', 'REFERENCES')
           AND NOT EXISTS (SELECT 1 FROM pg_roles o WHERE o.rolname = t.grantee AND o.rolsuper)
        UNION ALL
        SELECT 'error', r.rolname::text,
               'role is a member of pg_write_all_data: it may change keyturn''s tables directly, around every rule'
          FROM pg_roles r
         WHERE NOT r.rolsuper AND r.oid >= 16384
           AND pg_has_role(r.oid, 'pg_write_all_data', 'MEMBER')
        UNION ALL
        -- The predefined roles (oids below FirstNormalObjectId, 16384) are not
        -- reported themselves: their members are.
        SELECT 'error', 'keyturn_secret.approval_key',
               format('role %s may read the approval key: it could forge approvals', r.rolname)
          FROM pg_roles r
         WHERE NOT r.rolsuper AND r.oid >= 16384
           AND (has_table_privilege(r.oid, 'keyturn_secret.approval_key', 'SELECT')
                OR has_schema_privilege(r.oid, 'keyturn_secret', 'USAGE, CREATE'))
        UNION ALL
        SELECT 'error', format('%I.%I', t.table_schema, t.table_name),
               format('role %s (%s) may SELECT it: dispatchers, operators and admins reach keyturn only through its functions',
                      t.grantee, string_agg(DISTINCT k.rolname, ', '))
          FROM information_schema.role_table_grants t
          JOIN pg_roles g ON g.rolname = t.grantee
          JOIN pg_roles k ON k.rolname IN ('keyturn_dispatcher', 'keyturn_operator', 'keyturn_admin')
                         AND pg_has_role(g.oid, k.oid, 'MEMBER')
         WHERE t.table_schema = 'keyturn' AND t.privilege_type = 'SELECT' AND NOT g.rolsuper
           AND NOT pg_has_role(g.oid, 'keyturn_agent', 'MEMBER')
           AND NOT pg_has_role(g.oid, 'keyturn_approver', 'MEMBER')
         GROUP BY t.table_schema, t.table_name, t.grantee
        UNION ALL
        -- Gated tables that Citus distributes, and the workers (sql/071_citus.sql).
        SELECT c.severity, c.object, c.problem FROM keyturn._citus_problems() c
    )
    SELECT p.severity, p.object, p.problem FROM problems p
     ORDER BY CASE p.severity WHEN 'error' THEN 0 ELSE 1 END, p.object, p.problem;
END
$$;

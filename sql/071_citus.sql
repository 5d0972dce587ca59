-- keyturn on Citus (docs/scale-out.md): check_deployment's part for Citus,
-- the dispatcher's question whether to go tenant by tenant, and
-- citus_distribute, which lays keyturn's own tables out by tenant (layout
-- B). What Citus says about a table is sql/012_citus_catalog.sql.
--
-- The extension never depends on Citus: without it in this database every
-- function here answers nothing, and Citus's catalog and functions are only
-- reached through EXECUTE, once its presence is known.

-- Whether every backend of this node loads pg_keyturn when it starts
-- (shared_preload_libraries, or session_preload_libraries), so that its
-- planner hook runs before Citus plans any statement: the hook refuses a
-- tenant-explicit call whose tenant is NULL, which Citus would otherwise
-- hash as text and crash on (extension/src/route_guard.rs). A backend that
-- loads pg_keyturn later is protected only from then on.
CREATE FUNCTION keyturn._preloaded()
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT concat_ws(',', current_setting('shared_preload_libraries', true),
                     current_setting('session_preload_libraries', true))
           ~ '(^|,)\s*(\$libdir/)?pg_keyturn(\.so)?\s*(,|$)'
$$;

-- What every node must agree on for identity to resolve alike everywhere:
-- pg_keyturn's version and the settings that read identity. Calling
-- current_tenant() first loads pg_keyturn in this backend, so its settings
-- are defined here even on a worker's fresh connection.
CREATE FUNCTION keyturn._citus_node_settings()
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    PERFORM keyturn.current_tenant();
    RETURN format('%s|%s|%s|%s|%s|%s|%s', (SELECT extversion FROM pg_extension WHERE extname = 'pg_keyturn'),
                  current_setting('keyturn.claim_tenant', true), current_setting('keyturn.claim_principal', true),
                  current_setting('keyturn.claim_session', true), current_setting('keyturn.claim_numbers', true),
                  current_setting('keyturn.allow_session_identity', true), keyturn._preloaded());
END
$$;

-- check_deployment's part for Citus: the gated tables Citus distributes, and
-- what the workers must share with the coordinator. Severity as there.
-- VOLATILE: it asks the workers.
CREATE FUNCTION keyturn._citus_problems()
RETURNS TABLE (severity text, object text, problem text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_coord text;
    w       record;
BEGIN
    IF NOT keyturn._citus_present() THEN
        RETURN;
    END IF;

    RETURN QUERY
    SELECT 'error', format('tool %s', v.tool), p
      FROM keyturn.tool t
      JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
     CROSS JOIN LATERAL keyturn._citus_table_problems(
               to_regclass(format('%I.%I', v.sql_schema, v.sql_table)), v.sql_key, v.sql_version,
               v.sql_set, v.sql_types) p
     WHERE v.executor = 'sql' AND to_regclass(format('%I.%I', v.sql_schema, v.sql_table)) IS NOT NULL;

    -- Routing: without the distribution column in the form, Citus cannot
    -- tell which shard the write touches and runs it on all of them, in a
    -- two-phase commit over every worker (docs/scale-out.md, "Throughput").
    RETURN QUERY
    SELECT 'warning', format('tool %s', v.tool),
           format('the form cannot name %s, the distribution column of %s: every approval runs on every shard, in a two-phase commit over all workers; add it to spec.sql.where and have the agent fill it in',
                  quote_ident(c.dist_column), format('%I.%I', v.sql_schema, v.sql_table))
      FROM keyturn.tool t
      JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
     CROSS JOIN LATERAL keyturn._citus_table(to_regclass(format('%I.%I', v.sql_schema, v.sql_table))) c
     WHERE v.executor = 'sql' AND c.dist_column IS NOT NULL AND NOT c.dist_column = ANY (v.sql_where);

    -- Code on a distributed gated table runs on the workers, per shard, as
    -- the approver, inside the approved write.
    RETURN QUERY
    SELECT 'warning', g.relid::regclass::text,
           format('trigger %s runs on the workers, in each shard, inside the approved write (citus.enable_unsafe_triggers): it must touch only rows of the same shard (colocated tables, the same tenant); a statement without the tenant fans out to every node from inside the write',
                  tg.tgname)
      FROM keyturn._gated_tables() g
     CROSS JOIN LATERAL keyturn._citus_table(g.relid) c
      JOIN pg_trigger tg ON tg.tgrelid = g.relid AND NOT tg.tgisinternal
     WHERE g.kind = 'write' AND c.method = 'h' AND NOT c.reference;

    RETURN QUERY
    SELECT 'warning', g.relid::regclass::text,
           format('reference table gated by %s: every approval writes every node, in a two-phase commit', g.tools)
      FROM keyturn._gated_tables() g
     CROSS JOIN LATERAL keyturn._citus_table(g.relid) c
     WHERE g.kind = 'write' AND c.reference;

    -- The application's own statements on distributed tables (an agent's
    -- reads under RLS) reach the workers with its identity only as
    -- propagated SET LOCALs; keyturn re-asserts identity for its own.
    IF coalesce((SELECT s.reset_val FROM pg_settings s WHERE s.name = 'citus.propagate_set_commands'), 'none') <> 'local'
       AND EXISTS (SELECT 1 FROM keyturn._gated_tables() g CROSS JOIN LATERAL keyturn._citus_table(g.relid) c
                    WHERE NOT c.reference) THEN
        RETURN QUERY SELECT 'warning', 'setting citus.propagate_set_commands',
            'is not ''local'' for this login: the application''s own statements on distributed tables see no identity on the workers (row-level security there finds no tenant); set it to local and assert identity with SET LOCAL (docs/scale-out.md)';
    END IF;

    -- Distributed, every _for call is routed by Citus, which crashes on a NULL
    -- tenant unless pg_keyturn's planner hook refused it first.
    IF keyturn.dispatch_by_tenant() AND NOT keyturn._preloaded() THEN
        RETURN QUERY SELECT 'error', 'setting shared_preload_libraries',
            'does not load pg_keyturn: a tenant-explicit call with a NULL tenant, which any role that may make one can send, crashes the backend in Citus''s routing and restarts every connection of the node; set shared_preload_libraries = ''citus,pg_keyturn'' on every node and restart them (docs/scale-out.md)';
    END IF;

    -- Every worker resolves identity itself (RLS calls keyturn.current_tenant()
    -- there), from the settings keyturn propagates: it needs pg_keyturn at the
    -- coordinator's version and the same claim settings.
    v_coord := keyturn._citus_node_settings();
    BEGIN
        FOR w IN EXECUTE
            'SELECT nodename, nodeport, success, result
               FROM pg_catalog.run_command_on_workers(''SELECT keyturn._citus_node_settings()'')'
        LOOP
            IF NOT w.success THEN
                RETURN QUERY SELECT 'error', format('worker %s:%s', w.nodename, w.nodeport),
                    format('pg_keyturn is missing or differs there (keyturn._citus_node_settings() failed: %s): row-level security on that worker cannot resolve identity as here',
                           w.result);
            ELSIF w.result IS DISTINCT FROM v_coord THEN
                RETURN QUERY SELECT 'error', format('worker %s:%s', w.nodename, w.nodeport),
                    format('pg_keyturn version, identity settings or preloading (version|claim_tenant|claim_principal|claim_session|claim_numbers|allow_session_identity|preloaded) are %s there, %s here: row-level security on that worker would resolve another identity, or a call with a NULL tenant could crash a backend there; set them alike on every node',
                           w.result, v_coord);
            END IF;
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        RETURN QUERY SELECT 'warning', 'citus workers',
            format('could not compare keyturn''s version and identity settings with the workers: %s', SQLERRM);
    END;
END
$$;

-- Whether keyturn's own tables are distributed by tenant (layout B): the
-- dispatcher must then call the tenant-explicit forms, tenant by tenant
-- (sql/062_dispatch_for.sql). keyturnd asks this at start and whenever a
-- lease fails.
CREATE FUNCTION keyturn.dispatch_by_tenant()
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM keyturn._citus_table('keyturn.action'::regclass) c WHERE c.dist_column = 'tenant');
END
$$;

-- The nodes besides this one whose notifications keyturnd must hear: in
-- layout B an approval's wake-up (NOTIFY keyturn_dispatch) is sent on the
-- worker that holds the tenant's shards, where the delegated call commits,
-- and a notification is heard only on the node that sent it. Empty
-- otherwise. The names are those this node reaches the workers by.
CREATE FUNCTION keyturn.dispatch_nodes()
RETURNS TABLE (host text, port int)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT keyturn.dispatch_by_tenant() THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE
        'SELECT n.nodename::text, n.nodeport::int FROM pg_catalog.pg_dist_node n
          WHERE n.isactive AND n.noderole = ''primary''
            AND n.groupid <> (SELECT l.groupid FROM pg_catalog.pg_dist_local_group l)
          ORDER BY n.nodeid';
END
$$;

-- Whether the shard of p_rel (hash-distributed) that holds p_value has a
-- placement on this node. False without Citus or for a table Citus does not
-- hash-distribute. What keyturn runs at a worker's commit (the chain's
-- write, the recheck of the authorization epoch) asks it before it lets
-- Citus run those statements there (extension/src/citus.rs, begin_local):
-- only when, naming the tenant, they stay on this node.
CREATE FUNCTION keyturn._citus_shard_here(p_rel regclass, p_value text)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_here boolean;
BEGIN
    IF NOT keyturn._citus_present()
       OR NOT EXISTS (SELECT 1 FROM keyturn._citus_table(p_rel) c WHERE c.method = 'h') THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_placement pl
                              JOIN pg_catalog.pg_dist_local_group g ON g.groupid = pl.groupid
                             WHERE pl.shardid = pg_catalog.get_shard_id_for_distribution_column($1, $2))'
        INTO v_here USING p_rel, p_value;
    RETURN v_here;
END
$$;

-- Layout B in one call (docs/scale-out.md): keyturn's tables that hold no
-- tenant become reference tables, its tenant tables are distributed by
-- tenant, colocated with colocate_with (a business table distributed by its
-- text tenant column), and every tenant-explicit call (propose_for, …,
-- lease_for, …) is registered so that Citus sends it whole to the tenant's
-- worker. For the coordinator's superuser, once, with keyturnd stopped;
-- what is done already is skipped, so it may run again. Returns what it did.
--
-- The foreign keys from keyturn's tables to its tables without a tenant go:
-- with them Citus converts every table they join and fails on the
-- extension's own objects, and they cannot be added back, since every
-- worker's copy of the extension still holds them. keyturn's functions,
-- the only writers of these tables, keep what they kept.
CREATE FUNCTION keyturn.citus_distribute(colocate_with regclass)
RETURNS TABLE (object text, done text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c         record;
    r         record;
    delegated boolean;
BEGIN
    IF NOT keyturn._citus_present() THEN
        RAISE EXCEPTION 'keyturn: Citus is not installed in this database'
            USING ERRCODE = '55000',
                  HINT = 'CREATE EXTENSION citus on every node and add the workers first (docs/scale-out.md).';
    END IF;
    IF NOT keyturn._preloaded() THEN
        RAISE EXCEPTION 'keyturn: pg_keyturn is not in shared_preload_libraries'
            USING ERRCODE = '55000',
                  HINT = 'Distributed, every _for call is routed by Citus, which crashes a backend on a NULL tenant unless pg_keyturn refused it first (docs/scale-out.md): set shared_preload_libraries = ''citus,pg_keyturn'' on every node and restart them.';
    END IF;
    SELECT * INTO c FROM keyturn._citus_table(citus_distribute.colocate_with);
    IF NOT FOUND OR c.method <> 'h'
       OR (SELECT a.atttypid FROM pg_attribute a
            WHERE a.attrelid = citus_distribute.colocate_with AND a.attname = c.dist_column) <> 'text'::regtype THEN
        RAISE EXCEPTION 'keyturn: % is not a table Citus distributes by a text column', citus_distribute.colocate_with
            USING ERRCODE = '22023',
                  HINT = 'Name the business table distributed by its tenant: create_distributed_table(''…'', ''tenant'').';
    END IF;
    -- Distributing a table that has triggers (the lifecycle and the
    -- append-only guards) needs it; they run on every shard.
    PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
    -- Made on first use otherwise, by the first approval: on a worker, in a
    -- delegated call, which cannot write a reference table.
    PERFORM keyturn._ensure_approval_key();

    FOR r IN SELECT k.conrelid::regclass AS tbl, k.conname
               FROM pg_constraint k
              WHERE k.contype = 'f' AND k.connamespace = 'keyturn'::regnamespace
                AND NOT EXISTS (SELECT 1 FROM pg_attribute a
                                 WHERE a.attrelid = k.confrelid AND a.attname = 'tenant' AND NOT a.attisdropped)
              ORDER BY 1, 2 LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', r.tbl, r.conname);
        RETURN QUERY SELECT format('%s.%s', r.tbl, r.conname), 'foreign key dropped';
    END LOOP;

    FOR r IN SELECT k.oid::regclass AS tbl,
                    EXISTS (SELECT 1 FROM pg_attribute a
                             WHERE a.attrelid = k.oid AND a.attname = 'tenant' AND NOT a.attisdropped) AS tenant
               FROM pg_class k
              WHERE k.relnamespace IN ('keyturn'::regnamespace, 'keyturn_secret'::regnamespace) AND k.relkind = 'r'
                AND NOT EXISTS (SELECT 1 FROM keyturn._citus_table(k.oid))
              -- The tables without a tenant first, then action, which
              -- staged_payload's foreign key names.
              ORDER BY 2, k.relname <> 'action', 1 LOOP
        IF r.tenant THEN
            EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''tenant'', colocate_with => $2)'
                USING r.tbl, citus_distribute.colocate_with::text;
            RETURN QUERY SELECT r.tbl::text, format('distributed by tenant, colocated with %s', citus_distribute.colocate_with);
        ELSE
            EXECUTE 'SELECT pg_catalog.create_reference_table($1)' USING r.tbl;
            RETURN QUERY SELECT r.tbl::text, 'reference table';
        END IF;
    END LOOP;

    FOR r IN SELECT f.oid::regprocedure AS fn
               FROM pg_proc f
              WHERE f.pronamespace = 'keyturn'::regnamespace AND f.proname ~ '^[a-z].*_for$'
                AND f.proargtypes[0] = 'text'::regtype
              ORDER BY 1 LOOP
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_object o
                                  WHERE o.classid = ''pg_proc''::regclass AND o.objid = $1
                                    AND o.distribution_argument_index IS NOT NULL)'
            INTO delegated USING r.fn;
        CONTINUE WHEN delegated;
        EXECUTE 'SELECT pg_catalog.create_distributed_function($1, ''$1'', colocate_with => ''keyturn.action'',
                                                               force_delegation => true)'
            USING r.fn;
        RETURN QUERY SELECT r.fn::text, 'sent whole to the tenant''s worker (force_delegation)';
    END LOOP;
END
$$;

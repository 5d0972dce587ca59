-- What Citus says about a table (docs/scale-out.md), for the files after
-- this one: whether Citus is here, how it holds a table, what a gated table
-- it distributes must be (register_tool refuses, check_deployment reports),
-- and a reference table's placement on this node.
--
-- The extension never depends on Citus: without it in this database every
-- function here answers nothing, and Citus's catalog is only reached through
-- EXECUTE, once its presence is known (keyturn._citus_present, in Rust:
-- extension/src/citus.rs).

-- How Citus holds a table: method 'h' (hash-distributed), 'n' (reference,
-- single-shard or Citus-local: no distribution column), 'a'/'r' (append,
-- range); dist_column its distribution column. No row: not a Citus table,
-- or no Citus.
CREATE FUNCTION keyturn._citus_table(p_relid oid)
RETURNS TABLE (method text, dist_column text, reference boolean)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF NOT keyturn._citus_present() THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE
        'SELECT p.partmethod::text,
                CASE WHEN p.partkey IS NOT NULL THEN pg_catalog.column_to_column_name(p.logicalrelid, p.partkey) END,
                p.partmethod = ''n'' AND p.repmodel = ''t''
           FROM pg_catalog.pg_dist_partition p WHERE p.logicalrelid = $1'
        USING p_relid;
END
$$;

-- Key and version columns whose text depends on session settings (DateStyle,
-- TimeZone, IntervalStyle, extra_float_digits, bytea_output, lc_monetary).
-- keyturn stores a target's key and version as text written under settings
-- it pins for its own statements; on a distributed table that text is
-- written and read back on the workers, under whatever settings their
-- connections have (a SET LOCAL the application propagates included), so the
-- same text could name another row.
CREATE FUNCTION keyturn._citus_setting_dependent(p_type text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT split_part(p_type, '(', 1) IN (
        'date', 'timestamp without time zone', 'timestamp with time zone', 'time without time zone',
        'time with time zone', 'interval', 'real', 'double precision', 'bytea', 'money')
$$;

-- Why an sql tool's part (as _spec_sql returns it: table, key, version, set,
-- types) cannot work on a table Citus distributes, one line per problem, or
-- nothing. register_tool refuses on any; check_deployment reports them for
-- the registered tools of tables distributed since.
CREATE FUNCTION keyturn._citus_table_problems(p_relid oid, p_key text, p_version text, p_set text[],
                                              p_types jsonb)
RETURNS SETOF text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    c record;
    k text;
BEGIN
    SELECT * INTO c FROM keyturn._citus_table(p_relid);
    IF NOT FOUND OR c.reference THEN
        RETURN;
    END IF;
    IF c.dist_column = ANY (p_set) THEN
        RETURN NEXT format('spec.sql.set names %s, the distribution column of %s: Citus never changes a row''s distribution column, so every approval would fail',
                           quote_ident(c.dist_column), p_relid::regclass);
    END IF;
    FOREACH k IN ARRAY ARRAY[p_key, p_version] LOOP
        IF k <> 'xmin' AND keyturn._citus_setting_dependent(p_types ->> k) THEN
            RETURN NEXT format('%s %s of distributed table %s is %s, whose text depends on the workers'' session settings: the stored target could name another row there',
                               CASE WHEN k = p_key THEN 'key' ELSE 'version' END, quote_ident(k),
                               p_relid::regclass, p_types ->> k);
        END IF;
    END LOOP;
END
$$;

-- This node's placement of a reference table (the shard Citus keeps on every
-- node, keyturn.tool_<shard id>), or NULL: no Citus, not a reference table,
-- or no placement here. A row lock taken on it is a plain PostgreSQL lock on
-- this node, which a change of the reference table (made on every placement,
-- this one included) waits for. Citus would turn a row lock on the
-- reference table itself into a lock on another node too, which a call it
-- runs on a worker cannot take without deadlocking against another such call.
CREATE FUNCTION keyturn._local_placement(p_rel regclass)
RETURNS regclass
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_shard regclass;
BEGIN
    IF NOT keyturn._citus_present() THEN
        RETURN NULL;
    END IF;
    EXECUTE 'SELECT to_regclass(format(''%s_%s'', $1, s.shardid))
               FROM pg_catalog.pg_dist_shard s
               JOIN pg_catalog.pg_dist_partition p ON p.logicalrelid = s.logicalrelid
              WHERE s.logicalrelid = $1 AND p.partmethod = ''n'' AND p.repmodel = ''t'''
        INTO v_shard USING p_rel;
    RETURN v_shard;
END
$$;

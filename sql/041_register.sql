-- Tool registration (docs/sql-api.md, "Tools").
--
-- A spec is validated whole before anything is written: unknown keys, wrong
-- types and out-of-range values are 22023 with the key named. Each part of
-- the spec has its own function below (scalars, rate_limit, the external
-- part, the sql part); register_tool puts their answers together. sql tools
-- are checked against the catalog here, once, and stored by name.

CREATE FUNCTION keyturn._spec_choice(p_spec jsonb, p_key text, p_default text, p_allowed text[])
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v jsonb := p_spec -> p_key;
BEGIN
    IF v IS NULL THEN
        RETURN p_default;
    END IF;
    IF jsonb_typeof(v) <> 'string' OR NOT (v #>> '{}') = ANY (p_allowed) THEN
        RAISE EXCEPTION 'keyturn: spec.% must be one of %, not %', p_key,
                array_to_string(p_allowed, ', '), v
            USING ERRCODE = '22023';
    END IF;
    RETURN v #>> '{}';
END
$$;

CREATE FUNCTION keyturn._spec_string(p_spec jsonb, p_key text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v jsonb := p_spec -> p_key;
BEGIN
    IF v IS NULL THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'string' OR v #>> '{}' = '' THEN
        RAISE EXCEPTION 'keyturn: spec.% must be a non-empty string, not %', p_key, v
            USING ERRCODE = '22023';
    END IF;
    RETURN v #>> '{}';
END
$$;

CREATE FUNCTION keyturn._spec_positive_int(p_value jsonb, p_what text, p_max int)
RETURNS int
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF jsonb_typeof(p_value) <> 'number' OR (p_value #>> '{}')::numeric <> trunc((p_value #>> '{}')::numeric)
       OR (p_value #>> '{}')::numeric < 1 OR (p_value #>> '{}')::numeric > p_max THEN
        RAISE EXCEPTION 'keyturn: % must be a whole number from 1 to %, not %', p_what, p_max, p_value
            USING ERRCODE = '22023';
    END IF;
    RETURN (p_value #>> '{}')::int;
END
$$;

-- Whether v is more than 0 and at most p_max however the calendar adds it,
-- the one rule for every bound keyturn puts on a length of time (an expiry,
-- a rate window, a standing approval, a link, a reminder). Interval
-- comparison counts a month as 30 days and a year as 360, but adding one
-- counts the calendar, so '120 mons -3593 days' compared as 7 days and
-- lasted 60 (sixteenth red-team pass, docs/security.md row 116): every part
-- must be at least 0, and a month counts as 31 days, a year as 366.
CREATE FUNCTION keyturn._interval_within(v interval, p_max interval)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN v > interval '0'
   AND extract(year FROM v) >= 0 AND extract(month FROM v) >= 0 AND extract(day FROM v) >= 0
   AND v - make_interval(years => extract(year FROM v)::int, months => extract(month FROM v)::int,
                         days => extract(day FROM v)::int) >= interval '0'
   AND v + (6 * extract(year FROM v) + extract(month FROM v))::int * interval '1 day' <= p_max;

CREATE FUNCTION keyturn._spec_interval(p_value jsonb, p_what text, p_max interval)
RETURNS interval
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v interval;
BEGIN
    IF jsonb_typeof(p_value) <> 'string' THEN
        RAISE EXCEPTION 'keyturn: % must be an interval string such as ''15 minutes'', not %', p_what, p_value
            USING ERRCODE = '22023';
    END IF;
    BEGIN
        v := (p_value #>> '{}')::interval;
    EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
        RAISE EXCEPTION 'keyturn: % is not a valid interval: %', p_what, p_value
            USING ERRCODE = '22023';
    END;
    IF NOT keyturn._interval_within(v, p_max) THEN
        RAISE EXCEPTION 'keyturn: % must be more than 0 and at most %, without months or years, not %', p_what, p_max, v
            USING ERRCODE = '22023';
    END IF;
    RETURN v;
END
$$;

-- Refuses keys outside p_known, naming them.
CREATE FUNCTION keyturn._spec_keys(p_obj jsonb, p_what text, p_known text[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    k text;
BEGIN
    FOR k IN SELECT jsonb_object_keys(p_obj) LOOP
        IF NOT k = ANY (p_known) THEN
            RAISE EXCEPTION 'keyturn: unknown % key %', p_what, keyturn._quoted(k)
                USING ERRCODE = '22023',
                      HINT = format('Known keys: %s.', array_to_string(p_known, ', '));
        END IF;
    END LOOP;
END
$$;

-- The column's type as format_type prints it, or 22023 when it is not a plain
-- column of the table (system columns, dropped columns and typos alike).
CREATE FUNCTION keyturn._spec_column(p_relid oid, p_column jsonb, p_what text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_type text;
BEGIN
    IF jsonb_typeof(p_column) IS DISTINCT FROM 'string' THEN
        RAISE EXCEPTION 'keyturn: % must be a column name, not %', p_what, p_column
            USING ERRCODE = '22023';
    END IF;
    SELECT format_type(a.atttypid, a.atttypmod) INTO v_type
      FROM pg_attribute a
     WHERE a.attrelid = p_relid AND a.attname = p_column #>> '{}'
       AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '';
    IF v_type IS NULL THEN
        RAISE EXCEPTION 'keyturn: % names %, which is not a writable column of %',
                p_what, p_column, p_relid::regclass
            USING ERRCODE = '22023';
    END IF;
    RETURN v_type;
END
$$;

-- A form's spec.sql.where, of a write tool or a read tool (absent: none):
-- its column names, each a column of the table, with their types added to
-- p_types.
CREATE FUNCTION keyturn._spec_where(p_relid oid, p_sql jsonb, INOUT p_types jsonb, OUT o_where text[])
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    c jsonb;
BEGIN
    o_where := '{}';
    IF p_sql ? 'where' THEN
        IF jsonb_typeof(p_sql -> 'where') <> 'array' THEN
            RAISE EXCEPTION 'keyturn: spec.sql.where must be an array of column names' USING ERRCODE = '22023';
        END IF;
        FOR c IN SELECT jsonb_array_elements(p_sql -> 'where') LOOP
            p_types := p_types || jsonb_build_object(c #>> '{}', keyturn._spec_column(p_relid, c, 'spec.sql.where'));
            o_where := o_where || (c #>> '{}');
        END LOOP;
    END IF;
END
$$;

-- A table and every partition and inheritance child below it: a trigger on
-- a partition runs inside a write to its parent (thirty-second red-team
-- pass), so each is checked as the table.
CREATE FUNCTION keyturn._table_tree(p_relid oid)
RETURNS SETOF oid
LANGUAGE sql STABLE
AS $$
    WITH RECURSIVE tree (relid) AS (
        SELECT p_relid
        UNION
        SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid
    )
    SELECT relid FROM tree
$$;

-- What an agent owns that a table's policies, column defaults, constraints,
-- indexes, rules and column types use, one row each (the use, the object,
-- its owner): functions (an operator's through its function), relations (a
-- view or table a policy reads) and types (a domain's constraints) run or
-- are read inside an approved write, as the approver, and their owner can
-- change them at will (thirty-third and thirty-fourth red-team passes,
-- docs/security.md row 143). Triggers are check_deployment's own branch.
CREATE FUNCTION keyturn._agent_owned_uses(p_relid oid)
RETURNS TABLE (what text, obj text, owner oid)
LANGUAGE sql STABLE
AS $$
    WITH RECURSIVE used (what, classid, objid) AS (
        SELECT format('policy %I', p.polname), 'pg_policy'::regclass::oid, p.oid
          FROM pg_policy p WHERE p.polrelid = p_relid
        UNION ALL
        SELECT format('the default of column %I', a.attname), 'pg_attrdef'::regclass::oid, ad.oid
          FROM pg_attrdef ad
          JOIN pg_attribute a ON a.attrelid = ad.adrelid AND a.attnum = ad.adnum
         WHERE ad.adrelid = p_relid
        UNION ALL
        SELECT format('constraint %I', c.conname), 'pg_constraint'::regclass::oid, c.oid
          FROM pg_constraint c WHERE c.conrelid = p_relid
        UNION ALL
        SELECT format('index %s', i.indexrelid::regclass), 'pg_class'::regclass::oid, i.indexrelid
          FROM pg_index i WHERE i.indrelid = p_relid
        UNION ALL
        SELECT format('rule %I', r.rulename), 'pg_rewrite'::regclass::oid, r.oid
          FROM pg_rewrite r WHERE r.ev_class = p_relid
    ), refs (what, classid, objid) AS (
        SELECT u.what, d.refclassid, d.refobjid
          FROM used u
          JOIN pg_depend d ON d.classid = u.classid AND d.objid = u.objid
         WHERE d.refclassid IN ('pg_proc'::regclass, 'pg_class'::regclass, 'pg_type'::regclass, 'pg_operator'::regclass)
           AND NOT (d.refclassid = 'pg_class'::regclass AND d.refobjid = p_relid)
        UNION
        SELECT format('column %I', a.attname), 'pg_type'::regclass::oid, a.atttypid
          FROM pg_attribute a WHERE a.attrelid = p_relid AND a.attnum > 0 AND NOT a.attisdropped
        UNION
        -- An operator runs its function; a domain's base type and an
        -- array's element type are used as the type is.
        SELECT r.what, n.classid, n.objid
          FROM refs r
         CROSS JOIN LATERAL (
                SELECT 'pg_proc'::regclass::oid, o.oprcode::oid
                  FROM pg_operator o WHERE r.classid = 'pg_operator'::regclass AND o.oid = r.objid
                UNION ALL
                SELECT 'pg_type'::regclass::oid, t.typbasetype
                  FROM pg_type t WHERE r.classid = 'pg_type'::regclass AND t.oid = r.objid AND t.typbasetype <> 0
                UNION ALL
                SELECT 'pg_type'::regclass::oid, t.typelem
                  FROM pg_type t WHERE r.classid = 'pg_type'::regclass AND t.oid = r.objid AND t.typelem <> 0
             ) AS n (classid, objid)
    )
    SELECT DISTINCT r.what,
           coalesce(p.oid::regprocedure::text, c.oid::regclass::text, t.oid::regtype::text, o.oid::regoperator::text),
           w.owner
      FROM refs r
      LEFT JOIN pg_proc p ON r.classid = 'pg_proc'::regclass AND p.oid = r.objid
      LEFT JOIN pg_class c ON r.classid = 'pg_class'::regclass AND c.oid = r.objid
      LEFT JOIN pg_type t ON r.classid = 'pg_type'::regclass AND t.oid = r.objid
      LEFT JOIN pg_operator o ON r.classid = 'pg_operator'::regclass AND o.oid = r.objid
     CROSS JOIN LATERAL (SELECT coalesce(p.proowner, c.relowner, t.typowner, o.oprowner)) AS w (owner)
     WHERE keyturn._is_agent_role(w.owner)
$$;

-- What lets an agent change a table other than through an approved form, one
-- line per problem, or nothing: an agent role (a non-superuser member of
-- keyturn_agent) that owns it or its schema, or can act as their owner
-- (ALTER, CREATE TRIGGER on it, DROP, a table of its own in its place), or
-- holds a privilege that writes to it or attaches
-- code to it, or the same of one of its partitions or children. Such a role
-- could put a trigger on the table that runs inside the approved write, as
-- the approver. With p_reads_only, only what lets an
-- agent read it past its row-level security: owning it (an owner may turn
-- row-level security off, and is exempt unless it is forced) or BYPASSRLS.
-- Used by register_tool (which refuses) and check_deployment (which
-- reports).
CREATE FUNCTION keyturn._agent_table_problems(p_relid oid, p_reads_only boolean DEFAULT false)
RETURNS SETOF text
LANGUAGE sql STABLE
AS $$
    SELECT DISTINCT format('agent role %s %s', quote_ident(r.rolname), p.problem)
      FROM pg_roles r
     CROSS JOIN keyturn._table_tree(p_relid) AS tree (relid)
      JOIN pg_class c ON c.oid = tree.relid
      JOIN pg_namespace n ON n.oid = c.relnamespace
     CROSS JOIN LATERAL (VALUES
         (pg_has_role(r.oid, c.relowner, 'MEMBER'), true,
          format('owns %s or is a member of its owner %s', tree.relid::regclass, c.relowner::regrole)),
         -- A schema's owner may drop any table in it and create its own in
         -- its place (thirty-third red-team pass).
         (pg_has_role(r.oid, n.nspowner, 'MEMBER'), true,
          format('owns the schema %s of %s or is a member of its owner %s', quote_ident(n.nspname), tree.relid::regclass, n.nspowner::regrole)),
         (r.rolbypassrls, true, 'bypasses row-level security (BYPASSRLS)'),
         (has_table_privilege(r.oid, tree.relid, 'INSERT, UPDATE, DELETE, TRUNCATE')
          OR has_any_column_privilege(r.oid, tree.relid, 'INSERT, UPDATE'), false,
          format('may write %s directly', tree.relid::regclass)),
         (has_table_privilege(r.oid, tree.relid, 'TRIGGER'), false,
          format('may create triggers on %s', tree.relid::regclass))
     ) AS p (bad, reads, problem)
     WHERE keyturn._is_agent_role(r.oid) AND p.bad
       AND (p.reads OR NOT p_reads_only)
     ORDER BY 1
$$;

-- The table spec.sql.table names, of one of p_kinds (pg_class.relkind), not
-- temporary; 22023 otherwise. Shared by the write form and the read form
-- (sql/063_mcp.sql).
CREATE FUNCTION keyturn._spec_table(p_table jsonb, p_kinds "char"[])
RETURNS oid
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_relid oid;
BEGIN
    IF jsonb_typeof(p_table) IS DISTINCT FROM 'string' THEN
        RAISE EXCEPTION 'keyturn: spec.sql.table must name a table, e.g. "crm.deal"' USING ERRCODE = '22023';
    END IF;
    -- to_regclass answers NULL for a table that does not exist, but raises
    -- for text that is no table name at all ("..", "a.b.c.d", "db.s.t"):
    -- both are the same invalid input here.
    BEGIN
        v_relid := to_regclass(p_table #>> '{}');
    EXCEPTION WHEN invalid_name OR syntax_error OR feature_not_supported THEN
        v_relid := NULL;
    END;
    IF v_relid IS NULL OR NOT EXISTS (SELECT 1 FROM pg_class r WHERE r.oid = v_relid AND r.relkind = ANY (p_kinds)) THEN
        RAISE EXCEPTION 'keyturn: spec.sql.table % is not an existing table', p_table
            USING ERRCODE = '22023';
    END IF;
    IF (SELECT n.nspname LIKE 'pg\_temp\_%' OR n.nspname LIKE 'pg\_toast\_temp\_%'
          FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace WHERE r.oid = v_relid) THEN
        RAISE EXCEPTION 'keyturn: spec.sql.table % is a temporary table', p_table
            USING ERRCODE = '22023';
    END IF;
    RETURN v_relid;
END
$$;

-- The type of column p_column of p_relid, when keyturn cannot write a value
-- of it exactly (else NULL): what a person approves is the value the card
-- shows, and the table must store that value or refuse it. keyturn reads a
-- form's values in the column's type without its size and checks each
-- against the column (keyturn._form_fit, keyturn._form_problem); the types
-- below it checks (a domain as its base, an array as its elements). Not a
-- composite type (its fields' sizes apply with no size of its own), a range,
-- "char" or name (cut without a size), money (rounded, and read by
-- lc_monetary), xml (no equality), nor any other (docs/security.md, row 126).
CREATE FUNCTION keyturn._inexact_type(p_relid oid, p_column text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_declared oid;
    v_type     oid;
    v_array    boolean := false;
    t          record;
BEGIN
    SELECT a.atttypid INTO v_declared FROM pg_attribute a
     WHERE a.attrelid = p_relid AND a.attname = p_column AND a.attnum > 0 AND NOT a.attisdropped;
    v_type := v_declared;
    LOOP
        SELECT y.typtype, y.typbasetype, y.typelem, y.typcategory, y.typname INTO t
          FROM pg_type y WHERE y.oid = v_type;
        EXIT WHEN NOT FOUND;
        IF t.typtype = 'd' THEN
            v_type := t.typbasetype;
        ELSIF t.typcategory = 'A' AND t.typelem <> 0 THEN
            v_array := true;
            v_type := t.typelem;
        ELSE
            EXIT;
        END IF;
    END LOOP;
    -- citext only as the citext extension's own type, not any type so named.
    -- An array of JSON: its text would be read as JSON element by element,
    -- not as the JSON value the card shows.
    IF v_array AND v_type IN ('json'::regtype, 'jsonb'::regtype) THEN
        RETURN format_type(v_declared, NULL);
    END IF;
    IF t.typtype = 'e'
       OR (t.typname = 'citext' AND EXISTS (
             SELECT 1 FROM pg_depend d JOIN pg_extension x ON x.oid = d.refobjid
              WHERE d.classid = 'pg_type'::regclass AND d.objid = v_type AND d.deptype = 'e'
                AND x.extname = 'citext'))
       OR v_type = ANY ('{text,varchar,bpchar,int2,int4,int8,numeric,float4,float8,bool,uuid,date,time,timetz,timestamp,timestamptz,interval,json,jsonb,bytea,inet,cidr,macaddr,macaddr8,bit,varbit}'::regtype[]::oid[]) THEN
        RETURN NULL;
    END IF;
    RETURN format_type(v_declared, NULL);
END
$$;

-- Why p_key does not name one row of p_relid, or NULL. It does when the
-- column is NOT NULL and a valid unique index (not partial, on no expression)
-- is on it alone, or, on a table Citus distributes, on it and the
-- distribution column (Citus puts that column in every unique index, and the
-- tenant's row-level security pins it), under the collation keyturn compares
-- the key in (the column's, where that one is not deterministic); and no
-- child table inherits from it (the write would reach the child's rows,
-- which its index does not cover). With a key that can name two rows, a row
-- that took a target's key and version after the proposal is one the
-- approval writes, and no card showed it (docs/security.md, row 127).
-- register_tool refuses; check_deployment reports what changed since.
CREATE FUNCTION keyturn._key_problem(p_relid oid, p_key text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_key      int2;
    v_notnull  boolean;
    v_coll     oid;
    v_dist     int2;
    v_distname text;
    v_inexact  text;
BEGIN
    SELECT a.attnum, a.attnotnull, a.attcollation INTO v_key, v_notnull, v_coll
      FROM pg_attribute a
     WHERE a.attrelid = p_relid AND a.attname = p_key AND a.attnum > 0 AND NOT a.attisdropped;
    SELECT a.attnum, c.dist_column INTO v_dist, v_distname
      FROM keyturn._citus_table(p_relid) c
      JOIN pg_attribute a ON a.attrelid = p_relid AND a.attname = c.dist_column;
    v_inexact := keyturn._inexact_type(p_relid, p_key);
    IF v_inexact IS NOT NULL THEN
        RETURN format('key %s of %s is of type %s, which keyturn does not compare exactly',
                      quote_ident(p_key), p_relid::regclass, v_inexact);
    END IF;
    IF NOT v_notnull THEN
        RETURN format('key %s of %s may be NULL, and a row without a key cannot be named: make it NOT NULL',
                      quote_ident(p_key), p_relid::regclass);
    END IF;
    IF (SELECT r.relkind = 'r' FROM pg_class r WHERE r.oid = p_relid)
       AND EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhparent = p_relid) THEN
        RETURN format('%s has child tables (INHERITS), which an approval''s write reaches and its unique index does not cover',
                      p_relid::regclass);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_index i
                WHERE i.indrelid = p_relid AND i.indisunique AND i.indisvalid
                  AND i.indpred IS NULL AND i.indexprs IS NULL
                  AND (SELECT coalesce(bool_and(k = v_key OR k IS NOT DISTINCT FROM v_dist)
                                       AND bool_or(k = v_key
                                                   -- the equality approve compares the key with
                                                   AND (SELECT oc.opcdefault FROM pg_opclass oc
                                                         WHERE oc.oid = i.indclass[n - 1])
                                                   AND (i.indcollation[n - 1] = v_coll
                                                        OR v_coll = 0
                                                        OR (SELECT c.collisdeterministic FROM pg_collation c
                                                             WHERE c.oid = v_coll))),
                                       false)
                         FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS u (k, n)
                        WHERE n <= i.indnkeyatts)) THEN
        RETURN NULL;
    END IF;
    RETURN format('key %s does not name one row of %s: no unique index (not partial, on no expression, in the column''s collation) is on that column alone%s, so an approval could write a row its card never showed',
                  quote_ident(p_key), p_relid::regclass,
                  CASE WHEN v_distname IS NOT NULL
                       THEN format(' or on it and %s, the distribution column', quote_ident(v_distname)) ELSE '' END);
END
$$;

-- The sql part of a spec: {"table", "key", "version", "set", "where"}, checked
-- against the catalog. Returns the stored columns as one jsonb object.
CREATE FUNCTION keyturn._spec_sql(p_tool text, p_sql jsonb)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    c        jsonb;
    v_relid  oid;
    v_key    text;
    v_verc   text := 'xmin';
    v_set    text[] := '{}';
    v_where  text[] := '{}';
    v_types  jsonb;
    v_bad    text;
BEGIN
    IF p_sql IS NULL OR jsonb_typeof(p_sql) <> 'object' THEN
        RAISE EXCEPTION 'keyturn: sql tool % needs spec.sql = {"table", "key", "version", "set", "where"}', p_tool
            USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._spec_keys(p_sql, 'spec.sql', ARRAY['table', 'key', 'version', 'set', 'where']);
    v_relid := keyturn._spec_table(p_sql -> 'table', '{r,p}');
    v_bad := (SELECT string_agg(p, '; ') FROM keyturn._agent_table_problems(v_relid) p);
    v_bad := concat_ws('; ', v_bad,
                       (SELECT string_agg(format('%s on %s uses %s, owned by agent role %s', u.what, t::regclass, u.obj, u.owner::regrole), '; ')
                          FROM keyturn._table_tree(v_relid) AS t, keyturn._agent_owned_uses(t) u));
    IF v_bad <> '' THEN
        RAISE EXCEPTION 'keyturn: agents could change % outside the approved form: %', v_relid::regclass, v_bad
            USING ERRCODE = '22023',
                  HINT = 'Agent roles may only SELECT a gated table: revoke their write and TRIGGER privileges and make a non-agent role its owner, then register again.';
    END IF;

    v_key := p_sql ->> 'key';
    v_types := jsonb_build_object(v_key, keyturn._spec_column(v_relid, p_sql -> 'key', 'spec.sql.key'));
    IF p_sql ? 'version' AND p_sql -> 'version' IS DISTINCT FROM '"xmin"' THEN
        v_verc := p_sql ->> 'version';
        v_types := v_types || jsonb_build_object(v_verc, keyturn._spec_column(v_relid, p_sql -> 'version', 'spec.sql.version'));
        -- A version column that nothing changes on every write cannot show a
        -- conflicting edit: two proposals against the same before-state would
        -- both pass. keyturn's own write never sets it (set may not name it),
        -- so a trigger must.
        IF NOT EXISTS (SELECT 1 FROM pg_trigger t
                        WHERE t.tgrelid = v_relid AND NOT t.tgisinternal
                          AND (t.tgtype & 2) <> 0      -- BEFORE
                          AND (t.tgtype & 16) <> 0     -- UPDATE
                          AND (t.tgtype & 1) <> 0) THEN -- FOR EACH ROW
            RAISE EXCEPTION 'keyturn: spec.sql.version % is a column that no BEFORE UPDATE trigger on % maintains', v_verc, v_relid::regclass
                USING ERRCODE = '22023',
                      HINT = 'Use "version": "xmin" (the default), or add a BEFORE UPDATE ... FOR EACH ROW trigger that changes the column on every update.';
        END IF;
    ELSE
        v_types := v_types || jsonb_build_object('xmin', 'xid');
    END IF;
    IF jsonb_typeof(p_sql -> 'set') IS DISTINCT FROM 'array' OR jsonb_array_length(p_sql -> 'set') = 0 THEN
        RAISE EXCEPTION 'keyturn: spec.sql.set must be a non-empty array of column names' USING ERRCODE = '22023';
    END IF;
    FOR c IN SELECT jsonb_array_elements(p_sql -> 'set') LOOP
        v_types := v_types || jsonb_build_object(c #>> '{}', keyturn._spec_column(v_relid, c, 'spec.sql.set'));
        IF c #>> '{}' IN (v_key, v_verc) THEN
            RAISE EXCEPTION 'keyturn: spec.sql.set may not include the key or version column %', c
                USING ERRCODE = '22023';
        END IF;
        v_set := v_set || (c #>> '{}');
    END LOOP;
    SELECT w.p_types, w.o_where INTO v_types, v_where FROM keyturn._spec_where(v_relid, p_sql, v_types) w;
    IF cardinality(v_where) = 0 THEN
        RAISE EXCEPTION 'keyturn: spec.sql.where must name at least one column the form may filter on'
            USING ERRCODE = '22023',
                  HINT = 'A form without filters would address the whole table.';
    END IF;
    v_bad := (SELECT string_agg(format('spec.sql.%s names %s, a column of type %s', x.part, quote_ident(x.col), y.t), '; ')
                FROM (SELECT 'set' AS part, s AS col FROM unnest(v_set) s
                      UNION ALL SELECT 'where', w FROM unnest(v_where) w) x
               CROSS JOIN LATERAL keyturn._inexact_type(v_relid, x.col) AS y (t)
               WHERE y.t IS NOT NULL);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: %, whose values keyturn cannot write or compare exactly', v_bad
            USING ERRCODE = '22023',
                  HINT = 'Gate columns of plain types (text, numbers, booleans, uuid, dates and times, json, enums, and domains and arrays of them); a composite''s fields as columns of their own.';
    END IF;
    -- A table Citus distributes (sql/012_citus_catalog.sql); nothing without Citus.
    v_bad := (SELECT string_agg(p, '; ') FROM keyturn._citus_table_problems(v_relid, v_key, v_verc, v_set, v_types) p);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: % cannot be gated this way on Citus: %', v_relid::regclass, v_bad
            USING ERRCODE = '22023',
                  HINT = 'Leave the distribution column out of spec.sql.set, and use key and version columns of a type whose text is the same under every setting (integers, text, uuid; "xmin"); docs/scale-out.md.';
    END IF;
    v_bad := keyturn._key_problem(v_relid, v_key);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: spec.sql.%', v_bad
            USING ERRCODE = '22023',
                  HINT = 'Name a primary key or another unique column as spec.sql.key, or add a unique index on the column.';
    END IF;

    RETURN (SELECT jsonb_build_object(
                'schema', n.nspname, 'table', r.relname, 'key', v_key, 'version', v_verc,
                'set', to_jsonb(v_set), 'where', to_jsonb(v_where), 'types', v_types)
              FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace
             WHERE r.oid = v_relid);
END
$$;

-- The keys keyturnd's smtp adapter mails to (service/src/providers/smtp.rs).
-- Each one an smtp tool's schema declares must be an address (register_tool
-- below), and params carry only the ones it declares (propose,
-- keyturn._undeclared_recipient): so every recipient was checked as a bare
-- address and is one the tool's author meant the person to see.
CREATE FUNCTION keyturn._smtp_recipient_keys()
RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ARRAY['to', 'cc', 'bcc', 'reply_to']
$$;

-- The external part of a spec: provider, params_schema, targets_param and
-- the attachment keys. Returns {"provider", "params_schema" (normalized),
-- "targets_param", "attachments_param", "attachment_types",
-- "max_attachment_bytes"}.
CREATE FUNCTION keyturn._spec_external(p_tool text, p_spec jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_provider text := keyturn._spec_string(p_spec, 'provider');
    v_tparam   text := keyturn._spec_string(p_spec, 'targets_param');
    v_aparam   text := keyturn._spec_string(p_spec, 'attachments_param');
    v_types    jsonb := p_spec -> 'attachment_types';
    v_max      bigint := 10 * 1024 * 1024;
    v_schema   jsonb;
BEGIN
    IF v_provider IS NULL OR v_provider !~ '^[a-z][a-z0-9_]*$' THEN
        RAISE EXCEPTION 'keyturn: external tool % needs spec.provider, a lowercase adapter name such as webhook or smtp', p_tool
            USING ERRCODE = '22023';
    END IF;
    v_schema := keyturn._check_params_schema(coalesce(p_spec -> 'params_schema', '{}'));
    IF v_tparam IS NOT NULL AND NOT (v_schema -> 'properties') ? v_tparam THEN
        RAISE EXCEPTION 'keyturn: spec.targets_param % is not a property of params_schema', keyturn._quoted(v_tparam)
            USING ERRCODE = '22023';
    END IF;
    -- Every address the smtp adapter sends to is a bare addr-spec the card
    -- showed as it is: "Ann" <ann@x> display names and quoted local parts
    -- are refused by format: email, so these fields must use it.
    IF v_provider = 'smtp' AND EXISTS (
           SELECT 1 FROM jsonb_each(v_schema -> 'properties') p
            WHERE p.key = ANY (keyturn._smtp_recipient_keys())
              AND NOT (p.value @> '{"type": "string", "format": "email"}'
                       OR p.value @> '{"type": "array", "items": {"type": "string", "format": "email"}}')) THEN
        RAISE EXCEPTION 'keyturn: smtp tool %: params_schema properties to, cc, bcc and reply_to must be {"type": "string", "format": "email"} or arrays of them', p_tool
            USING ERRCODE = '22023',
                  HINT = 'format: email accepts only a bare address (no display name), so what the person approves is where the mail goes.';
    END IF;
    IF v_aparam IS NULL THEN
        IF p_spec ?| ARRAY['attachment_types', 'max_attachment_bytes'] THEN
            RAISE EXCEPTION 'keyturn: spec.attachment_types and spec.max_attachment_bytes need spec.attachments_param'
                USING ERRCODE = '22023';
        END IF;
    ELSE
        IF (v_schema #>> ARRAY['properties', v_aparam, 'type']) IS DISTINCT FROM 'array' THEN
            RAISE EXCEPTION 'keyturn: spec.attachments_param % must be an array property of params_schema', keyturn._quoted(v_aparam)
                USING ERRCODE = '22023';
        END IF;
        IF jsonb_typeof(v_types) IS DISTINCT FROM 'array' OR jsonb_array_length(v_types) = 0
           OR EXISTS (SELECT 1 FROM jsonb_array_elements(v_types) t
                       WHERE jsonb_typeof(t) <> 'string'
                          OR (t #>> '{}') !~ '^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$') THEN
            RAISE EXCEPTION 'keyturn: spec.attachment_types must list the allowed content types, e.g. ["application/pdf"]'
                USING ERRCODE = '22023';
        END IF;
        IF p_spec ? 'max_attachment_bytes' THEN
            v_max := keyturn._spec_positive_int(p_spec -> 'max_attachment_bytes', 'spec.max_attachment_bytes',
                                                keyturn._max_file_bytes()::int);
        END IF;
    END IF;
    RETURN jsonb_build_object('provider', v_provider, 'params_schema', v_schema, 'targets_param', v_tparam,
                              'attachments_param', v_aparam, 'attachment_types', v_types,
                              'max_attachment_bytes', CASE WHEN v_aparam IS NOT NULL THEN v_max END);
END
$$;

-- {"max": N, "per": "<interval>"} → {"max": N, "per": interval text}, or NULL.
CREATE FUNCTION keyturn._spec_rate_limit(p_rate jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_rate IS NULL THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_rate) <> 'object' OR NOT (p_rate ?& ARRAY['max', 'per']) THEN
        RAISE EXCEPTION 'keyturn: spec.rate_limit must be {"max": N, "per": "<interval>"}'
            USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._spec_keys(p_rate, 'spec.rate_limit', ARRAY['max', 'per']);
    RETURN jsonb_build_object(
        'max', keyturn._spec_positive_int(p_rate -> 'max', 'spec.rate_limit.max', 1000000),
        'per', keyturn._spec_interval(p_rate -> 'per', 'spec.rate_limit.per', interval '366 days')::text);
END
$$;

-- IntervalStyle is pinned so the stored spec reads the same whatever the
-- caller's session settings.
CREATE FUNCTION keyturn.register_tool(name text, spec jsonb)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET IntervalStyle = 'postgres'
-- The column types it stores are format_type's, which quotes every name
-- under quote_all_identifiers ("jsonb"), and keyturn reads them back
-- (docs/security.md, row 126).
SET quote_all_identifiers = off
AS $$
DECLARE
    v_name      text := register_tool.name;
    k           text;
    v_kind      keyturn.tool_kind;
    v_exec      keyturn.tool_executor;
    v_ext       jsonb;
    v_sql       jsonb;
    v_summary   text;
    v_effect    keyturn.tool_effect;
    v_expires   interval := interval '15 minutes';
    v_retain    keyturn.tool_retain;
    v_approval  keyturn.tool_approval;
    v_max       int := 100;
    v_rate      jsonb;
    v_quorum    int := 1;
    v_delegable boolean := false;
    v_version   int;
    v_normal    jsonb;
    v_set       text[];
    v_where     text[];
    v_att_types text[];
    v_desc      text;
    v_proj      text;
    v_select    text[];
    v_other     text;
BEGIN
    PERFORM keyturn._refuse_nested('register_tool');
    IF keyturn._name_ok(v_name, 63) IS NOT TRUE THEN
        RAISE EXCEPTION 'keyturn: tool name % is not allowed', coalesce(keyturn._quoted(v_name), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'Use ASCII letters, digits, underscores and hyphens in dot-separated parts that each start with a letter, at most 63 characters.';
    END IF;
    IF spec IS NULL OR jsonb_typeof(spec) <> 'object' THEN
        RAISE EXCEPTION 'keyturn: spec must be a JSON object' USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._spec_keys(spec, 'spec',
        ARRAY['kind', 'executor', 'provider', 'params_schema', 'summary', 'effect', 'expires_in',
              'retain', 'approval', 'max_targets', 'targets_param', 'sql', 'rate_limit', 'quorum',
              'delegable', 'attachments_param', 'attachment_types', 'max_attachment_bytes',
              'description', 'projection']);

    -- The words each key takes are the labels of its column's type.
    v_kind     := keyturn._spec_choice(spec, 'kind', 'write', enum_range(NULL::keyturn.tool_kind)::text[]);
    v_exec     := keyturn._spec_choice(spec, 'executor', NULL, enum_range(NULL::keyturn.tool_executor)::text[]);
    v_effect   := keyturn._spec_choice(spec, 'effect', 'irreversible', enum_range(NULL::keyturn.tool_effect)::text[]);
    v_retain   := keyturn._spec_choice(spec, 'retain', 'full', enum_range(NULL::keyturn.tool_retain)::text[]);
    v_approval := keyturn._spec_choice(spec, 'approval', 'self', enum_range(NULL::keyturn.tool_approval)::text[]);
    IF spec ? 'quorum' THEN
        v_quorum := keyturn._spec_positive_int(spec -> 'quorum', 'spec.quorum', 5);
    END IF;
    IF v_quorum > 1 AND v_approval <> 'independent' THEN
        RAISE EXCEPTION 'keyturn: spec.quorum above 1 needs "approval": "independent"'
            USING ERRCODE = '22023',
                  HINT = 'Several people approve only what its proposer may not approve alone.';
    END IF;
    IF spec ? 'delegable' THEN
        IF jsonb_typeof(spec -> 'delegable') <> 'boolean' THEN
            RAISE EXCEPTION 'keyturn: spec.delegable must be true or false' USING ERRCODE = '22023';
        END IF;
        v_delegable := (spec ->> 'delegable')::boolean;
    END IF;
    v_summary  := coalesce(keyturn._spec_string(spec, 'summary'), v_name);
    PERFORM keyturn._check_template(v_summary);
    IF spec ? 'expires_in' THEN
        v_expires := keyturn._spec_interval(spec -> 'expires_in', 'spec.expires_in', interval '7 days');
    END IF;
    IF spec ? 'max_targets' THEN
        v_max := keyturn._spec_positive_int(spec -> 'max_targets', 'spec.max_targets', 10000);
    END IF;
    v_rate := keyturn._spec_rate_limit(spec -> 'rate_limit');
    -- What tools/list tells an agent over MCP (sql/063_mcp.sql); a read
    -- tool's data reaches the agent only through its projection.
    v_desc := keyturn._spec_string(spec, 'description');
    IF length(v_desc) > 2000 THEN
        RAISE EXCEPTION 'keyturn: spec.description is longer than 2000 characters' USING ERRCODE = '22023';
    END IF;
    v_proj := keyturn._spec_string(spec, 'projection');
    IF v_proj IS NOT NULL AND v_kind <> 'read' THEN
        RAISE EXCEPTION 'keyturn: spec.projection is only for read tools' USING ERRCODE = '22023';
    END IF;
    IF v_kind = 'read' AND v_exec IS NOT NULL AND v_proj IS NULL THEN
        RAISE EXCEPTION 'keyturn: read tool % needs spec.projection, the registered projection its data is fenced with', v_name
            USING ERRCODE = '22023',
                  HINT = 'keyturn.register_projection(provider, spec) registers one; an unreviewed integration contributes nothing.';
    END IF;
    IF v_proj IS NOT NULL AND NOT keyturn._name_ok(v_proj, 63) THEN
        RAISE EXCEPTION 'keyturn: spec.projection % is not a projection name', keyturn._quoted(v_proj) USING ERRCODE = '22023';
    END IF;

    IF v_kind = 'read' AND (v_approval <> 'self' OR v_quorum > 1 OR v_delegable) THEN
        RAISE EXCEPTION 'keyturn: a read tool takes no approval settings' USING ERRCODE = '22023';
    END IF;
    IF v_kind = 'write' AND v_exec IS NULL THEN
        RAISE EXCEPTION 'keyturn: write tool % needs spec.executor (sql or external)', v_name
            USING ERRCODE = '22023';
    END IF;
    IF v_exec IS DISTINCT FROM 'external' THEN
        FOREACH k IN ARRAY ARRAY['provider', 'params_schema', 'targets_param', 'attachments_param',
                                 'attachment_types', 'max_attachment_bytes'] LOOP
            IF spec ? k THEN
                RAISE EXCEPTION 'keyturn: spec.% is only for external tools', k USING ERRCODE = '22023';
            END IF;
        END LOOP;
        IF v_retain = 'digest' THEN
            RAISE EXCEPTION 'keyturn: retain = digest is only for external tools'
                USING ERRCODE = '22023',
                      HINT = 'sql tools keep their params: approve re-reads them to run the write.';
        END IF;
    END IF;
    IF v_exec IS DISTINCT FROM 'sql' AND spec ? 'sql' THEN
        RAISE EXCEPTION 'keyturn: spec.sql is only for sql tools' USING ERRCODE = '22023';
    END IF;
    IF v_exec = 'external' THEN
        v_ext := keyturn._spec_external(v_name, spec);
    ELSIF v_exec = 'sql' AND v_kind = 'read' THEN
        v_sql := keyturn._spec_sql_read(v_name, spec -> 'sql');
    ELSIF v_exec = 'sql' THEN
        v_sql := keyturn._spec_sql(v_name, spec -> 'sql');
    END IF;

    v_normal := jsonb_strip_nulls(jsonb_build_object(
        'kind', v_kind, 'executor', v_exec, 'provider', v_ext ->> 'provider',
        'params_schema', v_ext -> 'params_schema',
        'summary', v_summary, 'effect', v_effect, 'expires_in', v_expires::text,
        'retain', v_retain, 'approval', v_approval, 'max_targets', v_max,
        'targets_param', v_ext ->> 'targets_param', 'quorum', v_quorum, 'delegable', v_delegable,
        'attachments_param', v_ext ->> 'attachments_param', 'attachment_types', v_ext -> 'attachment_types',
        'max_attachment_bytes', v_ext -> 'max_attachment_bytes',
        'sql', CASE WHEN v_sql IS NOT NULL THEN jsonb_build_object(
                    'table', format('%I.%I', v_sql ->> 'schema', v_sql ->> 'table'),
                    'key', v_sql -> 'key', 'version', v_sql -> 'version',
                    'set', v_sql -> 'set', 'where', v_sql -> 'where',
                    'select', v_sql -> 'select', 'max_rows', v_sql -> 'max_rows') END,
        'rate_limit', v_rate, 'description', v_desc, 'projection', v_proj));

    -- Two registrations of one name take turns here for the next version.
    -- FOR NO KEY UPDATE, as the name never changes; approval decisions read
    -- this row without a lock (keyturn._invalid_reason), so a new version
    -- waits only for commits rechecking the old one, never for a
    -- transaction left open.
    SELECT t.version + 1 INTO v_version FROM keyturn.tool t WHERE t.name = v_name FOR NO KEY UPDATE;
    IF v_version IS NULL THEN
        v_version := 1;
        SELECT t.name INTO v_other FROM keyturn.tool t WHERE lower(t.name COLLATE "C") = lower(v_name COLLATE "C");
        IF FOUND THEN
            RAISE EXCEPTION 'keyturn: tool name % differs from the tool % only in case', keyturn._quoted(v_name), keyturn._quoted(v_other)
                USING ERRCODE = '22023',
                      HINT = 'A person reads both as one name: register under that name, or under one that differs in more than case.';
        END IF;
        INSERT INTO keyturn.tool (name, version) VALUES (v_name, v_version);
    ELSE
        UPDATE keyturn.tool t SET version = v_version, updated_at = now() WHERE t.name = v_name;
        -- Commits that rechecked the old version end first (docs/security.md, row 95).
        PERFORM keyturn._await_rechecks(v_name, NULL, NULL);
    END IF;

    -- The arrays first: Citus takes no subquery in INSERT ... VALUES (docs/scale-out.md, layout B, step 5).
    IF v_sql IS NOT NULL THEN
        v_set := ARRAY(SELECT jsonb_array_elements_text(v_sql -> 'set'));
        v_where := ARRAY(SELECT jsonb_array_elements_text(v_sql -> 'where'));
        IF v_kind = 'read' THEN
            v_set := NULL;
            v_select := ARRAY(SELECT jsonb_array_elements_text(v_sql -> 'select'));
        END IF;
    END IF;
    IF v_ext ->> 'attachments_param' IS NOT NULL THEN
        v_att_types := ARRAY(SELECT jsonb_array_elements_text(v_ext -> 'attachment_types'));
    END IF;
    INSERT INTO keyturn.tool_version (tool, version, spec, kind, executor, provider, params_schema,
                                      summary, effect, expires_in, retain, approval, quorum, delegable,
                                      max_targets, targets_param, sql_schema, sql_table, sql_key, sql_version,
                                      sql_set, sql_where, sql_types, rate_max, rate_per,
                                      attachments_param, attachment_types, max_attachment_bytes,
                                      description, projection, sql_select, max_rows)
    VALUES (v_name, v_version, v_normal, v_kind, v_exec, v_ext ->> 'provider', v_ext -> 'params_schema',
            v_summary, v_effect, v_expires, v_retain, v_approval, v_quorum, v_delegable, v_max,
            v_ext ->> 'targets_param', v_sql ->> 'schema', v_sql ->> 'table', v_sql ->> 'key',
            v_sql ->> 'version', v_set, v_where,
            v_sql -> 'types', (v_rate ->> 'max')::int, (v_rate ->> 'per')::interval,
            v_ext ->> 'attachments_param', v_att_types, (v_ext ->> 'max_attachment_bytes')::bigint,
            v_desc, v_proj, v_select, (v_sql ->> 'max_rows')::int);
    RETURN v_version;
END
$$;

-- The catalog a DBA audits, as pgTAP tests (the `dba` layer of tests/run-all).
-- Run in a fresh database with pgtap and pg_keyturn installed; every check
-- prints the offending objects when it fails.
BEGIN;
SELECT plan(26);

SELECT is_empty($$
    SELECT c.oid::regclass FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
     WHERE c.relnamespace = 'keyturn'::regnamespace AND c.relkind = 'r' AND a.attname = 'tenant'
       AND NOT (c.relrowsecurity AND c.relforcerowsecurity)$$,
    'every keyturn table with tenant rows has row-level security enabled and forced');

SELECT is_empty($$
    SELECT c.oid::regclass, a.grantee::regrole FROM pg_class c LEFT JOIN LATERAL aclexplode(c.relacl) a ON true
     WHERE c.oid = 'keyturn_secret.approval_key'::regclass
       AND (NOT (c.relrowsecurity AND c.relforcerowsecurity) OR a.grantee <> c.relowner)$$,
    'the approval key: row-level security forced, no grant to anyone');

SELECT is_empty($$
    SELECT n.nspname, a.grantee::regrole FROM pg_namespace n, aclexplode(n.nspacl) a
     WHERE n.nspname = 'keyturn_secret' AND a.grantee <> n.nspowner$$,
    'nobody but its owner may use schema keyturn_secret');

SELECT is_empty($$
    SELECT p.oid::regprocedure FROM pg_proc p
     WHERE p.pronamespace = 'keyturn'::regnamespace AND p.proname ~ '^_'
       AND has_function_privilege('public', p.oid, 'EXECUTE')$$,
    'PUBLIC executes no internal function');

SELECT is(ARRAY(SELECT p.proname::text COLLATE "C" FROM pg_proc p
                 WHERE p.pronamespace = 'keyturn'::regnamespace AND has_function_privilege('public', p.oid, 'EXECUTE')
                 ORDER BY 1),
          ARRAY['canonical_json', 'current_principal', 'current_session', 'current_tenant', 'params_hash'],
          'PUBLIC executes exactly the identity functions, canonical_json and params_hash');

SELECT is_empty($$
    SELECT p.oid::regprocedure FROM pg_proc p
     WHERE p.pronamespace = 'keyturn'::regnamespace AND p.prosecdef
       AND NOT coalesce(array_to_string(p.proconfig, ',') LIKE '%search_path=%', false)$$,
    'every SECURITY DEFINER function pins search_path');

-- A generic plan is kept for the backend's life, made from the statistics of
-- the moment: one made while a table was empty would scan it whole ever after
-- (sql/060_dispatch.sql, before keyturn.begin_dispatch).
SELECT is_empty($$
    SELECT p.oid::regprocedure FROM pg_proc p
     WHERE p.pronamespace = 'keyturn'::regnamespace
       AND 'plan_cache_mode=force_generic_plan' = ANY (p.proconfig)
       AND NOT 'enable_seqscan=off' = ANY (p.proconfig)$$,
    'every function planned once per backend turns sequential scans off');

-- Why, and why not their _for forms: sql/060_dispatch.sql, the note before
-- keyturn.begin_dispatch.
SELECT is_empty($$
    SELECT p.oid::regprocedure FROM pg_proc p
     WHERE p.pronamespace = 'keyturn'::regnamespace
       AND p.proname IN ('lease', 'begin_dispatch', 'begin_dispatch_many', 'complete', 'complete_many')
       AND NOT coalesce('plan_cache_mode=force_generic_plan' = ANY (p.proconfig), false)$$,
    'the dispatcher''s plain calls are planned once per backend');

-- (The two hot-path triggers are Rust, language c: they resolve no name
-- through the search_path, since every name in their statements is
-- schema-qualified, operators included; see extension/src/lifecycle.rs.)
SELECT is_empty($$
    SELECT DISTINCT t.tgfoid::regprocedure FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
     WHERE t.tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'keyturn'::regnamespace)
       AND NOT t.tgisinternal AND p.prolang <> (SELECT oid FROM pg_language WHERE lanname = 'c')
       AND NOT coalesce(array_to_string(p.proconfig, ',') LIKE '%search_path=%', false)$$,
    'every SQL or plpgsql trigger function on keyturn''s tables pins search_path');

SELECT set_eq($$
    SELECT DISTINCT t.tgfoid::regprocedure::text FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
     WHERE t.tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'keyturn'::regnamespace)
       AND NOT t.tgisinternal AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'c')$$,
    ARRAY['keyturn._action_lifecycle()', 'keyturn._guard_status()'],
    'the only C trigger functions are the two audited ones');

SELECT is_empty($$
    SELECT c.oid::regclass, a.grantee::regrole, a.privilege_type
      FROM pg_class c, aclexplode(c.relacl) a
     WHERE c.relnamespace IN ('keyturn'::regnamespace, 'keyturn_secret'::regnamespace)
       AND a.grantee <> c.relowner
       AND a.privilege_type IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'TRIGGER', 'REFERENCES')$$,
    'no role but the owner may write keyturn''s tables');

SELECT is_empty($$
    SELECT c.oid::regclass, a.grantee::regrole
      FROM pg_class c, aclexplode(c.relacl) a
     WHERE c.relnamespace = 'keyturn'::regnamespace AND a.privilege_type = 'SELECT'
       AND a.grantee IN ('keyturn_dispatcher'::regrole, 'keyturn_operator'::regrole, 'keyturn_admin'::regrole)$$,
    'the dispatcher, operator and admin roles read no table directly');

SELECT is_empty($$
    SELECT p.oid::regprocedure FROM pg_proc p
     WHERE p.pronamespace = 'keyturn'::regnamespace AND p.proname !~ '^_'
       AND obj_description(p.oid, 'pg_proc') IS NULL$$,
    'every public function has a comment');

SELECT is_empty($$
    SELECT c.oid::regclass FROM pg_class c
     WHERE c.relnamespace IN ('keyturn'::regnamespace, 'keyturn_secret'::regnamespace)
       AND c.relkind = 'r' AND obj_description(c.oid, 'pg_class') IS NULL$$,
    'every table has a comment');

SELECT is_empty($$
    SELECT r.rolname FROM pg_roles r
     WHERE r.rolname IN ('keyturn_agent', 'keyturn_approver', 'keyturn_dispatcher', 'keyturn_operator', 'keyturn_admin')
       AND shobj_description(r.oid, 'pg_authid') IS NULL$$,
    'every keyturn role has a comment');

SELECT is_empty($$
    SELECT c.oid::regclass FROM pg_class c
     WHERE c.relnamespace IN ('keyturn'::regnamespace, 'keyturn_secret'::regnamespace)
       AND c.relkind IN ('r', 'S') AND c.relname <> 'transition'
       AND NOT c.oid = ANY ((SELECT extconfig FROM pg_extension WHERE extname = 'pg_keyturn')::oid[])$$,
    'every table but the install''s own transition graph is dumped with the data');

-- Shard-ready keys (docs/scale-out.md, layout B): Citus distributes a table
-- by tenant only if each of its unique keys holds the tenant, and takes a
-- foreign key between two such tables only on it.
SELECT is_empty($$
    SELECT c.conrelid::regclass, c.conname
      FROM pg_constraint c
      JOIN pg_attribute t ON t.attrelid = c.conrelid AND t.attname = 'tenant' AND NOT t.attisdropped
     WHERE c.connamespace = 'keyturn'::regnamespace AND c.contype IN ('p', 'u', 'f')
       AND ((c.contype IN ('p', 'u') AND NOT t.attnum = ANY (c.conkey))
            -- a foreign key to a global table (a reference table on Citus) needs none
            OR (c.contype = 'f' AND EXISTS (
                    SELECT 1 FROM pg_attribute r
                     WHERE r.attrelid = c.confrelid AND r.attname = 'tenant' AND NOT r.attisdropped
                       AND NOT (t.attnum = ANY (c.conkey)
                                AND c.confkey[array_position(c.conkey, t.attnum)] = r.attnum))))
    UNION ALL
    SELECT i.indrelid::regclass, i.indexrelid::regclass::name
      FROM pg_index i
      JOIN pg_class k ON k.oid = i.indrelid AND k.relnamespace = 'keyturn'::regnamespace
      JOIN pg_attribute t ON t.attrelid = i.indrelid AND t.attname = 'tenant' AND NOT t.attisdropped
     WHERE i.indisunique AND NOT t.attnum = ANY (i.indkey::int2[])$$,
    'every primary, unique and foreign key of a table with tenant rows holds the tenant');

-- The two checks below read keyturn's SQL statement by statement: a
-- statement is what lies between two semicolons of a function's source (so
-- a comment that explains one comes before its semicolon, and holds none).
CREATE FUNCTION pg_temp.statements() RETURNS TABLE (fn text, stmt text) LANGUAGE sql AS $f$
    SELECT f.oid::regprocedure::text, s
      FROM pg_proc f
      JOIN pg_language l ON l.oid = f.prolang
     CROSS JOIN regexp_split_to_table(f.prosrc, ';') s
     WHERE f.pronamespace = 'keyturn'::regnamespace AND l.lanname IN ('sql', 'plpgsql')
$f$;
-- The functions of pg_catalog and keyturn a piece of SQL calls whose
-- volatility is not in p_allowed.
CREATE FUNCTION pg_temp.calls_beyond(p_sql text, p_allowed "char"[]) RETURNS SETOF text LANGUAGE sql AS $f$
    SELECT DISTINCT lower(m[1]) FROM regexp_matches(p_sql, '([a-z_][a-z0-9_.]*)\s*\(', 'gi') m
     WHERE EXISTS (SELECT 1 FROM pg_proc v
                    WHERE NOT v.provolatile = ANY (p_allowed)
                      AND v.pronamespace IN ('pg_catalog'::regnamespace, 'keyturn'::regnamespace)
                      AND (v.proname = lower(m[1]) OR v.pronamespace::regnamespace::text || '.' || v.proname = lower(m[1])))
$f$;

-- Every statement of keyturn's SQL that finds rows of a table with tenant
-- rows by id names the tenant too (docs/scale-out.md, layout B, step 4), or
-- says why it cannot: "by id alone" in the statement (the dispatcher's and
-- the operators' calls, which name no tenant). A table's alias is the word
-- after its name.
CREATE FUNCTION pg_temp.by_id_without_tenant() RETURNS SETOF text LANGUAGE plpgsql AS $f$
DECLARE
    p      record;
    alias  text;
    tables text := (SELECT string_agg(c.relname, '|') FROM pg_class c
                     JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant'
                     WHERE c.relnamespace = 'keyturn'::regnamespace AND c.relkind = 'r');
BEGIN
    FOR p IN SELECT * FROM pg_temp.statements() s WHERE s.stmt !~* 'by id alone' LOOP
        FOR alias IN SELECT DISTINCT m[2] FROM regexp_matches(p.stmt,
                '\mkeyturn\.(' || tables || ')\M\s+(?:AS\s+)?([a-z_][a-z0-9_]*)', 'g') m LOOP
            CONTINUE WHEN alias IN ('on', 'where', 'set', 'join', 'left', 'using', 'as');
            IF (p.stmt ~ ('\m' || alias || '\.(id|action_id)\M\s*(=|IN\M|OPERATOR)')
                OR p.stmt ~ ('(=|OPERATOR\(pg_catalog\.=\))\s*' || alias || '\.(id|action_id)\M')
                OR p.stmt ~ ('\(\s*' || alias || '\.(id|action_id)\s*,'))
               AND p.stmt !~ ('\m' || alias || '\.tenant\M') THEN
                RETURN NEXT p.fn || ': ' || alias || ' in ' || regexp_replace(btrim(p.stmt), '\s+', ' ', 'g');
            END IF;
        END LOOP;
    END LOOP;
END
$f$;
SELECT is_empty('SELECT * FROM pg_temp.by_id_without_tenant()',
    'every statement that finds tenant rows by id names the tenant, or says why it cannot');

-- No statement of keyturn's SQL that writes keyturn's tables with UPDATE,
-- DELETE or an upsert calls a volatile function, no upsert's DO UPDATE calls
-- one that is not immutable, and no INSERT holds a subquery in VALUES: Citus
-- refuses each on distributed tables, so every such value is computed first
-- (docs/scale-out.md, layout B, step 5).
SELECT is_empty($$
    WITH s AS (SELECT fn, regexp_replace(stmt, '--[^\n]*', '', 'g') AS stmt FROM pg_temp.statements())
    SELECT s.fn, c, s.stmt FROM s, pg_temp.calls_beyond(s.stmt, '{i,s}') c
     WHERE s.stmt ~* '\m(UPDATE|DELETE\s+FROM)\s+keyturn\.' OR s.stmt ~* '\mINSERT\s+INTO\s+keyturn\..*\mDO\s+UPDATE'
    UNION ALL
    SELECT s.fn, c || ' in DO UPDATE', s.stmt
      FROM s, pg_temp.calls_beyond(substring(s.stmt FROM '(?i)\mDO\s+UPDATE\M.*$'), '{i}') c
    UNION ALL
    SELECT s.fn, 'a subquery in INSERT ... VALUES', s.stmt FROM s
     WHERE s.stmt ~* '\mINSERT\s+INTO\s+keyturn\.[^;]*\mVALUES\s*\(.*\mSELECT\M'$$,
    'no UPDATE, DELETE or upsert of keyturn''s tables calls a volatile function (an upsert''s DO UPDATE none but immutable ones), and no INSERT holds a subquery in VALUES');

-- What Citus refuses inside a call it runs on a tenant's worker (layout B,
-- docs/scale-out.md, "What a delegated call may not do"), for every
-- statement of the functions the tenant-explicit calls (the *_for
-- functions citus_distribute delegates) reach, read off their sources: a
-- function is reached when a reached function's source names it. The gate's
-- _for calls are Rust, whose statements name the SQL function each runs:
-- _propose, _preview, _approve, _reject, _approve_many and _revise.
CREATE FUNCTION pg_temp.reached_by_for() RETURNS TABLE (fn oid) LANGUAGE sql AS $f$
    WITH RECURSIVE r (fn) AS (
        SELECT f.oid FROM pg_proc f
         WHERE f.pronamespace = 'keyturn'::regnamespace
           AND (f.proname ~ '^[a-z].*_for$'
                OR f.proname IN ('_propose', '_preview', '_approve', '_reject', '_approve_many', '_revise'))
        UNION
        SELECT g.oid FROM r JOIN pg_proc f ON f.oid = r.fn
          JOIN pg_proc g ON g.pronamespace = 'keyturn'::regnamespace
                        AND f.prosrc ~ ('\mkeyturn\.' || g.proname || '\s*\(')
    )
    SELECT fn FROM r
$f$;
CREATE FUNCTION pg_temp.citus_refusals() RETURNS TABLE (fn text, problem text, stmt text) LANGUAGE sql AS $f$
    WITH tenant_tables AS (
        SELECT string_agg(c.relname, '|') AS re FROM pg_class c
          JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant' AND NOT a.attisdropped
         WHERE c.relnamespace = 'keyturn'::regnamespace AND c.relkind = 'r'),
    global_tables AS (
        SELECT string_agg(c.relname, '|') AS re FROM pg_class c
         WHERE c.relnamespace IN ('keyturn'::regnamespace, 'keyturn_secret'::regnamespace) AND c.relkind = 'r'
           AND NOT EXISTS (SELECT 1 FROM pg_attribute a
                            WHERE a.attrelid = c.oid AND a.attname = 'tenant' AND NOT a.attisdropped)),
    s AS (
        SELECT f.oid::regprocedure::text AS fn, f.proconfig, l.lanname,
               regexp_replace(x, '--[^\n]*', '', 'g') AS stmt
          FROM pg_temp.reached_by_for() r
          JOIN pg_proc f ON f.oid = r.fn
          JOIN pg_language l ON l.oid = f.prolang
         CROSS JOIN regexp_split_to_table(f.prosrc, ';') x
         WHERE l.lanname IN ('sql', 'plpgsql'))
    -- A generic plan keeps "p_tenant IS NULL OR x.tenant = p_tenant" from
    -- folding to the tenant Citus must see.
    SELECT DISTINCT s.fn, 'forces a generic plan', '' FROM s
     WHERE s.stmt ~ 'p_tenant IS NULL OR' AND 'plan_cache_mode=force_generic_plan' = ANY (s.proconfig)
    UNION ALL
    -- A tenant table and a table without a tenant (a reference table) in one
    -- statement: Citus cannot pin it to the call's tenant.
    SELECT s.fn, 'joins a table without a tenant', s.stmt FROM s, tenant_tables t, global_tables g
     WHERE s.stmt ~* ('\mkeyturn(_secret)?\.(' || g.re || ')\M') AND s.stmt ~* ('\mkeyturn\.(' || t.re || ')\M')
    UNION ALL
    -- A CASE or COALESCE in an UPDATE whose statement calls a function that is
    -- not immutable: refused on a distributed table.
    SELECT s.fn, c || ' in an UPDATE with CASE or COALESCE', s.stmt FROM s, pg_temp.calls_beyond(
               substring(s.stmt FROM '(?i)\mSET\M.*$'), '{i}') c
     WHERE s.stmt ~* '\mUPDATE\s+keyturn\.' AND s.stmt ~* '\m(CASE|coalesce)\M'
    UNION ALL
    -- A whole row of a tenant table read in a query: on a shard it is of the
    -- shard's row type, which keyturn's functions do not take.
    SELECT s.fn, 'a whole row of a shard', s.stmt FROM s
     WHERE s.stmt ~* '\mSELECT\s+([a-z_]+)\s+AS\s+[a-z_]+\s+FROM\s+keyturn\.[a-z_]+\s+\1\M'
    UNION ALL
    -- A parameter of an SQL function's statement on tenant tables, which
    -- Citus cannot plan.
    SELECT s.fn, 'an SQL function''s parameter', s.stmt FROM s, tenant_tables t
     WHERE s.lanname = 'sql' AND s.stmt ~* ('\mkeyturn\.(' || t.re || ')\M')
$f$;
SELECT is_empty('SELECT * FROM pg_temp.citus_refusals()',
    'nothing a tenant-explicit call reaches does what Citus refuses on a tenant''s worker');

-- A scalar SQL function PostgreSQL cannot inline is parsed and planned again
-- in every transaction that calls it (its cache lives in the calling
-- expression); one declared IMMUTABLE over a STABLE body such as format() is
-- not inlined. Each is called with column references, never constants,
-- which the planner would fold instead. The one listed cannot be inlined,
-- and is on no hot path: _legal_transition is a sub-select (a DBA's
-- helper). (_citus_present was the other, until approve and begin_dispatch
-- asked it once per action: it is Rust now.)
CREATE FUNCTION pg_temp.not_inlined() RETURNS SETOF text LANGUAGE plpgsql AS $f$
DECLARE
    p    record;
    line text;
    plan text;
BEGIN
    FOR p IN SELECT f.oid, f.proname, f.proargtypes::oid[] AS types
               FROM pg_proc f JOIN pg_language l ON l.oid = f.prolang
              WHERE f.pronamespace = 'keyturn'::regnamespace AND l.lanname = 'sql' AND f.prokind = 'f'
                AND NOT f.proretset AND NOT f.prosecdef AND f.proconfig IS NULL LOOP
        plan := '';
        FOR line IN EXECUTE format('EXPLAIN (VERBOSE, COSTS OFF) SELECT %s(%s) FROM (SELECT %s OFFSET 0) s',
                p.oid::regproc,
                (SELECT string_agg(format('s.a%s', i), ', ') FROM generate_subscripts(p.types, 1) i),
                coalesce((SELECT string_agg(format('NULL::%s AS a%s', format_type(p.types[i], NULL), i), ', ')
                            FROM generate_subscripts(p.types, 1) i), '1')) LOOP
            plan := plan || line;
        END LOOP;
        IF position(p.proname || '(' IN plan) > 0 THEN
            RETURN NEXT p.oid::regprocedure::text;
        END IF;
    END LOOP;
END
$f$;
SELECT set_eq('SELECT * FROM pg_temp.not_inlined()',
    ARRAY['keyturn._legal_transition(keyturn.status,keyturn.status)'],
    'every scalar SQL function is inlined but the one that cannot be');

SELECT is_empty($$SELECT object, problem FROM keyturn.check_deployment() WHERE severity = 'error'$$,
    'a fresh install passes keyturn.check_deployment()');

-- The predefined roles reach keyturn's tables around every grant: their
-- members are errors (the roles are dropped with the rollback).
CREATE ROLE kt_dba_reader IN ROLE pg_read_all_data;
CREATE ROLE kt_dba_writer IN ROLE pg_write_all_data;
SELECT ok(EXISTS (SELECT 1 FROM keyturn.check_deployment()
                   WHERE severity = 'error' AND object = 'keyturn_secret.approval_key'
                     AND problem LIKE 'role kt_dba_reader %'),
          'a member of pg_read_all_data is reported: it may read the approval key');
SELECT ok(EXISTS (SELECT 1 FROM keyturn.check_deployment()
                   WHERE severity = 'error' AND object = 'kt_dba_writer'),
          'a member of pg_write_all_data is reported: it may write keyturn''s tables');

-- A claim path the user may edit is an error (set for this transaction only).
SET LOCAL keyturn.claim_tenant = 'user_metadata.tenant_id';
SELECT ok(EXISTS (SELECT 1 FROM keyturn.check_deployment()
                   WHERE severity = 'error' AND object = 'setting keyturn.claim_tenant'),
          'a claim path into user_metadata is reported');

-- The signatures the documentation names exist as such, beside their
-- overloads, so a DBA's GRANT or has_function_privilege naming them works.
SELECT is_empty($$
    SELECT s FROM unnest(ARRAY['keyturn.preview(uuid,text)', 'keyturn.preview(uuid,text,jsonb)',
                               'keyturn.lease(text,int,interval)', 'keyturn.lease(text,int,interval,text[])',
                               'keyturn.record_evidence(text,text,text)']) s
     WHERE to_regprocedure(s) IS NULL$$,
    'the documented signatures of preview, lease and record_evidence exist');

SELECT * FROM finish();
ROLLBACK;

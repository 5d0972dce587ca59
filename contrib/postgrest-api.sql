-- keyturn_api: the schema to expose to PostgREST (or Supabase's Data API)
-- instead of keyturn itself. Not part of the extension; run it as a superuser
-- (or the extension's owner) after CREATE EXTENSION pg_keyturn and again
-- after every upgrade of it (docs/supabase.md):
--
--   psql -v ON_ERROR_STOP=1 -f contrib/postgrest-api.sql
--
-- Exposing schema keyturn would also expose its tables (agents and approvers
-- may SELECT them, under row-level security) and every function a role may
-- execute. keyturn_api holds one wrapper per call an agent or a person makes
-- and nothing else: no tables, no dispatcher, operator or platform-admin
-- calls, no internal helpers.
--
-- Each wrapper is SECURITY INVOKER and only calls the keyturn function of the
-- same name with the same arguments: the caller stays current_user, so every
-- rule keyturn applies (identity, separation of duties, grants, row-level
-- security) applies unchanged, and the wrapper adds no privilege. Each gets
-- exactly the EXECUTE grants of the function it wraps, its volatility (so
-- PostgREST allows GET for the read-only ones) and its comment (PostgREST's
-- OpenAPI description). The schema is this script's: it is dropped and made
-- again on every run, so keep nothing else in it.

BEGIN;

DROP SCHEMA IF EXISTS keyturn_api CASCADE;
CREATE SCHEMA keyturn_api;
COMMENT ON SCHEMA keyturn_api IS
    'keyturn''s agent and human calls for PostgREST: SECURITY INVOKER wrappers made by contrib/postgrest-api.sql; do not add objects here.';
REVOKE ALL ON SCHEMA keyturn_api FROM PUBLIC;
GRANT USAGE ON SCHEMA keyturn_api TO keyturn_agent, keyturn_approver;

DO $wrap$
DECLARE
    -- The calls of keyturn_agent and keyturn_approver (docs/sql-api.md,
    -- "Roles"), and the identity functions.
    v_calls CONSTANT text[] := ARRAY[
        'current_tenant', 'current_principal', 'current_session',
        'propose',
        'action_status', 'audit', 'end_session', 'cancel_origin', 'archive_conversation',
        'stage_file', 'fence',
        'approve', 'preview', 'reject', 'approve_many', 'revise', 'pending',
        'delegate', 'revoke_delegation', 'delegations', 'record_request',
        'add_member', 'remove_member', 'grant_tool', 'revoke_tool'];
    f record;
    g record;
    v_args text;
    v_call text;
    v_sig text;
    v_made int := 0;
BEGIN
    FOR f IN
        SELECT p.oid, p.proname, p.pronargs, p.proretset, p.provolatile, p.prorettype,
               pg_catalog.pg_get_function_arguments(p.oid) AS args,
               pg_catalog.pg_get_function_identity_arguments(p.oid) AS ident,
               pg_catalog.pg_get_function_result(p.oid) AS result,
               pg_catalog.obj_description(p.oid, 'pg_proc') AS comment
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'keyturn'::regnamespace
           AND p.proname = ANY (v_calls)
         ORDER BY p.proname, p.oid
    LOOP
        SELECT pg_catalog.string_agg('$' || i, ', ' ORDER BY i) INTO v_args
          FROM pg_catalog.generate_series(1, f.pronargs) AS i;
        v_call := pg_catalog.format('keyturn.%I(%s)', f.proname, coalesce(v_args, ''));
        -- A set or a row comes back as rows; a scalar (or void) as itself.
        IF f.proretset OR f.prorettype = 'pg_catalog.record'::regtype THEN
            v_call := 'SELECT * FROM ' || v_call;
        ELSE
            v_call := 'SELECT ' || v_call;
        END IF;
        EXECUTE pg_catalog.format(
            'CREATE FUNCTION keyturn_api.%I(%s) RETURNS %s LANGUAGE sql %s SECURITY INVOKER '
            'SET search_path = pg_catalog, pg_temp AS %L',
            f.proname, f.args, f.result,
            CASE f.provolatile WHEN 'i' THEN 'IMMUTABLE' WHEN 's' THEN 'STABLE' ELSE 'VOLATILE' END,
            v_call);
        v_sig := pg_catalog.format('keyturn_api.%I(%s)', f.proname, f.ident);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_sig);
        FOR g IN
            SELECT a.grantee
              FROM pg_catalog.pg_proc p, LATERAL pg_catalog.aclexplode(p.proacl) a
             WHERE p.oid = f.oid AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
        LOOP
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', v_sig,
                CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(g.grantee::regrole::text) END);
        END LOOP;
        EXECUTE pg_catalog.format('COMMENT ON FUNCTION %s IS %L', v_sig,
            coalesce(f.comment || ' ', '') || '(Calls keyturn.' || f.proname || ' as the caller.)');
        v_made := v_made + 1;
    END LOOP;
    -- A call missing from this keyturn means the list above is out of date:
    -- fail rather than expose less than the documentation promises.
    IF (SELECT pg_catalog.count(DISTINCT proname) FROM pg_catalog.pg_proc
         WHERE pronamespace = 'keyturn_api'::regnamespace) <> pg_catalog.cardinality(v_calls) THEN
        RAISE EXCEPTION 'keyturn_api: % of % calls found in schema keyturn', v_made, pg_catalog.cardinality(v_calls)
            USING ERRCODE = '55000',
                  HINT = 'Install pg_keyturn (CREATE EXTENSION pg_keyturn) in this database, or run the contrib/postgrest-api.sql of its release.';
    END IF;
END
$wrap$;

COMMIT;

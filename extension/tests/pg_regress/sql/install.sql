-- What a DBA audits after CREATE EXTENSION pg_keyturn.
BEGIN;
-- Every table that holds tenant rows has row-level security enabled and forced.
SELECT c.relname, c.relrowsecurity AS rls, c.relforcerowsecurity AS forced
  FROM pg_class c
 WHERE c.relnamespace = 'keyturn'::regnamespace AND c.relkind = 'r'
 ORDER BY c.relname;
-- Every SECURITY DEFINER function pins search_path (expect no rows).
SELECT p.proname FROM pg_proc p
 WHERE p.pronamespace = 'keyturn'::regnamespace AND p.prosecdef
   AND NOT coalesce(array_to_string(p.proconfig, ',') LIKE '%search_path=%', false);
-- PUBLIC may execute exactly these.
SELECT p.proname FROM pg_proc p
 WHERE p.pronamespace = 'keyturn'::regnamespace
   AND has_function_privilege('public', p.oid, 'EXECUTE')
 ORDER BY 1;
-- PUBLIC holds no table privilege.
SELECT count(*) AS public_table_grants FROM information_schema.role_table_grants
 WHERE table_schema = 'keyturn' AND grantee = 'PUBLIC';
-- Group roles: who may execute the state-changing calls.
SELECT p.proname,
       string_agg(DISTINCT r.rolname, ',' ORDER BY r.rolname) AS roles
  FROM pg_proc p
  CROSS JOIN pg_roles r
 WHERE p.pronamespace = 'keyturn'::regnamespace
   AND p.proname IN ('propose', 'approve', 'preview', 'reject', 'end_session', 'cancel_origin',
                     'action_status', 'audit', 'lease', 'begin_dispatch', 'complete', 'sweep',
                     'reconcile', 'uncertain_actions', 'register_tool', 'set_tool_enabled',
                     'add_member', 'remove_member', 'grant_tool', 'revoke_tool', 'classify')
   AND r.rolname LIKE 'keyturn\_%'
   AND has_function_privilege(r.oid, p.oid, 'EXECUTE')
 GROUP BY p.proname
 ORDER BY p.proname;
ROLLBACK;
-- pg_dump keeps the tenants' data: every table (and the event sequence) is a
-- configuration relation of the extension.
SELECT c::regclass AS dumped FROM pg_extension e, unnest(e.extconfig) AS c
 WHERE e.extname = 'pg_keyturn' ORDER BY c::regclass::text;

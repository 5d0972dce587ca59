-- Layout B, a NULL tenant: every tenant-explicit call is registered with
-- Citus (b_distribute), whose planner hashes the tenant argument to pick the
-- worker. Given a NULL, Citus 13.2 hashes a NULL datum as text and the
-- backend dies with signal 11: the postmaster then restarts every
-- connection of the node. Any role that may make one _for call could take
-- the coordinator down with one statement. pg_keyturn, preloaded after
-- citus, refuses such a call in its planner hook first (a NULL constant, a
-- parameter bound to NULL, any expression of them the planner folds to
-- NULL), with the error the call itself gives a missing tenant (22023), and
-- nothing restarts
-- (extension/src/route_guard.rs). Seen crashing before the hook: the
-- prepared approve_for below, with the tenant bound to NULL, as keyturnd's
-- /rpc once sent it for a JWT without a tenant claim.

\connect - postgres
\set ON_ERROR_STOP on
SELECT pg_postmaster_start_time() AS started \gset
SELECT citus_check.expect('pg_keyturn is preloaded on the coordinator', keyturn._preloaded()::text, 'true');
SELECT citus_check.expect('check_deployment has nothing to say about it',
    (SELECT count(*)::text FROM keyturn.check_deployment() WHERE object = 'setting shared_preload_libraries'), '0');
\set as_alice 'SET LOCAL citus.propagate_set_commands = ''local''; SET LOCAL keyturn.tenant = ''acme''; SET LOCAL keyturn.principal = ''alice''; SET LOCAL keyturn.session = ''s-null'';'

\set ON_ERROR_STOP off
\connect - app_agent
BEGIN;
:as_alice
\set LAST_ERROR_SQLSTATE ''
SELECT * FROM keyturn.propose_for(NULL, 'deal_stage_routed',
  '{"where": {"tenant": "acme", "id": 101}, "set": {"stage": "won"}}', '{}');
ROLLBACK;
\connect - postgres
SELECT citus_check.expect('propose_for with a NULL tenant: 22023', :'LAST_ERROR_SQLSTATE', '22023');

\connect - app_human
BEGIN;
:as_alice
\set LAST_ERROR_SQLSTATE ''
SELECT * FROM keyturn.approve_for(NULL, '01a23592-d356-76c7-b1c1-a1f1b7da6f8e', 'x');
ROLLBACK;
\connect - postgres
SELECT citus_check.expect('approve_for with a NULL tenant: 22023', :'LAST_ERROR_SQLSTATE', '22023');

-- An expression the planner folds to NULL, which is what Citus then hashes.
\connect - app_human
BEGIN;
:as_alice
\set LAST_ERROR_SQLSTATE ''
SELECT * FROM keyturn.approve_for(NULLIF('acme', 'acme'), '01a23592-d356-76c7-b1c1-a1f1b7da6f8e', 'x');
ROLLBACK;
\connect - postgres
SELECT citus_check.expect('approve_for with a tenant that folds to NULL: 22023', :'LAST_ERROR_SQLSTATE', '22023');

\connect - app_human
BEGIN;
:as_alice
\set LAST_ERROR_SQLSTATE ''
SELECT keyturn.preview_for(NULL, '01a23592-d356-76c7-b1c1-a1f1b7da6f8e', 'x');
ROLLBACK;
\connect - postgres
SELECT citus_check.expect('preview_for (a scalar call) with a NULL tenant: 22023', :'LAST_ERROR_SQLSTATE', '22023');

-- The statement keyturnd's /rpc sends, the tenant a bound parameter.
\connect - app_human
BEGIN;
:as_alice
PREPARE by_tenant(jsonb, text) AS
  SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.to_jsonb(r.*)), '[]'::pg_catalog.jsonb)
    FROM keyturn."approve_for"("tenant" => $2::pg_catalog.text, "action_id" => ($1 ->> 'action_id')::uuid,
                               "token" => ($1 ->> 'token')::text) AS r;
\set LAST_ERROR_SQLSTATE ''
EXECUTE by_tenant('{"action_id": "01a23592-d356-76c7-b1c1-a1f1b7da6f8e", "token": "x"}', NULL);
ROLLBACK;
\connect - postgres
SELECT citus_check.expect('approve_for with the tenant bound to NULL: 22023', :'LAST_ERROR_SQLSTATE', '22023');

\connect - app_human
BEGIN;
:as_alice
PREPARE by_lower(text) AS
  SELECT * FROM keyturn.approve_for(lower($1), '01a23592-d356-76c7-b1c1-a1f1b7da6f8e', 'x');
\set LAST_ERROR_SQLSTATE ''
EXECUTE by_lower(NULL);
ROLLBACK;
\connect - postgres
SELECT citus_check.expect('approve_for with the tenant an expression of a parameter bound to NULL: 22023',
    :'LAST_ERROR_SQLSTATE', '22023');

\connect - app_dispatcher
BEGIN;
\set LAST_ERROR_SQLSTATE ''
SELECT * FROM keyturn.lease_for(NULL, 'w-null', 1, '30 seconds', NULL);
ROLLBACK;
\connect - postgres
SELECT citus_check.expect('lease_for with a NULL tenant: 22023', :'LAST_ERROR_SQLSTATE', '22023');

\set ON_ERROR_STOP on
SELECT citus_check.expect('the coordinator never restarted', (pg_postmaster_start_time() = :'started')::text, 'true');

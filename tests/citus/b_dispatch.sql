-- Layout B, the dispatcher's side (docs/scale-out.md): after b_distribute,
-- with keyturn's tables distributed by tenant, external actions go through
-- the dispatcher protocol tenant by tenant, each call delegated to the
-- tenant's worker: tenants_due, lease_for, begin_dispatch_many_for,
-- complete_many_for, sweep_for, reconcile_for. The plain calls are refused.
-- Each call commits on one worker in one phase.

\connect - postgres
\set ON_ERROR_STOP on
\set as_alice 'SET LOCAL citus.propagate_set_commands = ''local''; SET LOCAL keyturn.tenant = ''acme''; SET LOCAL keyturn.principal = ''alice''; SET LOCAL keyturn.session = ''s1'';'
\set as_gina 'SET LOCAL citus.propagate_set_commands = ''local''; SET LOCAL keyturn.tenant = ''globex''; SET LOCAL keyturn.principal = ''gina''; SET LOCAL keyturn.session = ''s1'';'

-- Two approved notifications of acme's, one of globex's: queued, each
-- approval delegated to its tenant's worker.
\connect - app_agent
BEGIN;
:as_alice
SELECT action_id AS n1, token AS n1_token FROM keyturn.propose_for('acme', 'notify',
  '{"channel": "ops", "text": "one"}', '{"conversation_id": "c-d", "turn_id": "t-1"}') \gset
SELECT action_id AS n2, token AS n2_token FROM keyturn.propose_for('acme', 'notify',
  '{"channel": "ops", "text": "two"}', '{"conversation_id": "c-d", "turn_id": "t-2"}') \gset
COMMIT;
BEGIN;
:as_gina
SELECT action_id AS g1, token AS g1_token FROM keyturn.propose_for('globex', 'notify',
  '{"channel": "ops", "text": "globex"}', '{}') \gset
COMMIT;
\connect - app_human
BEGIN;
:as_alice
-- Each its own statement: Citus delegates only a call that is the whole
-- statement (SELECT f(…), or SELECT … FROM f(…)).
SELECT status AS a1 FROM keyturn.approve_for('acme', :'n1', :'n1_token') \gset
SELECT status AS a2 FROM keyturn.approve_for('acme', :'n2', :'n2_token') \gset
COMMIT;
BEGIN;
:as_gina
SELECT status AS g_approved FROM keyturn.approve_for('globex', :'g1', :'g1_token') \gset
COMMIT;
SELECT citus_check.expect('external approvals, delegated: queued', :'a1' || ' ' || :'a2' || ' ' || :'g_approved', 'queued queued queued');

\connect - postgres
SELECT count(*) AS before_2pc FROM pg_dist_transaction \gset

-- The plain lease scans every shard FOR UPDATE, which Citus refuses.
\connect - app_dispatcher
\set ON_ERROR_STOP off
\set LAST_ERROR_SQLSTATE ''
SELECT count(*) FROM keyturn.lease('w-plain', 8);
\set ON_ERROR_STOP on
SELECT citus_check.expect('the plain lease on distributed keyturn: refused', (:'LAST_ERROR_SQLSTATE' <> '')::text, 'true');
\echo 'plain lease refused with' :LAST_ERROR_SQLSTATE

-- (acme may have more due: layout A's tests left one queued before the
-- tables were distributed, and it was copied with them.)
SELECT string_agg(format('%s:%s:%s', tenant, to_lease >= 2, to_sweep), ' ' ORDER BY tenant) AS due
  FROM keyturn.tenants_due('{webhook}') WHERE tenant IN ('acme', 'globex') \gset
SELECT citus_check.expect('tenants_due: who has jobs due', :'due', 'acme:t:0 globex:f:0');
SELECT citus_check.expect('tenants_due: none for a provider without tools',
    (SELECT count(*)::text FROM keyturn.tenants_due('{smtp}') WHERE to_lease > 0), '0');

-- acme's step: lease_for, then begin, in one transaction on acme's worker.
-- globex's queued action named in acme's batch is refused there (55000),
-- and left as it was. (Arguments are constants: Citus delegates no call
-- with a volatile argument, such as gen_random_uuid().)
BEGIN;
SELECT string_agg(action_id::text, ' ' ORDER BY action_id) FILTER (WHERE action_id IN (:'n1', :'n2')) AS leased,
       min(tenant) || max(tenant) AS leased_tenants,
       string_agg(provider, ' ') FILTER (WHERE action_id IN (:'n1', :'n2')) AS providers,
       array_agg(lease_id ORDER BY action_id) FILTER (WHERE action_id IN (:'n1', :'n2')) AS leases
  FROM keyturn.lease_for('acme', 'w-b', 8, '30 seconds', '{webhook}') \gset
SELECT string_agg(coalesce(split_part(error, ' ', 1), dispatch::text), ' ' ORDER BY ord) AS begun
  FROM keyturn.begin_dispatch_many_for('acme',
         ARRAY[split_part(:'leased', ' ', 1), :'g1', split_part(:'leased', ' ', 2)]::uuid[],
         ARRAY[(:'leases'::uuid[])[1], '00000000-0000-0000-0000-000000000000', (:'leases'::uuid[])[2]])
       WITH ORDINALITY AS b (action_id, dispatch, error, ord) \gset
COMMIT;
SELECT citus_check.expect('lease_for: acme''s two jobs, acme''s only',
    :'leased' || ' ' || :'leased_tenants' || ' ' || :'providers',
    (SELECT string_agg(x::text, ' ' ORDER BY x) FROM unnest(ARRAY[:'n1', :'n2']::uuid[]) x) || ' acmeacme webhook webhook');
SELECT citus_check.expect('begin_dispatch_many_for: acme''s begun, globex''s refused', :'begun', 'true 55000 true');

-- The outcomes, recorded in acme's name: one delivered, one unknown.
SELECT string_agg(status, ' ' ORDER BY ord) AS completed
  FROM keyturn.complete_many_for('acme', ARRAY[split_part(:'leased', ' ', 1), split_part(:'leased', ' ', 2)]::uuid[],
         :'leases'::uuid[], '{succeeded,unknown}', ARRAY['{"status": 200}', '{}']::jsonb[], '{NULL,NULL}'::text[]::interval[])
       WITH ORDINALITY AS c (action_id, status, error, ord) \gset
SELECT citus_check.expect('complete_many_for: succeeded, uncertain', :'completed', 'succeeded uncertain');

-- globex's job, leased for a second and begun, lapses: its tenant's sweep
-- makes it uncertain.
BEGIN;
SELECT action_id AS gl, lease_id AS gl_lease FROM keyturn.lease_for('globex', 'w-b', 8, '1 second') \gset
SELECT keyturn.begin_dispatch_for('globex', :'gl', :'gl_lease') AS g_begun \gset
COMMIT;
SELECT citus_check.expect('globex''s job begun on its worker', :'gl' || ' ' || :'g_begun', :'g1' || ' t');
SELECT citus_check.wait_until(clock_timestamp() + interval '1.2 seconds');
SELECT citus_check.expect('tenants_due: globex has something to sweep',
    (SELECT to_sweep::text FROM keyturn.tenants_due() WHERE tenant = 'globex'), '1');
-- Columns, not format(…) of them: Citus takes SELECT g(…) FROM f(…) for a
-- call of g, and delegates neither.
SELECT expired, requeued, uncertain FROM keyturn.sweep_for('globex') \gset
SELECT citus_check.expect('sweep_for(''globex''): its lapsed call is uncertain',
    format('%s %s %s', :'expired', :'requeued', :'uncertain'), '0 0 1');
\set ON_ERROR_STOP off
\set LAST_ERROR_SQLSTATE ''
SELECT keyturn.complete_for('acme', :'gl', :'gl_lease', 'succeeded');
\set ON_ERROR_STOP on
SELECT citus_check.expect('a job completed in another tenant''s name: 55000', :'LAST_ERROR_SQLSTATE', '55000');

-- The operator: the uncertain queue across tenants, the attempts, and
-- reconcile_for on the action's own worker.
\connect - app_operator
SELECT citus_check.expect('uncertain_actions lists both tenants''',
    (SELECT string_agg(tenant, ' ' ORDER BY tenant) FROM keyturn.uncertain_actions()
      WHERE action_id IN (:'gl', split_part(:'leased', ' ', 2)::uuid)), 'acme globex');
SELECT citus_check.expect('attempts: who tried, what came back',
    (SELECT string_agg(format('%s:%s:%s', attempt, worker, outcome), ' ') FROM keyturn.attempts(split_part(:'leased', ' ', 1)::uuid)),
    '1:w-b:succeeded');
SELECT keyturn.reconcile_for('acme', split_part(:'leased', ' ', 2)::uuid, 'failed', 'the provider has no record') AS r1 \gset
SELECT keyturn.reconcile_for('globex', :'gl', 'succeeded', 'delivered, per the provider') AS r2 \gset
SELECT citus_check.expect('reconcile_for in each tenant', :'r1' || ' ' || :'r2', 'failed succeeded');

\connect - postgres
SELECT citus_check.expect('every call one worker''s one-phase commit: no two-phase commit',
    (SELECT count(*)::text FROM pg_dist_transaction), :'before_2pc');
SELECT citus_check.expect('the audit log, keyturn''s own on each worker',
    (SELECT string_agg(to_status::text || ':' || db_role, ' ' ORDER BY id) FROM keyturn.event
      WHERE tenant = 'acme' AND action_id = split_part(:'leased', ' ', 2)::uuid),
    'pending:app_agent queued:app_human leased:app_dispatcher executing:app_dispatcher uncertain:app_dispatcher failed:app_operator');
SELECT citus_check.expect('globex''s likewise',
    (SELECT string_agg(to_status::text || ':' || db_role, ' ' ORDER BY id) FROM keyturn.event
      WHERE tenant = 'globex' AND action_id = :'gl'),
    'pending:app_agent queued:app_human leased:app_dispatcher executing:app_dispatcher uncertain:app_dispatcher succeeded:app_operator');
SELECT citus_check.expect('no work-list rows left',
    (SELECT count(*)::text FROM keyturn.open_action WHERE action_id IN (:'n1', :'n2', :'g1')), '0');
SELECT citus_check.expect('one usage row per success',
    (SELECT count(*)::text FROM keyturn.usage WHERE action_id IN (:'n1', :'n2', :'g1')), '2');

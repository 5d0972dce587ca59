-- Layout B, as far as keyturn's schema goes today (docs/scale-out.md,
-- "Layout B: keyturn's own tables distributed"): every table of keyturn
-- distributed by tenant, colocated with crm.deal, or a reference table, and
-- what the current entry points then do. Runs last in the layer: it leaves
-- keyturn's tables distributed for good, and the cluster is thrown away
-- after it. If Citus or keyturn changes what happens, this test says so and
-- the plan needs another look.

\connect - postgres
\set ON_ERROR_STOP on
-- alice's identity in acme, asserted in each transaction as a pooled
-- application would, and propagated to the workers (docs/scale-out.md).
\set as_alice 'SET LOCAL citus.propagate_set_commands = ''local''; SET LOCAL keyturn.tenant = ''acme''; SET LOCAL keyturn.principal = ''alice''; SET LOCAL keyturn.session = ''s1'';'
SET citus.enable_unsafe_triggers = on;

-- The foreign keys to the global tables go first: with them, Citus would
-- convert the whole graph and fail on the extension's own tables (b_probe).
-- They cannot come back: each worker's copy of the extension still holds
-- them, so Citus's ADD CONSTRAINT fails there ("already exists").
ALTER TABLE keyturn.tool_version DROP CONSTRAINT tool_version_tool_fkey;
ALTER TABLE keyturn.tool_grant DROP CONSTRAINT tool_grant_tool_fkey;
ALTER TABLE keyturn.delegation DROP CONSTRAINT delegation_tool_fkey;
ALTER TABLE keyturn.projection_version DROP CONSTRAINT projection_version_provider_fkey;
SELECT count(create_reference_table(t)) AS referenced FROM unnest(ARRAY[
    'keyturn.tool', 'keyturn.tool_version', 'keyturn.projection', 'keyturn.projection_version',
    'keyturn.transition', 'keyturn_secret.approval_key']::regclass[]) t \gset
SELECT count(create_distributed_table(t, 'tenant', colocate_with => 'crm.deal')) AS distributed FROM unnest(ARRAY[
    'keyturn.member', 'keyturn.auth_epoch', 'keyturn.tool_grant', 'keyturn.cancelled_origin', 'keyturn.request',
    'keyturn.action', 'keyturn.open_action', 'keyturn.action_target', 'keyturn.staged_payload', 'keyturn.vote',
    'keyturn.delegation', 'keyturn.staged_file', 'keyturn.attempt', 'keyturn.event', 'keyturn.usage']::regclass[]) t \gset
SELECT citus_check.expect('every global table is a reference table', :'referenced', '6');
SELECT citus_check.expect('every tenant table is distributed by tenant, colocated with crm.deal', :'distributed', '15');
SELECT citus_check.expect('all of keyturn is in Citus''s catalog',
    (SELECT count(*)::text FROM pg_dist_partition WHERE logicalrelid::text ~ '^keyturn(_secret)?\.'), '21');

-- propose, called as today (not delegated), writes its action on the
-- tenant's shard; the lifecycle trigger fires there too, in the worker's
-- backend, which never ran keyturn's propose: keyturn's actor state is the
-- coordinator backend's, so the trigger takes the row for a restore and
-- writes no event and no work-list row. Step 3 (delegated entry points)
-- runs the whole call on the worker, where the trigger sees it.
\connect - app_agent
BEGIN;
:as_alice
SELECT action_id, token, status FROM keyturn.propose('deal_stage',
  '{"where": {"id": 102}, "set": {"stage": "won"}}', '{"conversation_id": "c-b", "turn_id": "t-b"}') \gset
COMMIT;
\connect - postgres
SELECT citus_check.expect('propose stored the action on a worker', :'status', 'pending');
SELECT citus_check.expect('on the shard: the action',
    (SELECT count(*)::text FROM keyturn.action WHERE tenant = 'acme' AND id = :'action_id'), '1');
SELECT citus_check.expect('not there: its event and work-list row (the trigger ran without keyturn''s actor)',
    (SELECT count(*)::text FROM keyturn.event WHERE tenant = 'acme' AND action_id = :'action_id')
    || ' ' || (SELECT count(*)::text FROM keyturn.open_action WHERE tenant = 'acme' AND action_id = :'action_id'), '0 0');

-- approve switches between the extension owner (keyturn's writes) and the
-- approving role (the business write) in one transaction; Citus ties a
-- placement one user modified to that user's connection, and refuses.
SELECT revision AS revision_before FROM crm.deal WHERE tenant = 'acme' AND id = 102 \gset
\connect - app_human
\set ON_ERROR_STOP off
\set LAST_ERROR_MESSAGE ''
BEGIN;
:as_alice
SELECT status FROM keyturn.approve(:'action_id', :'token');
ROLLBACK;
\set ON_ERROR_STOP on
SELECT citus_check.expect('approve across users on one placement is refused', :'LAST_ERROR_MESSAGE',
    'cannot perform query on placements that were modified in this transaction by a different user');
\connect - postgres
SELECT citus_check.expect('the deal was not written',
    (SELECT revision::text FROM crm.deal WHERE tenant = 'acme' AND id = 102), :'revision_before');
SELECT citus_check.expect('the action is still pending',
    (SELECT status::text FROM keyturn.action WHERE tenant = 'acme' AND id = :'action_id'), 'pending');

-- Delegated to the tenant's worker (step 3 of the plan: keyturn.propose_for
-- and keyturn.approve_for, the plain calls with the tenant named), each call
-- runs whole in one backend there: propose writes its event and work-list
-- row, and approve writes the deal as the approving role, with its events
-- and usage row, in that worker's one-phase commit. The form names the
-- tenant, so that the business statements stay on that worker too.
\connect - postgres
SELECT create_distributed_function('keyturn.propose_for(text,text,jsonb,jsonb)', 'tenant',
                                   colocate_with => 'keyturn.action', force_delegation => true) IS NULL AS d1 \gset
SELECT create_distributed_function('keyturn.approve_for(text,uuid,text,jsonb)', 'tenant',
                                   colocate_with => 'keyturn.action', force_delegation => true) IS NULL AS d2 \gset
SELECT create_distributed_function('keyturn.reject_for(text,uuid,text,text)', 'tenant',
                                   colocate_with => 'keyturn.action', force_delegation => true) IS NULL AS d4 \gset
SELECT revision AS d_revision_before FROM crm.deal WHERE tenant = 'acme' AND id = 103 \gset
SELECT count(*) AS d_2pc_before FROM pg_dist_transaction \gset

\connect - app_agent
BEGIN;
:as_alice
SELECT action_id AS d_action, token AS d_token, status AS d_status FROM keyturn.propose_for('acme', 'deal_stage_routed',
  '{"where": {"tenant": "acme", "id": 103}, "set": {"stage": "won"}}', '{"conversation_id": "c-b", "turn_id": "t-d"}') \gset
COMMIT;
\connect - postgres
SELECT citus_check.expect('delegated propose: pending', :'d_status', 'pending');
SELECT citus_check.expect('delegated propose: its event and its work-list row',
    (SELECT count(*)::text FROM keyturn.event WHERE tenant = 'acme' AND action_id = :'d_action')
    || ' ' || (SELECT count(*)::text FROM keyturn.open_action WHERE tenant = 'acme' AND action_id = :'d_action'), '1 1');

\connect - app_human
BEGIN;
:as_alice
SELECT status AS d_approved, result::text AS d_result FROM keyturn.approve_for('acme', :'d_action', :'d_token') \gset
COMMIT;
\connect - postgres
SELECT citus_check.expect('delegated approve: succeeded', :'d_approved' || ' ' || :'d_result',
    'succeeded {"keys": ["103"], "rows": 1}');
SELECT revision - :'d_revision_before' AS d_writes, last_by AS d_by, last_port AS d_port
  FROM crm.deal WHERE tenant = 'acme' AND id = 103 \gset
SELECT citus_check.expect('the deal written once, as the approving role, on a worker',
    :'d_writes' || ' ' || :'d_by' || ' ' || (:'d_port' IN (:'w1', :'w2'))::text, '1 app_human true');
SELECT citus_check.expect('its events, and the usage row',
    (SELECT string_agg(to_status::text, ' ' ORDER BY id) FROM keyturn.event WHERE tenant = 'acme' AND action_id = :'d_action')
    || ' ' || (SELECT count(*)::text FROM keyturn.usage WHERE tenant = 'acme' AND action_id = :'d_action'),
    'pending succeeded 1');
SELECT citus_check.expect('no work-list row left', (SELECT count(*)::text FROM keyturn.open_action
    WHERE tenant = 'acme' AND action_id = :'d_action'), '0');
SELECT citus_check.expect('one worker, one phase: no two-phase commit',
    (SELECT count(*)::text FROM pg_dist_transaction), :'d_2pc_before');

-- Routed by the tenant it names, the call still runs as the identity the
-- transaction asserted: naming another tenant is refused on its worker.
\connect - app_agent
\set ON_ERROR_STOP off
\set LAST_ERROR_SQLSTATE ''
BEGIN;
:as_alice
SELECT action_id FROM keyturn.propose_for('globex', 'deal_stage_routed',
  '{"where": {"tenant": "globex", "id": 101}, "set": {"stage": "won"}}', '{}');
ROLLBACK;
\set ON_ERROR_STOP on
\connect - postgres
SELECT citus_check.expect('delegated propose_for naming another tenant: 42501', :'LAST_ERROR_SQLSTATE', '42501');

-- reject_for, delegated the same way: the rejection's event is keyturn's own
-- there (the approving role, no direct_write mark). (preview has no
-- tenant-explicit form: its read of the business rows is by key alone, so
-- it runs on every shard, which a delegated call refuses.)
\connect - app_agent
BEGIN;
:as_alice
SELECT action_id AS r_action, token AS r_token FROM keyturn.propose_for('acme', 'deal_stage_routed',
  '{"where": {"tenant": "acme", "id": 104}, "set": {"stage": "won"}}', '{"conversation_id": "c-b", "turn_id": "t-r"}') \gset
COMMIT;
\connect - app_human
BEGIN;
:as_alice
SELECT keyturn.reject_for('acme', :'r_action', :'r_token', 'not now') AS r_status \gset
COMMIT;
\connect - postgres
SELECT citus_check.expect('delegated reject: rejected', :'r_status', 'rejected');
SELECT citus_check.expect('its events, keyturn''s own',
    (SELECT string_agg(to_status::text || ':' || db_role || ':' || (detail ? 'direct_write')::text, ' ' ORDER BY id)
       FROM keyturn.event WHERE tenant = 'acme' AND action_id = :'r_action'),
    'pending:app_agent:false rejected:app_human:false');

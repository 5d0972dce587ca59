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
-- keyturn.citus_distribute does it all (docs/scale-out.md, layout B): the
-- foreign keys to the global tables go first (with them, Citus would
-- convert the whole graph and fail on the extension's own tables, b_probe),
-- the global tables become reference tables, the tenant tables are
-- distributed colocated with crm.deal, and every tenant-explicit call is
-- registered to run whole on the tenant's worker.
SELECT count(*) FILTER (WHERE done = 'foreign key dropped') AS dropped,
       count(*) FILTER (WHERE done = 'reference table') AS referenced,
       count(*) FILTER (WHERE done LIKE 'distributed by tenant%') AS distributed,
       count(*) FILTER (WHERE done LIKE 'sent whole%') AS delegated
  FROM keyturn.citus_distribute('crm.deal') \gset
SELECT citus_check.expect('the four foreign keys to global tables dropped', :'dropped', '4');
SELECT citus_check.expect('every global table is a reference table', :'referenced', '6');
SELECT citus_check.expect('every tenant table is distributed by tenant, colocated with crm.deal', :'distributed', '22');
SELECT citus_check.expect('every tenant-explicit call is delegated', :'delegated',
    (SELECT count(*)::text FROM pg_proc WHERE pronamespace = 'keyturn'::regnamespace AND proname ~ '^[a-z].*_for$'));
SELECT citus_check.expect('all of keyturn is in Citus''s catalog',
    (SELECT count(*)::text FROM pg_dist_partition WHERE logicalrelid::text ~ '^keyturn(_secret)?\.'), '28');
SELECT citus_check.expect('colocated with crm.deal',
    (SELECT count(DISTINCT colocationid)::text FROM pg_dist_partition
      WHERE logicalrelid IN ('crm.deal'::regclass, 'keyturn.action'::regclass, 'keyturn.event'::regclass)), '1');
SELECT citus_check.expect('citus_distribute again: nothing left to do',
    (SELECT count(*)::text FROM keyturn.citus_distribute('crm.deal')), '0');
\set ON_ERROR_STOP off
\set LAST_ERROR_SQLSTATE ''
SELECT * FROM keyturn.citus_distribute('keyturn.tool');
\set ON_ERROR_STOP on
SELECT citus_check.expect('citus_distribute with a table not distributed by a text column: 22023', :'LAST_ERROR_SQLSTATE', '22023');
SELECT citus_check.expect('the dispatcher is told to dispatch by tenant',
    (SELECT keyturn.dispatch_by_tenant()::text), 'true');
SELECT citus_check.expect('and to listen on both workers',
    (SELECT string_agg(port::text, ' ' ORDER BY port) FROM keyturn.dispatch_nodes()),
    (SELECT string_agg(p, ' ' ORDER BY p) FROM unnest(ARRAY[:'w1', :'w2']) p));

-- propose, called as today (not delegated), would write its action on the
-- tenant's shard from the coordinator's backend; the lifecycle trigger
-- fires there, in the worker's backend, which never ran keyturn's propose
-- and does not know who acts, so the event and the work-list row would be
-- lost. The trigger refuses such a change (55000), and nothing is stored.
\connect - app_agent
\set ON_ERROR_STOP off
\set LAST_ERROR_SQLSTATE ''
\set LAST_ERROR_MESSAGE ''
BEGIN;
:as_alice
SELECT action_id FROM keyturn.propose('deal_stage_routed',
  '{"where": {"tenant": "acme", "id": 102}, "set": {"stage": "won"}}', '{"conversation_id": "c-b", "turn_id": "t-b"}');
ROLLBACK;
\set ON_ERROR_STOP on
SELECT citus_check.expect('plain propose on distributed keyturn: refused', :'LAST_ERROR_SQLSTATE', '55000');
SELECT citus_check.expect('and says what to call instead', (:'LAST_ERROR_MESSAGE' LIKE
    'keyturn: keyturn''s tables are distributed by tenant (Citus): this change to an action reached its shard from a call that did not run on the tenant''s worker%')::text, 'true');
\connect - postgres
SELECT citus_check.expect('nothing stored',
    (SELECT count(*)::text FROM keyturn.action WHERE tenant = 'acme' AND conversation_id = 'c-b'), '0');

-- Delegated to the tenant's worker (step 3 of the plan: keyturn.propose_for
-- and keyturn.approve_for, the plain calls with the tenant named), each call
-- runs whole in one backend there: propose writes its event and work-list
-- row, and approve writes the deal as the approving role, with its events
-- and usage row, in that worker's one-phase commit. The form names the
-- tenant, so that the business statements stay on that worker too.
\connect - postgres
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

-- approve, called as today (not delegated), is refused too, and nothing is
-- written: Citus ties a placement one user modified to that user's
-- connection, and approve writes keyturn's rows as the extension owner and
-- the business row as the approving role.
\connect - app_human
\set ON_ERROR_STOP off
\set LAST_ERROR_SQLSTATE ''
BEGIN;
:as_alice
SELECT status FROM keyturn.approve(:'d_action', :'d_token');
ROLLBACK;
\set ON_ERROR_STOP on
SELECT citus_check.expect('plain approve on distributed keyturn: refused', (:'LAST_ERROR_SQLSTATE' <> '')::text, 'true');
\echo 'plain approve refused with' :LAST_ERROR_SQLSTATE :LAST_ERROR_MESSAGE
\connect - postgres
SELECT citus_check.expect('the deal not written, the action still pending',
    (SELECT revision::text FROM crm.deal WHERE tenant = 'acme' AND id = 103) || ' '
    || (SELECT status::text FROM keyturn.action WHERE tenant = 'acme' AND id = :'d_action'), :'d_revision_before' || ' pending');

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

-- preview_for, delegated the same way: its read of the deal, as the person
-- under row-level security, carries the form's tenant and stays on the
-- worker. Then reject_for: the rejection's event is keyturn's own there
-- (the approving role, no direct_write mark).
\connect - postgres
SELECT stage AS r_before FROM crm.deal WHERE tenant = 'acme' AND id = 104 \gset
\connect - app_agent
BEGIN;
:as_alice
SELECT action_id AS r_action, token AS r_token FROM keyturn.propose_for('acme', 'deal_stage_routed',
  '{"where": {"tenant": "acme", "id": 104}, "set": {"stage": "lost"}}', '{"conversation_id": "c-b", "turn_id": "t-r"}') \gset
COMMIT;
\connect - app_human
BEGIN;
:as_alice
SELECT keyturn.preview_for('acme', :'r_action', :'r_token') AS r_preview \gset
COMMIT;
SELECT citus_check.expect('delegated preview: the target''s before and after, read on its worker',
    (:'r_preview'::jsonb -> 'targets')::text,
    format('[{"key": "104", "after": {"stage": "lost"}, "before": {"stage": "%s"}}]', :'r_before'));
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

-- Layout A: how an approved write commits. With the tenant in the form
-- (deal_stage_routed) Citus routes the write to the one shard that holds the
-- row and commits that worker in one phase, before the coordinator commits.
-- Without it (deal_stage) the write runs on every shard, and Citus commits
-- over every worker in two phases, each prepared transaction recorded in the
-- coordinator's pg_dist_transaction (kept here: the layer turns Citus's
-- automatic recovery off, citus.recover_2pc_interval = -1).
-- docs/scale-out.md, "A coordinator crash", says what each means.

\connect - app_agent
BEGIN;
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT action_id AS routed_id, token AS routed_token FROM keyturn.propose('deal_stage_routed',
  '{"where": {"tenant": "acme", "id": 103}, "set": {"stage": "qualified"}}') \gset
SELECT action_id AS fanned_id, token AS fanned_token FROM keyturn.propose('deal_stage',
  '{"where": {"id": 104}, "set": {"stage": "qualified"}}') \gset
COMMIT;

\connect - postgres
-- Earlier tests' records go first, so what follows counts this test's alone.
SELECT recover_prepared_transactions() IS NOT NULL AS cleared \gset
SELECT count(*) AS before_routed FROM pg_dist_transaction \gset
\connect - app_human
BEGIN;
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT status AS routed_status FROM keyturn.approve(:'routed_id', :'routed_token') \gset
COMMIT;
\connect - postgres
SELECT count(*) AS after_routed FROM pg_dist_transaction \gset
SELECT citus_check.expect('routed write succeeded', :'routed_status', 'succeeded');
SELECT citus_check.expect('routed write: one phase, no prepared transaction', (:after_routed - :before_routed)::text, '0');

\connect - app_human
BEGIN;
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT status AS fanned_status FROM keyturn.approve(:'fanned_id', :'fanned_token') \gset
COMMIT;
\connect - postgres
SELECT count(*) AS after_fanned FROM pg_dist_transaction \gset
SELECT citus_check.expect('fanned-out write succeeded', :'fanned_status', 'succeeded');
SELECT citus_check.expect('fanned-out write: two phases, over both workers',
    (SELECT (count(DISTINCT groupid) = 2)::text FROM pg_dist_transaction), 'true');
SELECT citus_check.expect('fanned-out write prepared on every connection', (:after_fanned - :after_routed > 1)::text, 'true');
SELECT citus_check.expect('each write once',
    (SELECT string_agg(id || ':' || stage || ':' || revision, ' ' ORDER BY id) FROM crm.deal WHERE tenant = 'acme' AND id IN (103, 104)),
    '103:qualified:2 104:qualified:2');
-- Nothing is left in doubt after a clean commit.
SELECT recover_prepared_transactions() AS recovered \gset
SELECT citus_check.expect('no prepared transaction left to recover', :'recovered', '0');

-- Layout A: a target changed on its worker after the proposal is a conflict
-- at approve, and nothing is written. The version is xmin, which lives with
-- the row on its shard.

\connect - app_agent
BEGIN;
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT action_id, token FROM keyturn.propose('deal_stage_routed',
  '{"where": {"tenant": "acme", "id": 102}, "set": {"stage": "won"}}') \gset
COMMIT;

\connect - postgres
-- Someone else edits the row in between.
UPDATE crm.deal SET amount = 5000 WHERE tenant = 'acme' AND id = 102;
SELECT revision AS revision_before FROM crm.deal WHERE tenant = 'acme' AND id = 102 \gset

\connect - app_human
BEGIN;
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT status, result ->> 'matched' AS matched FROM keyturn.approve(:'action_id', :'token') \gset
COMMIT;
SELECT citus_check.expect('a changed target is a conflict', :'status', 'conflict');
SELECT citus_check.expect('no row matched', :'matched', '0');

\connect - postgres
SELECT citus_check.expect('nothing written',
    (SELECT stage || ' ' || revision FROM crm.deal WHERE tenant = 'acme' AND id = 102),
    'qualified ' || :'revision_before');
SELECT citus_check.expect('the outcome is stored',
    (SELECT status::text FROM keyturn.action WHERE id = :'action_id'), 'conflict');

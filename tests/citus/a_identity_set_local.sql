-- Layout A, identity by SET LOCAL under Citus's default
-- citus.propagate_set_commands = 'none': keyturn re-asserts it for its own
-- statements on the distributed table (propose's target read, preview,
-- approve's write), which run on a worker, as the approving role, under RLS.
-- A replay returns the stored outcome and writes nothing.

\connect - app_agent
BEGIN;
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
-- The agent's own read: Citus sent the workers no identity, RLS there sees none.
SELECT count(*) AS plain_read FROM crm.deal \gset
SELECT action_id, token, summary, status FROM keyturn.propose('deal_stage',
  '{"where": {"id": 101}, "set": {"stage": "negotiation"}}',
  '{"conversation_id": "c-1", "turn_id": "t-1"}') \gset
COMMIT;
SELECT citus_check.expect('the agent''s own read finds nothing on the workers', :'plain_read', '0');
SELECT citus_check.expect('propose resolved the target on a worker', :'summary', 'Set stage negotiation on 1 deal(s)');
SELECT citus_check.expect('pending', :'status', 'pending');

\connect - app_human
BEGIN;
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT keyturn.preview(:'action_id', :'token') -> 'targets' -> 0 -> 'before' ->> 'stage' AS before \gset
SELECT status, result::text AS result FROM keyturn.approve(:'action_id', :'token') \gset
-- The caller's settings are as they were.
SELECT current_setting('keyturn.tenant') AS tenant_after,
       current_setting('citus.propagate_set_commands') AS propagate_after \gset
COMMIT;
SELECT citus_check.expect('preview read the row on a worker', :'before', 'qualified');
SELECT citus_check.expect('approve succeeded', :'status', 'succeeded');
SELECT citus_check.expect('result', :'result', '{"keys": ["101"], "rows": 1}');
SELECT citus_check.expect('keyturn.tenant unchanged', :'tenant_after', 'acme');
SELECT citus_check.expect('propagation back to none', :'propagate_after', 'none');

\connect - postgres
SELECT stage, revision::text, last_by, last_tenant, last_port::text AS last_port
  FROM crm.deal WHERE tenant = 'acme' AND id = 101 \gset
SELECT citus_check.expect('written', :'stage', 'negotiation');
SELECT citus_check.expect('once', :'revision', '2');
SELECT citus_check.expect('as the approving role', :'last_by', 'app_human');
SELECT citus_check.expect('row-level security on the worker saw the tenant', :'last_tenant', 'acme');
SELECT citus_check.expect('on a worker', (:'last_port' IN (:'w1', :'w2'))::text, 'true');

-- A replay: the same answer, nothing written again.
\connect - app_human
BEGIN;
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT status AS replay_status, result::text AS replay_result FROM keyturn.approve(:'action_id', :'token') \gset
COMMIT;
\connect - postgres
SELECT citus_check.expect('replay status', :'replay_status', 'succeeded');
SELECT citus_check.expect('replay result', :'replay_result', :'result');
SELECT citus_check.expect('replay wrote nothing',
    (SELECT revision::text FROM crm.deal WHERE tenant = 'acme' AND id = 101), '2');
SELECT citus_check.expect('one usage row', (SELECT count(*)::text FROM keyturn.usage WHERE action_id = :'action_id'), '1');

-- Layout A: an external tool, end to end, on the coordinator's local tables:
-- approve queues it (and NOTIFYs), the dispatcher leases, begins and
-- completes it. Then an approval of an external tool and a fanned-out sql
-- write in one transaction: Citus prepares the workers in two phases, and the
-- NOTIFY, which PostgreSQL never allows in a prepared transaction, is the
-- coordinator's own, so the commit goes through.

\connect - app_agent
BEGIN;
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT action_id AS note_id, token AS note_token FROM keyturn.propose('notify',
  '{"channel": "sales", "text": "Two deals won"}') \gset
COMMIT;

\connect - app_human
BEGIN;
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT status AS approved FROM keyturn.approve(:'note_id', :'note_token') \gset
COMMIT;
SELECT citus_check.expect('external: queued', :'approved', 'queued');

\connect - app_dispatcher
BEGIN;
SELECT action_id AS job, lease_id FROM keyturn.lease('worker-1', 1, '30 seconds', ARRAY['webhook']) \gset
SELECT keyturn.begin_dispatch(:'job', :'lease_id')::text AS begun \gset
COMMIT;
SELECT keyturn.complete(:'job', :'lease_id', 'succeeded', '{"status": 200}') AS completed \gset
SELECT citus_check.expect('external: leased the note', :'job', :'note_id');
SELECT citus_check.expect('external: begun', :'begun', 'true');
SELECT citus_check.expect('external: succeeded', :'completed', 'succeeded');

-- One transaction: a fanned-out sql write (two-phase over the workers) and
-- an external approval (a NOTIFY on the coordinator).
\connect - app_agent
BEGIN;
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT action_id AS note2_id, token AS note2_token FROM keyturn.propose('notify',
  '{"channel": "sales", "text": "Deal 105 qualified"}') \gset
SELECT action_id AS deal_id, token AS deal_token FROM keyturn.propose('deal_stage',
  '{"where": {"id": 105}, "set": {"stage": "qualified"}}') \gset
COMMIT;
\connect - app_human
BEGIN;
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT status AS deal_status FROM keyturn.approve(:'deal_id', :'deal_token') \gset
SELECT status AS note2_status FROM keyturn.approve(:'note2_id', :'note2_token') \gset
COMMIT;
\connect - postgres
SELECT citus_check.expect('together: sql write', :'deal_status', 'succeeded');
SELECT citus_check.expect('together: external queued', :'note2_status', 'queued');
SELECT citus_check.expect('together: both committed',
    (SELECT string_agg(status::text, ' ' ORDER BY status::text) FROM keyturn.action WHERE id IN (:'deal_id', :'note2_id')),
    'queued succeeded');
SELECT citus_check.expect('together: the write is on its worker',
    (SELECT stage FROM crm.deal WHERE tenant = 'acme' AND id = 105), 'qualified');

-- Layout A: the sweep (an expired proposal, a lapsed lease), end_session and
-- audit, all on the coordinator's local tables next to a distributed
-- business table.

-- A proposal that expires a second after it is made.
\connect - app_agent
BEGIN;
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT action_id AS brief_id, token AS brief_token FROM keyturn.propose('deal_stage_brief',
  '{"where": {"id": 106}, "set": {"stage": "won"}}') \gset
COMMIT;
\connect - postgres
SELECT citus_check.wait_until((SELECT expires_at FROM keyturn.action WHERE id = :'brief_id'));

-- A lease that lapses a second after it is taken.
\connect - app_dispatcher
SELECT action_id AS job, lease_id FROM keyturn.lease('worker-1', 1, '1 second') \gset
\connect - postgres
SELECT citus_check.wait_until((SELECT lease_expires_at FROM keyturn.action WHERE id = :'job'));

\connect - app_dispatcher
SELECT expired::text AS expired, requeued::text AS requeued FROM keyturn.sweep() \gset
\connect - postgres
SELECT citus_check.expect('sweep: one expired', :'expired', '1');
SELECT citus_check.expect('sweep: one requeued', :'requeued', '1');
SELECT citus_check.expect('sweep: the proposal expired',
    (SELECT status::text FROM keyturn.action WHERE id = :'brief_id'), 'expired');
SELECT citus_check.expect('sweep: the job is queued again',
    (SELECT status::text FROM keyturn.action WHERE id = :'job'), 'queued');
SELECT citus_check.expect('sweep: the expired proposal wrote nothing',
    (SELECT stage FROM crm.deal WHERE tenant = 'acme' AND id = 106), 'lead');

-- Logout: end_session cancels the session's open proposals.
\connect - app_agent
BEGIN;
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's-end';
SELECT action_id AS end1 FROM keyturn.propose('deal_stage_routed',
  '{"where": {"tenant": "acme", "id": 106}, "set": {"stage": "won"}}') \gset
SELECT action_id AS end2 FROM keyturn.propose('notify', '{"channel": "sales", "text": "bye"}') \gset
SELECT keyturn.end_session() AS ended \gset
COMMIT;
SELECT citus_check.expect('end_session: two cancelled', :'ended', '2');
\connect - postgres
SELECT citus_check.expect('end_session: statuses',
    (SELECT string_agg(status::text, ' ') FROM keyturn.action WHERE id IN (:'end1', :'end2')), 'cancelled cancelled');

-- Audit: the history of an action that ran on a worker.
\connect - postgres
SELECT id AS audited FROM keyturn.action
 WHERE tool = 'deal_stage_routed' AND status = 'succeeded' AND tenant = 'acme' ORDER BY created_at LIMIT 1 \gset
\connect - app_human
BEGIN;
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT string_agg(coalesce(from_status::text, '-') || '>' || to_status, ' ' ORDER BY at) AS trail,
       string_agg(DISTINCT db_role, ' ') FILTER (WHERE to_status = 'succeeded') AS by_role
  FROM keyturn.audit(:'audited') \gset
COMMIT;
SELECT citus_check.expect('audit: the trail', :'trail', '->pending pending>succeeded');
SELECT citus_check.expect('audit: approved as', :'by_role', 'app_human');

-- The hash chain on Citus (layout A: keyturn's tables on the coordinator):
-- it verifies, the export is every event, and a changed event, triggers
-- off, is found where it is.
\connect - postgres
SELECT citus_check.expect('chain: acme''s verifies',
    (SELECT ok::text || ' ' || (events > 0)::text FROM keyturn.verify_audit('acme')), 'true true');
SELECT citus_check.expect('chain: the export is every event',
    (SELECT (SELECT count(*) FROM keyturn.audit_export('acme')) = (SELECT events FROM keyturn.verify_audit('acme')))::text,
    'true');
SELECT id AS tampered FROM keyturn.event WHERE tenant = 'acme' ORDER BY id OFFSET 1 LIMIT 1 \gset
BEGIN;
SET LOCAL session_replication_role = replica;
UPDATE keyturn.event SET detail = coalesce(detail, '{}') || '{"edited": true}' WHERE id = :'tampered';
SELECT citus_check.expect('chain: a changed event is the first bad one',
    (SELECT ok::text || ' ' || (first_bad = :'tampered')::text FROM keyturn.verify_audit('acme')), 'false true');
ROLLBACK;
SELECT citus_check.expect('chain: verifies again once undone',
    (SELECT ok::text FROM keyturn.verify_audit('acme')), 'true');

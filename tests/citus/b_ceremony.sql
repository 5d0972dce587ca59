-- Layout B, the person's other calls (docs/scale-out.md): with keyturn's
-- tables distributed (b_distribute), the calls that change an action run
-- delegated in their tenant-explicit forms (revise_for, approve_many_for,
-- end_session_for, cancel_origin_for), and the others as they are, on the
-- coordinator, which routes each of their statements to the tenant's worker
-- (pending, delegate, delegations, revoke_delegation, action_status, audit,
-- stage_file): they change no action, so no trigger runs without keyturn.

\connect - postgres
\set ON_ERROR_STOP on
\set as_alice 'SET LOCAL citus.propagate_set_commands = ''local''; SET LOCAL keyturn.tenant = ''acme''; SET LOCAL keyturn.principal = ''alice''; SET LOCAL keyturn.session = ''s-cer'';'

\connect - app_agent
BEGIN;
:as_alice
SELECT action_id AS p1, token AS p1_token FROM keyturn.propose_for('acme', 'deal_stage_routed',
  '{"where": {"tenant": "acme", "id": 105}, "set": {"stage": "qualified"}}', '{"conversation_id": "c-cer"}') \gset
SELECT action_id AS p2, token AS p2_token FROM keyturn.propose_for('acme', 'deal_stage_routed',
  '{"where": {"tenant": "acme", "id": 106}, "set": {"stage": "qualified"}}', '{"conversation_id": "c-cer"}') \gset
SELECT action_id AS p3 FROM keyturn.propose_for('acme', 'notify',
  '{"channel": "ops", "text": "left for logout"}', '{"conversation_id": "c-other"}') \gset
COMMIT;

-- pending, on the coordinator: alice's queue, read on acme's worker.
\connect - app_human
BEGIN;
:as_alice
SELECT string_agg(action_id::text, ' ' ORDER BY action_id) AS queue FROM keyturn.pending(100)
 WHERE action_id IN (:'p1', :'p2', :'p3') \gset
COMMIT;
SELECT citus_check.expect('pending: alice''s three proposals',
    :'queue', (SELECT string_agg(x::text, ' ' ORDER BY x) FROM unnest(ARRAY[:'p1', :'p2', :'p3']::uuid[]) x));

-- revise_for, delegated: the first proposal superseded by its edit.
BEGIN;
:as_alice
SELECT action_id AS p1b, token AS p1b_token FROM keyturn.revise_for('acme', :'p1', :'p1_token',
  '{"where": {"tenant": "acme", "id": 105}, "set": {"stage": "negotiation"}}') \gset
COMMIT;

-- approve_many_for, delegated: the edit and the second proposal on one card.
BEGIN;
:as_alice
SELECT string_agg(status, ' ' ORDER BY ord) AS batch
  FROM keyturn.approve_many_for('acme', jsonb_build_array(
         jsonb_build_object('action_id', :'p1b', 'token', :'p1b_token'),
         jsonb_build_object('action_id', :'p2', 'token', :'p2_token'))) WITH ORDINALITY AS b (action_id, status, result, ord) \gset
COMMIT;
\connect - postgres
SELECT citus_check.expect('revise_for and approve_many_for: both written',
    :'batch' || ' ' || (SELECT status::text FROM keyturn.action WHERE tenant = 'acme' AND id = :'p1')
    || ' ' || (SELECT string_agg(stage, ' ' ORDER BY id) FROM crm.deal WHERE tenant = 'acme' AND id IN (105, 106)),
    'succeeded succeeded superseded negotiation qualified');
SELECT citus_check.expect('their events, keyturn''s own',
    (SELECT string_agg(to_status::text || ':' || db_role, ' ' ORDER BY id) FROM keyturn.event
      WHERE tenant = 'acme' AND action_id IN (:'p1', :'p1b')),
    'pending:app_agent pending:app_human superseded:app_human succeeded:app_human');

-- A standing approval, made and listed on the coordinator, spent inside a
-- delegated propose_for on the worker, then revoked. Its scope names every
-- path the proposal carries (an empty scope covers nothing: docs/sql-api.md,
-- "Scoped grants and standing approvals").
\connect - app_human
BEGIN;
:as_alice
SELECT keyturn.delegate('deal_stage_routed',
  '{"params": {"where.tenant": {"eq": "acme"}, "where.id": {"any": true}, "set.stage": {"eq": "won"}}}',
  2, '1 hour') AS standing \gset
COMMIT;
\connect - app_agent
BEGIN;
:as_alice
SELECT status AS covered, delegation_id AS spent FROM keyturn.propose_for('acme', 'deal_stage_routed',
  '{"where": {"tenant": "acme", "id": 105}, "set": {"stage": "won"}}', '{"conversation_id": "c-cer"}') \gset
COMMIT;
\connect - app_human
BEGIN;
:as_alice
SELECT uses::text || '/' || max_uses AS used FROM keyturn.delegations() WHERE delegation_id = :'standing' \gset
SELECT keyturn.revoke_delegation(:'standing') AS revoked \gset
COMMIT;
SELECT citus_check.expect('a standing approval on layout B: covered, one use spent, revoked',
    :'covered' || ' ' || (:'spent' = :'standing')::text || ' ' || :'used' || ' ' || :'revoked',
    'succeeded true 1/2 t');

-- action_status and audit, read on the coordinator.
BEGIN;
:as_alice
SELECT status AS p2_status FROM keyturn.action_status(:'p2') \gset
SELECT string_agg(to_status, ' ' ORDER BY at) AS p2_audit FROM keyturn.audit(:'p2') \gset
COMMIT;
SELECT citus_check.expect('action_status and audit', :'p2_status' || ' / ' || :'p2_audit',
    'succeeded / pending succeeded');

-- stage_file, on the coordinator: the file on acme's worker.
\connect - app_agent
BEGIN;
:as_alice
SELECT file_id AS staged FROM keyturn.stage_file('\x68656c6c6f'::bytea, 'hello.txt', 'text/plain') \gset
COMMIT;
\connect - postgres
SELECT citus_check.expect('stage_file: the bytes on the tenant''s shard',
    (SELECT convert_from(content, 'UTF8') FROM keyturn.staged_file WHERE tenant = 'acme' AND id = :'staged'), 'hello');

-- end_session_for and cancel_origin_for, delegated: logout cancels the
-- session's pending proposal; the cancelled conversation starts nothing more.
\connect - app_agent
BEGIN;
:as_alice
SELECT keyturn.cancel_origin_for('acme', 'c-cer') AS cancelled_in_conversation \gset
SELECT keyturn.end_session_for('acme') AS ended \gset
COMMIT;
SELECT citus_check.expect('end_session_for: the session''s pending proposal cancelled',
    :'cancelled_in_conversation' || ' ' || :'ended', '0 1');
\set ON_ERROR_STOP off
\set LAST_ERROR_SQLSTATE ''
BEGIN;
:as_alice
SELECT action_id FROM keyturn.propose_for('acme', 'deal_stage_routed',
  '{"where": {"tenant": "acme", "id": 105}, "set": {"stage": "lost"}}', '{"conversation_id": "c-cer"}');
ROLLBACK;
\set ON_ERROR_STOP on
SELECT citus_check.expect('a cancelled conversation starts nothing: 55000', :'LAST_ERROR_SQLSTATE', '55000');
\connect - postgres
SELECT citus_check.expect('logout, keyturn''s own event on the worker',
    (SELECT string_agg(to_status::text || ':' || db_role, ' ' ORDER BY id) FROM keyturn.event
      WHERE tenant = 'acme' AND action_id = :'p3'),
    'pending:app_agent cancelled:app_agent');

-- keyturn's own tables read directly, under row-level security, is what
-- layout B cannot do (docs/scale-out.md): the policy (keyturn._sees) runs on
-- the worker, per row, and its read of keyturn.member is a distributed query
-- from inside one. The calls above are the way to read.
\connect - app_agent
\set ON_ERROR_STOP off
\set LAST_ERROR_MESSAGE ''
BEGIN;
:as_alice
SELECT count(*) FROM keyturn.action WHERE tenant = 'acme' AND id = :'p3';
ROLLBACK;
\set ON_ERROR_STOP on
SELECT citus_check.expect('a direct read of keyturn.action under row-level security: refused by Citus',
    :'LAST_ERROR_MESSAGE', 'cannot execute a distributed query from a query on a shard');

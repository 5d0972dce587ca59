-- Layout B, task-only effects (docs/sql-api.md, "Task-only effects"): the
-- person's recorded request is the approval. record_request runs as it is,
-- on the coordinator, which routes its one row to the tenant's worker; the
-- agent's propose_for of a task tool, delegated there, finds the request,
-- approves at once and writes the deal as the role that recorded it. The
-- same call again is the same action; a call no request covers is refused.

\connect - postgres
\set ON_ERROR_STOP on
\set as_alice 'SET LOCAL citus.propagate_set_commands = ''local''; SET LOCAL keyturn.tenant = ''acme''; SET LOCAL keyturn.principal = ''alice''; SET LOCAL keyturn.session = ''s-task'';'

\connect - app_admin
SELECT keyturn.register_tool('deal_stage_task', '{
  "executor": "sql", "effect": "reversible", "approval": "task",
  "summary": "Set stage {set.stage} on {count} deal(s)",
  "sql": {"table": "crm.deal", "key": "id", "set": ["stage"], "where": ["tenant", "id", "owner"]}}') IS NOT NULL AS registered \gset
SELECT keyturn.grant_tool('acme', 'alice', 'deal_stage_task') IS NOT NULL AS granted \gset

\connect - app_human
BEGIN;
:as_alice
SELECT keyturn.record_request('c-task', 't-1', 'm-1', encode(sha256(convert_to('move 102 to won', 'UTF8')), 'hex')) AS recorded \gset
COMMIT;
SELECT citus_check.expect('record_request, as it is: recorded', :'recorded', 't');

\connect - app_agent
BEGIN;
:as_alice
SELECT action_id AS t1, status AS t1_status FROM keyturn.propose_for('acme', 'deal_stage_task',
  '{"where": {"tenant": "acme", "id": 102, "owner": "alice"}, "set": {"stage": "won"}}',
  '{"conversation_id": "c-task", "turn_id": "t-1", "message_id": "m-1", "assistant_message_id": "a-1"}') \gset
COMMIT;
BEGIN;
:as_alice
SELECT action_id AS t1_again FROM keyturn.propose_for('acme', 'deal_stage_task',
  '{"where": {"tenant": "acme", "id": 102, "owner": "alice"}, "set": {"stage": "won"}}',
  '{"conversation_id": "c-task", "turn_id": "t-1", "message_id": "m-1", "assistant_message_id": "a-1"}') \gset
COMMIT;

\set ON_ERROR_STOP off
BEGIN;
:as_alice
\set LAST_ERROR_SQLSTATE ''
SELECT * FROM keyturn.propose_for('acme', 'deal_stage_task',
  '{"where": {"tenant": "acme", "id": 102, "owner": "alice"}, "set": {"stage": "lost"}}',
  '{"conversation_id": "c-task", "turn_id": "t-1", "message_id": "m-never", "assistant_message_id": "a-2"}');
ROLLBACK;
\set ON_ERROR_STOP on

\connect - postgres
SELECT citus_check.expect('the task call, delegated: approved at once and written',
    :'t1_status' || ' ' || (SELECT stage FROM crm.deal WHERE tenant = 'acme' AND id = 102), 'succeeded won');
SELECT citus_check.expect('the same call again is the same action', :'t1_again', :'t1');
SELECT citus_check.expect('a call no recorded request covers: 42501', :'LAST_ERROR_SQLSTATE', '42501');
-- Both events are the agent's call's, as on one node: the request, not a
-- separate approval, admitted it.
SELECT citus_check.expect('its events, keyturn''s own on the worker',
    (SELECT string_agg(to_status::text || ':' || db_role, ' ' ORDER BY id) FROM keyturn.event
      WHERE tenant = 'acme' AND action_id = :'t1'),
    'pending:app_agent succeeded:app_agent');
SELECT citus_check.expect('approved by the role that recorded the request',
    (SELECT approved_role || ' ' || approved_via FROM keyturn.action WHERE tenant = 'acme' AND id = :'t1'),
    'app_human task:m-1');

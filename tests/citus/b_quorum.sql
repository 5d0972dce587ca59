-- Layout B, quorum votes (docs/sql-api.md, "Quorum votes"): a tool that
-- needs two approvers. Each approve_for, delegated to acme's worker, records
-- one vote there; the same voter again is no second vote; the vote that
-- completes the quorum claims the action, and the events are keyturn's own.

\connect - postgres
\set ON_ERROR_STOP on
\set as_alice 'SET LOCAL citus.propagate_set_commands = ''local''; SET LOCAL keyturn.tenant = ''acme''; SET LOCAL keyturn.principal = ''alice''; SET LOCAL keyturn.session = ''s-q'';'
\set as_anna 'SET LOCAL citus.propagate_set_commands = ''local''; SET LOCAL keyturn.tenant = ''acme''; SET LOCAL keyturn.principal = ''anna''; SET LOCAL keyturn.session = ''s-q'';'
\set as_bert 'SET LOCAL citus.propagate_set_commands = ''local''; SET LOCAL keyturn.tenant = ''acme''; SET LOCAL keyturn.principal = ''bert''; SET LOCAL keyturn.session = ''s-q'';'

\connect - app_admin
-- A provider no keyturnd of the layer has: the queued action stays queued,
-- out of the way of b_keyturnd's deliveries and b_rpc's hand lease.
SELECT keyturn.register_tool('notify_quorum', '{
  "executor": "external", "provider": "ledger", "effect": "irreversible",
  "approval": "independent", "quorum": 2,
  "params_schema": {"type": "object", "required": ["channel", "text"],
                    "properties": {"channel": {"type": "string"}, "text": {"type": "string"}}}}') IS NOT NULL AS registered \gset
SELECT count(keyturn.add_member('acme', p, 'approver')) AS added FROM unnest(ARRAY['anna', 'bert']) p \gset
SELECT count(keyturn.grant_tool('acme', p, 'notify_quorum')) AS granted FROM unnest(ARRAY['alice', 'anna', 'bert']) p \gset

\connect - app_agent
BEGIN;
:as_alice
SELECT action_id AS q, token AS q_token FROM keyturn.propose_for('acme', 'notify_quorum',
  '{"channel": "ops", "text": "two approvers"}', '{}') \gset
COMMIT;

\connect - app_human
BEGIN;
:as_anna
SELECT status || ' ' || result::text AS v1 FROM keyturn.approve_for('acme', :'q', :'q_token') \gset
COMMIT;
BEGIN;
:as_anna
SELECT status || ' ' || result::text AS v1_again FROM keyturn.approve_for('acme', :'q', :'q_token') \gset
COMMIT;
BEGIN;
:as_bert
SELECT status AS v2 FROM keyturn.approve_for('acme', :'q', :'q_token') \gset
COMMIT;

\connect - postgres
SELECT citus_check.expect('the first vote, on acme''s worker: pending, one of two', :'v1',
    'pending {"votes": 1, "quorum": 2}');
SELECT citus_check.expect('the same voter again is no second vote', :'v1_again',
    'pending {"votes": 1, "quorum": 2}');
SELECT citus_check.expect('the second approver''s vote completes the quorum: queued', :'v2', 'queued');
SELECT citus_check.expect('two votes, each its voter''s',
    (SELECT string_agg(principal, ' ' ORDER BY principal) FROM keyturn.vote WHERE tenant = 'acme' AND action_id = :'q'),
    'anna bert');
SELECT citus_check.expect('its events, keyturn''s own on the worker: the proposal, one per new vote, the claim',
    (SELECT string_agg(format('%s:%s:%s', to_status, db_role, principal), ' ' ORDER BY id) FROM keyturn.event
      WHERE tenant = 'acme' AND action_id = :'q'),
    'pending:app_agent:alice pending:app_human:anna pending:app_human:bert queued:app_human:bert');

-- Layout B with keyturnd running (tests/citus/keyturnd.sh starts it against
-- the coordinator, with a webhook receiver): keyturnd asks the database to
-- dispatch by tenant, and delivers each tenant's approved notifications
-- with the tenant-explicit calls; its sweep expires a tenant's stale
-- proposal. A provider keyturnd lacks ('pager') is leased here by hand and
-- left uncertain, for the operator command the shell part runs after.

\connect - postgres
\set ON_ERROR_STOP on
\set as_alice 'SET LOCAL citus.propagate_set_commands = ''local''; SET LOCAL keyturn.tenant = ''acme''; SET LOCAL keyturn.principal = ''alice''; SET LOCAL keyturn.session = ''s1'';'
\set as_gina 'SET LOCAL citus.propagate_set_commands = ''local''; SET LOCAL keyturn.tenant = ''globex''; SET LOCAL keyturn.principal = ''gina''; SET LOCAL keyturn.session = ''s1'';'

\connect - app_admin
SELECT keyturn.register_tool('deal_stage_brief_routed', '{
  "executor": "sql", "effect": "reversible", "expires_in": "1 second",
  "sql": {"table": "crm.deal", "key": "id", "set": ["stage"], "where": ["tenant", "id"]}}') IS NOT NULL AS registered \gset
SELECT keyturn.register_tool('page_oncall', '{
  "executor": "external", "provider": "pager", "effect": "irreversible",
  "params_schema": {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}}') IS NOT NULL AS registered \gset
SELECT count(keyturn.grant_tool(t, p, tool)) AS granted
  FROM (VALUES ('acme', 'alice'), ('globex', 'gina')) AS m (t, p),
       unnest(ARRAY['deal_stage_brief_routed', 'page_oncall']) AS tool \gset

\connect - app_agent
BEGIN;
:as_alice
SELECT action_id AS k1, token AS k1_token FROM keyturn.propose_for('acme', 'notify',
  '{"channel": "ops", "text": "by keyturnd, acme"}', '{}') \gset
SELECT action_id AS stale FROM keyturn.propose_for('acme', 'deal_stage_brief_routed',
  '{"where": {"tenant": "acme", "id": 106}, "set": {"stage": "won"}}', '{}') \gset
SELECT action_id AS p1, token AS p1_token FROM keyturn.propose_for('acme', 'page_oncall', '{"text": "wake up"}', '{}') \gset
COMMIT;
BEGIN;
:as_gina
SELECT action_id AS k2, token AS k2_token FROM keyturn.propose_for('globex', 'notify',
  '{"channel": "ops", "text": "by keyturnd, globex"}', '{}') \gset
COMMIT;
\connect - app_human
BEGIN;
:as_alice
SELECT status AS s1 FROM keyturn.approve_for('acme', :'k1', :'k1_token') \gset
SELECT status AS s3 FROM keyturn.approve_for('acme', :'p1', :'p1_token') \gset
COMMIT;
BEGIN;
:as_gina
SELECT status AS s2 FROM keyturn.approve_for('globex', :'k2', :'k2_token') \gset
COMMIT;
SELECT citus_check.expect('approved on their workers: queued', :'s1' || ' ' || :'s2' || ' ' || :'s3', 'queued queued queued');

-- keyturnd delivers both; its sweep expires the stale proposal. Each wait
-- is for a state, bounded by the layer's statement_timeout.
\connect - postgres
SELECT set_config('kt.k1', :'k1', false), set_config('kt.k2', :'k2', false), set_config('kt.stale', :'stale', false) \gset
DO $$
DECLARE
    k1    uuid := current_setting('kt.k1');
    k2    uuid := current_setting('kt.k2');
    stale uuid := current_setting('kt.stale');
BEGIN
    WHILE (SELECT count(*) FROM keyturn.action WHERE id IN (k1, k2) AND status = 'succeeded') < 2
          OR (SELECT status FROM keyturn.action WHERE tenant = 'acme' AND id = stale) <> 'expired' LOOP
        PERFORM pg_sleep(0.1);
    END LOOP;
END
$$;
SELECT citus_check.expect('keyturnd delivered both tenants'' notifications, each on its worker',
    (SELECT string_agg(tenant || ':' || status, ' ' ORDER BY tenant) FROM keyturn.action WHERE id IN (:'k1', :'k2')),
    'acme:succeeded globex:succeeded');
SELECT citus_check.expect('with keyturn''s own events',
    (SELECT string_agg(to_status::text || ':' || db_role, ' ' ORDER BY id) FROM keyturn.event
      WHERE tenant = 'globex' AND action_id = :'k2'),
    'pending:app_agent queued:app_human leased:app_dispatcher executing:app_dispatcher succeeded:app_dispatcher');
SELECT citus_check.expect('one attempt each, its outcome the receiver''s',
    (SELECT string_agg(format('%s:%s', attempt, outcome), ' ') FROM keyturn.attempt WHERE action_id IN (:'k1', :'k2')),
    '1:succeeded 1:succeeded');
SELECT citus_check.expect('keyturnd''s sweep expired the stale proposal',
    (SELECT string_agg(to_status::text || ':' || db_role, ' ' ORDER BY id) FROM keyturn.event
      WHERE tenant = 'acme' AND action_id = :'stale'),
    'pending:app_agent expired:app_dispatcher');
SELECT citus_check.expect('keyturnd never leased the pager job it has no adapter for',
    (SELECT status::text FROM keyturn.action WHERE tenant = 'acme' AND id = :'p1'), 'queued');

-- The pager job, by hand: leased, begun, its outcome unknown.
\connect - app_dispatcher
BEGIN;
SELECT action_id AS pl, lease_id AS pl_lease FROM keyturn.lease_for('acme', 'by-hand', 1, '30 seconds', '{pager}') \gset
SELECT keyturn.begin_dispatch_for('acme', :'pl', :'pl_lease') AS p_begun \gset
COMMIT;
SELECT keyturn.complete_for('acme', :'pl', :'pl_lease', 'unknown') AS p_status \gset
SELECT citus_check.expect('the pager job is uncertain', :'pl' || ' ' || :'p_begun' || ' ' || :'p_status',
    :'p1' || ' t uncertain');
\echo UNCERTAIN :pl

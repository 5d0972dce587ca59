-- The two keys, end to end, as an application wires them: one NOINHERIT
-- login (setup.sql) switches per request to an agent role, which proposes,
-- and to a human role, which approves; the business row changes under RLS.
-- Identity is transaction-local, as a pooled application asserts it.
\set VERBOSITY terse
\c - rg_auth
BEGIN;
SET LOCAL ROLE rg_admin;
SELECT keyturn.add_member('acme', 'alice', 'member');
SELECT keyturn.register_tool('rg_stage', '{"executor": "sql", "summary": "Set stage {set.stage} on {count} deal(s)",
  "sql": {"table": "public.rg_deal", "key": "id", "set": ["stage"], "where": ["id", "stage"]}}');
SELECT keyturn.grant_tool('acme', 'alice', 'rg_stage');
RESET ROLE;
SET LOCAL keyturn.tenant = 'acme';
SET LOCAL keyturn.principal = 'alice';
SET LOCAL keyturn.session = 'web-1';

-- The agent proposes; the form's filter sees only acme's rows (RLS), so 2 targets.
SET LOCAL ROLE rg_agent;
SELECT action_id, token, summary FROM keyturn.propose('rg_stage', '{"where": {"stage": "lead"}, "set": {"stage": "won"}}') \gset
SELECT :'summary' AS summary;
-- An agent never approves.
SAVEPOINT agent_tries;
SELECT status FROM keyturn.approve(:'action_id', :'token');
ROLLBACK TO agent_tries;
RESET ROLE;

-- The human sees the card, then approves once; the second call is a replay.
SET LOCAL ROLE rg_human;
SELECT keyturn.preview(:'action_id', :'token') -> 'targets' AS targets;
SAVEPOINT wrong_token;
SELECT status FROM keyturn.approve(:'action_id', 'wrong-token');
ROLLBACK TO wrong_token;
SELECT status, result FROM keyturn.approve(:'action_id', :'token');
SELECT status, result FROM keyturn.approve(:'action_id', :'token');
SELECT tool, status, summary, attempts FROM keyturn.action_status(:'action_id');
-- Events join their tenant's hash chain at COMMIT (docs/audit.md); until
-- then audit() shows this transaction (rolled back below) its own.
-- The MACs an event commits to are under this database's own key: shown
-- by name, not value.
SELECT db_role, principal, from_status, to_status,
       detail - ARRAY['params_mac', 'approval_mac', 'result_mac', 'receipt_mac'] AS detail,
       ARRAY(SELECT k FROM jsonb_object_keys(detail) k WHERE k LIKE '%\_mac' ORDER BY k) AS macs
  FROM keyturn.audit(:'action_id');
SELECT id, tenant, stage FROM public.rg_deal ORDER BY id;
SELECT count(*) AS usage_rows FROM keyturn.usage WHERE action_id = :'action_id';
RESET ROLE;
ROLLBACK;

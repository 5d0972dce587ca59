-- The two keys, end to end, as an application wires them: an agent role
-- proposes, a human role approves, the business row changes under RLS.
\set VERBOSITY terse
BEGIN;
CREATE ROLE rg_agent IN ROLE keyturn_agent;
CREATE ROLE rg_human IN ROLE keyturn_approver;
CREATE TABLE public.rg_deal (id int PRIMARY KEY, tenant text NOT NULL, stage text NOT NULL);
ALTER TABLE public.rg_deal ENABLE ROW LEVEL SECURITY;
CREATE POLICY rg_deal_tenant ON public.rg_deal USING (tenant = keyturn.current_tenant());
GRANT SELECT ON public.rg_deal TO rg_agent;
GRANT SELECT, UPDATE ON public.rg_deal TO rg_human;
INSERT INTO public.rg_deal VALUES (1, 'acme', 'lead'), (2, 'acme', 'lead'), (3, 'globex', 'lead');
SELECT keyturn.add_member('acme', 'alice', 'member');
SELECT keyturn.register_tool('rg_stage', '{"executor": "sql", "summary": "Set stage {set.stage} on {count} deal(s)",
  "sql": {"table": "public.rg_deal", "key": "id", "set": ["stage"], "where": ["id", "stage"]}}');
SELECT keyturn.grant_tool('acme', 'alice', 'rg_stage');
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
SELECT db_role, principal, from_status, to_status, detail FROM keyturn.audit(:'action_id');
RESET ROLE;
SELECT id, tenant, stage FROM public.rg_deal ORDER BY id;
SELECT count(*) AS usage_rows FROM keyturn.usage WHERE action_id = :'action_id';
ROLLBACK;

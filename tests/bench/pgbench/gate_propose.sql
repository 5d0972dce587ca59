-- Item latency, A propose: the gate flow's first transaction alone
-- (gate_flow.sql, tx 1): propose of the sql tool as app_agent, identity with
-- set_config(…, true). Per-transaction latency from pgbench -l.
\set deal random(1, 100000)
\set s random(1, 4)
BEGIN;
SET LOCAL ROLE app_agent;
SELECT set_config('keyturn.tenant', 'acme', true), set_config('keyturn.principal', 'p' || :client_id::text, true), set_config('keyturn.session', 's' || :client_id::text, true);
SELECT action_id, token FROM keyturn.propose('deal.set_stage', jsonb_build_object('where', jsonb_build_object('id', :deal::bigint), 'set', jsonb_build_object('stage', (ARRAY['lead', 'qualified', 'negotiation', 'won'])[:s::int]))) \gset
COMMIT;

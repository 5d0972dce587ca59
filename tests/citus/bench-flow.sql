-- tests/citus/bench: propose then approve of an sql tool, two transactions, as
-- an app would (tests/bench/pgbench/gate_flow.sql), a tenant and a deal at
-- random. The tool is pgbench's variable tool (-D tool=...): deal.set_stage
-- names the tenant in the form, deal.set_stage_anywhere does not. Identity as
-- PostgREST asserts it, set_config(..., true): on Citus keyturn re-asserts it
-- for the workers.
\set t random(1, 16)
\set deal random(1, 1250)
\set s random(1, 4)
BEGIN;
SET LOCAL ROLE app_agent;
SELECT set_config('keyturn.tenant', 't' || :t, true), set_config('keyturn.principal', 'p' || (:deal % 16), true), set_config('keyturn.session', 's' || :client_id, true);
SELECT action_id, token FROM keyturn.propose(:tool, jsonb_build_object('where', jsonb_build_object('id', :deal::bigint) || CASE WHEN :tool = 'deal.set_stage' THEN jsonb_build_object('tenant', 't' || :t) ELSE '{}' END, 'set', jsonb_build_object('stage', (ARRAY['lead', 'qualified', 'negotiation', 'won'])[:s::int]))) \gset
COMMIT;
BEGIN;
SET LOCAL ROLE app_human;
SELECT set_config('keyturn.tenant', 't' || :t, true), set_config('keyturn.principal', 'p' || (:deal % 16), true), set_config('keyturn.session', 's' || :client_id, true);
SELECT status FROM keyturn.approve(:action_id::uuid, :token::text) \gset
COMMIT;

-- Item chain, B: the gate flow (gate_flow.sql) with a tenant per client
-- (m<client>, setup.sql), so no two clients' commits wait for one audit chain.
\set deal 200000 + :client_id * 2000 + random(1, 2000)
\set s random(1, 4)
BEGIN;
SET LOCAL ROLE app_agent;
SELECT set_config('keyturn.tenant', 'm' || :client_id::text, true), set_config('keyturn.principal', 'p' || :client_id::text, true), set_config('keyturn.session', 's' || :client_id::text, true);
SELECT action_id, token FROM keyturn.propose('deal.set_stage', jsonb_build_object('where', jsonb_build_object('id', :deal::bigint), 'set', jsonb_build_object('stage', (ARRAY['lead', 'qualified', 'negotiation', 'won'])[:s::int]))) \gset
COMMIT;
BEGIN;
SET LOCAL ROLE app_human;
SELECT set_config('keyturn.tenant', 'm' || :client_id::text, true), set_config('keyturn.principal', 'p' || :client_id::text, true), set_config('keyturn.session', 's' || :client_id::text, true);
SELECT status FROM keyturn.approve(:action_id::uuid, :token::text) \gset
COMMIT;

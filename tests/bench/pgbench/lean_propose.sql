-- Item latency, B propose: the lean flow's first transaction alone
-- (lean_flow.sql, tx 1): one INSERT of the proposal with a sha256 of the
-- params, as bench_lean (no role switch, no identity, RLS bypassed).
\set deal random(1, 100000)
\set s random(1, 4)
BEGIN;
WITH p AS (SELECT jsonb_build_object('where', jsonb_build_object('id', :deal::bigint), 'set', jsonb_build_object('stage', (ARRAY['lead', 'qualified', 'negotiation', 'won'])[:s::int])) AS params)
INSERT INTO bare.proposal (tenant, principal, tool, params, params_hash)
SELECT 'acme', 'p' || :client_id::text, 'deal.set_stage', p.params, encode(sha256(convert_to(p.params::text, 'UTF8')), 'hex') FROM p
RETURNING id AS proposal_id \gset
COMMIT;

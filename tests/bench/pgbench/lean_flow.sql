-- Item 1b, B: the leanest hand-written flow: one INSERT with a sha256 of the
-- params, one conditional claim UPDATE, the business UPDATE, one event
-- INSERT; no role switching and no identity settings (bench_lean bypasses
-- row-level security instead), so it is what the gate's checks cost at most.
\set deal random(1, 100000)
\set s random(1, 4)
BEGIN;
WITH p AS (SELECT jsonb_build_object('where', jsonb_build_object('id', :deal::bigint), 'set', jsonb_build_object('stage', (ARRAY['lead', 'qualified', 'negotiation', 'won'])[:s::int])) AS params)
INSERT INTO bare.proposal (tenant, principal, tool, params, params_hash)
SELECT 'acme', 'p' || :client_id::text, 'deal.set_stage', p.params, encode(sha256(convert_to(p.params::text, 'UTF8')), 'hex') FROM p
RETURNING id AS proposal_id \gset
COMMIT;
BEGIN;
UPDATE bare.proposal SET status = 'approved', approved_by = 'p' || :client_id::text, approved_at = now() WHERE id = :proposal_id::uuid AND status = 'pending' RETURNING params -> 'where' ->> 'id' AS target, params -> 'set' ->> 'stage' AS stage \gset
UPDATE crm.deal SET stage = :stage::text WHERE id = :target::bigint;
INSERT INTO bare.event (proposal_id, tenant, principal, to_status) VALUES (:proposal_id::uuid, 'acme', 'p' || :client_id::text, 'succeeded');
COMMIT;

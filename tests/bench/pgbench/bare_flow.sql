-- Item 1, B: the same work written plainly. Proposal row with a sha256 of the
-- params; conditional UPDATE claim, business UPDATE, event INSERT.
\set deal random(1, 100000)
\set s random(1, 4)
BEGIN;
SET LOCAL ROLE app_agent;
SELECT set_config('keyturn.tenant', 'acme', true), set_config('keyturn.principal', 'p' || :client_id::text, true), set_config('keyturn.session', 's' || :client_id::text, true);
WITH p AS (SELECT jsonb_build_object('where', jsonb_build_object('id', :deal::bigint), 'set', jsonb_build_object('stage', (ARRAY['lead', 'qualified', 'negotiation', 'won'])[:s::int])) AS params)
INSERT INTO bare.proposal (tenant, principal, tool, params, params_hash)
SELECT current_setting('keyturn.tenant'), current_setting('keyturn.principal'), 'deal.set_stage', p.params, encode(sha256(convert_to(p.params::text, 'UTF8')), 'hex') FROM p
RETURNING id AS proposal_id \gset
COMMIT;
BEGIN;
SET LOCAL ROLE app_human;
SELECT set_config('keyturn.tenant', 'acme', true), set_config('keyturn.principal', 'p' || :client_id::text, true), set_config('keyturn.session', 's' || :client_id::text, true);
UPDATE bare.proposal SET status = 'approved', approved_by = current_setting('keyturn.principal'), approved_at = now() WHERE id = :proposal_id::uuid AND status = 'pending' RETURNING params -> 'where' ->> 'id' AS target, params -> 'set' ->> 'stage' AS stage \gset
UPDATE crm.deal SET stage = :stage::text WHERE id = :target::bigint;
INSERT INTO bare.event (proposal_id, tenant, principal, to_status) VALUES (:proposal_id::uuid, current_setting('keyturn.tenant'), current_setting('keyturn.principal'), 'succeeded');
COMMIT;

-- Item latency, B approve: the lean flow's claim-and-write transaction alone
-- (lean_flow.sql, tx 2) for the next of this client's pending proposals,
-- inserted before the timed run and listed in bare.pending (see
-- gate_approve.sql); run as bench_lean with -D k=0 and -t <how many>.
\set k :k + 1
BEGIN;
UPDATE bare.proposal SET status = 'approved', approved_by = 'p' || :client_id::text, approved_at = now() WHERE id = (SELECT action_id FROM bare.pending WHERE side = 'lean' AND client = :client_id AND k = :k) AND status = 'pending' RETURNING id AS proposal_id, params -> 'where' ->> 'id' AS target, params -> 'set' ->> 'stage' AS stage \gset
UPDATE crm.deal SET stage = :stage::text WHERE id = :target::bigint;
INSERT INTO bare.event (proposal_id, tenant, principal, to_status) VALUES (:proposal_id::uuid, 'acme', 'p' || :client_id::text, 'succeeded');
COMMIT;

-- Item latency, A approve: the gate flow's second transaction alone
-- (gate_flow.sql, tx 2), approving the next of this client's pending
-- proposals. tests/bench/latency.sh proposed them before the timed run, as
-- p<client>/s<client>, one deal each, and kept (client, k, action_id, token)
-- in bare.pending; run with -D k=0 and -t <how many it made>. The one primary
-- key probe of bare.pending is in the approve statement; the lean side
-- (lean_approve.sql) makes the same probe in its claim.
\set k :k + 1
BEGIN;
SET LOCAL ROLE app_human;
SELECT set_config('keyturn.tenant', 'acme', true), set_config('keyturn.principal', 'p' || :client_id::text, true), set_config('keyturn.session', 's' || :client_id::text, true);
SELECT a.status AS status FROM bare.pending t, LATERAL keyturn.approve(t.action_id, t.token) a WHERE t.side = 'gate' AND t.client = :client_id AND t.k = :k \gset
COMMIT;

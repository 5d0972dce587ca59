-- Layout A, identity as PostgREST asserts it: request.jwt.claims with
-- set_config(..., true), which Citus never propagates. keyturn re-asserts the
-- resolved identity and the claims as propagated SET LOCALs for its own
-- statements, so row-level security on the worker sees the tenant (and the
-- claims); afterwards the caller's keyturn.* settings are as they were.

\connect - app_agent
BEGIN;
SELECT set_config('request.jwt.claims', '{"tenant_id": "globex", "sub": "gina", "session_id": "g1"}', true) IS NOT NULL AS claimed \gset
SELECT count(*) AS plain_read FROM crm.deal \gset
SELECT action_id, token, summary FROM keyturn.propose('deal_stage_routed',
  '{"where": {"tenant": "globex", "id": 101}, "set": {"stage": "won"}}') \gset
SELECT coalesce(current_setting('keyturn.tenant', true), '') AS tenant_after_propose \gset
COMMIT;
SELECT citus_check.expect('claims: the agent''s own read finds nothing on the workers', :'plain_read', '0');
SELECT citus_check.expect('claims: propose resolved the target', :'summary', 'Set stage won on 1 deal(s)');
SELECT citus_check.expect('claims: propose left keyturn.tenant unset', :'tenant_after_propose', '');

\connect - app_human
BEGIN;
SELECT set_config('request.jwt.claims', '{"tenant_id": "globex", "sub": "gina", "session_id": "g1"}', true) IS NOT NULL AS claimed \gset
SELECT keyturn.preview(:'action_id', :'token') -> 'targets' -> 0 -> 'before' ->> 'stage' AS before \gset
SELECT status, result::text AS result FROM keyturn.approve(:'action_id', :'token') \gset
SELECT coalesce(current_setting('keyturn.tenant', true), '') AS tenant_after,
       coalesce(current_setting('keyturn.principal', true), '') AS principal_after,
       keyturn.current_tenant() AS resolved_after \gset
COMMIT;
SELECT citus_check.expect('claims: preview read the row on a worker', :'before', 'lead');
SELECT citus_check.expect('claims: approve succeeded', :'status', 'succeeded');
SELECT citus_check.expect('claims: keyturn.tenant put back', :'tenant_after', '');
SELECT citus_check.expect('claims: keyturn.principal put back', :'principal_after', '');
SELECT citus_check.expect('claims: identity still from the claims', :'resolved_after', 'globex');

\connect - postgres
SELECT stage, last_by, last_tenant, last_port::text AS last_port, last_claims::jsonb ->> 'sub' AS claimed_sub
  FROM crm.deal WHERE tenant = 'globex' AND id = 101 \gset
SELECT citus_check.expect('claims: written', :'stage', 'won');
SELECT citus_check.expect('claims: as the approving role', :'last_by', 'app_human');
SELECT citus_check.expect('claims: row-level security on the worker saw the tenant', :'last_tenant', 'globex');
SELECT citus_check.expect('claims: the worker saw the claims', :'claimed_sub', 'gina');
SELECT citus_check.expect('claims: on a worker', (:'last_port' IN (:'w1', :'w2'))::text, 'true');

-- Identity that is not transaction-local is refused on the coordinator
-- before anything reaches a worker, as without Citus.
\connect - app_human
SELECT set_config('request.jwt.claims', '{"tenant_id": "globex", "sub": "gina", "session_id": "g1"}', false) IS NOT NULL AS claimed \gset
\set ON_ERROR_STOP off
SELECT * FROM keyturn.approve(:'action_id', :'token');
\set ON_ERROR_STOP on
SELECT citus_check.expect('session-level claims refused', :'LAST_ERROR_SQLSTATE', '42501');

-- Layout A: the application's own statements on distributed tables (an
-- agent's read of its deals under RLS) see no identity on the workers when
-- it is asserted with set_config, as PostgREST does. The recipe of
-- docs/scale-out.md: a pre-request function that asserts the claims again
-- as a propagated SET LOCAL.

\connect - postgres
CREATE SCHEMA app;
CREATE FUNCTION app.citus_identity() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM set_config('citus.propagate_set_commands', 'local', true);
    EXECUTE format('SET LOCAL request.jwt.claims = %L', current_setting('request.jwt.claims', true));
END
$$;
GRANT USAGE ON SCHEMA app TO app_agent;

\connect - app_agent
BEGIN;
SELECT set_config('request.jwt.claims', '{"tenant_id": "globex", "sub": "gina", "session_id": "g1"}', true) IS NOT NULL AS claimed \gset
SELECT count(*) AS before_recipe FROM crm.deal \gset
SELECT app.citus_identity();
SELECT count(*) AS after_recipe, string_agg(DISTINCT tenant, ',') AS tenants FROM crm.deal \gset
COMMIT;
SELECT citus_check.expect('app: set_config claims do not reach the workers', :'before_recipe', '0');
SELECT citus_check.expect('app: after the pre-request function they do', :'after_recipe', '2');
SELECT citus_check.expect('app: and only the claimed tenant''s rows', :'tenants', 'globex');

-- SET LOCAL with propagation on, the other way (docs/scale-out.md).
\connect - app_agent
BEGIN;
SET LOCAL citus.propagate_set_commands = 'local';
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT count(*) AS set_local_read FROM crm.deal \gset
COMMIT;
SELECT citus_check.expect('app: SET LOCAL with propagation reaches the workers', :'set_local_read', '6');

-- Nothing outlives the transaction: the next one on the same connection
-- sees no tenant on the workers.
\connect - app_agent
BEGIN;
SET LOCAL citus.propagate_set_commands = 'local';
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT count(*) AS first_tx FROM crm.deal \gset
COMMIT;
SELECT count(*) AS next_tx FROM crm.deal \gset
SELECT citus_check.expect('app: the first transaction saw its rows', :'first_tx', '6');
SELECT citus_check.expect('app: the next one, on the same connection, none', :'next_tx', '0');

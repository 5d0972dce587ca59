-- Layout A: register_tool refuses what cannot work on a distributed table,
-- check_deployment reports the gated tables' routing and triggers, Citus's
-- propagation setting, and workers whose pg_keyturn or identity settings
-- differ from the coordinator's.

\connect - postgres
CREATE TABLE crm.visit (
    tenant  text NOT NULL,
    at      timestamptz NOT NULL,
    id      bigint NOT NULL,
    note    text,
    PRIMARY KEY (tenant, id)
);
SELECT create_distributed_table('crm.visit', 'tenant', colocate_with => 'crm.deal') IS NOT NULL AS distributed \gset
ALTER TABLE crm.visit ENABLE ROW LEVEL SECURITY;
GRANT SELECT ON crm.visit TO app_agent;
GRANT SELECT, UPDATE ON crm.visit TO app_human;

\connect - app_admin
\set ON_ERROR_STOP off
SELECT keyturn.register_tool('visit_move', '{"executor": "sql",
  "sql": {"table": "crm.visit", "key": "id", "set": ["note", "tenant"], "where": ["id"]}}');
\set ON_ERROR_STOP on
SELECT citus_check.expect('register: the distribution column in set is refused', :'LAST_ERROR_SQLSTATE', '22023');
SELECT citus_check.expect('register: the message names it',
    (:'LAST_ERROR_MESSAGE' LIKE '%spec.sql.set names tenant, the distribution column of crm.visit%')::text, 'true');
\set ON_ERROR_STOP off
SELECT keyturn.register_tool('visit_note', '{"executor": "sql",
  "sql": {"table": "crm.visit", "key": "at", "set": ["note"], "where": ["at"]}}');
\set ON_ERROR_STOP on
SELECT citus_check.expect('register: a timestamptz key is refused', :'LAST_ERROR_SQLSTATE', '22023');
SELECT citus_check.expect('register: the message says why',
    (:'LAST_ERROR_MESSAGE' LIKE '%key at of distributed table crm.visit is timestamp with time zone%')::text, 'true');
SELECT keyturn.register_tool('visit_note', '{"executor": "sql",
  "sql": {"table": "crm.visit", "key": "id", "set": ["note"], "where": ["tenant", "id"]}}')::text AS registered \gset
SELECT citus_check.expect('register: an integer key, routed, is accepted', :'registered', '1');

-- check_deployment, as the platform admin.
SELECT count(*) FILTER (WHERE object = 'tool deal_stage' AND problem LIKE 'the form cannot name tenant%')::text AS fanned,
       count(*) FILTER (WHERE object IN ('tool deal_stage_routed', 'tool visit_note'))::text AS routed,
       count(*) FILTER (WHERE object = 'crm.deal' AND problem LIKE 'trigger deal_written runs on the workers%')::text AS trig,
       count(*) FILTER (WHERE object = 'setting citus.propagate_set_commands')::text AS propagate,
       count(*) FILTER (WHERE object LIKE 'worker %')::text AS workers
  FROM keyturn.check_deployment() \gset
SELECT citus_check.expect('check: the fanned-out tool is reported', :'fanned', '1');
SELECT citus_check.expect('check: routed tools are not', :'routed', '0');
SELECT citus_check.expect('check: the trigger on the distributed table', :'trig', '1');
SELECT citus_check.expect('check: propagation is not local', :'propagate', '1');
SELECT citus_check.expect('check: the workers agree', :'workers', '0');

-- A worker whose claim path differs: row-level security there would read
-- another claim. (current_tenant() first loads pg_keyturn, which defines
-- the setting ALTER SYSTEM names.)
\connect keyturn postgres 127.0.0.1 :w1
SELECT keyturn.current_tenant() IS NULL AS loaded \gset
ALTER SYSTEM SET keyturn.claim_tenant = 'org_id';
SELECT pg_reload_conf() AS reloaded \gset
\connect keyturn app_admin 127.0.0.1 :c
DO $$
BEGIN
    -- Until the worker has read its configuration again (a state; the
    -- layer's statement_timeout bounds the wait).
    WHILE NOT EXISTS (SELECT 1 FROM keyturn.check_deployment() WHERE object LIKE 'worker %') LOOP
        PERFORM pg_sleep(0.1);
    END LOOP;
END
$$;
SELECT severity, problem LIKE '%|org_id|%' AS names_it FROM keyturn.check_deployment() WHERE object LIKE 'worker %' \gset
SELECT citus_check.expect('check: a worker with another claim path is an error', :'severity', 'error');
SELECT citus_check.expect('check: it shows the setting', :'names_it', 't');
\connect keyturn postgres 127.0.0.1 :w1
SELECT keyturn.current_tenant() IS NULL AS loaded \gset
ALTER SYSTEM RESET keyturn.claim_tenant;
SELECT pg_reload_conf() AS reloaded \gset
\connect keyturn app_admin 127.0.0.1 :c
DO $$
BEGIN
    WHILE EXISTS (SELECT 1 FROM keyturn.check_deployment() WHERE object LIKE 'worker %') LOOP
        PERFORM pg_sleep(0.1);
    END LOOP;
END
$$;
SELECT citus_check.expect('check: agreed again',
    (SELECT count(*)::text FROM keyturn.check_deployment() WHERE object LIKE 'worker %'), '0');
\connect keyturn postgres 127.0.0.1 :c

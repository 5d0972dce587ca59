-- The fixture of tests/citus/bench, the same on a single node and on a Citus
-- coordinator (psql variable citus: on or off): 16 tenants of 1,250 deals,
-- the tenant leading the key, under row-level security; 16 principals per
-- tenant; two tools over it (the form names the tenant, or not). One login,
-- bench_app, plays the application (NOINHERIT, SET LOCAL ROLE to each part),
-- as in tests/bench.

CREATE ROLE app_agent LOGIN IN ROLE keyturn_agent;
CREATE ROLE app_human LOGIN IN ROLE keyturn_approver;
CREATE ROLE app_admin LOGIN IN ROLE keyturn_admin;
CREATE ROLE bench_app LOGIN NOINHERIT IN ROLE app_agent, app_human;

CREATE SCHEMA crm;
CREATE TABLE crm.deal (
    tenant  text   NOT NULL,
    id      bigint NOT NULL,
    owner   text   NOT NULL,
    stage   text   NOT NULL DEFAULT 'lead',
    amount  numeric(12, 2) NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, id)
);
ALTER TABLE crm.deal ENABLE ROW LEVEL SECURITY;
ALTER TABLE crm.deal FORCE ROW LEVEL SECURITY;
CREATE POLICY deal_by_tenant ON crm.deal
    USING (tenant = keyturn.current_tenant()) WITH CHECK (tenant = keyturn.current_tenant());
GRANT USAGE ON SCHEMA crm TO app_agent, app_human;
GRANT SELECT ON crm.deal TO app_agent;
GRANT SELECT, UPDATE ON crm.deal TO app_human;
\if :citus
SELECT create_distributed_table('crm.deal', 'tenant') IS NOT NULL AS distributed \gset
\endif
INSERT INTO crm.deal (tenant, id, owner, amount)
SELECT 't' || t, i, 'p' || (i % 16), 1000 + i % 5000
  FROM generate_series(1, 16) t, generate_series(1, 1250) i;
ANALYZE crm.deal;

\connect - app_admin
SELECT keyturn.register_tool('deal.set_stage', $${
    "executor": "sql", "effect": "reversible", "max_targets": 10,
    "summary": "Set {set.stage} on {count} deal(s)",
    "sql": {"table": "crm.deal", "key": "id", "set": ["stage"], "where": ["tenant", "id"]}}$$) IS NOT NULL AS registered \gset
SELECT keyturn.register_tool('deal.set_stage_anywhere', $${
    "executor": "sql", "effect": "reversible", "max_targets": 10,
    "summary": "Set {set.stage} on {count} deal(s)",
    "sql": {"table": "crm.deal", "key": "id", "set": ["stage"], "where": ["id"]}}$$) IS NOT NULL AS registered \gset
SELECT count(*) AS granted FROM (
    SELECT keyturn.add_member('t' || t, 'p' || p, 'member'),
           keyturn.grant_tool('t' || t, 'p' || p, 'deal.set_stage'),
           keyturn.grant_tool('t' || t, 'p' || p, 'deal.set_stage_anywhere')
      FROM generate_series(1, 16) t, generate_series(0, 15) p) s \gset
\connect - postgres

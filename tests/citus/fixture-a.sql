-- Layout A (docs/scale-out.md): keyturn's tables local on the coordinator, the
-- business table distributed by tenant. Loaded as the superuser on the
-- coordinator of a fresh cluster (tests/citus/lib.sh); Citus propagates the
-- roles, the schema, the policy and the trigger to the workers.

-- The checks every test of the layer uses: a mismatch raises, and the test
-- (run with ON_ERROR_STOP) fails at that line.
CREATE SCHEMA citus_check;
CREATE FUNCTION citus_check.expect(what text, got text, want text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF got IS DISTINCT FROM want THEN
        RAISE EXCEPTION 'citus check "%": got %, want %', what, coalesce(got, 'NULL'), coalesce(want, 'NULL');
    END IF;
    RAISE NOTICE 'ok - %', what;
END
$$;
GRANT USAGE ON SCHEMA citus_check TO PUBLIC;

-- Waits, without a time limit of its own (the layer's statement_timeout is
-- the bound), until clock_timestamp() passes p_at: a state, not a duration.
CREATE FUNCTION citus_check.wait_until(p_at timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    WHILE clock_timestamp() <= p_at LOOP
        PERFORM pg_sleep(0.05);
    END LOOP;
END
$$;

CREATE ROLE app_agent LOGIN IN ROLE keyturn_agent;
CREATE ROLE app_human LOGIN IN ROLE keyturn_approver;
CREATE ROLE app_admin LOGIN IN ROLE keyturn_admin;
CREATE ROLE app_dispatcher LOGIN IN ROLE keyturn_dispatcher;
CREATE ROLE app_operator LOGIN IN ROLE keyturn_operator;

CREATE SCHEMA crm;
-- The tenant leads the primary key: Citus requires every unique key of a
-- distributed table to include its distribution column.
CREATE TABLE crm.deal (
    tenant       text    NOT NULL,
    id           bigint  NOT NULL,
    owner        text    NOT NULL,
    name         text    NOT NULL,
    stage        text    NOT NULL DEFAULT 'lead',
    amount       numeric(12, 2) NOT NULL DEFAULT 0,
    revision     int     NOT NULL DEFAULT 1,
    -- Written by the trigger below, on the worker that holds the row: who
    -- wrote it, which tenant row-level security saw there, on which port.
    last_by      text,
    last_tenant  text,
    last_port    int,
    last_claims  text,
    PRIMARY KEY (tenant, id),
    CONSTRAINT deal_stage_known CHECK (stage IN ('lead', 'qualified', 'negotiation', 'won', 'lost'))
);
ALTER TABLE crm.deal ENABLE ROW LEVEL SECURITY;
ALTER TABLE crm.deal FORCE ROW LEVEL SECURITY;
CREATE POLICY deal_by_tenant ON crm.deal
    USING (tenant = keyturn.current_tenant())
    WITH CHECK (tenant = keyturn.current_tenant());
GRANT USAGE ON SCHEMA crm TO app_agent, app_human;
GRANT SELECT ON crm.deal TO app_agent;
GRANT SELECT, UPDATE ON crm.deal TO app_human;

SELECT create_distributed_table('crm.deal', 'tenant', shard_count => 8);

-- Citus distributes no table with triggers and takes triggers on distributed
-- tables only with citus.enable_unsafe_triggers: this one touches only its own
-- row, so it is safe on a shard.
CREATE FUNCTION crm.note_write() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.revision := OLD.revision + 1;
    NEW.last_by := current_user;
    NEW.last_tenant := keyturn.current_tenant();
    NEW.last_port := inet_server_port();
    NEW.last_claims := current_setting('request.jwt.claims', true);
    RETURN NEW;
END
$$;
SET citus.enable_unsafe_triggers = on;
CREATE TRIGGER deal_written BEFORE UPDATE ON crm.deal
    FOR EACH ROW EXECUTE FUNCTION crm.note_write();
RESET citus.enable_unsafe_triggers;

INSERT INTO crm.deal (tenant, id, owner, name, stage) VALUES
  ('acme', 101, 'alice', 'Northwind renewal', 'qualified'),
  ('acme', 102, 'alice', 'Contoso pilot', 'qualified'),
  ('acme', 103, 'alice', 'Fabrikam expansion', 'lead'),
  ('acme', 104, 'alice', 'Litware upsell', 'lead'),
  ('acme', 105, 'alice', 'Tailspin renewal', 'lead'),
  ('acme', 106, 'alice', 'Wingtip pilot', 'lead'),
  ('globex', 101, 'gina', 'Globex deal', 'lead'),
  ('globex', 102, 'gina', 'Globex follow-up', 'lead');

\connect - app_admin
SELECT keyturn.add_member('acme', 'alice', 'member'), keyturn.add_member('globex', 'gina', 'member');
-- deal_stage: the form may not name the tenant, so every write runs on every
-- shard; deal_stage_routed: the agent names the tenant, and Citus routes it.
SELECT keyturn.register_tool('deal_stage', '{
  "executor": "sql", "effect": "reversible",
  "summary": "Set stage {set.stage} on {count} deal(s)",
  "sql": {"table": "crm.deal", "key": "id", "set": ["stage"], "where": ["id", "owner"]}}');
SELECT keyturn.register_tool('deal_stage_routed', '{
  "executor": "sql", "effect": "reversible",
  "summary": "Set stage {set.stage} on {count} deal(s)",
  "sql": {"table": "crm.deal", "key": "id", "set": ["stage"], "where": ["tenant", "id", "owner"]}}');
SELECT keyturn.register_tool('notify', '{
  "executor": "external", "provider": "webhook", "effect": "irreversible",
  "summary": "Post to #{channel}",
  "params_schema": {"type": "object", "required": ["channel", "text"],
                    "properties": {"channel": {"type": "string", "maxLength": 40},
                                   "text": {"type": "string", "maxLength": 200}}}}');
SELECT keyturn.register_tool('deal_stage_brief', '{
  "executor": "sql", "effect": "reversible", "expires_in": "1 second",
  "sql": {"table": "crm.deal", "key": "id", "set": ["stage"], "where": ["id"]}}');
SELECT keyturn.grant_tool(t, p, tool)
  FROM (VALUES ('acme', 'alice'), ('globex', 'gina')) AS m (t, p),
       unnest(ARRAY['deal_stage', 'deal_stage_routed', 'notify', 'deal_stage_brief']) AS tool;
\connect - postgres

-- Layout B, shard-ready: a prototype cut of keyturn's core (schema ktb, not
-- the extension) that proves the key points of the plan in
-- docs/scale-out.md on the real cluster:
--   1. the tenant leads every primary and foreign key, and keyturn's rows are
--      colocated with the business table: one tenant's rows share a worker;
--   2. tenant-explicit entry points, delegated with create_distributed_function,
--      run a whole approval on that worker: claim, business write as the
--      approving role under RLS, event, in one local transaction (no 2PC);
--   3. Citus refuses volatile functions and subqueries in routed DML, and
--      FOR UPDATE across shards; values computed first, and a tenant filter
--      on every statement by id, are accepted;
--   4. lease per tenant (FOR UPDATE SKIP LOCKED, routed) and sweep per shard
--      (run_command_on_colocated_placements);
--   5. wake-ups: a NOTIFY in the worker's one-phase commit reaches a
--      listener on that worker; PostgreSQL refuses one in a prepared
--      transaction (what Citus's two-phase commit would need);
--   6. OIDs are per node: the prototype keeps role names;
--   7. identity only reaches a delegated call as propagated SET LOCALs;
--   8. a trigger on a shard may write the colocated rows of its own tenant
--      (keyturn's lifecycle trigger writes the event row so); a statement in
--      it without the tenant is refused;
--   9. INSERT ... ON CONFLICT DO UPDATE SET ... now() (keyturn._bump_epoch) is
--      refused; with the value computed first and taken from EXCLUDED it
--      works. (The same statement in a LANGUAGE sql function crashes the
--      coordinator's backend, signal 11, with Citus 13.2.2: docs/scale-out.md
--      shows it; this layer does not run it.)
-- The prototype runs as the caller, with grants on ktb that keyturn's own
-- tables would not give (the role switch of the real extension is the same on
-- a worker as on one node).

\connect - postgres
CREATE EXTENSION IF NOT EXISTS dblink;
CREATE SCHEMA ktb;
GRANT USAGE ON SCHEMA ktb TO app_agent, app_human, app_dispatcher;

-- Global and small, read on every node: a reference table.
CREATE TABLE ktb.tool (name text PRIMARY KEY, executor text NOT NULL);
SELECT create_reference_table('ktb.tool') IS NOT NULL AS ref \gset
INSERT INTO ktb.tool VALUES ('deal_stage', 'sql'), ('notify', 'external');

-- 1. Tenant rows: the tenant leads every key, colocated with crm.deal.
CREATE TABLE ktb.action (
    tenant           text        NOT NULL,
    id               uuid        NOT NULL,
    principal        text        NOT NULL,
    tool             text        NOT NULL REFERENCES ktb.tool (name),
    params           jsonb       NOT NULL,
    token_digest     bytea       NOT NULL,
    status           text        NOT NULL,
    approved_by      text,
    approved_role    text,                     -- a name: OIDs differ per node
    next_attempt_at  timestamptz,
    expires_at       timestamptz NOT NULL,
    lease_id         uuid,
    lease_expires_at timestamptz,
    updated_at       timestamptz NOT NULL,
    PRIMARY KEY (tenant, id)
);
SELECT create_distributed_table('ktb.action', 'tenant', colocate_with => 'crm.deal') IS NOT NULL AS dist \gset
CREATE TABLE ktb.event (
    tenant     text        NOT NULL,
    action_id  uuid        NOT NULL,
    n          int         NOT NULL,
    to_status  text        NOT NULL,
    db_role    text        NOT NULL,
    node       int         NOT NULL,           -- inet_server_port(): where it ran
    at         timestamptz NOT NULL,
    PRIMARY KEY (tenant, action_id, n),
    FOREIGN KEY (tenant, action_id) REFERENCES ktb.action (tenant, id)
);
SELECT create_distributed_table('ktb.event', 'tenant', colocate_with => 'ktb.action') IS NOT NULL AS dist \gset
GRANT SELECT, INSERT, UPDATE ON ktb.action, ktb.event TO app_agent, app_human, app_dispatcher;
GRANT SELECT ON ktb.tool TO app_agent, app_human, app_dispatcher;
SELECT citus_check.expect('b1: colocated with the business table',
    (SELECT count(DISTINCT colocationid)::text FROM pg_dist_partition
      WHERE logicalrelid IN ('crm.deal'::regclass, 'ktb.action'::regclass, 'ktb.event'::regclass)), '1');

-- 2. Tenant-explicit entry points. Volatile values are computed before the
-- statements (Citus refuses them inside DML on a distributed table); every
-- statement names the tenant, so each is routed to the tenant's shard.
CREATE FUNCTION ktb.propose(p_tenant text, p_tool text, p_params jsonb)
RETURNS TABLE (action_id uuid, token text, node int)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id    uuid := gen_random_uuid();
    v_token text := gen_random_uuid()::text;
    v_at    timestamptz := clock_timestamp();
    v_node  int := inet_server_port();
BEGIN
    IF p_tenant IS DISTINCT FROM keyturn.current_tenant() THEN
        RAISE EXCEPTION 'ktb: tenant % is not the caller''s (%)', p_tenant, coalesce(keyturn.current_tenant(), 'no identity')
            USING ERRCODE = '42501';
    END IF;
    INSERT INTO ktb.action (tenant, id, principal, tool, params, token_digest, status, expires_at, updated_at)
    VALUES (p_tenant, v_id, keyturn.current_principal(), p_tool, p_params, sha256(convert_to(v_token, 'UTF8')),
            'pending', v_at + interval '15 minutes', v_at);
    INSERT INTO ktb.event VALUES (p_tenant, v_id, 1, 'pending', current_user, v_node, v_at);
    RETURN QUERY SELECT v_id, v_token, v_node;
END
$$;

CREATE FUNCTION ktb.approve(p_tenant text, p_id uuid, p_token text)
RETURNS TABLE (status text, node int)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_at    timestamptz := clock_timestamp();
    v_node  int := inet_server_port();
    v_role  text := current_user;
    v_tool  ktb.tool;
    a       ktb.action;
    v_rows  int;
    v_to    text;
BEGIN
    IF p_tenant IS DISTINCT FROM keyturn.current_tenant() THEN
        RAISE EXCEPTION 'ktb: tenant % is not the caller''s (%)', p_tenant, coalesce(keyturn.current_tenant(), 'no identity')
            USING ERRCODE = '42501';
    END IF;
    -- The claim: one conditional UPDATE, by (tenant, id).
    UPDATE ktb.action x SET status = 'approving', approved_by = keyturn.current_principal(),
                            approved_role = v_role, updated_at = v_at
     WHERE x.tenant = p_tenant AND x.id = p_id AND x.status = 'pending'
       AND x.token_digest = sha256(convert_to(p_token, 'UTF8'))
    RETURNING x.* INTO a;
    IF a.id IS NULL THEN
        RETURN QUERY SELECT x.status, v_node FROM ktb.action x WHERE x.tenant = p_tenant AND x.id = p_id;
        RETURN;
    END IF;
    SELECT t.* INTO v_tool FROM ktb.tool t WHERE t.name = a.tool;
    IF v_tool.executor = 'sql' THEN
        -- The business write, on the same worker, as the approving role
        -- under RLS (which sees the propagated identity).
        UPDATE crm.deal t SET stage = a.params -> 'set' ->> 'stage'
         WHERE t.tenant = p_tenant AND t.id = (a.params -> 'where' ->> 'id')::bigint;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        v_to := CASE WHEN v_rows = 1 THEN 'succeeded' ELSE 'conflict' END;
    ELSE
        v_to := 'queued';
        -- 5. The dispatcher's wake-up, on this worker, in its one-phase commit.
        PERFORM pg_notify('ktb_dispatch', p_tenant);
    END IF;
    UPDATE ktb.action x SET status = v_to, updated_at = v_at,
                            next_attempt_at = CASE WHEN v_to = 'queued' THEN v_at END
     WHERE x.tenant = p_tenant AND x.id = p_id;
    INSERT INTO ktb.event VALUES (p_tenant, p_id, 2, v_to, v_role, v_node, v_at);
    RETURN QUERY SELECT v_to, v_node;
END
$$;

-- 4. Lease per tenant: FOR UPDATE SKIP LOCKED is accepted on a routed query.
CREATE FUNCTION ktb.lease(p_tenant text, p_worker text, p_max int)
RETURNS TABLE (action_id uuid, lease_id uuid, node int)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_at    timestamptz := clock_timestamp();
    v_lease uuid := gen_random_uuid();
    v_node  int := inet_server_port();
    v_id    uuid;
BEGIN
    FOR v_id IN
        SELECT x.id FROM ktb.action x
         WHERE x.tenant = p_tenant AND x.status = 'queued' AND x.next_attempt_at <= v_at
         ORDER BY x.next_attempt_at, x.id LIMIT p_max
           FOR UPDATE SKIP LOCKED
    LOOP
        UPDATE ktb.action x SET status = 'leased', lease_id = v_lease,
                                lease_expires_at = v_at + interval '30 seconds', updated_at = v_at
         WHERE x.tenant = p_tenant AND x.id = v_id;
        action_id := v_id; lease_id := v_lease; node := v_node;
        RETURN NEXT;
    END LOOP;
END
$$;

SELECT create_distributed_function('ktb.propose(text, text, jsonb)', distribution_arg_name => 'p_tenant',
                                   colocate_with => 'ktb.action', force_delegation => true) IS NOT NULL AS delegated \gset
SELECT create_distributed_function('ktb.approve(text, uuid, text)', distribution_arg_name => 'p_tenant',
                                   colocate_with => 'ktb.action', force_delegation => true) IS NOT NULL AS delegated \gset
SELECT create_distributed_function('ktb.lease(text, text, int)', distribution_arg_name => 'p_tenant',
                                   colocate_with => 'ktb.action', force_delegation => true) IS NOT NULL AS delegated \gset
GRANT EXECUTE ON FUNCTION ktb.propose(text, text, jsonb), ktb.approve(text, uuid, text) TO app_agent, app_human;
GRANT EXECUTE ON FUNCTION ktb.lease(text, text, int) TO app_dispatcher;

SELECT s.nodeport AS acme_node FROM citus_shards s
 WHERE s.table_name = 'ktb.action'::regclass
   AND s.shardid = get_shard_id_for_distribution_column('ktb.action', 'acme') \gset
SELECT recover_prepared_transactions() IS NOT NULL AS cleared \gset
SELECT count(*) AS prepared_before FROM pg_dist_transaction \gset

-- 2. A whole approval on the tenant's worker. Identity as propagated SET LOCALs.
\connect - app_agent
BEGIN;
SET LOCAL citus.propagate_set_commands = 'local';
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT action_id, token, node AS proposed_on FROM ktb.propose('acme', 'deal_stage',
  '{"where": {"id": 104}, "set": {"stage": "won"}}') \gset
COMMIT;
\connect - app_human
BEGIN;
SET LOCAL citus.propagate_set_commands = 'local';
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT status AS approved, node AS approved_on FROM ktb.approve('acme', :'action_id', :'token') \gset
COMMIT;
\connect - postgres
SELECT citus_check.expect('b2: propose ran on the tenant''s worker', :'proposed_on', :'acme_node');
SELECT citus_check.expect('b2: approve ran on the tenant''s worker', :'approved_on', :'acme_node');
SELECT citus_check.expect('b2: approved', :'approved', 'succeeded');
SELECT citus_check.expect('b2: the business write, as the approving role, under RLS there',
    (SELECT stage || ' ' || last_by || ' ' || last_tenant || ' ' || last_port FROM crm.deal WHERE tenant = 'acme' AND id = 104),
    'won app_human acme ' || :'acme_node');
SELECT citus_check.expect('b2: claim, write and event in one worker''s commit: no two-phase commit',
    (SELECT count(*) FROM pg_dist_transaction)::text, :'prepared_before');
SELECT citus_check.expect('b2: the events, on the worker',
    (SELECT string_agg(to_status || '@' || (node = :acme_node), ' ' ORDER BY n) FROM ktb.event WHERE action_id = :'action_id'),
    'pending@true succeeded@true');

-- 7. Identity asserted with set_config only: the delegated call sees none.
\connect - app_human
BEGIN;
SELECT set_config('request.jwt.claims', '{"tenant_id": "acme", "sub": "alice", "session_id": "s1"}', true) IS NOT NULL AS claimed \gset
\set ON_ERROR_STOP off
SELECT * FROM ktb.approve('acme', :'action_id', :'token');
\set ON_ERROR_STOP on
ROLLBACK;
SELECT citus_check.expect('b7: set_config identity does not reach a delegated call', :'LAST_ERROR_SQLSTATE', '42501');
SELECT citus_check.expect('b7: the worker saw no identity', (:'LAST_ERROR_MESSAGE' LIKE '%(no identity)%')::text, 'true');

-- 3. What Citus refuses in DML on a distributed table, and the forms it takes.
\connect - postgres
\set ON_ERROR_STOP off
UPDATE ktb.action SET updated_at = clock_timestamp() WHERE tenant = 'acme' AND id = :'action_id';
\set ON_ERROR_STOP on
SELECT citus_check.expect('b3: a volatile function in a routed UPDATE is refused', :'LAST_ERROR_MESSAGE',
    'functions used in UPDATE queries on distributed tables must not be VOLATILE');
\set ON_ERROR_STOP off
INSERT INTO ktb.event VALUES ('acme', :'action_id',
    (SELECT max(n) + 1 FROM ktb.event WHERE tenant = 'acme' AND action_id = :'action_id'), 'x', 'x', 0, now());
\set ON_ERROR_STOP on
SELECT citus_check.expect('b3: a subquery in INSERT is refused', :'LAST_ERROR_MESSAGE',
    'subqueries are not supported within INSERT queries');
\set ON_ERROR_STOP off
SELECT id FROM ktb.action WHERE status = 'queued' ORDER BY next_attempt_at LIMIT 10 FOR UPDATE SKIP LOCKED;
\set ON_ERROR_STOP on
SELECT citus_check.expect('b3: FOR UPDATE across shards is refused', :'LAST_ERROR_SQLSTATE', '0A000');
SELECT now() AS stamp \gset
UPDATE ktb.action SET updated_at = :'stamp' WHERE tenant = 'acme' AND id = :'action_id';
SELECT citus_check.expect('b3: a value computed first is accepted',
    (SELECT (updated_at = :'stamp')::text FROM ktb.action WHERE tenant = 'acme' AND id = :'action_id'), 'true');

-- 4 and 5. An external action: approve queues it and NOTIFYs on the worker,
-- where a listener (keyturnd would listen on every worker) hears it; the
-- dispatcher leases it per tenant. One session throughout, switching roles
-- with SET LOCAL ROLE, so the listener's dblink connection stays open.
SELECT dblink_connect('listener', format('host=127.0.0.1 port=%s dbname=keyturn user=postgres', :'acme_node')) AS connected \gset
SELECT dblink_exec('listener', 'LISTEN ktb_dispatch') AS listening \gset
BEGIN;
SET LOCAL ROLE app_agent;
SET LOCAL citus.propagate_set_commands = 'local';
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT action_id AS note_id, token AS note_token FROM ktb.propose('acme', 'notify', '{"channel": "sales", "text": "hi"}') \gset
COMMIT;
SELECT count(*) AS heard_before FROM dblink_get_notify('listener') \gset
BEGIN;
SET LOCAL ROLE app_human;
SET LOCAL citus.propagate_set_commands = 'local';
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT status AS note_status FROM ktb.approve('acme', :'note_id', :'note_token') \gset
COMMIT;
CREATE TEMP TABLE heard AS SELECT * FROM dblink_get_notify('listener') LIMIT 0;
DO $$
BEGIN
    -- Until the notification has arrived (a state; statement_timeout bounds it).
    WHILE NOT EXISTS (SELECT 1 FROM heard) LOOP
        INSERT INTO heard SELECT * FROM dblink_get_notify('listener');
        PERFORM pg_sleep(0.05);
    END LOOP;
END
$$;
SELECT citus_check.expect('b5: nothing heard before the approval', :'heard_before', '0');
SELECT citus_check.expect('b5: queued', :'note_status', 'queued');
SELECT citus_check.expect('b5: the worker''s listener heard the wake-up',
    (SELECT string_agg(notify_name || ':' || extra, ' ') FROM heard), 'ktb_dispatch:acme');
SELECT dblink_disconnect('listener') AS disconnected \gset

-- PostgreSQL refuses a NOTIFY in a prepared transaction: a wake-up inside a
-- transaction that Citus commits in two phases could never be sent.
\connect keyturn postgres 127.0.0.1 :acme_node
BEGIN;
NOTIFY ktb_dispatch, 'two-phase';
\set ON_ERROR_STOP off
PREPARE TRANSACTION 'kt_notify_probe';
\set ON_ERROR_STOP on
SELECT citus_check.expect('b5: no NOTIFY in a prepared transaction', :'LAST_ERROR_SQLSTATE', '0A000');
\connect keyturn postgres 127.0.0.1 :c

-- 4. Lease per tenant, delegated: FOR UPDATE SKIP LOCKED on the tenant's
-- shard. The dispatcher finds the tenants with due work by a read over all
-- shards (no lock), then leases tenant by tenant.
\connect - app_dispatcher
SELECT string_agg(DISTINCT tenant, ',') AS due_tenants FROM ktb.action WHERE status = 'queued' \gset
SELECT action_id AS leased, node AS leased_on FROM ktb.lease('acme', 'worker-1', 10) \gset
\connect - postgres
SELECT citus_check.expect('b4: the tenants with due work', :'due_tenants', 'acme');
SELECT citus_check.expect('b4: leased per tenant', :'leased', :'note_id');
SELECT citus_check.expect('b4: on the tenant''s worker', :'leased_on', :'acme_node');
SELECT citus_check.expect('b4: leased', (SELECT status FROM ktb.action WHERE tenant = 'acme' AND id = :'note_id'), 'leased');

-- Sweep per shard: each worker's shards, with the colocated event shard,
-- where volatile functions and FOR UPDATE are plain PostgreSQL again.
BEGIN;
SET LOCAL ROLE app_agent;
SET LOCAL citus.propagate_set_commands = 'local';
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1';
SELECT action_id AS stale_id FROM ktb.propose('acme', 'deal_stage', '{"where": {"id": 105}, "set": {"stage": "won"}}') \gset
COMMIT;
UPDATE ktb.action SET expires_at = '2000-01-01' WHERE tenant = 'acme' AND id = :'stale_id';
SELECT sum(result::int)::text AS swept FROM run_command_on_colocated_placements('ktb.action', 'ktb.event', $cmd$
    WITH due AS (
        SELECT tenant, id FROM %s WHERE status = 'pending' AND expires_at < clock_timestamp()
           FOR UPDATE SKIP LOCKED),
    expired AS (
        UPDATE %1$s a SET status = 'expired', updated_at = clock_timestamp()
          FROM due WHERE a.tenant = due.tenant AND a.id = due.id RETURNING a.tenant, a.id),
    logged AS (
        INSERT INTO %2$s (tenant, action_id, n, to_status, db_role, node, at)
        SELECT tenant, id, 2, 'expired', current_user, inet_server_port(), clock_timestamp() FROM expired
        RETURNING 1)
    SELECT count(*) FROM logged
$cmd$) \gset
SELECT citus_check.expect('b4: the sweep expired the stale proposal on its shard', :'swept', '1');
SELECT citus_check.expect('b4: with its event',
    (SELECT a.status || ' ' || e.to_status FROM ktb.action a JOIN ktb.event e ON e.tenant = a.tenant AND e.action_id = a.id AND e.n = 2
      WHERE a.tenant = 'acme' AND a.id = :'stale_id'), 'expired expired');

-- 6. OIDs: the coordinator and the workers number roles independently, so
-- the prototype stores role names, which every node resolves.
SELECT string_agg(result, ' ' ORDER BY nodeid) AS role_oids
  FROM run_command_on_all_nodes($$SELECT 'app_human'::regrole::oid$$) \gset
\echo 'OIDs of app_human, node by node:' :role_oids
SELECT citus_check.expect('b6: the stored role is a name every node resolves',
    (SELECT bool_and(success AND result = 'app_human')::text
       FROM run_command_on_all_nodes($$SELECT (SELECT approved_role FROM ktb.action WHERE approved_role IS NOT NULL LIMIT 1)::regrole::text$$)),
    'true');

-- 8. Triggers on a distributed table run on the shard, on the worker.
\connect - postgres
CREATE TABLE ktb.guarded (tenant text NOT NULL, id int NOT NULL, status text NOT NULL, PRIMARY KEY (tenant, id));
CREATE TABLE ktb.guarded_log (tenant text NOT NULL, id int NOT NULL, n int NOT NULL, status text NOT NULL,
                              at timestamptz NOT NULL, PRIMARY KEY (tenant, id, n));
SELECT create_distributed_table('ktb.guarded', 'tenant', colocate_with => 'ktb.action') IS NOT NULL AS dist \gset
SELECT create_distributed_table('ktb.guarded_log', 'tenant', colocate_with => 'ktb.action') IS NOT NULL AS dist \gset
CREATE FUNCTION ktb.guarded_logged() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- Names its tenant: routed to the colocated shard on this worker.
    INSERT INTO ktb.guarded_log VALUES (NEW.tenant, NEW.id, 1, NEW.status, clock_timestamp());
    RETURN NULL;
END
$$;
CREATE FUNCTION ktb.guarded_fanned() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- Names no tenant: a statement over every shard, from inside a shard.
    UPDATE ktb.guarded_log SET at = now() WHERE id = NEW.id;
    RETURN NULL;
END
$$;
\set ON_ERROR_STOP off
CREATE TRIGGER guarded_logged AFTER INSERT ON ktb.guarded FOR EACH ROW EXECUTE FUNCTION ktb.guarded_logged();
\set ON_ERROR_STOP on
SELECT citus_check.expect('b8: a trigger on a distributed table needs citus.enable_unsafe_triggers', :'LAST_ERROR_MESSAGE',
    'triggers are not supported on distributed tables');
SET citus.enable_unsafe_triggers = on;
CREATE TRIGGER guarded_logged AFTER INSERT ON ktb.guarded FOR EACH ROW EXECUTE FUNCTION ktb.guarded_logged();
INSERT INTO ktb.guarded VALUES ('acme', 1, 'pending');
SELECT citus_check.expect('b8: the trigger wrote its tenant''s colocated row',
    (SELECT status FROM ktb.guarded_log WHERE tenant = 'acme' AND id = 1), 'pending');
CREATE TRIGGER guarded_fanned AFTER INSERT ON ktb.guarded FOR EACH ROW EXECUTE FUNCTION ktb.guarded_fanned();
\set ON_ERROR_STOP off
INSERT INTO ktb.guarded VALUES ('acme', 2, 'pending');
\set ON_ERROR_STOP on
SELECT citus_check.expect('b8: a statement without the tenant in a trigger is refused', :'LAST_ERROR_MESSAGE',
    'cannot execute a distributed query from a query on a shard');
SELECT citus_check.expect('b8: and nothing of that insert is left',
    (SELECT count(*)::text FROM ktb.guarded WHERE tenant = 'acme' AND id = 2), '0');
RESET citus.enable_unsafe_triggers;

-- 9. The epoch bump, upserted.
CREATE TABLE ktb.auth_epoch (tenant text NOT NULL, principal text NOT NULL, epoch bigint NOT NULL DEFAULT 0,
                             changed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (tenant, principal));
SELECT create_distributed_table('ktb.auth_epoch', 'tenant', colocate_with => 'ktb.action') IS NOT NULL AS dist \gset
\set ON_ERROR_STOP off
INSERT INTO ktb.auth_epoch AS e (tenant, principal, epoch) VALUES ('acme', 'alice', 1)
ON CONFLICT (tenant, principal) DO UPDATE SET epoch = e.epoch + 1, changed_at = now();
\set ON_ERROR_STOP on
SELECT citus_check.expect('b9: now() in DO UPDATE SET is refused', :'LAST_ERROR_MESSAGE',
    'functions used in the DO UPDATE SET clause of INSERTs on distributed tables must be marked IMMUTABLE');
CREATE FUNCTION ktb.bump_epoch(p_tenant text, p_principal text) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_at    timestamptz := now();
    v_epoch bigint;
BEGIN
    INSERT INTO ktb.auth_epoch AS e (tenant, principal, epoch, changed_at) VALUES (p_tenant, p_principal, 1, v_at)
    ON CONFLICT (tenant, principal) DO UPDATE SET epoch = e.epoch + 1, changed_at = EXCLUDED.changed_at
    RETURNING e.epoch INTO v_epoch;
    RETURN v_epoch;
END
$$;
SELECT ktb.bump_epoch('acme', 'alice') AS first_bump \gset
SELECT ktb.bump_epoch('acme', 'alice') AS second_bump \gset
SELECT citus_check.expect('b9: the value computed first, from EXCLUDED', :'first_bump' || ' ' || :'second_bump', '1 2');

-- Data in every status, made the way pg_keyturn 0.1.0 makes it, for the
-- upgrade layer (tests/upgrade-check). Run as a superuser in a database with
-- the CRM fixture's schema and `CREATE EXTENSION pg_keyturn VERSION '0.1.0'`.
--
-- The library installed is the current one, whose SQL entry points expect
-- the current schema; so this calls 0.1.0's own plpgsql state machine
-- (keyturn._propose, keyturn._approve, keyturn._reject and the dispatcher
-- functions), which writes every row exactly as 0.1.0 did, with the calling
-- role passed as 0.1.0's Rust entry points passed it. Identity is
-- transaction-local.
\set ON_ERROR_STOP 1

SELECT keyturn.add_member('up', 'alice', 'member'), keyturn.add_member('up', 'bob', 'approver');
SELECT keyturn.register_tool('up_stage', '{"executor": "sql", "summary": "Set stage {set.stage} on {count} deal(s)",
    "sql": {"table": "crm.deal", "key": "id", "version": "xmin", "set": ["stage"], "where": ["id"]}}');
SELECT keyturn.register_tool('up_stage_short', '{"executor": "sql", "expires_in": "1 second",
    "sql": {"table": "crm.deal", "key": "id", "set": ["stage"], "where": ["id"]}}');
SELECT keyturn.register_tool('up_hook', '{"executor": "external", "provider": "webhook",
    "params_schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}');
SELECT keyturn.register_tool('up_digest', '{"executor": "external", "provider": "webhook", "retain": "digest",
    "params_schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}');
SELECT keyturn.grant_tool('up', p, t)
  FROM unnest(ARRAY['alice', 'bob']) p, unnest(ARRAY['up_stage', 'up_stage_short', 'up_hook', 'up_digest']) t;
INSERT INTO crm.deal (id, tenant, owner, name) SELECT 990000 + i, 'up', 'alice', 'deal ' || i FROM generate_series(1, 12) i;

CREATE TEMP TABLE seed (label text PRIMARY KEY, action_id uuid, token text, lease_id uuid);

-- propose(label, tool, params) as the agent, with alice's identity.
CREATE FUNCTION pg_temp.propose(p_label text, p_tool text, p_params jsonb, p_origin jsonb DEFAULT '{}')
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('keyturn.tenant', 'up', true), set_config('keyturn.principal', 'alice', true),
            set_config('keyturn.session', 's1', true);
    INSERT INTO seed (label, action_id, token)
    SELECT p_label, p.o_action_id, p.o_token FROM keyturn._propose('app_agent'::regrole, p_tool, p_params, p_origin) p;
END $$;
-- approve(label[, params]) as the human alice.
CREATE FUNCTION pg_temp.approve(p_label text, p_params jsonb DEFAULT NULL) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE v text;
BEGIN
    PERFORM set_config('keyturn.tenant', 'up', true), set_config('keyturn.principal', 'alice', true),
            set_config('keyturn.session', 's1', true);
    SELECT a.o_status INTO v FROM seed s, keyturn._approve('app_human'::regrole, s.action_id, s.token, p_params) a
     WHERE s.label = p_label;
    RETURN v;
END $$;
-- lease, begin and complete one queued action as the dispatcher.
CREATE FUNCTION pg_temp.lease(p_label text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE seed s SET lease_id = l.lease_id
      FROM keyturn.lease('upgrade-seed', 1000) l
     WHERE l.action_id = s.action_id AND s.label = p_label;
END $$;

BEGIN; SELECT pg_temp.propose('pending_sql', 'up_stage', '{"where": {"id": 990001}, "set": {"stage": "won"}}'); COMMIT;
BEGIN; SELECT pg_temp.propose('pending_hook', 'up_hook', '{"n": 1}'); COMMIT;
BEGIN; SELECT pg_temp.propose('succeeded_sql', 'up_stage', '{"where": {"id": 990002}, "set": {"stage": "won"}}'); COMMIT;
BEGIN; SELECT pg_temp.approve('succeeded_sql'); COMMIT;
BEGIN; SELECT pg_temp.propose('conflict', 'up_stage', '{"where": {"id": 990003}, "set": {"stage": "won"}}'); COMMIT;
UPDATE crm.deal SET name = 'changed meanwhile' WHERE id = 990003;
BEGIN; SELECT pg_temp.approve('conflict'); COMMIT;
BEGIN; SELECT pg_temp.propose('failed_sql', 'up_stage', '{"where": {"id": 990004}, "set": {"stage": "bogus"}}'); COMMIT;
BEGIN; SELECT pg_temp.approve('failed_sql'); COMMIT;
BEGIN; SELECT pg_temp.propose('expired', 'up_stage_short', '{"where": {"id": 990005}, "set": {"stage": "won"}}'); COMMIT;
SELECT pg_sleep(1.1);
BEGIN; SELECT pg_temp.approve('expired'); COMMIT;
BEGIN; SELECT pg_temp.propose('rejected', 'up_hook', '{"n": 2}'); COMMIT;
BEGIN;
SELECT set_config('keyturn.tenant', 'up', true), set_config('keyturn.principal', 'alice', true), set_config('keyturn.session', 's1', true);
SELECT keyturn._reject('app_human'::regrole, action_id, token, 'no') FROM seed WHERE label = 'rejected';
COMMIT;
BEGIN; SELECT pg_temp.propose('tampered', 'up_hook', '{"n": 3}'); COMMIT;
BEGIN;
SET LOCAL session_replication_role = replica;
UPDATE keyturn.action SET params = '{"n": 33}' WHERE id = (SELECT action_id FROM seed WHERE label = 'tampered');
COMMIT;
BEGIN; SELECT pg_temp.approve('tampered'); COMMIT;
BEGIN; SELECT pg_temp.propose('cancelled', 'up_hook', '{"n": 4}', '{"conversation_id": "conv-cancel"}'); COMMIT;
BEGIN;
SELECT set_config('keyturn.tenant', 'up', true), set_config('keyturn.principal', 'alice', true), set_config('keyturn.session', 's1', true);
SELECT keyturn.cancel_origin('conv-cancel');
COMMIT;

-- External actions along the dispatch path, one at a time so that each
-- lease takes exactly the one queued.
BEGIN; SELECT pg_temp.propose('succeeded_hook', 'up_hook', '{"n": 5}'); COMMIT;
BEGIN; SELECT pg_temp.approve('succeeded_hook'); COMMIT;
BEGIN; SELECT pg_temp.lease('succeeded_hook'); COMMIT;
SELECT keyturn.begin_dispatch(action_id, lease_id) FROM seed WHERE label = 'succeeded_hook';
SELECT keyturn.complete(action_id, lease_id, 'succeeded', '{"status": 200}') FROM seed WHERE label = 'succeeded_hook';

BEGIN; SELECT pg_temp.propose('uncertain', 'up_hook', '{"n": 6}'); COMMIT;
BEGIN; SELECT pg_temp.approve('uncertain'); COMMIT;
BEGIN; SELECT pg_temp.lease('uncertain'); COMMIT;
SELECT keyturn.begin_dispatch(action_id, lease_id) FROM seed WHERE label = 'uncertain';
SELECT keyturn.complete(action_id, lease_id, 'unknown', '{"status": 500}') FROM seed WHERE label = 'uncertain';

BEGIN; SELECT pg_temp.propose('failed_hook', 'up_hook', '{"n": 7}'); COMMIT;
BEGIN; SELECT pg_temp.approve('failed_hook'); COMMIT;
BEGIN; SELECT pg_temp.lease('failed_hook'); COMMIT;
SELECT keyturn.begin_dispatch(action_id, lease_id) FROM seed WHERE label = 'failed_hook';
SELECT keyturn.complete(action_id, lease_id, 'failed', '{"status": 400}') FROM seed WHERE label = 'failed_hook';

BEGIN; SELECT pg_temp.propose('executing', 'up_hook', '{"n": 8}'); COMMIT;
BEGIN; SELECT pg_temp.approve('executing'); COMMIT;
BEGIN; SELECT pg_temp.lease('executing'); COMMIT;
SELECT keyturn.begin_dispatch(action_id, lease_id) FROM seed WHERE label = 'executing';

BEGIN; SELECT pg_temp.propose('leased', 'up_hook', '{"n": 9}'); COMMIT;
BEGIN; SELECT pg_temp.approve('leased'); COMMIT;
BEGIN; SELECT pg_temp.lease('leased'); COMMIT;

BEGIN; SELECT pg_temp.propose('digest_queued', 'up_digest', '{"n": 10}'); COMMIT;
BEGIN; SELECT pg_temp.approve('digest_queued', '{"n": 10}'); COMMIT;
BEGIN; SELECT pg_temp.propose('queued', 'up_hook', '{"n": 11}'); COMMIT;
BEGIN; SELECT pg_temp.approve('queued'); COMMIT;

-- Invalidated last: the revoke bumps alice's epoch, which invalidates at
-- approve every pending proposal of hers, so it comes after the others.
BEGIN; SELECT pg_temp.propose('invalidated', 'up_hook', '{"n": 12}'); COMMIT;
SELECT keyturn.revoke_tool('up', 'alice', 'up_hook'), keyturn.grant_tool('up', 'alice', 'up_hook');
BEGIN; SELECT pg_temp.approve('invalidated'); COMMIT;

-- What the upgrade must keep, as upgrade-check reads it back.
CREATE TABLE public.upgrade_seed AS
SELECT s.label, s.action_id, s.lease_id, a.status AS status_before FROM seed s JOIN keyturn.action a ON a.id = s.action_id;

-- Data in every status, made the way pg_keyturn 0.2.0 makes it, for the
-- upgrade layer (tests/upgrade-check). Run as a superuser in a database with
-- the CRM fixture's schema and `CREATE EXTENSION pg_keyturn VERSION '0.2.0'`.
--
-- The library installed is the current one, whose SQL entry points expect
-- the current schema; so this calls 0.2.0's own plpgsql state machine
-- (keyturn._propose, _approve, _reject, _revise, _delegate, _record_request,
-- and the dispatcher functions), which writes every row exactly as 0.2.0 did,
-- with the calling role passed as 0.2.0's Rust entry points passed it.
-- Beyond 0.1.0's statuses: superseded (a revision), a quorum proposal with
-- one vote, a standing approval with a use spent, a task request and the
-- task action it admitted, a staged file bound to a pending proposal, a
-- scoped grant and a projection. Identity is transaction-local.
\set ON_ERROR_STOP 1

SELECT keyturn.add_member('up', 'alice', 'member'), keyturn.add_member('up', 'bob', 'approver'),
       keyturn.add_member('up', 'carol', 'approver');
SELECT keyturn.register_tool('up_stage', '{"executor": "sql", "summary": "Set stage {set.stage} on {count} deal(s)",
    "sql": {"table": "crm.deal", "key": "id", "version": "xmin", "set": ["stage"], "where": ["id"]}}');
SELECT keyturn.register_tool('up_stage_short', '{"executor": "sql", "expires_in": "1 second",
    "sql": {"table": "crm.deal", "key": "id", "set": ["stage"], "where": ["id"]}}');
SELECT keyturn.register_tool('up_hook', '{"executor": "external", "provider": "webhook",
    "params_schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}');
SELECT keyturn.register_tool('up_digest', '{"executor": "external", "provider": "webhook", "retain": "digest",
    "params_schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}');
SELECT keyturn.register_tool('up_quorum', '{"executor": "external", "provider": "webhook", "approval": "independent",
    "quorum": 2, "params_schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}');
SELECT keyturn.register_tool('up_hook_rev', '{"executor": "external", "provider": "webhook", "effect": "reversible",
    "params_schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}');
SELECT keyturn.register_tool('up_task', '{"executor": "external", "provider": "webhook", "approval": "task",
    "params_schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}');
SELECT keyturn.register_tool('up_mail', '{"executor": "external", "provider": "smtp", "effect": "irreversible",
    "attachments_param": "files", "attachment_types": ["text/plain"],
    "params_schema": {"type": "object", "required": ["to", "subject", "text"], "properties": {
        "to": {"type": "string", "format": "email"}, "subject": {"type": "string"}, "text": {"type": "string"},
        "files": {"type": "array"}}}}');
SELECT keyturn.grant_tool('up', p, t)
  FROM unnest(ARRAY['alice', 'bob', 'carol']) p,
       unnest(ARRAY['up_stage', 'up_stage_short', 'up_hook', 'up_digest', 'up_quorum', 'up_task', 'up_mail', 'up_hook_rev']) t;
SELECT keyturn.grant_tool('up', 'bob', 'up_stage', '{"params": {"set.stage": {"in": ["won", "lost"]}}}');
SELECT keyturn.register_projection('up_crm', '{"fields": {"name": {"max_length": 40}}}');
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

-- A revision: the original is superseded, the revision pending.
BEGIN; SELECT pg_temp.propose('superseded', 'up_hook', '{"n": 13}'); COMMIT;
BEGIN;
SELECT set_config('keyturn.tenant', 'up', true), set_config('keyturn.principal', 'alice', true), set_config('keyturn.session', 's1', true);
INSERT INTO seed (label, action_id, token)
SELECT 'revision', r.o_action_id, r.o_token FROM seed s, keyturn._revise('app_human'::regrole, s.action_id, s.token, '{"n": 14}') r
 WHERE s.label = 'superseded';
COMMIT;

-- A quorum of two with one vote (bob's) recorded: still pending.
BEGIN; SELECT pg_temp.propose('quorum_one_vote', 'up_quorum', '{"n": 15}'); COMMIT;
BEGIN;
SELECT set_config('keyturn.tenant', 'up', true), set_config('keyturn.principal', 'bob', true), set_config('keyturn.session', 's2', true);
SELECT a.o_status FROM seed s, keyturn._approve('app_human'::regrole, s.action_id, s.token, NULL) a WHERE s.label = 'quorum_one_vote';
COMMIT;

-- A standing approval of alice's, one of its three uses spent by a covered
-- proposal, which is queued at once.
BEGIN;
SELECT set_config('keyturn.tenant', 'up', true), set_config('keyturn.principal', 'alice', true), set_config('keyturn.session', 's1', true);
SELECT keyturn._delegate('app_human'::regrole, 'up_hook_rev', '{"params": {"n": {"max": 100}}}', 3, '1 day');
COMMIT;
BEGIN; SELECT pg_temp.propose('delegated_queued', 'up_hook_rev', '{"n": 16}'); COMMIT;

-- A standing approval given under a tool's first version, the tool
-- registered again since (version 2 sets another field). 0.2.0 let it cover
-- the new version; 0.3.0 binds a standing approval to the version it was
-- given for, and the upgrade must bind this one to version 1, so that it
-- covers nothing (upgrade-check proposes under it).
SELECT keyturn.register_tool('up_hook_v', '{"executor": "external", "provider": "webhook", "effect": "reversible",
    "params_schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}');
SELECT keyturn.grant_tool('up', 'alice', 'up_hook_v');
BEGIN;
SELECT set_config('keyturn.tenant', 'up', true), set_config('keyturn.principal', 'alice', true), set_config('keyturn.session', 's1', true);
SELECT keyturn._delegate('app_human'::regrole, 'up_hook_v', '{"params": {"n": {"max": 100}}}', 3, '1 day');
COMMIT;
SELECT keyturn.register_tool('up_hook_v', '{"executor": "external", "provider": "webhook", "effect": "irreversible",
    "params_schema": {"type": "object", "properties": {"n": {"type": "integer"}, "to": {"type": "string"}}}}');

-- A task request recorded by the person, and the task call it admitted.
BEGIN;
SELECT set_config('keyturn.tenant', 'up', true), set_config('keyturn.principal', 'alice', true), set_config('keyturn.session', 's1', true);
SELECT keyturn._record_request('app_human'::regrole, 'conv-task', 'turn-1', 'msg-1', repeat('a', 64));
COMMIT;
BEGIN; SELECT pg_temp.propose('task_queued', 'up_task', '{"n": 17}',
    '{"conversation_id": "conv-task", "turn_id": "turn-1", "message_id": "msg-1", "assistant_message_id": "am-1"}'); COMMIT;

-- A file the person staged, bound to a pending mail proposal; and one staged
-- and never used.
CREATE TEMP TABLE staged (label text PRIMARY KEY, file_id uuid, sha256 text);
BEGIN;
SELECT set_config('keyturn.tenant', 'up', true), set_config('keyturn.principal', 'alice', true), set_config('keyturn.session', 's1', true);
INSERT INTO staged SELECT 'bound', f.file_id, f.sha256 FROM keyturn.stage_file('hello'::bytea, 'hello.txt', 'text/plain') f;
INSERT INTO staged SELECT 'loose', f.file_id, f.sha256 FROM keyturn.stage_file('loose'::bytea, 'loose.txt', 'text/plain') f;
INSERT INTO staged SELECT 'float', f.file_id, f.sha256 FROM keyturn.stage_file('float'::bytea, 'float.txt', 'text/plain') f;
COMMIT;
BEGIN;
SELECT pg_temp.propose('pending_mail', 'up_mail', jsonb_build_object('to', 'ann@example.com', 'subject', 'hi', 'text', 'hello',
    'files', jsonb_build_array(jsonb_build_object('file_id', f.file_id, 'filename', 'hello.txt', 'content_type', 'text/plain',
                                                  'size', 5, 'sha256', f.sha256))))
  FROM staged f WHERE f.label = 'bound';
COMMIT;
-- Metadata 0.2.0 accepted and could never send: a size written 5.0. The
-- upgrade invalidates it (0.3.0 types metadata at propose).
BEGIN;
SELECT pg_temp.propose('bad_metadata', 'up_mail', jsonb_build_object('to', 'ann@example.com', 'subject', 'hi', 'text', 'hello',
    'files', jsonb_build_array(jsonb_build_object('file_id', f.file_id, 'filename', 'float.txt', 'content_type', 'text/plain',
                                                  'size', 5.0, 'sha256', f.sha256))))
  FROM staged f WHERE f.label = 'float';
COMMIT;

-- Evidence 0.2.0 took unchecked: the upgrade invalidates the pending
-- proposal that cites it (nobody recorded it).
BEGIN; SELECT pg_temp.propose('cites_evidence', 'up_hook', '{"n": 18}', '{"evidence": ["ev-never-recorded"]}'); COMMIT;

-- Invalidated last: the revoke bumps alice's epoch, which invalidates at
-- approve every pending proposal of hers, so it comes after the others.
BEGIN; SELECT pg_temp.propose('invalidated', 'up_hook', '{"n": 12}'); COMMIT;
SELECT keyturn.revoke_tool('up', 'alice', 'up_hook'), keyturn.grant_tool('up', 'alice', 'up_hook');
BEGIN; SELECT pg_temp.approve('invalidated'); COMMIT;

-- What the upgrade must keep (status_after: what it must change), as
-- upgrade-check reads it back.
CREATE TABLE public.upgrade_seed AS
SELECT s.label, s.action_id, s.lease_id, a.status::text AS status_before,
       CASE WHEN s.label IN ('bad_metadata', 'cites_evidence') THEN 'invalidated' ELSE a.status::text END AS status_after
  FROM seed s JOIN keyturn.action a ON a.id = s.action_id;

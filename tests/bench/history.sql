-- Rows :from .. :to of synthetic keyturn history, written as superuser with
-- triggers disabled (session_replication_role = replica). Settled actions of
-- both tools spread over a year and 1,000 tenants (acme gets every tenth),
-- one final event and, for the sql tool, one target each.
SET session_replication_role = replica;
BEGIN;
CREATE TEMP TABLE h ON COMMIT DROP AS
SELECT g,
       gen_random_uuid() AS id,
       CASE WHEN g % 10 = 0 THEN 'acme' ELSE 't' || (g % 997) END AS tenant,
       'p' || (g % 64) AS principal,
       CASE WHEN g % 3 = 0 THEN 'email.send' ELSE 'deal.set_stage' END AS tool,
       (CASE g % 20 WHEN 0 THEN 'expired' WHEN 1 THEN 'rejected' WHEN 2 THEN 'conflict' ELSE 'succeeded' END)::keyturn.status AS status,
       now() - make_interval(secs => (g % 31536000)) - interval '1 day' AS at
  FROM generate_series(:from, :to) g;

INSERT INTO keyturn.action (id, tenant, principal, session, tool, tool_version, executor, approval, retain,
    params, param_keys, params_hash, summary, origin, conversation_id, epoch, target_count,
    token_digest, token_binding, idempotency_key, authors, created_at, expires_at, status, result,
    approved_by, approved_role, approved_at, attempts, dispatched_at, updated_at)
SELECT h.id, h.tenant, h.principal, 's' || (h.g % 64), h.tool, 1,
       CASE WHEN h.tool = 'email.send' THEN 'external' ELSE 'sql' END, 'self', 'full',
       CASE WHEN h.tool = 'email.send'
            THEN jsonb_build_object('to', 'ann' || h.g || '@example.com', 'subject', 'Q3 numbers')
            ELSE jsonb_build_object('where', jsonb_build_object('id', h.g % 100000 + 1), 'set', jsonb_build_object('stage', 'won')) END,
       CASE WHEN h.tool = 'email.send' THEN ARRAY['subject', 'to'] ELSE ARRAY['set', 'where'] END,
       md5(h.g::text) || md5((h.g + 1)::text),
       'Set won on 1 deal(s)', '{}', NULL, 1, 1,
       decode(md5(h.g::text) || md5(h.g::text), 'hex'), decode(md5((-h.g)::text) || md5(h.g::text), 'hex'),
       'keyturn-' || h.id, ARRAY[h.principal], h.at, h.at + interval '15 minutes', h.status,
       CASE WHEN h.status = 'succeeded' THEN '{"rows": 1}'::jsonb ELSE '{"reason": "history"}'::jsonb END,
       CASE WHEN h.status IN ('succeeded', 'conflict') THEN h.principal END,
       CASE WHEN h.status IN ('succeeded', 'conflict') THEN 'app_human' END,
       CASE WHEN h.status IN ('succeeded', 'conflict') THEN h.at + interval '1 minute' END,
       CASE WHEN h.tool = 'email.send' AND h.status = 'succeeded' THEN 1 ELSE 0 END,
       CASE WHEN h.tool = 'email.send' AND h.status = 'succeeded' THEN h.at + interval '1 minute' END,
       h.at + interval '1 minute'
  FROM h;

-- Placeholder hashes: the synthetic history is no audit chain (verify_audit
-- of these tenants says so); the item measures the hot paths' plans and the
-- sweep among many rows, which read neither hash.
INSERT INTO keyturn.event (action_id, tenant, action_principal, at, db_role, principal, from_status, to_status, detail,
    prev_hash, hash)
SELECT h.id, h.tenant, h.principal, h.at + interval '1 minute', 'app_human', h.principal, 'pending', h.status, '{}',
       repeat('0', 64), md5(h.g::text) || md5((h.g + 2)::text)
  FROM h;

INSERT INTO keyturn.action_target (action_id, ord, tenant, principal, key, version)
SELECT h.id, 1, h.tenant, h.principal, (h.g % 100000 + 1)::text, '1'
  FROM h WHERE h.tool = 'deal.set_stage';

INSERT INTO keyturn.usage (action_id, tenant, principal, tool, executor, attempts, at)
SELECT h.id, h.tenant, h.principal, h.tool, CASE WHEN h.tool = 'email.send' THEN 'external' ELSE 'sql' END, 1, h.at + interval '1 minute'
  FROM h WHERE h.status = 'succeeded';
COMMIT;

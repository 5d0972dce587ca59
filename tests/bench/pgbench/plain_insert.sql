-- Item 2, B: a plain INSERT of the same row into a table of the same shape.
\set n random(1, 1000000)
BEGIN;
SET LOCAL ROLE app_agent;
SELECT set_config('keyturn.tenant', 'acme', true), set_config('keyturn.principal', 'p' || :client_id::text, true), set_config('keyturn.session', 's' || :client_id::text, true);
WITH p AS (SELECT gen_random_uuid() AS id, jsonb_build_object('to', 'ann' || :n::text || '@example.com', 'subject', 'Q3 numbers', 'body', 'Hi Ann, the Q3 numbers are attached. Best, Bob') AS params, sha256(uuid_send(gen_random_uuid())) AS tok)
INSERT INTO bare.action (id, tenant, principal, session, tool, tool_version, executor, approval, retain, params, param_keys, params_hash, summary, origin, epoch, target_count, token_digest, token_binding, idempotency_key, authors, created_at, expires_at, status, updated_at)
SELECT p.id, current_setting('keyturn.tenant'), current_setting('keyturn.principal'), current_setting('keyturn.session'), 'email.send', 1, 'external', 'self', 'full', p.params, ARRAY['body', 'subject', 'to'], encode(sha256(convert_to(p.params::text, 'UTF8')), 'hex'), 'Send email to ' || (p.params ->> 'to') || ' about "Q3 numbers"', '{}', 1, 1, sha256(p.tok), sha256(p.tok || uuid_send(p.id)), 'keyturn-' || p.id, ARRAY[current_setting('keyturn.principal')], now(), now() + interval '15 minutes', 'pending', now() FROM p
RETURNING id AS action_id \gset
COMMIT;

-- Item 7: propose + approve of an external tool. keyturn.notify (the
-- in-transaction NOTIFY of approve, read by the lifecycle trigger) is a
-- superuser's setting: the "off" side connects as bench_quiet, which has it
-- off (tests/bench/setup.sql).
\set n random(1, 1000000)
BEGIN;
SET LOCAL ROLE app_agent;
SELECT set_config('keyturn.tenant', 'acme', true), set_config('keyturn.principal', 'p' || :client_id::text, true), set_config('keyturn.session', 's' || :client_id::text, true);
SELECT action_id, token FROM keyturn.propose('email.send', jsonb_build_object('to', 'ann' || :n::text || '@example.com', 'subject', 'Q3 numbers', 'body', 'Hi Ann, the Q3 numbers are attached. Best, Bob')) \gset
COMMIT;
BEGIN;
SET LOCAL ROLE app_human;
SELECT set_config('keyturn.tenant', 'acme', true), set_config('keyturn.principal', 'p' || :client_id::text, true), set_config('keyturn.session', 's' || :client_id::text, true);
SELECT status FROM keyturn.approve(:action_id::uuid, :token::text) \gset
COMMIT;

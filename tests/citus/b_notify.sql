-- Layout B, notifications (docs/notifications.md, sql/064_notify.sql): after
-- b_distribute, with keyturn.notify_channel and keyturn.notification
-- distributed by tenant. alice sets a webhook channel; her proposal, made by
-- propose_for on acme's worker, records its notice and reminder there; the
-- dispatcher carries the notice with the tenant-explicit calls, each
-- delegated to acme's worker: lease_for, begin_dispatch_for,
-- notification_message_for (which mints the card link there), complete_for.
-- The outcome is an event on the action's timeline, in acme's audit chain,
-- which still verifies. Then the session ends, the channel goes, and
-- sweep_for cancels the reminder: nothing is left for later tests.

\connect - postgres
\set ON_ERROR_STOP on
\set as_alice 'SET LOCAL citus.propagate_set_commands = ''local''; SET LOCAL keyturn.tenant = ''acme''; SET LOCAL keyturn.principal = ''alice''; SET LOCAL keyturn.session = ''s-n'';'

-- alice's channel: set_notify is a plain call, a routed write of one row.
\connect - app_human
BEGIN;
:as_alice
SELECT keyturn.set_notify('webhook', 'https://hooks.acme.example/keyturn', '{}');
COMMIT;
\connect - postgres
SELECT citus_check.expect('alice''s channel, on acme''s shard',
    (SELECT string_agg(channel::text || ':' || db_role, ' ') FROM keyturn.notify_channel
      WHERE tenant = 'acme' AND principal = 'alice'), 'webhook:app_human');
SELECT count(*) AS before_2pc FROM pg_dist_transaction \gset

-- Her proposal waits for her (self approval): a notice due now and a
-- reminder before it expires, recorded on acme's worker by propose_for.
\connect - app_agent
BEGIN;
:as_alice
SELECT action_id AS n1 FROM keyturn.propose_for('acme', 'notify',
  '{"channel": "ops", "text": "notify me"}', '{"conversation_id": "c-n", "turn_id": "t-1"}') \gset
COMMIT;
\connect - postgres
SELECT citus_check.expect('propose_for recorded a notice and a reminder for alice',
    (SELECT string_agg(kind::text || ':' || status::text || ':' || principal, ' ' ORDER BY kind::text)
       FROM keyturn.notification WHERE tenant = 'acme' AND action_id = :'n1'),
    'notice:queued:alice reminder:queued:alice');

\connect - app_dispatcher
SELECT citus_check.expect('tenants_due: acme has a notification due on notify.webhook',
    (SELECT (to_lease >= 1)::text FROM keyturn.tenants_due('{notify.webhook}') WHERE tenant = 'acme'), 'true');
-- Lease and begin in one transaction on acme's worker.
BEGIN;
SELECT action_id AS nid, lease_id AS nlease, tool AS ntool, provider AS nprovider, idempotency_key AS nkey
  FROM keyturn.lease_for('acme', 'w-n', 8, '30 seconds', '{notify.webhook}') \gset
SELECT keyturn.begin_dispatch_for('acme', :'nid', :'nlease') AS nbegun \gset
COMMIT;
SELECT citus_check.expect('lease_for: the notice, as a job of keyturn.notify',
    :'ntool' || ' ' || :'nprovider' || ' ' || (:'nkey' = 'keyturn-notify-' || :'nid')::text,
    'keyturn.notify notify.webhook true');
SELECT citus_check.expect('begin_dispatch_for: begun', :'nbegun', 't');
-- The message, with a fresh card link code minted on acme's worker.
SELECT send AS msend, kind AS mkind, title AS mtitle, link_action_ids AS mlinks, code AS mcode
  FROM keyturn.notification_message_for('acme', :'nid', :'nlease') \gset
SELECT citus_check.expect('notification_message_for: the notice, linking the action, with a code',
    :'msend' || ' ' || :'mkind' || ' ' || (:'mlinks' = '{' || :'n1' || '}')::text || ' ' || (length(:'mcode') > 20)::text,
    't notice true true');
SELECT citus_check.expect('its title', :'mtitle', 'Approval needed: Post to #ops');
-- Another tenant's name: an unknown notification there (55000).
\set ON_ERROR_STOP off
\set LAST_ERROR_SQLSTATE ''
SELECT keyturn.complete_for('globex', :'nid', :'nlease', 'succeeded');
\set ON_ERROR_STOP on
SELECT citus_check.expect('complete_for in another tenant''s name: 55000', :'LAST_ERROR_SQLSTATE', '55000');
SELECT keyturn.complete_for('acme', :'nid', :'nlease', 'succeeded', '{"status": 200}') AS ndone \gset
SELECT citus_check.expect('complete_for: sent', :'ndone', 'succeeded');

\connect - postgres
SELECT citus_check.expect('every call one worker''s one-phase commit: no two-phase commit',
    (SELECT count(*)::text FROM pg_dist_transaction), :'before_2pc');
SELECT citus_check.expect('the notice succeeded, its one attempt closed',
    (SELECT n.status::text || ':' || n.attempts || ':' || t.outcome::text || ':' || t.worker
       FROM keyturn.notification n
       JOIN keyturn.attempt t ON t.action_id = n.id AND t.tenant = n.tenant AND t.attempt = n.attempts
      WHERE n.tenant = 'acme' AND n.id = :'nid'),
    'succeeded:1:succeeded:w-n');
SELECT citus_check.expect('the card link, on acme''s shard, for alice and the action',
    (SELECT count(*)::text FROM keyturn.card_link
      WHERE tenant = 'acme' AND principal = 'alice' AND action_ids = ARRAY[:'n1']::uuid[] AND redeemed_at IS NULL),
    '1');
SELECT citus_check.expect('the action''s audit is its status changes',
    (SELECT string_agg(to_status::text || ':' || db_role, ' ' ORDER BY id)
       FROM keyturn.event WHERE tenant = 'acme' AND action_id = :'n1'),
    'pending:app_agent');
SELECT citus_check.expect('the notification is an event in acme''s chain, under its own id',
    (SELECT string_agg(detail -> 'notification' ->> 'status' || ':' || db_role, ' ' ORDER BY id)
       FROM keyturn.event WHERE tenant = 'acme' AND detail -> 'notification' ->> 'action_id' = :'n1'
        AND action_id <> :'n1'),
    'succeeded:app_dispatcher');
SELECT citus_check.expect('acme''s audit chain verifies', (SELECT ok::text FROM keyturn.verify_audit('acme')), 'true');
SELECT citus_check.expect('and globex''s', (SELECT ok::text FROM keyturn.verify_audit('globex')), 'true');

-- Nothing left behind: the session ends (its action cancelled), the
-- channel goes, and the tenant's sweep cancels the queued reminder.
\connect - app_agent
BEGIN;
:as_alice
SELECT keyturn.end_session_for('acme', 's-n') AS ended \gset
COMMIT;
\connect - app_human
BEGIN;
:as_alice
SELECT keyturn.remove_notify('webhook') AS removed \gset
COMMIT;
SELECT citus_check.expect('end_session_for and remove_notify', :'ended' || ' ' || :'removed', '1 t');
\connect - app_dispatcher
SELECT expired, requeued, uncertain FROM keyturn.sweep_for('acme') \gset
\connect - postgres
SELECT citus_check.expect('sweep_for cancelled the reminder',
    (SELECT string_agg(kind::text || ':' || status::text, ' ' ORDER BY kind::text)
       FROM keyturn.notification WHERE tenant = 'acme' AND action_id = :'n1'),
    'notice:succeeded reminder:cancelled');

-- Layout B, today: which of keyturn's own tables Citus refuses to distribute
-- by tenant, which it accepts, and why (docs/scale-out.md, "Layout B: what fails today"). Each
-- attempt runs in a transaction that is rolled back. If Citus or keyturn's
-- schema changes what happens, this test says so and the plan needs another
-- look.

\connect - postgres
\set ON_ERROR_STOP off

\set LAST_ERROR_MESSAGE ''
BEGIN;
SELECT create_distributed_table('keyturn.action', 'tenant');
ROLLBACK;
SELECT citus_check.expect('probe: action has triggers (the lifecycle guard)', :'LAST_ERROR_MESSAGE',
    'cannot distribute relation "action" because it has triggers');

\set LAST_ERROR_MESSAGE ''
BEGIN;
SELECT create_distributed_table('keyturn.event', 'tenant');
ROLLBACK;
SELECT citus_check.expect('probe: event has triggers (append-only guard)', :'LAST_ERROR_MESSAGE',
    'cannot distribute relation "event" because it has triggers');

\set LAST_ERROR_MESSAGE ''
BEGIN;
SELECT create_distributed_table('keyturn.tool_grant', 'tenant');
ROLLBACK;
SELECT citus_check.expect('probe: tool_grant references the local tool table', :'LAST_ERROR_MESSAGE',
    'referenced table "tool" must be a distributed table or a reference table');

\set LAST_ERROR_MESSAGE ''
BEGIN;
SELECT create_distributed_table('keyturn.staged_payload', 'tenant');
ROLLBACK;
SELECT citus_check.expect('probe: staged_payload references action by id alone', :'LAST_ERROR_MESSAGE',
    'referenced table "action" must be a distributed table or a reference table');

\set LAST_ERROR_MESSAGE ''
BEGIN;
SELECT create_distributed_table('keyturn.action_target', 'tenant');
ROLLBACK;
SELECT citus_check.expect('probe: action_target has triggers', :'LAST_ERROR_MESSAGE',
    'cannot distribute relation "action_target" because it has triggers');

\set LAST_ERROR_MESSAGE ''
BEGIN;
SELECT create_distributed_table('keyturn.usage', 'tenant');
ROLLBACK;
SELECT citus_check.expect('probe: usage has triggers', :'LAST_ERROR_MESSAGE',
    'cannot distribute relation "usage" because it has triggers');

\set LAST_ERROR_MESSAGE ''
BEGIN;
SELECT create_distributed_table('keyturn.delegation', 'tenant');
ROLLBACK;
SELECT citus_check.expect('probe: delegation references the local tool table', :'LAST_ERROR_MESSAGE',
    'referenced table "tool" must be a distributed table or a reference table');

-- The global tables as reference tables: the foreign keys between the local
-- ones make Citus convert the whole graph, which the extension's own
-- objects cannot take.
\set LAST_ERROR_MESSAGE ''
BEGIN;
SELECT create_reference_table('keyturn.tool');
ROLLBACK;
SELECT citus_check.expect('probe: tool as a reference table', :'LAST_ERROR_MESSAGE',
    'relation "tool_version" already exists');

-- Tables without triggers or foreign keys are accepted, every key of theirs
-- holding the tenant (the rest of keyturn could not use them yet). Before the
-- tenant was in every key (step 1 of the plan), Citus refused open_action,
-- attempt, vote and staged_file: "cannot create constraint".
\set LAST_ERROR_MESSAGE ''
BEGIN;
SELECT create_distributed_table('keyturn.member', 'tenant') IS NOT NULL AS member_distributed \gset
SELECT create_distributed_table('keyturn.auth_epoch', 'tenant', colocate_with => 'keyturn.member') IS NOT NULL AS epoch_distributed \gset
SELECT create_distributed_table('keyturn.request', 'tenant', colocate_with => 'keyturn.member') IS NOT NULL AS request_distributed \gset
SELECT create_distributed_table('keyturn.cancelled_origin', 'tenant', colocate_with => 'keyturn.member') IS NOT NULL AS origin_distributed \gset
SELECT create_distributed_table('keyturn.open_action', 'tenant', colocate_with => 'keyturn.member') IS NOT NULL AS open_distributed \gset
SELECT create_distributed_table('keyturn.attempt', 'tenant', colocate_with => 'keyturn.member') IS NOT NULL AS attempt_distributed \gset
SELECT create_distributed_table('keyturn.vote', 'tenant', colocate_with => 'keyturn.member') IS NOT NULL AS vote_distributed \gset
SELECT create_distributed_table('keyturn.staged_file', 'tenant', colocate_with => 'keyturn.member') IS NOT NULL AS file_distributed \gset
ROLLBACK;
SELECT citus_check.expect('probe: member, auth_epoch, request, cancelled_origin, open_action, attempt, vote and staged_file are accepted',
    :'LAST_ERROR_MESSAGE' || :'member_distributed' || :'epoch_distributed' || :'request_distributed' || :'origin_distributed'
    || :'open_distributed' || :'attempt_distributed' || :'vote_distributed' || :'file_distributed', 'tttttttt');

-- The tables with triggers, once Citus is told to take triggers
-- (citus.enable_unsafe_triggers, step 6 of the plan): their keys no longer
-- stand in the way, and action's family is accepted with staged_payload's
-- foreign key, which now carries the tenant.
\set LAST_ERROR_MESSAGE ''
BEGIN;
SET LOCAL citus.enable_unsafe_triggers = on;
SELECT create_distributed_table('keyturn.action', 'tenant') IS NOT NULL AS action_distributed \gset
SELECT create_distributed_table('keyturn.event', 'tenant', colocate_with => 'keyturn.action') IS NOT NULL AS event_distributed \gset
SELECT create_distributed_table('keyturn.action_target', 'tenant', colocate_with => 'keyturn.action') IS NOT NULL AS target_distributed \gset
SELECT create_distributed_table('keyturn.usage', 'tenant', colocate_with => 'keyturn.action') IS NOT NULL AS usage_distributed \gset
SELECT create_distributed_table('keyturn.staged_payload', 'tenant', colocate_with => 'keyturn.action') IS NOT NULL AS payload_distributed \gset
ROLLBACK;
SELECT citus_check.expect('probe: with triggers allowed, action, event, action_target, usage and staged_payload are accepted',
    :'LAST_ERROR_MESSAGE' || :'action_distributed' || :'event_distributed' || :'target_distributed'
    || :'usage_distributed' || :'payload_distributed', 'ttttt');

\set ON_ERROR_STOP on
SELECT citus_check.expect('probe: nothing stayed distributed',
    (SELECT count(*)::text FROM pg_dist_partition WHERE logicalrelid::regclass::text LIKE 'keyturn.%'), '0');

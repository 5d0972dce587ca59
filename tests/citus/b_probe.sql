-- Layout B, today: which of keyturn's own tables Citus refuses to distribute
-- by tenant, and why (docs/scale-out.md, "Layout B: what fails today"). Each
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
SELECT create_distributed_table('keyturn.open_action', 'tenant');
ROLLBACK;
SELECT citus_check.expect('probe: open_action''s primary key has no tenant', :'LAST_ERROR_MESSAGE',
    'cannot create constraint on "open_action"');

\set LAST_ERROR_MESSAGE ''
BEGIN;
SELECT create_distributed_table('keyturn.attempt', 'tenant');
ROLLBACK;
SELECT citus_check.expect('probe: attempt''s primary key has no tenant', :'LAST_ERROR_MESSAGE',
    'cannot create constraint on "attempt"');

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
SELECT create_distributed_table('keyturn.vote', 'tenant');
ROLLBACK;
SELECT citus_check.expect('probe: vote''s primary key has no tenant', :'LAST_ERROR_MESSAGE',
    'cannot create constraint on "vote"');

\set LAST_ERROR_MESSAGE ''
BEGIN;
SELECT create_distributed_table('keyturn.staged_file', 'tenant');
ROLLBACK;
SELECT citus_check.expect('probe: staged_file''s primary key has no tenant', :'LAST_ERROR_MESSAGE',
    'cannot create constraint on "staged_file"');

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

-- Tables without triggers or foreign keys whose keys lead with the tenant
-- are accepted alone (the rest of keyturn could not use them yet).
\set LAST_ERROR_MESSAGE ''
BEGIN;
SELECT create_distributed_table('keyturn.member', 'tenant') IS NOT NULL AS member_distributed \gset
SELECT create_distributed_table('keyturn.auth_epoch', 'tenant', colocate_with => 'keyturn.member') IS NOT NULL AS epoch_distributed \gset
SELECT create_distributed_table('keyturn.request', 'tenant', colocate_with => 'keyturn.member') IS NOT NULL AS request_distributed \gset
SELECT create_distributed_table('keyturn.cancelled_origin', 'tenant', colocate_with => 'keyturn.member') IS NOT NULL AS origin_distributed \gset
ROLLBACK;
SELECT citus_check.expect('probe: member, auth_epoch, request and cancelled_origin are accepted',
    :'LAST_ERROR_MESSAGE' || :'member_distributed' || :'epoch_distributed' || :'request_distributed' || :'origin_distributed', 'tttt');

\set ON_ERROR_STOP on
SELECT citus_check.expect('probe: nothing stayed distributed',
    (SELECT count(*)::text FROM pg_dist_partition WHERE logicalrelid::regclass::text LIKE 'keyturn.%'), '0');

-- Layout A: a transaction that changed keyturn actions cannot be prepared,
-- whatever application_name it claims. Citus names its own connections
-- "citus_internal gpid=…", and any client may claim that name (Citus's own
-- tests do), so it must not exempt a PREPARE: a prepared transaction would
-- hold the tenant's audit chain, and commit a decision checked at PREPARE,
-- whenever its owner chose (seventh red-team pass, docs/security.md row 88).
\connect - app_agent
BEGIN;
SET LOCAL application_name = 'citus_internal gpid=10000000001';
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's-prep';
-- An external tool: Citus refuses a backend that says it is its own any
-- query on a distributed table, such as an sql tool's targets.
SELECT action_id AS prep_id FROM keyturn.propose('notify', '{"channel": "sales", "text": "prepared"}') \gset
\set ON_ERROR_STOP off
PREPARE TRANSACTION 'kt_claims_to_be_citus';
\set ON_ERROR_STOP on
\set prep_state :LAST_ERROR_SQLSTATE
\connect - postgres
-- Whatever happened, nothing prepared is left behind for the tests after.
SELECT count(*) > 0 AS was_prepared FROM pg_prepared_xacts WHERE gid = 'kt_claims_to_be_citus' \gset
\if :was_prepared
ROLLBACK PREPARED 'kt_claims_to_be_citus';
\endif
SELECT citus_check.expect('prepare: refused under a Citus application_name', :'prep_state', '0A000');
SELECT citus_check.expect('prepare: nothing was prepared', :'was_prepared', 'f');
SELECT citus_check.expect('prepare: the proposal rolled back',
    (SELECT count(*)::text FROM keyturn.action WHERE id = :'prep_id'), '0');

-- tests/citus/bench, layout B: the flow of bench-flow.sql through the
-- tenant-explicit calls Citus runs whole on the tenant's worker (propose_for,
-- approve_for), identity asserted with propagated SET LOCALs (a delegated call
-- sees nothing else). The same script runs on the single node it is compared
-- with, where the propagation setting is an inert placeholder. Run with
-- -M simple: pgbench puts the variables into the SET LOCALs' strings.
\set t random(1, 16)
\set deal random(1, 1250)
\set s random(1, 4)
\set p :deal % 16
BEGIN;
SET LOCAL ROLE app_agent;
SET LOCAL citus.propagate_set_commands = 'local';
SET LOCAL keyturn.tenant = 't:t';
SET LOCAL keyturn.principal = 'p:p';
SET LOCAL keyturn.session = 's:client_id';
SELECT action_id, token FROM keyturn.propose_for('t:t', 'deal.set_stage', jsonb_build_object('where', jsonb_build_object('id', :deal::bigint, 'tenant', 't:t'), 'set', jsonb_build_object('stage', (ARRAY['lead', 'qualified', 'negotiation', 'won'])[:s::int]))) \gset
COMMIT;
BEGIN;
SET LOCAL ROLE app_human;
SET LOCAL citus.propagate_set_commands = 'local';
SET LOCAL keyturn.tenant = 't:t';
SET LOCAL keyturn.principal = 'p:p';
SET LOCAL keyturn.session = 's:client_id';
SELECT status FROM keyturn.approve_for('t:t', ':action_id', ':token') \gset
COMMIT;

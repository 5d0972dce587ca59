-- Plans the dispatcher keeps for a backend's life (the `dba` layer of
-- tests/run-all, in the fresh database of catalog.sql). begin and complete are
-- planned once per backend (sql/060_dispatch.sql, the note before
-- keyturn.begin_dispatch); planned while keyturn.attempt is empty, as on a new
-- installation, complete must still find a batch's attempt rows by key, not
-- read the table whole in every later call. And complete's checks run once
-- an element (a subquery the planner pulls up runs its expressions once for
-- each place that names them: they ran four and five times). Everything is
-- rolled back.
BEGIN;
SELECT plan(5);
\o /dev/null

CREATE ROLE kt_plans_agent IN ROLE keyturn_agent;
CREATE ROLE kt_plans_human IN ROLE keyturn_approver;
CREATE ROLE kt_plans_dispatcher IN ROLE keyturn_dispatcher;
SELECT keyturn.add_member('plans', 'pat', 'member');
SELECT keyturn.register_tool('plans.mail', $${"executor": "external", "provider": "webhook",
    "summary": "Mail {to}", "params_schema": {"type": "object", "properties": {"to": {"type": "string"}},
    "required": ["to"], "additionalProperties": false}}$$);
SELECT keyturn.grant_tool('plans', 'pat', 'plans.mail');
-- The statistics of a new installation: no attempt rows.
ANALYZE keyturn.attempt;
SET LOCAL keyturn.notify = off;
SET LOCAL track_functions = 'all';

SET SESSION AUTHORIZATION kt_plans_agent;
SELECT set_config('keyturn.tenant', 'plans', true), set_config('keyturn.principal', 'pat', true),
       set_config('keyturn.session', 's1', true);
SELECT array_agg(p.action_id) AS ids, array_agg(p.token) AS tokens
  FROM generate_series(1, 40) g,
       LATERAL keyturn.propose('plans.mail', jsonb_build_object('to', 'a' || g || '@example.com')) p \gset
SET SESSION AUTHORIZATION kt_plans_human;
SELECT count(*) FROM unnest(:'ids'::uuid[], :'tokens'::text[]) AS t (id, token),
       LATERAL keyturn.approve(t.id, t.token) a WHERE a.status = 'queued';

-- Five steps of eight, as keyturnd's one connection would run them.
SET SESSION AUTHORIZATION kt_plans_dispatcher;
DO $$
DECLARE
    v_ids    uuid[];
    v_leases uuid[];
BEGIN
    FOR i IN 1 .. 5 LOOP
        SELECT array_agg(l.action_id), array_agg(l.lease_id) INTO v_ids, v_leases
          FROM keyturn.lease('plans-worker', 8, '30 seconds') l;
        PERFORM keyturn.begin_dispatch_many(v_ids, v_leases);
        PERFORM keyturn.complete_many(v_ids, v_leases, array_fill('succeeded'::text, ARRAY[8]),
                                      array_fill('{}'::jsonb, ARRAY[8]), array_fill(NULL::interval, ARRAY[8]));
    END LOOP;
END
$$;
RESET SESSION AUTHORIZATION;
\o

SELECT is((SELECT count(*) FROM keyturn.action WHERE tenant = 'plans' AND status = 'succeeded'), 40::bigint,
          'forty actions dispatched in five steps of eight');
SELECT is((SELECT seq_tup_read FROM pg_stat_xact_user_tables WHERE relid = 'keyturn.attempt'::regclass), 0::bigint,
          'complete, planned while keyturn.attempt was empty, never reads it whole');
SELECT cmp_ok((SELECT idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relid = 'keyturn.attempt'::regclass),
              '<=', 40::bigint, 'complete reads only its own batch''s attempt rows');

SELECT is((SELECT calls FROM pg_stat_xact_user_functions
            WHERE funcid = 'keyturn._complete_args_error(text, interval, jsonb)'::regprocedure), 40::bigint,
          'complete checks each element''s arguments once');
SELECT is((SELECT calls FROM pg_stat_xact_user_functions
            WHERE funcid = 'keyturn._complete_problem(keyturn.action, uuid, uuid, text)'::regprocedure), 40::bigint,
          'complete checks each element''s lease once');

SELECT * FROM finish();
ROLLBACK;

-- Item L (experiments.sh): one dispatch step of :n jobs, as keyturnd's
-- dispatcher role runs it (lease, begin, complete), rolled back so that every
-- step finds the same queue. Run with -D n=<jobs>, under -M prepared.
BEGIN;
SELECT array_agg(action_id) AS ids, array_agg(lease_id) AS ls FROM keyturn.lease('bench-step', :n::int, '30 s', '{webhook}') \gset
SELECT count(*) FROM keyturn.begin_dispatch_many(:ids::uuid[], :ls::uuid[]);
SELECT count(*) FROM keyturn.complete_many(:ids::uuid[], :ls::uuid[], array_fill('succeeded'::text, ARRAY[:n::int]),
                                           array_fill('{}'::jsonb, ARRAY[:n::int]), array_fill(NULL::interval, ARRAY[:n::int]));
ROLLBACK;

-- The status graph (docs/concepts.md), as the database enforces it.
SELECT f AS from_status, string_agg(t, ' ' ORDER BY t) AS may_become
  FROM unnest(ARRAY['pending', 'queued', 'leased', 'executing', 'uncertain', 'succeeded', 'failed',
                    'rejected', 'rejected_tampered', 'expired', 'cancelled', 'conflict', 'invalidated']) AS f,
       unnest(ARRAY['pending', 'queued', 'leased', 'executing', 'uncertain', 'succeeded', 'failed',
                    'rejected', 'rejected_tampered', 'expired', 'cancelled', 'conflict', 'invalidated']) AS t
 WHERE keyturn._legal_transition(f, t)
 GROUP BY f
 ORDER BY f;
-- The trigger on keyturn.action enforces exactly that graph: every pair tried
-- on a real row (each successful try rolled back), compared with the table above.
BEGIN;
CREATE TEMP TABLE tried (from_status text, to_status text, allowed boolean);
DO $$
DECLARE
    statuses text[] := ARRAY['pending', 'queued', 'leased', 'executing', 'uncertain', 'succeeded',
                             'failed', 'rejected', 'rejected_tampered', 'expired', 'cancelled',
                             'conflict', 'invalidated'];
    f text;
    t text;
    v_id uuid;
BEGIN
    FOREACH f IN ARRAY statuses LOOP
        v_id := md5(f)::uuid;
        INSERT INTO keyturn.action (id, tenant, principal, session, tool, tool_version, executor,
                                    approval, retain, param_keys, params_hash, origin, epoch,
                                    target_count, token_digest, token_binding, idempotency_key,
                                    created_at, expires_at, status, updated_at)
        VALUES (v_id, 'graph', 'p', 's', 'graph.tool', 1, 'external', 'self', 'full', '{}', 'h', '{}',
                0, 1, '\x00', '\x00', 'k', now(), now() + interval '1 hour', f, now());
        FOREACH t IN ARRAY statuses LOOP
            CONTINUE WHEN t = f;
            BEGIN
                UPDATE keyturn.action a SET status = t WHERE a.id = v_id;
                RAISE EXCEPTION 'tried' USING ERRCODE = 'KT000';
            EXCEPTION
                WHEN SQLSTATE 'KT000' THEN INSERT INTO tried VALUES (f, t, true);
                WHEN SQLSTATE '55000' THEN INSERT INTO tried VALUES (f, t, false);
            END;
        END LOOP;
    END LOOP;
END
$$;
SELECT count(*) AS pairs_tried,
       count(*) FILTER (WHERE allowed IS DISTINCT FROM keyturn._legal_transition(from_status, to_status)) AS disagreements
  FROM tried;
-- A change to a proposal column is refused, whatever else changes with it.
UPDATE keyturn.action SET params_hash = 'other' WHERE tenant = 'graph' AND status = 'pending';
ROLLBACK;
-- The event log is append-only, even for a superuser.
BEGIN;
UPDATE keyturn.event SET detail = '{}';
ROLLBACK;
BEGIN;
DELETE FROM keyturn.usage;
ROLLBACK;
BEGIN;
TRUNCATE keyturn.event;
ROLLBACK;

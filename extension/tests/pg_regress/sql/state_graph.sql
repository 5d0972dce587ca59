-- The status graph (docs/concepts.md, "The state machine"): every legal
-- change is a row of keyturn.transition.
SELECT from_status, string_agg(to_status::text, ' ' ORDER BY to_status) AS may_become
  FROM keyturn.transition
 GROUP BY from_status
 ORDER BY from_status;
-- Final: a status no transition leaves.
SELECT s AS status, keyturn._is_final(s) AS final
  FROM unnest(enum_range(NULL::keyturn.status)) AS s;
-- The trigger on keyturn.action enforces exactly that graph: every pair tried
-- on a real row (each successful try rolled back), compared with the table.
-- A change that only an approval may make (pending -> queued and approve's
-- outcomes) is refused to a table write however legal it is.
BEGIN;
CREATE TEMP TABLE tried (from_status keyturn.status, to_status keyturn.status, answer text);
DO $$
DECLARE
    f keyturn.status;
    t keyturn.status;
    v_id uuid;
BEGIN
    FOREACH f IN ARRAY enum_range(NULL::keyturn.status) LOOP
        v_id := md5(f::text)::uuid;
        INSERT INTO keyturn.action (id, tenant, principal, session, tool, tool_version, executor,
                                    approval, retain, param_keys, params_hash, origin, epoch,
                                    target_count, token_digest, token_binding, idempotency_key, authors,
                                    created_at, expires_at, status, updated_at)
        VALUES (v_id, 'graph', 'p', 's', 'graph.tool', 1, 'external', 'self', 'full', '{}', 'h', '{}',
                0, 1, '\x00', '\x00', 'k', '{p}', now(), now() + interval '1 hour', f, now());
        FOREACH t IN ARRAY enum_range(NULL::keyturn.status) LOOP
            CONTINUE WHEN t = f;
            BEGIN
                UPDATE keyturn.action a SET status = t WHERE a.id = v_id;
                RAISE EXCEPTION 'tried' USING ERRCODE = 'KT000';
            EXCEPTION
                WHEN SQLSTATE 'KT000' THEN INSERT INTO tried VALUES (f, t, 'allowed');
                WHEN SQLSTATE '55000' THEN INSERT INTO tried VALUES (f, t, 'illegal');
                WHEN SQLSTATE '42501' THEN INSERT INTO tried VALUES (f, t, 'needs an approval');
            END;
        END LOOP;
    END LOOP;
END
$$;
SELECT count(*) AS pairs_tried,
       count(*) FILTER (WHERE (answer <> 'illegal') IS DISTINCT FROM keyturn._legal_transition(from_status, to_status)) AS disagreements
  FROM tried;
SELECT from_status, to_status FROM tried WHERE answer = 'needs an approval' ORDER BY 1, 2;
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

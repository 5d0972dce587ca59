-- The status graph of CONTRACT.md §4, as the database enforces it.
SELECT f AS from_status, string_agg(t, ' ' ORDER BY t) AS may_become
  FROM unnest(ARRAY['pending', 'queued', 'leased', 'executing', 'uncertain', 'succeeded', 'failed',
                    'rejected', 'rejected_tampered', 'expired', 'cancelled', 'conflict', 'invalidated']) AS f,
       unnest(ARRAY['pending', 'queued', 'leased', 'executing', 'uncertain', 'succeeded', 'failed',
                    'rejected', 'rejected_tampered', 'expired', 'cancelled', 'conflict', 'invalidated']) AS t
 WHERE keyturn._legal_transition(f, t)
 GROUP BY f
 ORDER BY f;
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

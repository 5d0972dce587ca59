-- What the status graph (keyturn.transition, 005_status.sql) implies, as
-- functions: whether a change is legal, and which statuses are final.

-- Whether a status change is legal (for people and tests; the guard itself
-- uses the generated condition).
CREATE FUNCTION keyturn._legal_transition(from_status keyturn.status, to_status keyturn.status)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT EXISTS (SELECT 1 FROM keyturn.transition t
                    WHERE t.from_status = _legal_transition.from_status
                      AND t.to_status = _legal_transition.to_status)
$$;

-- Final: a status that no transition leaves. ('uncertain' is terminal for
-- automation, but an operator may still reconcile it, so it is not final.)
-- Generated as a constant list, so the planner inlines it wherever it is used.
DO $do$
BEGIN
    EXECUTE pg_catalog.format(
        $f$CREATE FUNCTION keyturn._is_final(status keyturn.status)
           RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
           AS $b$SELECT status <> ALL (%L::keyturn.status[])$b$$f$,
        (SELECT pg_catalog.array_agg(DISTINCT t.from_status ORDER BY t.from_status)::text
           FROM keyturn.transition t));
END
$do$;

-- The status of an action: the names once (a type), the graph once (a table),
-- and "final" derived from the graph.

CREATE TYPE keyturn.status AS ENUM (
    'pending',            -- proposed, waiting for a person
    'queued',             -- approved external action, due for dispatch
    'leased',             -- taken by a dispatcher, not yet begun
    'executing',          -- the provider call may be under way
    'succeeded',
    'failed',
    'uncertain',          -- the provider call's outcome is unknown: an operator decides
    'rejected',
    'rejected_tampered',
    'expired',
    'cancelled',
    'conflict',
    'invalidated',
    'superseded'          -- edited before approval: a new proposal replaced it
);

-- Every legal status change. The status guard (020_guards.sql) refuses any
-- other; keyturn._is_final and the guard's condition are generated from these
-- rows at install, so the graph is written down exactly once.
CREATE TABLE keyturn.transition (
    from_status  keyturn.status NOT NULL,
    to_status    keyturn.status NOT NULL,
    PRIMARY KEY (from_status, to_status)
);
INSERT INTO keyturn.transition (from_status, to_status) VALUES
    -- approve's outcomes, and what else may end a proposal
    ('pending', 'expired'), ('pending', 'invalidated'), ('pending', 'rejected_tampered'),
    ('pending', 'succeeded'), ('pending', 'conflict'), ('pending', 'failed'),
    ('pending', 'queued'), ('pending', 'rejected'), ('pending', 'cancelled'),
    ('pending', 'superseded'),
    -- dispatch
    ('queued', 'leased'), ('queued', 'cancelled'), ('queued', 'invalidated'),
    ('leased', 'executing'), ('leased', 'queued'), ('leased', 'cancelled'), ('leased', 'invalidated'),
    ('executing', 'succeeded'), ('executing', 'failed'), ('executing', 'uncertain'),
    ('executing', 'queued'),
    -- the operator's reconciliation
    ('uncertain', 'succeeded'), ('uncertain', 'failed');

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

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
-- other; keyturn._is_final (011_status_rules.sql) and the guard's condition
-- are generated from these rows at install, so the graph is written down
-- exactly once.
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

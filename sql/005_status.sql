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
    ('leased', 'failed'),     -- begin_dispatch: a deterministic failure, nothing sent
    ('executing', 'succeeded'), ('executing', 'failed'), ('executing', 'uncertain'),
    ('executing', 'queued'),
    -- an upstream MCP tool whose live definition is no longer the one
    -- approved: nothing was sent (keyturn.check_upstream_tool)
    ('executing', 'invalidated'),
    -- the operator's reconciliation
    ('uncertain', 'succeeded'), ('uncertain', 'failed');

-- The words of a tool's spec, each list said once: the columns of
-- keyturn.tool_version are of these types, and register_tool offers exactly
-- their labels (enum_range), so a word added here is accepted there and
-- nowhere else needs to learn it.
CREATE TYPE keyturn.tool_kind AS ENUM ('read', 'write');
CREATE TYPE keyturn.tool_executor AS ENUM ('sql', 'external');
CREATE TYPE keyturn.tool_effect AS ENUM ('reversible', 'compensatable', 'irreversible');
CREATE TYPE keyturn.tool_retain AS ENUM ('full', 'digest');
CREATE TYPE keyturn.tool_approval AS ENUM ('self', 'independent', 'task');

-- What a provider attempt came to: complete's four outcomes, and lapsed (the
-- sweep found its lease over). keyturnd's outcome type says the first four
-- again, and a test of keyturnd's compares them with this list.
CREATE TYPE keyturn.attempt_outcome AS ENUM ('succeeded', 'failed', 'retry', 'unknown', 'lapsed');

-- What the dispatcher may say of an attempt it never finished: that it sent
-- nothing (keyturn.record_not_sent).
CREATE TYPE keyturn.dispatcher_account AS ENUM ('not_sent');

-- Notifications (sql/064_notify.sql): the channels a person can be reached
-- on, and what a notification is: the first word that an action waits for
-- them, the one reminder before it expires, or the one message that carries
-- those over a person's hourly cap.
CREATE TYPE keyturn.channel AS ENUM ('email', 'webhook', 'webpush');
CREATE TYPE keyturn.notification_kind AS ENUM ('notice', 'reminder', 'digest');

-- An agent's own action as /mcp answers for it after the call that proposed
-- it (sql/063_mcp.sql: keyturn.mcp_resume, keyturn.mcp_task): its status,
-- its result once final, its summary, expiry and times, and whether the
-- caller is in the session that proposed it (the only one a card link may
-- be shown to).
CREATE TYPE keyturn.mcp_action AS (status text, result jsonb, summary text, expires_at timestamptz,
                                   created_at timestamptz, updated_at timestamptz, same_session boolean);

-- What approve's and propose's internal steps return: one row, as a
-- composite, so that one step returns another's result with RETURN, an
-- expression (sql/051_approve.sql, keyturn._settle).
CREATE TYPE keyturn._outcome AS (o_action_id uuid, o_status text, o_result jsonb);
CREATE TYPE keyturn._proposed AS (o_action_id uuid, o_token text, o_summary text, o_params_hash text,
                                  o_expires_at timestamptz, o_status text, o_delegation_id uuid);
-- What begin_dispatch's checks answer for one action (sql/060_dispatch.sql,
-- keyturn._begin_check): why it may not be sent (NULL: it may), and whether
-- that reason ends it failed rather than invalidated.
CREATE TYPE keyturn._begun AS (reason text, failed boolean);

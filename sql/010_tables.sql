-- The data model.
--
-- Nobody but a superuser writes these tables directly: every state change goes
-- through the functions in the later files, which run as the extension owner.
-- Tables that hold tenant rows are under FORCEd row-level security (030_access.sql).
--
-- Every primary, unique and foreign key of a table of one action's (or one
-- person's) rows holds the tenant: Citus distributes a table by tenant only
-- when each of its unique keys contains the tenant, and joins two such tables
-- by foreign key only on it (docs/scale-out.md, layout B). The id comes first,
-- so a lookup by id alone still finds its row through the key's index, and a
-- v7 id still lands on the right edge of it (extension/src/ids.rs). An id
-- names one row across tenants all the same: ids are minted only by keyturn's
-- own functions (keyturn._uuid_v7()), and no role but the owner inserts.

-- The one rule for a name keyturn keeps (a tool, a projection, an upstream
-- MCP server): dot-separated segments of ASCII letters, digits, '_' and '-',
-- each starting with a letter, at most max_len characters. MCP servers name
-- their tools in any case and with hyphens (getTinyImage, get-weather), and
-- keyturn names them <upstream>.<tool>. ASCII only, so a look-alike (Cyrillic
-- 'е' in 'sеnd_email') can never be registered next to the real name; a name
-- that differs from another only in case is kept out by the tables' folded
-- keys. The tables' constraints call it, so it is part of the data model: the
-- upgrade scripts' sweep of old functions leaves it (it has dependents) and
-- it changes only in a data-model step.
CREATE FUNCTION keyturn._name_ok(name text, max_len int) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN name ~ '^[A-Za-z][A-Za-z0-9_-]*(\.[A-Za-z][A-Za-z0-9_-]*)*$' AND length(name) <= max_len;

-- Tools are global; what a tenant may do with them is decided by grants.
CREATE TABLE keyturn.tool (
    name        text        PRIMARY KEY,
    version     int         NOT NULL CHECK (version > 0),
    enabled     boolean     NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tool_name_shape CHECK (keyturn._name_ok(name, 63))
);
-- Names that differ only in case are one name to a person reading a card.
-- Folded as ASCII (COLLATE "C"), whatever the database's collation: under a
-- Turkish one lower('Index') is 'ındex', and 'Index' and 'index' would both
-- register.
CREATE UNIQUE INDEX tool_name_folded ON keyturn.tool (lower(name COLLATE "C"));

-- Every registration is a new immutable version; proposals are bound to one.
CREATE TABLE keyturn.tool_version (
    tool           text        NOT NULL REFERENCES keyturn.tool (name),
    version        int         NOT NULL,
    spec           jsonb       NOT NULL,           -- the normalized spec, as registered
    kind           keyturn.tool_kind NOT NULL,
    executor       keyturn.tool_executor,
    provider       text,
    params_schema  jsonb,                          -- normalized; external tools only
    summary        text        NOT NULL,
    effect         keyturn.tool_effect NOT NULL,
    expires_in     interval    NOT NULL,
    retain         keyturn.tool_retain NOT NULL,
    approval       keyturn.tool_approval NOT NULL,
    quorum         int         NOT NULL DEFAULT 1 CHECK (quorum BETWEEN 1 AND 5),
    delegable      boolean     NOT NULL DEFAULT false,
    max_targets    int         NOT NULL CHECK (max_targets > 0),
    targets_param  text,
    -- sql executor: checked against the catalog at registration, named (never
    -- by OID: a dump and restore gives the table another one) and looked up
    -- again by name at every use. Re-register after altering the table.
    sql_schema     text,
    sql_table      text,
    sql_key        text,
    sql_version    text,                           -- 'xmin' or a column name
    sql_set        text[],
    sql_where      text[],
    sql_types      jsonb,                          -- {column: format_type} for key, version, set and where
    rate_max       int         CHECK (rate_max > 0),
    rate_per       interval,
    -- private attachments (sql/056_files.sql)
    attachments_param     text,
    attachment_types      text[],
    max_attachment_bytes  bigint,
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- over MCP (sql/063_mcp.sql): what tools/list tells agents the tool does;
    -- a read tool's projection (fence) and, for an sql read tool, the
    -- columns it may select and the most rows one call returns
    description    text,
    projection     text,
    sql_select     text[],
    max_rows       int         CHECK (max_rows > 0),
    -- a tool discovered on an upstream MCP server: which, its name there,
    -- and the SHA-256 of the RFC 8785 form of its definition as received,
    -- which the mcp provider compares with the live one before each call
    upstream                text,
    upstream_tool           text,
    upstream_schema_sha256  text CHECK (upstream_schema_sha256 ~ '^[0-9a-f]{64}$'),
    PRIMARY KEY (tool, version)
);
-- An upstream's versions by time: what keyturn.register_discovered_tool
-- counts to bound them.
CREATE INDEX tool_version_upstream_idx ON keyturn.tool_version (upstream, created_at) WHERE upstream IS NOT NULL;

CREATE TABLE keyturn.member (
    tenant      text        NOT NULL CHECK (tenant <> ''),
    principal   text        NOT NULL CHECK (principal <> ''),
    role        text        NOT NULL CHECK (role IN ('member', 'approver', 'admin')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, principal)
);

-- What a principal may propose. A grant may be scoped (which params, how
-- many targets: keyturn-core's scope language), end at valid_until, and allow
-- max_uses proposals, counted in keyturn.grant_use by propose itself. The
-- row is the admin's: nothing a proposal does locks it.
CREATE TABLE keyturn.tool_grant (
    tenant       text        NOT NULL,
    principal    text        NOT NULL,
    tool         text        NOT NULL REFERENCES keyturn.tool (name),
    granted_at   timestamptz NOT NULL DEFAULT now(),
    scope        jsonb,
    valid_until  timestamptz,
    max_uses     int         CHECK (max_uses > 0),
    PRIMARY KEY (tenant, principal, tool)
);

-- The proposer's side of a grant: propose locks this row, so concurrent
-- proposals of one (tenant, principal, tool) count the grant's uses and rate
-- window one at a time, and counts the uses here, against the grant made at
-- granted_at (a grant given again with new terms starts from zero). A lock
-- on the grant row itself let an agent that left its transaction open stall
-- the admin's revoke_tool, grant_tool and remove_member (twelfth red-team
-- pass, docs/security.md row 101): grant_tool makes it when there is none,
-- and no admin call touches it after.
CREATE TABLE keyturn.grant_use (
    tenant       text        NOT NULL,
    principal    text        NOT NULL,
    tool         text        NOT NULL,
    granted_at   timestamptz,
    uses         int         NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, principal, tool)
);

-- Bumped on every membership or grant change of (tenant, principal); a proposal
-- records it, and a different value at approve or dispatch invalidates it.
CREATE TABLE keyturn.auth_epoch (
    tenant      text        NOT NULL,
    principal   text        NOT NULL,
    epoch       bigint      NOT NULL DEFAULT 0,
    changed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, principal)
);

-- Conversations a principal cancelled: later proposals carrying them are refused.
-- Conversations that ended: cancelled (cancel_origin) or archived
-- (archive_conversation). Either way they start no new actions.
CREATE TABLE keyturn.cancelled_origin (
    tenant           text        NOT NULL,
    principal        text        NOT NULL,
    conversation_id  text        NOT NULL,
    cancelled_at     timestamptz NOT NULL DEFAULT now(),
    how              text        NOT NULL DEFAULT 'cancelled' CHECK (how IN ('cancelled', 'archived')),
    PRIMARY KEY (tenant, principal, conversation_id)
);

-- The human messages a task tool's proposals may cite as their approval
-- (sql/055_task.sql): recorded by the human side, never by an agent.
CREATE TABLE keyturn.request (
    tenant           text        NOT NULL,
    principal        text        NOT NULL,
    message_id       text        NOT NULL,
    session          text        NOT NULL,
    conversation_id  text        NOT NULL,
    turn_id          text        NOT NULL,
    text_sha256      text        NOT NULL CHECK (text_sha256 ~ '^[0-9a-f]{64}$'),
    recorded_role    text        NOT NULL,
    recorded_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    seq              bigint      GENERATED ALWAYS AS IDENTITY,
    PRIMARY KEY (tenant, principal, message_id)
);
CREATE INDEX request_turn_idx ON keyturn.request (tenant, principal, conversation_id, seq);

-- An immutable proposal plus its lifecycle. The columns above `status` are fixed
-- at propose time (020_guards.sql refuses any change to them).
CREATE TABLE keyturn.action (
    id               uuid        NOT NULL,
    tenant           text        NOT NULL,
    principal        text        NOT NULL,
    session          text        NOT NULL,
    tool             text        NOT NULL,
    tool_version     int         NOT NULL,
    executor         text        NOT NULL,
    approval         text        NOT NULL,
    retain           text        NOT NULL,
    params           jsonb,                        -- NULL when retain = digest
    param_keys       text[]      NOT NULL,         -- sorted top-level keys
    params_hash      text        NOT NULL,
    summary          text,                         -- NULL when retain = digest
    origin           jsonb       NOT NULL,
    conversation_id  text,
    epoch            bigint      NOT NULL,
    target_count     int         NOT NULL,
    token_digest     bytea       NOT NULL,         -- sha256(token): finds the claim
    token_binding    bytea       NOT NULL,         -- HMAC(token; id, params_hash, expires_at, origin)
    idempotency_key  text        NOT NULL,
    revised_from     uuid,                         -- the proposal this one revised
    revised_by       text,                         -- the principal who revised it
    -- Everyone who wrote this content: the proposer and every reviser of the
    -- chain; none of them approves it where the tool asks for an
    -- independent approver (docs/concepts.md, approve's checks).
    authors          text[]      NOT NULL,
    created_at       timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    -- lifecycle
    status           keyturn.status NOT NULL,
    result           jsonb,
    -- The approval: who, as which role, when, how (approve, a standing
    -- approval, a task request), bound by approval_mac (sql/051_approve.sql).
    approved_by      text,
    approved_role    text,
    approved_at      timestamptz,
    approved_via     text,
    approval_mac     bytea,
    attempts         int         NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    lease_id         uuid,
    leased_by        text,
    lease_expires_at timestamptz,
    dispatched_at    timestamptz,
    receipt          jsonb,
    updated_at       timestamptz NOT NULL,
    PRIMARY KEY (id, tenant)
) WITH (fillfactor = 70);
-- Only immutable columns are indexed here, so every status change is a HOT update
-- (fillfactor leaves the room): it writes no index entry, and its WAL record
-- carries only the changed tail of the row. The status predicates are indexed on
-- keyturn.open_action instead.
CREATE INDEX action_rate_idx ON keyturn.action (tenant, principal, tool, created_at);
-- A revision's chain, followed forward (a card session covers the revisions
-- its person makes): few actions are revisions, so the index is small.
CREATE INDEX action_revised_from_idx ON keyturn.action (revised_from, tenant) WHERE revised_from IS NOT NULL;

-- The work list: one narrow row per action that is not final, kept in step with
-- keyturn.action by the lifecycle trigger (020_guards.sql) and deleted when the
-- action reaches a final status. Every hot "which actions are …" question (due,
-- lapsed, expired, a session's, a conversation's, uncertain) is answered by an
-- index here, on a table as large as the open work rather than the history.
-- keyturn.action stays the truth: readers lock the action row and recheck its
-- status before acting. An executing action stays listed as leased (its row
-- does not move at begin: extension/src/lifecycle.rs, Shape::listed), and
-- dispatched_at is the action's once it is uncertain, the status that reads it.
CREATE TABLE keyturn.open_action (
    action_id        uuid        NOT NULL,
    tenant           text        NOT NULL,
    principal        text        NOT NULL,
    session          text        NOT NULL,
    conversation_id  text,
    status           keyturn.status NOT NULL,
    expires_at       timestamptz NOT NULL,
    next_attempt_at  timestamptz,
    lease_expires_at timestamptz,
    dispatched_at    timestamptz,
    PRIMARY KEY (action_id, tenant)
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
        autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 1000);
-- A queue: every row is inserted, updated a few times and deleted, so it is
-- vacuumed and analyzed after every thousand changes, not after a fraction of
-- a size that is always small.
-- (next_attempt_at, action_id) is lease's whole ORDER BY, so the plan is an
-- ordered index scan that stops after max_jobs rows (lease pins that plan: sql/060).
CREATE INDEX open_action_due_idx       ON keyturn.open_action (next_attempt_at, action_id) WHERE status = 'queued';
CREATE INDEX open_action_lease_idx     ON keyturn.open_action (lease_expires_at) WHERE status IN ('leased', 'executing');
CREATE INDEX open_action_expiry_idx    ON keyturn.open_action (expires_at) WHERE status = 'pending';
CREATE INDEX open_action_session_idx   ON keyturn.open_action (tenant, principal, session);
CREATE INDEX open_action_origin_idx    ON keyturn.open_action (tenant, principal, conversation_id)
    WHERE conversation_id IS NOT NULL;
CREATE INDEX open_action_uncertain_idx ON keyturn.open_action (dispatched_at) WHERE status = 'uncertain';

-- The tables below are written only by keyturn's own functions, in the same
-- transaction as their action row; they carry no foreign key to it, which would
-- make every insert lock the action row (FOR KEY SHARE) and write WAL for it.

-- sql tools: each target's key and before-state version, fixed at propose time.
CREATE TABLE keyturn.action_target (
    action_id  uuid NOT NULL,
    ord        int  NOT NULL,
    tenant     text NOT NULL,
    principal  text NOT NULL,
    key        text NOT NULL,
    version    text NOT NULL,
    PRIMARY KEY (action_id, tenant, ord)
);

-- digest-retained external actions: the approved payload, from approve until a
-- final status (docs/concepts.md, "Digest retention"). Deleted by the lifecycle
-- trigger.
CREATE TABLE keyturn.staged_payload (
    action_id  uuid        NOT NULL,
    tenant     text        NOT NULL,
    principal  text        NOT NULL,
    params     jsonb       NOT NULL,
    staged_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (action_id, tenant),
    FOREIGN KEY (action_id, tenant) REFERENCES keyturn.action (id, tenant)
);

-- Quorum votes: one per principal and action (sql/053_ceremony.sql). Each is
-- also an event (pending -> pending); this table is what keeps it to one.
CREATE TABLE keyturn.vote (
    action_id         uuid        NOT NULL,
    principal         text        NOT NULL,
    tenant            text        NOT NULL,
    action_principal  text        NOT NULL,
    epoch             bigint      NOT NULL,       -- the voter's, re-checked when votes are counted
    db_role           text        NOT NULL,
    voted_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (action_id, tenant, principal)
);

-- Standing approvals (sql/054_delegation.sql): a person's "approve these for
-- me", within a scope, a number of uses and a time. propose spends the uses.
CREATE TABLE keyturn.delegation (
    id          uuid        NOT NULL,
    tenant      text        NOT NULL,
    principal   text        NOT NULL,
    tool        text        NOT NULL REFERENCES keyturn.tool (name),
    tool_version int        NOT NULL,             -- the version it was given for; a new one ends it
    scope       jsonb       NOT NULL,
    max_uses    int         NOT NULL CHECK (max_uses BETWEEN 1 AND 1000),
    uses        int         NOT NULL DEFAULT 0 CHECK (uses <= max_uses),
    epoch       bigint      NOT NULL,             -- the delegator's; a change ends it
    db_role     text        NOT NULL,             -- the role the covered writes run as
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at  timestamptz NOT NULL,
    revoked_at  timestamptz,
    PRIMARY KEY (id, tenant)
);
CREATE INDEX delegation_live_idx ON keyturn.delegation (tenant, principal, tool, expires_at)
    WHERE revoked_at IS NULL;

-- Private attachments (sql/056_files.sql): the bytes, staged by an agent or
-- a person, bound to at most one action, deleted in the transaction that
-- gives that action a final status (or by the sweep, a day after staging, if
-- never bound). A table rather than object storage: the deletion is part of
-- the same transaction as the status, row-level security guards it, and
-- there is exactly one copy. EXTERNAL storage: files arrive compressed
-- already, so TOAST should not spend time compressing them again.
CREATE TABLE keyturn.staged_file (
    id            uuid        NOT NULL,
    tenant        text        NOT NULL,
    principal     text        NOT NULL,
    filename      text        NOT NULL,
    content_type  text        NOT NULL,
    size          bigint      NOT NULL,
    sha256        text        NOT NULL,
    content       bytea       NOT NULL,
    staged_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    action_id     uuid,
    PRIMARY KEY (id, tenant)
);
ALTER TABLE keyturn.staged_file ALTER COLUMN content SET STORAGE EXTERNAL;
CREATE INDEX staged_file_action_idx ON keyturn.staged_file (action_id, tenant) WHERE action_id IS NOT NULL;
CREATE INDEX staged_file_unbound_idx ON keyturn.staged_file (staged_at) WHERE action_id IS NULL;

-- One row per principal that has staged a file: stage_file locks it, so a
-- principal's concurrent stagings count the quota one at a time, on a row
-- nothing else locks (a lock on the member or epoch row would let an open
-- staging stall the principal's own revocation).
CREATE TABLE keyturn.stager (
    tenant          text        NOT NULL,
    principal       text        NOT NULL,
    last_staged_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant, principal)
);

-- Card links (sql/058_links.sql): the one-time code a link to the approval
-- card carries instead of any credential, redeemed once (by keyturnd) for
-- a card session of at most 15 minutes, scoped to the link's actions. Only
-- SHA-256 digests of the code and of the session's bearer are stored.
CREATE TABLE keyturn.card_link (
    code_digest         bytea       NOT NULL,
    tenant              text        NOT NULL,
    principal           text        NOT NULL,
    session             text        NOT NULL,     -- the identity's session the card acts in
    db_role             text,                     -- what the card's calls run as; NULL: keyturnd's card role
    action_ids          uuid[]      NOT NULL,
    created_at          timestamptz NOT NULL,
    expires_at          timestamptz NOT NULL,     -- the code's: its ttl, or the first action's expiry
    redeemed_at         timestamptz,
    session_digest      bytea,
    session_expires_at  timestamptz,
    elicits             uuid,                     -- a dispatcher's code (keyturnd's MCP elicitation): its one action
    notification        uuid,                     -- a notification's code: the notification whose message carried it
    PRIMARY KEY (code_digest, tenant)
);
CREATE UNIQUE INDEX card_link_session_idx ON keyturn.card_link (session_digest, tenant)
    WHERE session_digest IS NOT NULL;
CREATE INDEX card_link_expiry_idx ON keyturn.card_link (expires_at);
-- At most one dispatcher's code per action (keyturn._link_code): an index,
-- which no snapshot can miss.
CREATE UNIQUE INDEX card_link_elicits_idx ON keyturn.card_link (elicits, tenant) WHERE elicits IS NOT NULL;
-- A channel's links, ended with it (keyturn._end_channel_links).
CREATE INDEX card_link_notification_idx ON keyturn.card_link (notification, tenant) WHERE notification IS NOT NULL;

-- Evidence recorded by the trusted side (sql/057_fence.sql): what a person
-- showed, or what keyturn.fence handed an agent, by kind, reference and
-- SHA-256, never the content. A proposal may cite it (origin key evidence);
-- revoking it invalidates the pending proposals that do.
CREATE TABLE keyturn.evidence (
    id             uuid        NOT NULL,
    tenant         text        NOT NULL,
    principal      text        NOT NULL,
    kind           text        NOT NULL,
    ref            text        NOT NULL,
    sha256         text        NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    recorded_role  text        NOT NULL,
    recorded_at    timestamptz NOT NULL,
    revoked_at     timestamptz,
    PRIMARY KEY (id, tenant)
);

-- Where a person is reached (sql/064_notify.sql): one target per channel,
-- set by the person (keyturn.set_notify), with the role they set it as (the
-- card their notifications open runs as that role). secret: a webhook's own
-- Standard Webhooks secret; read only by the dispatcher, for the message it
-- signs, and never shown back.
CREATE TABLE keyturn.notify_channel (
    tenant         text            NOT NULL,
    principal      text            NOT NULL,
    channel        keyturn.channel NOT NULL,
    target         text            NOT NULL,     -- an address, a URL, a subscription's JSON (normalized)
    remind_before  interval        NOT NULL,
    max_per_hour   int             NOT NULL CHECK (max_per_hour BETWEEN 1 AND 1000),
    secret         text,
    db_role        text            NOT NULL,
    created_at     timestamptz     NOT NULL,
    updated_at     timestamptz     NOT NULL,
    PRIMARY KEY (tenant, principal, channel)
);

-- Notifications: keyturn's own effects, carried by the dispatcher under the
-- same lease / begin / complete protocol as an action (sql/064_notify.sql
-- says why a table of their own). One per (action, person, channel, kind),
-- kind a notice or the one reminder; a digest (action_id NULL) carries the
-- notices and reminders over the person's hourly cap (batched_into), and
-- covers lists the actions its message linked. status takes the values of an
-- action's dispatch: queued, leased, executing, succeeded, failed, uncertain,
-- and cancelled (its action no longer waits for the person) or superseded
-- (batched into a digest). The id is a UUID of version 8 (a v7 with its
-- version changed), so the dispatcher calls tell a notification from an
-- action by its id alone (keyturn._is_notification).
CREATE TABLE keyturn.notification (
    id               uuid                       NOT NULL,
    tenant           text                       NOT NULL,
    principal        text                       NOT NULL,   -- the person it reaches
    channel          keyturn.channel            NOT NULL,
    kind             keyturn.notification_kind  NOT NULL,
    action_id        uuid,
    covers           uuid[],
    batched_into     uuid,
    status           keyturn.status             NOT NULL,
    result           jsonb,
    attempts         int                        NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz                NOT NULL,   -- when it is due
    lease_id         uuid,
    leased_by        text,
    lease_expires_at timestamptz,
    dispatched_at    timestamptz,
    receipt          jsonb,
    link_digest      bytea,                                 -- the code of its last message (one per attempt)
    link_attempt     int,                                   -- the attempt that message was written for
    created_at       timestamptz                NOT NULL,
    updated_at       timestamptz                NOT NULL,
    PRIMARY KEY (id, tenant),
    CHECK ((kind = 'digest') = (action_id IS NULL))
);
-- Exactly one notice and one reminder per action, person and channel.
CREATE UNIQUE INDEX notification_once_idx ON keyturn.notification (action_id, tenant, principal, channel, kind)
    WHERE action_id IS NOT NULL;
-- At most one digest waiting per person and channel.
CREATE UNIQUE INDEX notification_digest_idx ON keyturn.notification (tenant, principal, channel)
    WHERE kind = 'digest' AND status = 'queued';
CREATE INDEX notification_due_idx       ON keyturn.notification (next_attempt_at, id) WHERE status = 'queued';
CREATE INDEX notification_lease_idx     ON keyturn.notification (lease_expires_at) WHERE status IN ('leased', 'executing');
CREATE INDEX notification_uncertain_idx ON keyturn.notification (dispatched_at) WHERE status = 'uncertain';
-- The hourly cap counts a person's recent notifications on a channel.
CREATE INDEX notification_sent_idx      ON keyturn.notification (tenant, principal, channel, dispatched_at)
    WHERE dispatched_at IS NOT NULL;
CREATE INDEX notification_batch_idx     ON keyturn.notification (batched_into, tenant) WHERE batched_into IS NOT NULL;

-- Read-side projections (sql/057_fence.sql): which fields of a provider's
-- data may reach a prompt. Versioned like tools.
CREATE TABLE keyturn.projection (
    provider    text        PRIMARY KEY,
    version     int         NOT NULL CHECK (version > 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT projection_name_shape CHECK (keyturn._name_ok(provider, 63))
);
CREATE UNIQUE INDEX projection_name_folded ON keyturn.projection (lower(provider COLLATE "C"));
CREATE TABLE keyturn.projection_version (
    provider    text        NOT NULL REFERENCES keyturn.projection (provider),
    version     int         NOT NULL,
    spec        jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, version)
);

-- One row per provider attempt; kept after reconciliation so the reason recovery
-- was needed is never erased.
CREATE TABLE keyturn.attempt (
    action_id    uuid        NOT NULL,
    attempt      int         NOT NULL,
    tenant       text        NOT NULL,
    principal    text        NOT NULL,
    lease_id     uuid        NOT NULL,
    worker       text,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz,
    outcome      keyturn.attempt_outcome,
    receipt      jsonb,
    -- The dispatcher's own account of an attempt the sweep ended before it
    -- could record one (keyturn.record_not_sent): decides nothing, informs
    -- the operator who does.
    dispatcher_account  keyturn.dispatcher_account,
    dispatcher_receipt  jsonb,
    PRIMARY KEY (action_id, tenant, attempt)
) WITH (fillfactor = 70);

-- Append-only: one row per status change, the creation included. Keyed by
-- (action_id, tenant, id): every reader asks for one action's events in order,
-- and one index per row is half the cost of a surrogate key plus an action index.
CREATE TABLE keyturn.event (
    id                bigint      GENERATED ALWAYS AS IDENTITY,
    action_id         uuid        NOT NULL,
    tenant            text        NOT NULL,
    action_principal  text        NOT NULL,   -- whose action it is (for RLS)
    at                timestamptz NOT NULL DEFAULT clock_timestamp(),
    db_role           text        NOT NULL,
    principal         text,                   -- the acting principal; NULL for role-only callers
    from_status       keyturn.status,
    to_status         keyturn.status NOT NULL,
    detail            jsonb       NOT NULL DEFAULT '{}',
    -- The tenant's hash chain (sql/059_audit.sql): the previous event's
    -- hash (64 zeros for the first) and this one's.
    prev_hash         text        NOT NULL,
    hash              text        NOT NULL,
    PRIMARY KEY (action_id, tenant, id)
);

-- Each tenant's chain head: how many events it holds, the last hash and id.
-- Locked by the commit that appends to it (sql/059_audit.sql).
CREATE TABLE keyturn.audit_chain (
    tenant      text        NOT NULL,
    events      bigint      NOT NULL,
    head        text        NOT NULL,
    -- The id of the last event: the next one's is above it. On one node the
    -- event sequence gives that by itself; on Citus (layout B) each worker
    -- has a sequence of its own, behind the ids a tenant's events brought
    -- from the coordinator or another worker (extension/src/audit.rs).
    last_id     bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant)
);

-- Metering: exactly one row per action that reached 'succeeded', written in the
-- same transaction as that status.
CREATE TABLE keyturn.usage (
    action_id  uuid        NOT NULL,
    tenant     text        NOT NULL,
    principal  text        NOT NULL,
    tool       text        NOT NULL,
    executor   text        NOT NULL,
    attempts   int         NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (action_id, tenant)
);
CREATE INDEX usage_tenant_idx ON keyturn.usage (tenant, at);

-- The key of the approval binding (sql/051_approve.sql): one row, made on
-- first use (extension/src/approval.rs), readable by the extension owner alone. It lives in a schema of its own on
-- which no role holds any privilege, so not even GRANT ... ON ALL TABLES IN
-- SCHEMA keyturn (to a role with BYPASSRLS, say) reaches it;
-- keyturn.check_deployment() reports any grant on either.
CREATE SCHEMA keyturn_secret;
REVOKE ALL ON SCHEMA keyturn_secret FROM PUBLIC;
CREATE TABLE keyturn_secret.approval_key (
    id   int   PRIMARY KEY CHECK (id = 1),
    key  bytea NOT NULL CHECK (length(key) = 32)
);

-- These tables hold the tenants' data, not the extension's code: pg_dump must
-- dump their rows (and the event sequence). A restore needs no special
-- settings: rows that keyturn's own functions did not insert (a restore's)
-- fire no lifecycle side effects (020_guards.sql).
-- (One statement each: every call updates the pg_extension row.)
SELECT pg_catalog.pg_extension_config_dump('keyturn.tool', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.tool_version', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.member', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.grant_use', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.tool_grant', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.auth_epoch', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.cancelled_origin', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.action', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.open_action', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.action_target', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.staged_payload', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.attempt', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.event', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.usage', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.request', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.vote', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.delegation', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.staged_file', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.stager', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.card_link', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.audit_chain', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.evidence', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.notify_channel', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.notification', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.projection', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.projection_version', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.request_seq_seq', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.event_id_seq', '');
-- The approval key travels with the data it verifies (dumping keyturn's
-- tables, all under forced row-level security, takes a superuser anyway).
SELECT pg_catalog.pg_extension_config_dump('keyturn_secret.approval_key', '');

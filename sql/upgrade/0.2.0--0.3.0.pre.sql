-- pg_keyturn 0.2.0 -> 0.3.0: the data model (hand-written; runs first).
--
-- sql/make-upgrade writes sql/pg_keyturn--0.2.0--0.3.0.sql from this file,
-- every function of 0.3.0 (the code files of extension/src/lib.rs: they are
-- recreated whole, after every 0.2.0 function is dropped), and
-- 0.2.0--0.3.0.post.sql. The upgrade layer checks that the result leaves a
-- database equal to a fresh 0.3.0 install and keeps its data in every status.

-- keyturn's functions go first, with CASCADE: the triggers and policies of
-- keyturn's tables that use them go too, and the code part recreates all of
-- them (CREATE OR REPLACE). A function something outside the extension uses
-- stays -- an application's RLS policy on keyturn.current_tenant(), say,
-- would go with it -- and is replaced in place, which keeps its dependents.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        WITH members AS (
            SELECT d.classid, d.objid FROM pg_catalog.pg_depend d
             WHERE d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.deptype = 'e'
               AND d.refobjid = (SELECT oid FROM pg_catalog.pg_extension WHERE extname = 'pg_keyturn')),
        -- What belongs to keyturn: its members, and the triggers and policies
        -- of its tables (which are not members themselves).
        own AS (
            SELECT classid, objid FROM members
            UNION ALL
            SELECT 'pg_catalog.pg_trigger'::regclass, t.oid FROM pg_catalog.pg_trigger t
             WHERE (('pg_catalog.pg_class'::regclass)::oid, t.tgrelid) IN (SELECT classid, objid FROM members)
            UNION ALL
            SELECT 'pg_catalog.pg_policy'::regclass, p.oid FROM pg_catalog.pg_policy p
             WHERE (('pg_catalog.pg_class'::regclass)::oid, p.polrelid) IN (SELECT classid, objid FROM members))
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'keyturn'::regnamespace
           AND NOT EXISTS (
                 SELECT 1 FROM pg_catalog.pg_depend d
                  WHERE d.refclassid = 'pg_catalog.pg_proc'::regclass AND d.refobjid = p.oid
                    AND d.deptype = 'n' AND (d.classid, d.objid) NOT IN (SELECT classid, objid FROM own))
    LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s CASCADE', f);
    END LOOP;
END
$$;

-- Every author of a revision chain (the proposer and each reviser) is a
-- proposer for independent and quorum approval: the authors of existing
-- actions, from their chains. A chain is followed from its first proposal.
ALTER TABLE keyturn.action ADD COLUMN authors text[];
WITH RECURSIVE chain (id, tenant, authors) AS (
    SELECT a.id, a.tenant, ARRAY[a.principal] FROM keyturn.action a WHERE a.revised_from IS NULL
    UNION ALL
    SELECT a.id, a.tenant,
           CASE WHEN a.revised_by IS NULL OR a.revised_by = ANY (c.authors) THEN c.authors
                ELSE c.authors || a.revised_by END
      FROM keyturn.action a JOIN chain c ON a.revised_from = c.id AND a.tenant = c.tenant
)
UPDATE keyturn.action a SET authors = c.authors FROM chain c WHERE a.id = c.id AND a.tenant = c.tenant;
-- A revision whose original is gone (none in practice): its own principal
-- and reviser.
UPDATE keyturn.action a SET authors = array_remove(ARRAY[a.principal, a.revised_by], NULL)
 WHERE a.authors IS NULL;
ALTER TABLE keyturn.action ALTER COLUMN authors SET NOT NULL;

-- A standing approval is bound to the tool version it was given for. 0.2.0
-- did not record it: it is the newest version registered by the time the
-- approval was given (tool_version.created_at), not the tool's version now,
-- which would let an approval given for version 1 cover a version 2 that
-- nobody approved (fifth red-team pass). One that no version predates is
-- bound to none (0), and covers nothing.
ALTER TABLE keyturn.delegation ADD COLUMN tool_version int;
UPDATE keyturn.delegation d
   SET tool_version = coalesce((SELECT max(v.version) FROM keyturn.tool_version v
                                 WHERE v.tool = d.tool AND v.created_at <= d.created_at), 0);
ALTER TABLE keyturn.delegation ALTER COLUMN tool_version SET NOT NULL;

-- The proposer's side of a grant (sql/050_propose.sql): its lock and use
-- count move off the grant row, which only admins change.
CREATE TABLE keyturn.grant_use (
    tenant       text        NOT NULL,
    principal    text        NOT NULL,
    tool         text        NOT NULL,
    granted_at   timestamptz,
    uses         int         NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, principal, tool)
);
SELECT pg_catalog.pg_extension_config_dump('keyturn.grant_use', '');
INSERT INTO keyturn.grant_use (tenant, principal, tool, granted_at, uses)
SELECT g.tenant, g.principal, g.tool, g.granted_at, g.uses FROM keyturn.tool_grant g;
ALTER TABLE keyturn.tool_grant DROP COLUMN uses;

-- The staging quota's lock row per principal (sql/056_files.sql).
CREATE TABLE keyturn.stager (
    tenant          text        NOT NULL,
    principal       text        NOT NULL,
    last_staged_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant, principal)
);
SELECT pg_catalog.pg_extension_config_dump('keyturn.stager', '');

-- Card links and their sessions (sql/058_links.sql).
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
CREATE INDEX action_revised_from_idx ON keyturn.action (revised_from, tenant) WHERE revised_from IS NOT NULL;
SELECT pg_catalog.pg_extension_config_dump('keyturn.card_link', '');

-- Value lists as types, each said once (sql/005_status.sql).
CREATE TYPE keyturn.tool_kind AS ENUM ('read', 'write');
CREATE TYPE keyturn.tool_executor AS ENUM ('sql', 'external');
CREATE TYPE keyturn.tool_effect AS ENUM ('reversible', 'compensatable', 'irreversible');
CREATE TYPE keyturn.tool_retain AS ENUM ('full', 'digest');
CREATE TYPE keyturn.tool_approval AS ENUM ('self', 'independent', 'task');
CREATE TYPE keyturn.attempt_outcome AS ENUM ('succeeded', 'failed', 'retry', 'unknown', 'lapsed');
CREATE TYPE keyturn.dispatcher_account AS ENUM ('not_sent');
ALTER TABLE keyturn.tool_version
    DROP CONSTRAINT tool_version_kind_check, DROP CONSTRAINT tool_version_executor_check,
    DROP CONSTRAINT tool_version_effect_check, DROP CONSTRAINT tool_version_retain_check,
    DROP CONSTRAINT tool_version_approval_check;
ALTER TABLE keyturn.tool_version
    ALTER COLUMN kind TYPE keyturn.tool_kind USING kind::keyturn.tool_kind,
    ALTER COLUMN executor TYPE keyturn.tool_executor USING executor::keyturn.tool_executor,
    ALTER COLUMN effect TYPE keyturn.tool_effect USING effect::keyturn.tool_effect,
    ALTER COLUMN retain TYPE keyturn.tool_retain USING retain::keyturn.tool_retain,
    ALTER COLUMN approval TYPE keyturn.tool_approval USING approval::keyturn.tool_approval;
ALTER TABLE keyturn.attempt
    ALTER COLUMN outcome TYPE keyturn.attempt_outcome USING outcome::keyturn.attempt_outcome,
    ADD COLUMN dispatcher_account keyturn.dispatcher_account,
    ADD COLUMN dispatcher_receipt jsonb;

-- The audit's hash chain (sql/059_audit.sql): the columns here, the chain
-- over the existing events in the post part, once the hash functions exist.
ALTER TABLE keyturn.event ADD COLUMN prev_hash text, ADD COLUMN hash text;
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
SELECT pg_catalog.pg_extension_config_dump('keyturn.audit_chain', '');

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
SELECT pg_catalog.pg_extension_config_dump('keyturn.evidence', '');

-- begin_dispatch ends an action failed when it can never be carried out as
-- approved (its attachments' metadata cannot be read, or its files are
-- missing from storage): a new edge of the lifecycle.
INSERT INTO keyturn.transition (from_status, to_status) VALUES ('leased', 'failed');

-- keyturn over MCP (sql/063_mcp.sql): a tool's description, a read tool's
-- projection and sql read form, a discovered tool's upstream and definition
-- hash; and the one new status change, an upstream tool's drift found
-- right before its call.
ALTER TABLE keyturn.tool_version
    ADD COLUMN description text,
    ADD COLUMN projection text,
    ADD COLUMN sql_select text[],
    ADD COLUMN max_rows int CHECK (max_rows > 0),
    ADD COLUMN upstream text,
    ADD COLUMN upstream_tool text,
    ADD COLUMN upstream_schema_sha256 text CHECK (upstream_schema_sha256 ~ '^[0-9a-f]{64}$');
CREATE INDEX tool_version_upstream_idx ON keyturn.tool_version (upstream, created_at) WHERE upstream IS NOT NULL;
INSERT INTO keyturn.transition (from_status, to_status) VALUES ('executing', 'invalidated');
-- Notifications (sql/064_notify.sql): the channels a person is reached on,
-- and the notifications keyturn records when an action starts to wait.
CREATE TYPE keyturn.channel AS ENUM ('email', 'webhook', 'webpush');
CREATE TYPE keyturn.notification_kind AS ENUM ('notice', 'reminder', 'digest');
CREATE TYPE keyturn.mcp_action AS (status text, result jsonb, summary text, expires_at timestamptz,
                                   created_at timestamptz, updated_at timestamptz, same_session boolean);
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
SELECT pg_catalog.pg_extension_config_dump('keyturn.notify_channel', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.notification', '');

-- What approve's and propose's internal steps return (sql/005_status.sql).
CREATE TYPE keyturn._outcome AS (o_action_id uuid, o_status text, o_result jsonb);
CREATE TYPE keyturn._proposed AS (o_action_id uuid, o_token text, o_summary text, o_params_hash text,
                                  o_expires_at timestamptz, o_status text, o_delegation_id uuid);
-- What begin_dispatch's checks answer for one action (sql/005_status.sql).
CREATE TYPE keyturn._begun AS (reason text, failed boolean);

-- One name rule, which MCP servers' tool names fit (sql/010_tables.sql):
-- ASCII letters in any case and hyphens as well, and no two tools whose
-- names differ only in case. 0.2.0's names are all lowercase, so none
-- collide.
CREATE FUNCTION keyturn._name_ok(name text, max_len int) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN name ~ '^[A-Za-z][A-Za-z0-9_-]*(\.[A-Za-z][A-Za-z0-9_-]*)*$' AND length(name) <= max_len;
ALTER TABLE keyturn.tool DROP CONSTRAINT tool_name_shape,
    ADD CONSTRAINT tool_name_shape CHECK (keyturn._name_ok(name, 63));
CREATE UNIQUE INDEX tool_name_folded ON keyturn.tool (lower(name COLLATE "C"));
ALTER TABLE keyturn.projection DROP CONSTRAINT projection_name_shape,
    ADD CONSTRAINT projection_name_shape CHECK (keyturn._name_ok(provider, 63));
CREATE UNIQUE INDEX projection_name_folded ON keyturn.projection (lower(provider COLLATE "C"));

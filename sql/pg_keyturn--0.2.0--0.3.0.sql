\echo Use "ALTER EXTENSION pg_keyturn UPDATE TO '0.3.0'" to load this file. \quit
-- GENERATED FILE: do not edit. pg_keyturn 0.2.0 -> 0.3.0.
-- Written by sql/make-upgrade from sql/upgrade/0.2.0--0.3.0.pre.sql, the
-- functions of 0.3.0 and sql/upgrade/0.2.0--0.3.0.post.sql; edit those, never this
-- (CONTRIBUTING.md, "How a change reaches an upgrade script").

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


-- ==== The functions of 0.3.0, from its install script ====

-- pg_keyturn::actor::_acting
CREATE OR REPLACE FUNCTION "_acting"() RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'acting_wrapper';

-- pg_keyturn::actor::_actor_principal
CREATE OR REPLACE FUNCTION "_actor_principal"() RETURNS TEXT /* Option < String > */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'actor_principal_wrapper';

-- pg_keyturn::actor::_actor_role
CREATE OR REPLACE FUNCTION "_actor_role"() RETURNS TEXT /* Option < String > */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'actor_role_wrapper';

-- pg_keyturn::audit::_append_event
CREATE OR REPLACE FUNCTION "_append_event"(
	"action_id" uuid, /* pgrx :: Uuid */
	"tenant" TEXT, /* & str */
	"action_principal" TEXT, /* & str */
	"db_role" TEXT, /* & str */
	"principal" TEXT, /* Option < & str > */
	"from_status" TEXT, /* Option < & str > */
	"to_status" TEXT, /* & str */
	"detail" jsonb /* JsonbText */
) RETURNS void
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'append_event_wrapper';

-- pg_keyturn::approval::_approval_mac
CREATE OR REPLACE FUNCTION "_approval_mac"(
	"action_id" uuid, /* pgrx :: Uuid */
	"params_hash" TEXT, /* & str */
	"approved_by" TEXT, /* & str */
	"approved_role" TEXT, /* & str */
	"approved_at" timestamp with time zone, /* TimestampWithTimeZone */
	"via" TEXT /* & str */
) RETURNS bytea /* Vec < u8 > */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'approval_mac_wrapper';

-- pg_keyturn::approval::_approval_valid
CREATE OR REPLACE FUNCTION "_approval_valid"(
	"action_id" uuid, /* Option < pgrx :: Uuid > */
	"params_hash" TEXT, /* Option < & str > */
	"approved_by" TEXT, /* Option < & str > */
	"approved_role" TEXT, /* Option < & str > */
	"approved_at" timestamp with time zone, /* Option < TimestampWithTimeZone > */
	"via" TEXT, /* Option < & str > */
	"mac" bytea /* Option < & [u8] > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'approval_valid_wrapper';

-- pg_keyturn::recheck_locks::_await_rechecks
CREATE OR REPLACE FUNCTION "_await_rechecks"(
	"tool" TEXT, /* Option < & str > */
	"tenant" TEXT, /* Option < & str > */
	"principal" TEXT /* Option < & str > */
) RETURNS TEXT /* String */
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'await_rechecks_wrapper';

-- pg_keyturn::args::_batch_check_arrays
CREATE OR REPLACE FUNCTION "_batch_check_arrays"(
	"p_n1" INT, /* Option < i32 > */
	"p_n2" INT, /* Option < i32 > */
	"p_what" TEXT /* & str */
) RETURNS INT /* i32 */
IMMUTABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'batch_check_arrays_wrapper';

-- pg_keyturn::args::_batch_rounds
CREATE OR REPLACE FUNCTION "_batch_rounds"(
	"p_ids" uuid[] /* Vec < Option < pgrx :: Uuid > > */
) RETURNS INT[] /* :: std :: option :: Option < Vec < i32 > > */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'batch_rounds_wrapper';

-- pg_keyturn::identity::_card_claims
CREATE OR REPLACE FUNCTION "_card_claims"(
	"tenant" TEXT, /* & str */
	"principal" TEXT, /* & str */
	"session" TEXT /* & str */
) RETURNS jsonb /* pgrx :: JsonB */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'card_claims_wrapper';

-- pg_keyturn::args::_check_lease_args
CREATE OR REPLACE FUNCTION "_check_lease_args"(
	"p_worker" TEXT, /* Option < & str > */
	"p_max_jobs" INT, /* Option < i32 > */
	"p_lease_for" interval /* Option < Interval > */
) RETURNS void
IMMUTABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'check_lease_args_wrapper';

-- pg_keyturn::validation::_check_params_schema
CREATE OR REPLACE FUNCTION "_check_params_schema"(
	"params_schema" jsonb /* JsonbText */
) RETURNS jsonb /* JsonB */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'check_params_schema_wrapper';

-- pg_keyturn::fence::_check_projection
CREATE OR REPLACE FUNCTION "_check_projection"(
	"spec" jsonb /* JsonbText */
) RETURNS jsonb /* JsonB */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'check_projection_wrapper';

-- pg_keyturn::validation::_check_scope
CREATE OR REPLACE FUNCTION "_check_scope"(
	"scope" jsonb /* JsonbText */
) RETURNS jsonb /* JsonB */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'check_scope_wrapper';

-- pg_keyturn::validation::_check_template
CREATE OR REPLACE FUNCTION "_check_template"(
	"template" TEXT /* & str */
) RETURNS void
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'check_template_wrapper';

-- pg_keyturn::validation::_check_webhook_secret
CREATE OR REPLACE FUNCTION "_check_webhook_secret"(
	"secret" TEXT /* & str */
) RETURNS void
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'check_webhook_secret_wrapper';

-- pg_keyturn::citus::_citus_present
CREATE OR REPLACE FUNCTION "_citus_present"() RETURNS bool /* bool */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'citus_present_wrapper';

-- pg_keyturn::identity::_claims_for
CREATE OR REPLACE FUNCTION "_claims_for"(
	"role" TEXT, /* Option < & str > */
	"tenant" TEXT, /* & str */
	"principal" TEXT, /* & str */
	"session" TEXT /* & str */
) RETURNS jsonb /* pgrx :: JsonB */
STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'claims_for_wrapper';

-- pg_keyturn::approval::_commitment
CREATE OR REPLACE FUNCTION "_commitment"(
	"what" TEXT, /* & str */
	"value" TEXT /* & str */
) RETURNS TEXT /* String */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'commitment_sql_wrapper';

-- pg_keyturn::committed::_committed_grant_at
CREATE OR REPLACE FUNCTION "_committed_grant_at"(
	"tenant" TEXT, /* & str */
	"principal" TEXT, /* & str */
	"tool" TEXT /* & str */
) RETURNS TEXT /* Option < String > */
STRICT STABLE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'committed_grant_at_wrapper';

-- pg_keyturn::committed::_committed_staged
CREATE OR REPLACE FUNCTION "_committed_staged"(
	"tenant" TEXT, /* & str */
	"principal" TEXT /* & str */
) RETURNS TEXT /* String */
STRICT STABLE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'committed_staged_wrapper';

-- pg_keyturn::validation::_credential_path
CREATE OR REPLACE FUNCTION "_credential_path"(
	"params" jsonb /* JsonbText */
) RETURNS TEXT /* Option < String > */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'credential_path_wrapper';

-- pg_keyturn::token::_ct_eq
CREATE OR REPLACE FUNCTION "_ct_eq"(
	"a" bytea, /* & [u8] */
	"b" bytea /* & [u8] */
) RETURNS bool /* bool */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'ct_eq_wrapper';

-- pg_keyturn::approval::_digest_mac
CREATE OR REPLACE FUNCTION "_digest_mac"(
	"params_hash" TEXT /* & str */
) RETURNS TEXT /* String */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'digest_mac_wrapper';

-- pg_keyturn::committed::_ended_how
CREATE OR REPLACE FUNCTION "_ended_how"(
	"tenant" TEXT, /* & str */
	"principal" TEXT, /* & str */
	"conversation" TEXT /* & str */
) RETURNS TEXT /* Option < String > */
STRICT STABLE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'ended_how_wrapper';

-- pg_keyturn::committed::_ends_at_commit
CREATE OR REPLACE FUNCTION "_ends_at_commit"(
	"at" timestamp with time zone, /* TimestampWithTimeZone */
	"what" TEXT /* & str */
) RETURNS TEXT /* String */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'ends_at_commit_wrapper';

-- pg_keyturn::approval::_ensure_approval_key
CREATE OR REPLACE FUNCTION "_ensure_approval_key"() RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'ensure_approval_key_wrapper';

-- pg_keyturn::actor::_event_detail
CREATE OR REPLACE FUNCTION "_event_detail"() RETURNS TEXT /* Option < String > */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'event_detail_wrapper';

-- pg_keyturn::audit::_event_hash
CREATE OR REPLACE FUNCTION "_event_hash"(
	"event" jsonb /* JsonbText */
) RETURNS TEXT /* String */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'event_hash_sql_wrapper';

-- pg_keyturn::committed::_evidence_revoked
CREATE OR REPLACE FUNCTION "_evidence_revoked"(
	"tenant" TEXT, /* & str */
	"ids" TEXT[] /* Vec < String > */
) RETURNS TEXT /* Option < String > */
STRICT STABLE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'evidence_revoked_wrapper';

-- pg_keyturn::committed::_evidence_usable
CREATE OR REPLACE FUNCTION "_evidence_usable"(
	"tenant" TEXT, /* & str */
	"principal" TEXT, /* & str */
	"id" TEXT /* & str */
) RETURNS bool /* bool */
STRICT STABLE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'evidence_usable_wrapper';

-- pg_keyturn::exec_as::_exec_as
CREATE OR REPLACE FUNCTION "_exec_as"(
	"role" oid, /* pg_sys :: Oid */
	"query" TEXT, /* & str */
	"arg" jsonb /* RawJsonb */
) RETURNS jsonb /* RawJsonb */
STRICT VOLATILE PARALLEL UNSAFE 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'exec_as_wrapper';

-- pg_keyturn::fence::_fence
CREATE OR REPLACE FUNCTION "_fence"(
	"provider" TEXT, /* & str */
	"spec" jsonb, /* JsonbText */
	"data" jsonb /* JsonbText */
) RETURNS TABLE (
	"guard" TEXT,  /* String */
	"reference" TEXT,  /* String */
	"marker" TEXT  /* String */
)
STRICT VOLATILE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'fence_data_wrapper';

-- pg_keyturn::validation::_filename_problem
CREATE OR REPLACE FUNCTION "_filename_problem"(
	"name" TEXT /* & str */
) RETURNS TEXT /* Option < String > */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'filename_problem_wrapper';

-- pg_keyturn::canonical::_form_arg
CREATE OR REPLACE FUNCTION "_form_arg"(
	"form" jsonb, /* JsonbText */
	"types" jsonb /* JsonB */
) RETURNS jsonb /* JsonB */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'form_arg_wrapper';

-- pg_keyturn::form::_form_fit
CREATE OR REPLACE FUNCTION "_form_fit"(
	"types" jsonb, /* Option < JsonbText > */
	"form" jsonb /* Option < JsonbText > */
) RETURNS TEXT[] /* :: std :: option :: Option < Vec < String > > */
IMMUTABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'form_fit_wrapper';

-- pg_keyturn::form::_form_problem
CREATE OR REPLACE FUNCTION "_form_problem"(
	"tool" TEXT, /* Option < & str > */
	"where_columns" TEXT[], /* :: std :: option :: Option < Vec < Option < String > > > */
	"set_columns" TEXT[], /* :: std :: option :: Option < Vec < Option < String > > > */
	"types" jsonb, /* Option < JsonbText > */
	"form" jsonb /* Option < JsonbText > */
) RETURNS TEXT /* Option < String > */
IMMUTABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'form_problem_wrapper';

-- pg_keyturn::privilege::_has_children
CREATE OR REPLACE FUNCTION "_has_children"(
	"relid" oid /* pg_sys :: Oid */
) RETURNS bool /* bool */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'has_children_wrapper';

-- pg_keyturn::identity::_identity_problem
CREATE OR REPLACE FUNCTION "_identity_problem"() RETURNS TEXT /* Option < String > */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'problem_wrapper';

-- pg_keyturn::identity::_in_card_session
CREATE OR REPLACE FUNCTION "_in_card_session"() RETURNS bool /* bool */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'in_card_session_wrapper';

-- pg_keyturn::validation::_inspect_params
CREATE OR REPLACE FUNCTION "_inspect_params"(
	"tool" TEXT, /* & str */
	"params" jsonb, /* JsonbText */
	"params_schema" jsonb /* JsonbText */
) RETURNS TABLE (
	"credential_path" TEXT,  /* Option < String > */
	"params_hash" TEXT,  /* Option < String > */
	"schema_errors" TEXT  /* Option < String > */
)
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'inspect_params_wrapper';

-- pg_keyturn::validation::_inspected
CREATE OR REPLACE FUNCTION "_inspected"(
	"tool" TEXT, /* & str */
	"params" jsonb, /* JsonbText */
	"params_schema" jsonb, /* JsonbText */
	"withhold_values" bool /* bool */
) RETURNS TEXT[] /* Vec < Option < String > > */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'inspected_wrapper';

-- pg_keyturn::privilege::_is_agent_role
CREATE OR REPLACE FUNCTION "_is_agent_role"(
	"role" oid /* pg_sys :: Oid */
) RETURNS bool /* bool */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'is_agent_role_sql_wrapper';

-- pg_keyturn::committed::_latest_turn
CREATE OR REPLACE FUNCTION "_latest_turn"(
	"tenant" TEXT, /* & str */
	"principal" TEXT, /* & str */
	"conversation" TEXT /* & str */
) RETURNS TEXT /* Option < String > */
STRICT STABLE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'latest_turn_wrapper';

-- pg_keyturn::audit::_noted_events
CREATE OR REPLACE FUNCTION "_noted_events"(
	"action_id" uuid /* pgrx :: Uuid */
) RETURNS TABLE (
	"at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"db_role" TEXT,  /* String */
	"principal" TEXT,  /* Option < String > */
	"from_status" TEXT,  /* Option < String > */
	"to_status" TEXT,  /* String */
	"detail" TEXT  /* String */
)
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'noted_events_wrapper';

-- pg_keyturn::ids::_notification_id
CREATE OR REPLACE FUNCTION "_notification_id"() RETURNS uuid /* pgrx :: Uuid */
STRICT VOLATILE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'notification_id_wrapper';

-- pg_keyturn::validation::_notify_target
CREATE OR REPLACE FUNCTION "_notify_target"(
	"channel" TEXT, /* & str */
	"target" TEXT /* & str */
) RETURNS TEXT /* String */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'notify_target_wrapper';

-- pg_keyturn::validation::_notify_target_hint
CREATE OR REPLACE FUNCTION "_notify_target_hint"(
	"channel" TEXT, /* & str */
	"target" TEXT /* & str */
) RETURNS TEXT /* String */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'notify_target_hint_wrapper';

-- pg_keyturn::privilege::_owned_by_agent
CREATE OR REPLACE FUNCTION "_owned_by_agent"(
	"relid" oid /* pg_sys :: Oid */
) RETURNS bool /* bool */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'owned_by_agent_sql_wrapper';

-- pg_keyturn::canonical::_param_keys
CREATE OR REPLACE FUNCTION "_param_keys"(
	"params" jsonb /* JsonbText */
) RETURNS TEXT[] /* Vec < String > */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'param_keys_wrapper';

-- pg_keyturn::validation::_params_errors
CREATE OR REPLACE FUNCTION "_params_errors"(
	"params_schema" jsonb, /* JsonbText */
	"params" jsonb /* JsonbText */
) RETURNS TEXT /* Option < String > */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'params_errors_wrapper';

-- pg_keyturn::approval::_params_hash_matches
CREATE OR REPLACE FUNCTION "_params_hash_matches"(
	"retain" TEXT, /* Option < & str > */
	"stored" TEXT, /* Option < & str > */
	"plain" TEXT /* Option < & str > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'params_hash_matches_wrapper';

-- pg_keyturn::validation::_quoted
CREATE OR REPLACE FUNCTION "_quoted"(
	"value" TEXT /* & str */
) RETURNS TEXT /* String */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'quoted_wrapper';

-- pg_keyturn::committed::_read_as_committed
CREATE OR REPLACE FUNCTION "_read_as_committed"(
	"tool" TEXT, /* & str */
	"enabled" bool, /* Option < bool > */
	"version" INT, /* Option < i32 > */
	"tenant" TEXT, /* & str */
	"principal" TEXT, /* & str */
	"epoch" bigint /* i64 */
) RETURNS TEXT /* String */
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'read_as_committed_wrapper';

-- pg_keyturn::validation::_receipt_problem
CREATE OR REPLACE FUNCTION "_receipt_problem"(
	"receipt" jsonb /* JsonbText */
) RETURNS TEXT /* Option < String > */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'receipt_problem_wrapper';

-- pg_keyturn::committed::_recent_proposals
CREATE OR REPLACE FUNCTION "_recent_proposals"(
	"tenant" TEXT, /* & str */
	"principal" TEXT, /* & str */
	"tool" TEXT, /* & str */
	"per" TEXT /* & str */
) RETURNS bigint /* i64 */
STRICT STABLE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'recent_proposals_wrapper';

-- pg_keyturn::committed::_recheck_at_commit
CREATE OR REPLACE FUNCTION "_recheck_at_commit"(
	"tool" TEXT, /* & str */
	"version" INT, /* i32 */
	"tenant" TEXT, /* & str */
	"principal" TEXT, /* & str */
	"epoch" bigint, /* i64 */
	"conversation" TEXT, /* Option < & str > */
	"evidence" TEXT[] /* :: std :: option :: Option < Vec < String > > */
) RETURNS TEXT /* String */
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'recheck_at_commit_wrapper';

-- pg_keyturn::committed::_recheck_epoch_at_commit
CREATE OR REPLACE FUNCTION "_recheck_epoch_at_commit"(
	"tenant" TEXT, /* & str */
	"principal" TEXT, /* & str */
	"epoch" bigint /* i64 */
) RETURNS TEXT /* String */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'recheck_epoch_at_commit_wrapper';

-- pg_keyturn::validation::_redact
CREATE OR REPLACE FUNCTION "_redact"(
	"receipt" jsonb /* JsonbText */
) RETURNS jsonb /* JsonB */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'redact_wrapper';

-- pg_keyturn::privilege::_refuse_nested
CREATE OR REPLACE FUNCTION "_refuse_nested"(
	"what" TEXT /* & str */
) RETURNS void
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'refuse_nested_wrapper';

-- pg_keyturn::gate::_refuse_other_tenant
CREATE OR REPLACE FUNCTION "_refuse_other_tenant"(
	"what" TEXT, /* & str */
	"tenant" TEXT /* Option < & str > */
) RETURNS void
STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'refuse_other_tenant_sql_wrapper';

-- pg_keyturn::privilege::_refuse_rls_bypass
CREATE OR REPLACE FUNCTION "_refuse_rls_bypass"(
	"role" oid /* pg_sys :: Oid */
) RETURNS TEXT /* String */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'refuse_rls_bypass_sql_wrapper';

-- pg_keyturn::validation::_render_summary
CREATE OR REPLACE FUNCTION "_render_summary"(
	"template" TEXT, /* & str */
	"params" jsonb, /* JsonbText */
	"count" INT /* i32 */
) RETURNS TEXT /* String */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'render_summary_wrapper';

-- pg_keyturn::identity::_require_identity_text
CREATE OR REPLACE FUNCTION "_require_identity_text"(
	"value" TEXT, /* & str */
	"what" TEXT /* & str */
) RETURNS void
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'require_identity_text_wrapper';

-- pg_keyturn::route_guard::_require_tenant
CREATE OR REPLACE FUNCTION "_require_tenant"(
	"p_tenant" TEXT, /* Option < & str > */
	"p_what" TEXT /* & str */
) RETURNS TEXT /* String */
IMMUTABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'require_tenant_sql_wrapper';

-- pg_keyturn::args::_require_text
CREATE OR REPLACE FUNCTION "_require_text"(
	"p_value" TEXT, /* Option < & str > */
	"p_what" TEXT /* & str */
) RETURNS TEXT /* String */
IMMUTABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'require_text_sql_wrapper';

-- pg_keyturn::validation::_scope_uncovered
CREATE OR REPLACE FUNCTION "_scope_uncovered"(
	"scope" jsonb, /* Option < JsonbText > */
	"params" jsonb, /* Option < JsonbText > */
	"target_count" INT /* Option < i32 > */
) RETURNS TEXT /* Option < String > */
IMMUTABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'scope_cover_violation_wrapper';

-- pg_keyturn::validation::_scope_violation
CREATE OR REPLACE FUNCTION "_scope_violation"(
	"scope" jsonb, /* Option < JsonbText > */
	"params" jsonb, /* Option < JsonbText > */
	"target_count" INT /* Option < i32 > */
) RETURNS TEXT /* Option < String > */
IMMUTABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'scope_violation_wrapper';

-- pg_keyturn::actor::_set_actor
CREATE OR REPLACE FUNCTION "_set_actor"(
	"p_role" TEXT, /* Option < & str > */
	"p_principal" TEXT /* Option < & str > */
) RETURNS TEXT /* String */
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'set_actor_wrapper';

-- pg_keyturn::form::_set_clauses
CREATE OR REPLACE FUNCTION "_set_clauses"(
	"types" jsonb, /* Option < JsonbText > */
	"form" jsonb /* Option < JsonbText > */
) RETURNS TEXT[] /* Vec < String > */
IMMUTABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'set_clauses_wrapper';

-- pg_keyturn::actor::_set_event_context
CREATE OR REPLACE FUNCTION "_set_event_context"(
	"p_context" jsonb /* Option < pgrx :: JsonB > */
) RETURNS TEXT /* String */
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'set_event_context_wrapper';

-- pg_keyturn::actor::_set_event_detail
CREATE OR REPLACE FUNCTION "_set_event_detail"(
	"p_detail" jsonb /* Option < JsonbText > */
) RETURNS TEXT /* String */
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'set_event_detail_wrapper';

-- pg_keyturn::actor::_set_event_details
CREATE OR REPLACE FUNCTION "_set_event_details"(
	"p_ids" uuid[], /* :: std :: option :: Option < Vec < Option < pgrx :: Uuid > > > */
	"p_details" TEXT[] /* :: std :: option :: Option < Vec < Option < String > > > */
) RETURNS TEXT /* String */
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'set_event_details_wrapper';

-- pg_keyturn::guc::_strict_dispatcher_links
CREATE OR REPLACE FUNCTION "_strict_dispatcher_links"() RETURNS bool /* bool */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'strict_dispatcher_links_wrapper';

-- pg_keyturn::form::_table_problem
CREATE OR REPLACE FUNCTION "_table_problem"(
	"table" oid /* Option < pg_sys :: Oid > */
) RETURNS TEXT /* Option < & '_ str > */
STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'table_problem_wrapper';

-- pg_keyturn::token::_token_binding
CREATE OR REPLACE FUNCTION "_token_binding"(
	"token" TEXT, /* & str */
	"action_id" uuid, /* pgrx :: Uuid */
	"params_hash" TEXT, /* & str */
	"expires_at" timestamp with time zone, /* TimestampWithTimeZone */
	"origin" jsonb /* pgrx :: JsonB */
) RETURNS bytea /* Vec < u8 > */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'token_binding_of_wrapper';

-- pg_keyturn::token::_token_binds
CREATE OR REPLACE FUNCTION "_token_binds"(
	"token" TEXT, /* & str */
	"action_id" uuid, /* pgrx :: Uuid */
	"params_hash" TEXT, /* & str */
	"expires_at" timestamp with time zone, /* TimestampWithTimeZone */
	"origin" jsonb, /* pgrx :: JsonB */
	"stored" bytea /* & [u8] */
) RETURNS bool /* bool */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'token_binds_of_wrapper';

-- pg_keyturn::token::_token_digest
CREATE OR REPLACE FUNCTION "_token_digest"(
	"token" TEXT /* & str */
) RETURNS bytea /* Vec < u8 > */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'token_digest_wrapper';

-- pg_keyturn::token::_token_new
CREATE OR REPLACE FUNCTION "_token_new"() RETURNS TEXT /* String */
STRICT VOLATILE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'token_new_wrapper';

-- pg_keyturn::committed::_turn_at_commit
CREATE OR REPLACE FUNCTION "_turn_at_commit"(
	"tenant" TEXT, /* & str */
	"principal" TEXT, /* & str */
	"conversation" TEXT, /* & str */
	"turn" TEXT /* & str */
) RETURNS TEXT /* String */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'turn_at_commit_wrapper';

-- pg_keyturn::mcp::_upstream_tool
CREATE OR REPLACE FUNCTION "_upstream_tool"(
	"definition" jsonb, /* JsonbText */
	"trust_annotations" bool /* bool */
) RETURNS jsonb /* JsonB */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'upstream_tool_wrapper';

-- pg_keyturn::ids::_uuid_v7
CREATE OR REPLACE FUNCTION "_uuid_v7"() RETURNS uuid /* pgrx :: Uuid */
STRICT VOLATILE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'uuid_v7_wrapper';

-- pg_keyturn::form::_value_expr
CREATE OR REPLACE FUNCTION "_value_expr"(
	"types" jsonb, /* Option < JsonbText > */
	"part" TEXT, /* & str */
	"column" TEXT /* & str */
) RETURNS TEXT /* String */
IMMUTABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'value_expr_wrapper';

-- pg_keyturn::form::_where_clause
CREATE OR REPLACE FUNCTION "_where_clause"(
	"types" jsonb, /* Option < JsonbText > */
	"form" jsonb /* Option < JsonbText > */
) RETURNS TEXT /* String */
IMMUTABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'where_clause_wrapper';

-- pg_keyturn::form::_written_keys
CREATE OR REPLACE FUNCTION "_written_keys"(
	"rows" jsonb, /* Option < JsonbText > */
	"failed_only" bool /* bool */
) RETURNS jsonb /* Option < RawJsonb > */
IMMUTABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'written_keys_wrapper';

-- pg_keyturn::gate::human::approve
CREATE OR REPLACE FUNCTION "approve"(
	"action_id" uuid, /* Option < pgrx :: Uuid > */
	"token" TEXT, /* Option < String > */
	"params" jsonb DEFAULT NULL /* Option < JsonbText > */
) RETURNS TABLE (
	"action_id" uuid,  /* pgrx :: Uuid */
	"status" TEXT,  /* String */
	"result" jsonb  /* Option < RawJsonb > */
)
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'approve_wrapper';

-- pg_keyturn::gate::human::approve_for
CREATE OR REPLACE FUNCTION "approve_for"(
	"tenant" TEXT, /* Option < String > */
	"action_id" uuid, /* Option < pgrx :: Uuid > */
	"token" TEXT, /* Option < String > */
	"params" jsonb DEFAULT NULL /* Option < JsonbText > */
) RETURNS TABLE (
	"action_id" uuid,  /* pgrx :: Uuid */
	"status" TEXT,  /* String */
	"result" jsonb  /* Option < RawJsonb > */
)
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'approve_for_wrapper';

-- pg_keyturn::gate::human::approve_many
CREATE OR REPLACE FUNCTION "approve_many"(
	"items" jsonb /* Option < JsonbText > */
) RETURNS TABLE (
	"action_id" uuid,  /* pgrx :: Uuid */
	"status" TEXT,  /* String */
	"result" jsonb  /* Option < RawJsonb > */
)
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'approve_many_wrapper';

-- pg_keyturn::gate::human::approve_many_for
CREATE OR REPLACE FUNCTION "approve_many_for"(
	"tenant" TEXT, /* Option < String > */
	"items" jsonb /* Option < JsonbText > */
) RETURNS TABLE (
	"action_id" uuid,  /* pgrx :: Uuid */
	"status" TEXT,  /* String */
	"result" jsonb  /* Option < RawJsonb > */
)
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'approve_many_for_wrapper';

-- pg_keyturn::canonical::canonical_json
CREATE OR REPLACE FUNCTION "canonical_json"(
	"j" jsonb /* JsonbText */
) RETURNS TEXT /* String */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'canonical_json_wrapper';

-- pg_keyturn::identity::current_principal
CREATE OR REPLACE FUNCTION "current_principal"() RETURNS TEXT /* Option < String > */
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'current_principal_wrapper';

-- pg_keyturn::identity::current_session
CREATE OR REPLACE FUNCTION "current_session"() RETURNS TEXT /* Option < String > */
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'current_session_wrapper';

-- pg_keyturn::identity::current_tenant
CREATE OR REPLACE FUNCTION "current_tenant"() RETURNS TEXT /* Option < String > */
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'current_tenant_wrapper';

-- pg_keyturn::gate::human::delegate
CREATE OR REPLACE FUNCTION "delegate"(
	"tool" TEXT, /* Option < String > */
	"scope" jsonb, /* Option < JsonbText > */
	"max_uses" INT, /* Option < i32 > */
	"valid_for" interval /* Option < pgrx :: datum :: Interval > */
) RETURNS uuid /* pgrx :: Uuid */
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'delegate_wrapper';

-- pg_keyturn::gate::human::delegations
CREATE OR REPLACE FUNCTION "delegations"() RETURNS TABLE (
	"delegation_id" uuid,  /* pgrx :: Uuid */
	"principal" TEXT,  /* String */
	"tool" TEXT,  /* String */
	"scope" jsonb,  /* RawJsonb */
	"max_uses" INT,  /* i32 */
	"uses" INT,  /* i32 */
	"expires_at" timestamp with time zone,  /* TimestampWithTimeZone */
	"revoked" bool,  /* bool */
	"tool_version" INT,  /* i32 */
	"ended" TEXT  /* Option < String > */
)
STRICT VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'delegations_wrapper';

-- pg_keyturn::gate::human::issue_token
CREATE OR REPLACE FUNCTION "issue_token"(
	"action_id" uuid /* Option < pgrx :: Uuid > */
) RETURNS TEXT /* Option < String > */
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'issue_token_wrapper';

-- pg_keyturn::gate::human::link_code
CREATE OR REPLACE FUNCTION "link_code"(
	"action_ids" uuid[], /* :: std :: option :: Option < Vec < Option < pgrx :: Uuid > > > */
	"ttl" interval DEFAULT '15 minutes' /* Option < pgrx :: datum :: Interval > */
) RETURNS TEXT /* String */
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'link_code_wrapper';

-- pg_keyturn::gate::human::notify_channels
CREATE OR REPLACE FUNCTION "notify_channels"() RETURNS TABLE (
	"channel" TEXT,  /* String */
	"target" TEXT,  /* String */
	"remind_before" interval,  /* pgrx :: datum :: Interval */
	"max_per_hour" INT,  /* i32 */
	"own_secret" bool,  /* bool */
	"db_role" TEXT,  /* String */
	"updated_at" timestamp with time zone  /* TimestampWithTimeZone */
)
STRICT VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'notify_channels_wrapper';

-- pg_keyturn::canonical::params_hash
CREATE OR REPLACE FUNCTION "params_hash"(
	"tool" TEXT, /* & str */
	"params" jsonb /* JsonbText */
) RETURNS TEXT /* String */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'params_hash_wrapper';

-- pg_keyturn::gate::human::pending
CREATE OR REPLACE FUNCTION "pending"(
	"max_rows" INT DEFAULT 50 /* Option < i32 > */
) RETURNS TABLE (
	"action_id" uuid,  /* pgrx :: Uuid */
	"tool" TEXT,  /* String */
	"summary" TEXT,  /* String */
	"effect" TEXT,  /* String */
	"approval" TEXT,  /* String */
	"principal" TEXT,  /* String */
	"created_at" timestamp with time zone,  /* TimestampWithTimeZone */
	"expires_at" timestamp with time zone,  /* TimestampWithTimeZone */
	"votes" INT,  /* i32 */
	"quorum" INT  /* i32 */
)
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'pending_wrapper';

-- pg_keyturn::gate::human::preview
CREATE OR REPLACE FUNCTION "preview"(
	"action_id" uuid, /* Option < pgrx :: Uuid > */
	"token" TEXT /* Option < String > */
) RETURNS jsonb /* RawJsonb */
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'preview_wrapper';

-- pg_keyturn::gate::human::preview
CREATE OR REPLACE FUNCTION "preview"(
	"action_id" uuid, /* Option < pgrx :: Uuid > */
	"token" TEXT, /* Option < String > */
	"params" jsonb /* Option < JsonbText > */
) RETURNS jsonb /* RawJsonb */
VOLATILE PARALLEL UNSAFE 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'preview_checking_wrapper';

-- pg_keyturn::gate::human::preview_for
CREATE OR REPLACE FUNCTION "preview_for"(
	"tenant" TEXT, /* Option < String > */
	"action_id" uuid, /* Option < pgrx :: Uuid > */
	"token" TEXT /* Option < String > */
) RETURNS jsonb /* RawJsonb */
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'preview_for_wrapper';

-- pg_keyturn::gate::human::preview_for
CREATE OR REPLACE FUNCTION "preview_for"(
	"tenant" TEXT, /* Option < String > */
	"action_id" uuid, /* Option < pgrx :: Uuid > */
	"token" TEXT, /* Option < String > */
	"params" jsonb /* Option < JsonbText > */
) RETURNS jsonb /* RawJsonb */
VOLATILE PARALLEL UNSAFE 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'preview_for_checking_wrapper';

-- pg_keyturn::gate::agent::propose
CREATE OR REPLACE FUNCTION "propose"(
	"tool" TEXT, /* Option < String > */
	"params" jsonb, /* Option < JsonbText > */
	"origin" jsonb DEFAULT '{}' /* Option < JsonbText > */
) RETURNS TABLE (
	"action_id" uuid,  /* pgrx :: Uuid */
	"token" TEXT,  /* Option < String > */
	"summary" TEXT,  /* String */
	"params_hash" TEXT,  /* String */
	"expires_at" timestamp with time zone,  /* TimestampWithTimeZone */
	"status" TEXT,  /* String */
	"delegation_id" uuid  /* Option < pgrx :: Uuid > */
)
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'propose_wrapper';

-- pg_keyturn::gate::agent::propose_for
CREATE OR REPLACE FUNCTION "propose_for"(
	"tenant" TEXT, /* Option < String > */
	"tool" TEXT, /* Option < String > */
	"params" jsonb, /* Option < JsonbText > */
	"origin" jsonb DEFAULT '{}' /* Option < JsonbText > */
) RETURNS TABLE (
	"action_id" uuid,  /* pgrx :: Uuid */
	"token" TEXT,  /* Option < String > */
	"summary" TEXT,  /* String */
	"params_hash" TEXT,  /* String */
	"expires_at" timestamp with time zone,  /* TimestampWithTimeZone */
	"status" TEXT,  /* String */
	"delegation_id" uuid  /* Option < pgrx :: Uuid > */
)
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'propose_for_wrapper';

-- pg_keyturn::gate::human::record_evidence

CREATE OR REPLACE FUNCTION "record_evidence"(
	"kind" TEXT,
	"ref" TEXT,
	"sha256" TEXT
) RETURNS uuid
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'record_evidence_wrapper';

-- pg_keyturn::gate::human::record_request
CREATE OR REPLACE FUNCTION "record_request"(
	"conversation_id" TEXT, /* Option < String > */
	"turn_id" TEXT, /* Option < String > */
	"message_id" TEXT, /* Option < String > */
	"text_sha256" TEXT /* Option < String > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'record_request_wrapper';

-- pg_keyturn::gate::human::reject
CREATE OR REPLACE FUNCTION "reject"(
	"action_id" uuid, /* Option < pgrx :: Uuid > */
	"token" TEXT, /* Option < String > */
	"reason" TEXT DEFAULT NULL /* Option < String > */
) RETURNS TEXT /* String */
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'reject_wrapper';

-- pg_keyturn::gate::human::reject_for
CREATE OR REPLACE FUNCTION "reject_for"(
	"tenant" TEXT, /* Option < String > */
	"action_id" uuid, /* Option < pgrx :: Uuid > */
	"token" TEXT, /* Option < String > */
	"reason" TEXT DEFAULT NULL /* Option < String > */
) RETURNS TEXT /* String */
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'reject_for_wrapper';

-- pg_keyturn::gate::human::remove_notify
CREATE OR REPLACE FUNCTION "remove_notify"(
	"channel" TEXT /* Option < String > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'remove_notify_wrapper';

-- pg_keyturn::gate::human::revise
CREATE OR REPLACE FUNCTION "revise"(
	"action_id" uuid, /* Option < pgrx :: Uuid > */
	"token" TEXT, /* Option < String > */
	"params" jsonb /* Option < JsonbText > */
) RETURNS TABLE (
	"action_id" uuid,  /* pgrx :: Uuid */
	"token" TEXT,  /* String */
	"summary" TEXT,  /* String */
	"params_hash" TEXT,  /* String */
	"expires_at" timestamp with time zone  /* TimestampWithTimeZone */
)
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'revise_wrapper';

-- pg_keyturn::gate::human::revise_for
CREATE OR REPLACE FUNCTION "revise_for"(
	"tenant" TEXT, /* Option < String > */
	"action_id" uuid, /* Option < pgrx :: Uuid > */
	"token" TEXT, /* Option < String > */
	"params" jsonb /* Option < JsonbText > */
) RETURNS TABLE (
	"action_id" uuid,  /* pgrx :: Uuid */
	"token" TEXT,  /* String */
	"summary" TEXT,  /* String */
	"params_hash" TEXT,  /* String */
	"expires_at" timestamp with time zone  /* TimestampWithTimeZone */
)
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'revise_for_wrapper';

-- pg_keyturn::gate::human::revoke_delegation
CREATE OR REPLACE FUNCTION "revoke_delegation"(
	"delegation_id" uuid /* Option < pgrx :: Uuid > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'revoke_delegation_wrapper';

-- pg_keyturn::gate::human::revoke_links
CREATE OR REPLACE FUNCTION "revoke_links"() RETURNS INT /* i32 */
STRICT VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'revoke_links_wrapper';

-- pg_keyturn::gate::human::set_notify
CREATE OR REPLACE FUNCTION "set_notify"(
	"channel" TEXT, /* Option < String > */
	"target" TEXT, /* Option < String > */
	"settings" jsonb DEFAULT '{}' /* Option < JsonbText > */
) RETURNS void
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'set_notify_wrapper';

-- pg_keyturn::token::token_binding
-- Skipped due to `#[pgrx(sql = false)]`

-- pg_keyturn::token::token_binds
-- Skipped due to `#[pgrx(sql = false)]`

-- pg_keyturn::lifecycle::_action_lifecycle
CREATE OR REPLACE FUNCTION "_action_lifecycle"()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', '_action_lifecycle_wrapper';

-- pg_keyturn::lifecycle::_guard_status
CREATE OR REPLACE FUNCTION "_guard_status"()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', '_guard_status_wrapper';


-- ==== sql/011_status_rules.sql ====

-- What the status graph (keyturn.transition, 005_status.sql) implies, as
-- functions: whether a change is legal, and which statuses are final.

-- Whether a status change is legal (for people and tests; the guard itself
-- uses the generated condition).
CREATE OR REPLACE FUNCTION keyturn._legal_transition(from_status keyturn.status, to_status keyturn.status)
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
        $f$CREATE OR REPLACE FUNCTION keyturn._is_final(status keyturn.status)
           RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
           AS $b$SELECT status <> ALL (%L::keyturn.status[])$b$$f$,
        (SELECT pg_catalog.array_agg(DISTINCT t.from_status ORDER BY t.from_status)::text
           FROM keyturn.transition t));
END
$do$;


-- ==== sql/012_citus_catalog.sql ====

-- What Citus says about a table (docs/scale-out.md), for the files after
-- this one: whether Citus is here, how it holds a table, what a gated table
-- it distributes must be (register_tool refuses, check_deployment reports),
-- and a reference table's placement on this node.
--
-- The extension never depends on Citus: without it in this database every
-- function here answers nothing, and Citus's catalog is only reached through
-- EXECUTE, once its presence is known (keyturn._citus_present, in Rust:
-- extension/src/citus.rs).

-- How Citus holds a table: method 'h' (hash-distributed), 'n' (reference,
-- single-shard or Citus-local: no distribution column), 'a'/'r' (append,
-- range); dist_column its distribution column. No row: not a Citus table,
-- or no Citus.
CREATE OR REPLACE FUNCTION keyturn._citus_table(p_relid oid)
RETURNS TABLE (method text, dist_column text, reference boolean)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF NOT keyturn._citus_present() THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE
        'SELECT p.partmethod::text,
                CASE WHEN p.partkey IS NOT NULL THEN pg_catalog.column_to_column_name(p.logicalrelid, p.partkey) END,
                p.partmethod = ''n'' AND p.repmodel = ''t''
           FROM pg_catalog.pg_dist_partition p WHERE p.logicalrelid = $1'
        USING p_relid;
END
$$;

-- Key and version columns whose text depends on session settings (DateStyle,
-- TimeZone, IntervalStyle, extra_float_digits, bytea_output, lc_monetary).
-- keyturn stores a target's key and version as text written under settings
-- it pins for its own statements; on a distributed table that text is
-- written and read back on the workers, under whatever settings their
-- connections have (a SET LOCAL the application propagates included), so the
-- same text could name another row.
CREATE OR REPLACE FUNCTION keyturn._citus_setting_dependent(p_type text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT split_part(p_type, '(', 1) IN (
        'date', 'timestamp without time zone', 'timestamp with time zone', 'time without time zone',
        'time with time zone', 'interval', 'real', 'double precision', 'bytea', 'money')
$$;

-- Why an sql tool's part (as _spec_sql returns it: table, key, version, set,
-- types) cannot work on a table Citus distributes, one line per problem, or
-- nothing. register_tool refuses on any; check_deployment reports them for
-- the registered tools of tables distributed since.
CREATE OR REPLACE FUNCTION keyturn._citus_table_problems(p_relid oid, p_key text, p_version text, p_set text[],
                                              p_types jsonb)
RETURNS SETOF text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    c record;
    k text;
BEGIN
    SELECT * INTO c FROM keyturn._citus_table(p_relid);
    IF NOT FOUND OR c.reference THEN
        RETURN;
    END IF;
    IF c.dist_column = ANY (p_set) THEN
        RETURN NEXT format('spec.sql.set names %s, the distribution column of %s: Citus never changes a row''s distribution column, so every approval would fail',
                           quote_ident(c.dist_column), p_relid::regclass);
    END IF;
    FOREACH k IN ARRAY ARRAY[p_key, p_version] LOOP
        IF k <> 'xmin' AND keyturn._citus_setting_dependent(p_types ->> k) THEN
            RETURN NEXT format('%s %s of distributed table %s is %s, whose text depends on the workers'' session settings: the stored target could name another row there',
                               CASE WHEN k = p_key THEN 'key' ELSE 'version' END, quote_ident(k),
                               p_relid::regclass, p_types ->> k);
        END IF;
    END LOOP;
END
$$;

-- This node's placement of a reference table (the shard Citus keeps on every
-- node, keyturn.tool_<shard id>), or NULL: no Citus, not a reference table,
-- or no placement here. A row lock taken on it is a plain PostgreSQL lock on
-- this node, which a change of the reference table (made on every placement,
-- this one included) waits for. Citus would turn a row lock on the
-- reference table itself into a lock on another node too, which a call it
-- runs on a worker cannot take without deadlocking against another such call.
CREATE OR REPLACE FUNCTION keyturn._local_placement(p_rel regclass)
RETURNS regclass
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_shard regclass;
BEGIN
    IF NOT keyturn._citus_present() THEN
        RETURN NULL;
    END IF;
    EXECUTE 'SELECT to_regclass(format(''%s_%s'', $1, s.shardid))
               FROM pg_catalog.pg_dist_shard s
               JOIN pg_catalog.pg_dist_partition p ON p.logicalrelid = s.logicalrelid
              WHERE s.logicalrelid = $1 AND p.partmethod = ''n'' AND p.repmodel = ''t'''
        INTO v_shard USING p_rel;
    RETURN v_shard;
END
$$;


-- ==== sql/020_guards.sql ====

-- The guards the database keeps whoever writes.
--
-- Triggers refuse illegal status transitions, any change to proposal columns,
-- and an approval-only status without an approval; keep the event log and
-- usage append-only; and perform the lifecycle side effects (work list, event
-- row, usage row, staged-payload deletion, NOTIFY) in the same transaction as
-- the status change, so no code path can forget them.

CREATE OR REPLACE FUNCTION keyturn._refuse_proposal_change()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'proposal columns of action % are immutable', OLD.id
        USING ERRCODE = '55000',
              HINT = 'Propose a new action instead of changing this one.';
END
$$;

-- Proposal columns never change (the token excepted: keyturn.issue_token and
-- a redeemed card link give a pending proposal a fresh one, and the binding,
-- an HMAC keyed by the token over the proposal, is what approve trusts): a
-- WHEN condition, parsed here with
-- pg_catalog's operators (no caller's search_path is ever consulted), that
-- runs the raising function only when they do. The column list comes first:
-- an UPDATE that sets none of these columns (every keyturn function's) skips
-- the trigger on a bitmap test, before the condition is even loaded; one that
-- sets them to their own values passes.
CREATE TRIGGER action_proposal_immutable
    BEFORE UPDATE OF id, tenant, principal, session, tool, tool_version, executor, approval,
                     retain, params, param_keys, params_hash, summary, origin, conversation_id,
                     epoch, target_count, idempotency_key,
                     revised_from, revised_by, authors, created_at, expires_at
    ON keyturn.action
    FOR EACH ROW
    WHEN ((NEW.id, NEW.tenant, NEW.principal, NEW.session, NEW.tool, NEW.tool_version,
           NEW.executor, NEW.approval, NEW.retain, NEW.params, NEW.param_keys, NEW.params_hash,
           NEW.summary, NEW.origin, NEW.conversation_id, NEW.epoch, NEW.target_count,
           NEW.idempotency_key, NEW.revised_from,
           NEW.revised_by, NEW.authors, NEW.created_at, NEW.expires_at)
          IS DISTINCT FROM
          (OLD.id, OLD.tenant, OLD.principal, OLD.session, OLD.tool, OLD.tool_version,
           OLD.executor, OLD.approval, OLD.retain, OLD.params, OLD.param_keys, OLD.params_hash,
           OLD.summary, OLD.origin, OLD.conversation_id, OLD.epoch, OLD.target_count,
           OLD.idempotency_key, OLD.revised_from,
           OLD.revised_by, OLD.authors, OLD.created_at, OLD.expires_at))
    EXECUTE FUNCTION keyturn._refuse_proposal_change();

-- The status graph (keyturn.transition), and a status only an approval can
-- give: whoever writes the row (a role that was granted UPDATE, one with
-- BYPASSRLS) cannot move an action along a step the graph does not have, nor
-- a proposal to queued or an outcome without the approval MAC that only
-- keyturn's approve, standing approvals and task admission can compute
-- (lease and begin_dispatch check the MAC again, for rows that reached
-- 'queued' with the triggers off). keyturn._guard_status() is Rust
-- (extension/src/lifecycle.rs): it reads the graph once per backend, where
-- a WHEN condition is parsed again by every statement, and verifies the
-- binding with the key only the extension owner reads.
CREATE TRIGGER action_status_guard
    BEFORE UPDATE OF status ON keyturn.action
    FOR EACH ROW EXECUTE FUNCTION keyturn._guard_status();

-- Everything a status change implies, in the same transaction: the work list
-- (keyturn.open_action), the event, the usage row, the staged payload, the
-- NOTIFY. The acting role and principal come from keyturn's own backend state
-- (extension/src/actor.rs), never from a setting a caller can write; a change
-- keyturn's functions did not make is logged as the session's role, marked
-- direct_write. A row inserted by anything but keyturn's propose (a restore
-- from a dump, which brings its own events and work list) implies nothing.
-- keyturn._action_lifecycle() is Rust (extension/src/lifecycle.rs), for
-- speed: it fires for every status change. It runs its statements as the
-- extension owner: the side effects are keyturn's to write whoever changed
-- the row, so a direct write (by a role someone granted UPDATE) is logged,
-- not failed for want of privileges on keyturn's internals.
CREATE TRIGGER action_lifecycle
    AFTER INSERT OR UPDATE OF status, next_attempt_at, lease_expires_at, dispatched_at ON keyturn.action
    FOR EACH ROW EXECUTE FUNCTION keyturn._action_lifecycle();

-- Append-only tables refuse UPDATE, DELETE and TRUNCATE even to their owner.
CREATE OR REPLACE FUNCTION keyturn._append_only()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'keyturn.% does not allow %', TG_TABLE_NAME, TG_OP
        USING ERRCODE = '42501',
              HINT = 'Audit and metering rows are never changed. Archive with triggers disabled, as a superuser.';
END
$$;

-- Statement-level, so even an UPDATE or DELETE that matches no row is refused.
CREATE TRIGGER event_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON keyturn.event
    FOR EACH STATEMENT EXECUTE FUNCTION keyturn._append_only();
CREATE TRIGGER usage_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON keyturn.usage
    FOR EACH STATEMENT EXECUTE FUNCTION keyturn._append_only();
CREATE TRIGGER action_target_immutable
    BEFORE UPDATE OR DELETE OR TRUNCATE ON keyturn.action_target
    FOR EACH STATEMENT EXECUTE FUNCTION keyturn._append_only();
CREATE TRIGGER action_never_deleted
    BEFORE DELETE OR TRUNCATE ON keyturn.action
    FOR EACH STATEMENT EXECUTE FUNCTION keyturn._append_only();


-- ==== sql/030_access.sql ====

-- Identity checks, membership lookups and row-level security.
--
-- The identity functions themselves (current_tenant, current_principal,
-- current_session) are written in Rust (extension/src/identity.rs): they parse
-- request.jwt.claims without a subtransaction, which keeps them cheap enough to
-- sit inside RLS policies.

-- The role a SECURITY DEFINER function was called from: the SET ROLE role, else
-- the login role (current_user inside such a function is its owner).
CREATE OR REPLACE FUNCTION keyturn._calling_role()
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN current_setting('role') = 'none' THEN session_user::text
                ELSE current_setting('role') END
$$;

-- Raises 42501 unless the call carries a full identity whose principal is a
-- member of its tenant; returns that member's role and authorization epoch
-- (as keyturn._epoch reads it), in one statement: propose stores the
-- epoch, and a decision notes it for its commit's recheck.
CREATE OR REPLACE FUNCTION keyturn._membership(p_tenant text, p_principal text, p_session text,
                                    OUT o_role text, OUT o_epoch bigint)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_tenant IS NULL OR p_principal IS NULL OR p_session IS NULL THEN
        RAISE EXCEPTION 'keyturn: missing identity (tenant=%, principal=%, session=%)',
                coalesce(p_tenant, '<missing>'), coalesce(p_principal, '<missing>'),
                coalesce(p_session, '<missing>')
            USING ERRCODE = '42501',
                  DETAIL = coalesce(keyturn._identity_problem(), 'identity changed during the call'),
                  HINT = 'Inside the transaction: BEGIN; SET LOCAL keyturn.tenant = ...; SET LOCAL keyturn.principal = ...; SET LOCAL keyturn.session = ...; or set_config(''request.jwt.claims'', ..., true).';
    END IF;
    SELECT m.role, coalesce((SELECT e.epoch FROM keyturn.auth_epoch e
                              WHERE e.tenant = p_tenant AND e.principal = p_principal), 0)
      INTO o_role, o_epoch
      FROM keyturn.member m
     WHERE m.tenant = p_tenant AND m.principal = p_principal;
    IF o_role IS NULL THEN
        RAISE EXCEPTION 'keyturn: principal % is not a member of tenant %', p_principal, p_tenant
            USING ERRCODE = '42501',
                  HINT = 'An admin adds members with keyturn.add_member(tenant, principal, role).';
    END IF;
END
$$;

-- For a caller whose one-statement read (its membership joined with what
-- else it needs) found no membership row: raises keyturn._membership's
-- 42501 if there is none, and 40001 if one is there now, added between the
-- two reads (READ COMMITTED gives each statement its own snapshot), so the
-- caller retries rather than acting on a read without it. Never returns.
CREATE OR REPLACE FUNCTION keyturn._membership_missing(p_tenant text, p_principal text, p_session text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    PERFORM keyturn._membership(p_tenant, p_principal, p_session);
    RAISE EXCEPTION 'keyturn: the membership of % in tenant % changed during the call', p_principal, p_tenant
        USING ERRCODE = '40001', HINT = 'Retry the transaction.';
END
$$;

-- keyturn._membership's role: raises 42501 unless the call carries a full
-- identity whose principal is a member of its tenant.
CREATE OR REPLACE FUNCTION keyturn._require_member(p_tenant text, p_principal text, p_session text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN (keyturn._membership(p_tenant, p_principal, p_session)).o_role;
END
$$;

-- Whether a grant with this valid_until is in force now: a grant past its
-- valid_until is no grant, it ends like a revoke. The rule's one place,
-- written where a grant is read (tool_grant g ... AND
-- keyturn._grant_live(g.valid_until)); LANGUAGE sql, declared as volatile as
-- its body and free of sub-queries, so the planner inlines it into the
-- statement that reads the grant: no call, no statement of its own.
CREATE OR REPLACE FUNCTION keyturn._grant_live(p_valid_until timestamptz)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT p_valid_until IS NULL OR p_valid_until > pg_catalog.clock_timestamp()
$$;

-- plpgsql, not sql: a sql function with a subquery is never inlined, and is
-- parsed and planned again on every call; plpgsql keeps the plan.
CREATE OR REPLACE FUNCTION keyturn._has_grant(p_tenant text, p_principal text, p_tool text)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM keyturn.tool_grant g
                    WHERE g.tenant = p_tenant AND g.principal = p_principal AND g.tool = p_tool
                      AND keyturn._grant_live(g.valid_until));
END
$$;

CREATE OR REPLACE FUNCTION keyturn._epoch(p_tenant text, p_principal text)
RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN coalesce((SELECT e.epoch FROM keyturn.auth_epoch e
                      WHERE e.tenant = p_tenant AND e.principal = p_principal), 0);
END
$$;

-- plpgsql, and the time taken from EXCLUDED: Citus refuses a function in DO
-- UPDATE SET, and crashed on this statement as a LANGUAGE sql function with
-- now() there (docs/scale-out.md, layout B).
CREATE OR REPLACE FUNCTION keyturn._bump_epoch(p_tenant text, p_principal text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    INSERT INTO keyturn.auth_epoch AS e (tenant, principal, epoch)
    VALUES (p_tenant, p_principal, 1)
    ON CONFLICT (tenant, principal)
    DO UPDATE SET epoch = e.epoch + 1, changed_at = EXCLUDED.changed_at;
    -- Commits that rechecked the old authorization end first (docs/security.md, row 95).
    PERFORM keyturn._await_rechecks(NULL, p_tenant, p_principal);
END
$$;

-- Row visibility for the calling identity: its own tenant only; a 'member' sees
-- its own rows, an approver or admin the whole tenant's. SECURITY DEFINER so the
-- policies below can consult keyturn.member without granting it more widely.
-- plpgsql, not sql: Citus cannot plan an SQL function's parameter in a
-- statement on a distributed table (layout B, docs/scale-out.md).
CREATE OR REPLACE FUNCTION keyturn._sees(p_tenant text, p_principal text)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN p_tenant = keyturn.current_tenant()
       AND EXISTS (SELECT 1 FROM keyturn.member m
                    WHERE m.tenant = p_tenant
                      AND m.principal = keyturn.current_principal()
                      AND (m.role IN ('approver', 'admin') OR p_principal = m.principal));
END
$$;

-- FORCE: the table owner is bound too. Superusers and the extension's own
-- SECURITY DEFINER functions (owned by a superuser) are not: those filter by
-- tenant themselves.
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['member', 'tool_grant', 'grant_use', 'auth_epoch', 'cancelled_origin', 'action',
                             'open_action', 'action_target', 'staged_payload', 'attempt', 'event', 'usage',
                             'request', 'vote', 'delegation', 'staged_file', 'stager', 'card_link', 'audit_chain', 'evidence',
                             'notify_channel', 'notification']
    LOOP
        EXECUTE format('ALTER TABLE keyturn.%I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE keyturn.%I FORCE ROW LEVEL SECURITY', t);
    END LOOP;
END
$$;

CREATE POLICY member_visible ON keyturn.member FOR SELECT
    USING (keyturn._sees(tenant, principal));
CREATE POLICY tool_grant_visible ON keyturn.tool_grant FOR SELECT
    USING (keyturn._sees(tenant, principal));
CREATE POLICY grant_use_visible ON keyturn.grant_use FOR SELECT
    USING (keyturn._sees(tenant, principal));
CREATE POLICY auth_epoch_visible ON keyturn.auth_epoch FOR SELECT
    USING (keyturn._sees(tenant, principal));
CREATE POLICY cancelled_origin_visible ON keyturn.cancelled_origin FOR SELECT
    USING (keyturn._sees(tenant, principal));
CREATE POLICY action_visible ON keyturn.action FOR SELECT
    USING (keyturn._sees(tenant, principal));
CREATE POLICY open_action_visible ON keyturn.open_action FOR SELECT
    USING (keyturn._sees(tenant, principal));
CREATE POLICY action_target_visible ON keyturn.action_target FOR SELECT
    USING (keyturn._sees(tenant, principal));
CREATE POLICY staged_payload_visible ON keyturn.staged_payload FOR SELECT
    USING (keyturn._sees(tenant, principal));
CREATE POLICY attempt_visible ON keyturn.attempt FOR SELECT
    USING (keyturn._sees(tenant, principal));
CREATE POLICY event_visible ON keyturn.event FOR SELECT
    USING (keyturn._sees(tenant, action_principal));
CREATE POLICY usage_visible ON keyturn.usage FOR SELECT
    USING (keyturn._sees(tenant, principal));
CREATE POLICY request_visible ON keyturn.request FOR SELECT
    USING (keyturn._sees(tenant, principal));
CREATE POLICY vote_visible ON keyturn.vote FOR SELECT
    USING (keyturn._sees(tenant, action_principal));
CREATE POLICY delegation_visible ON keyturn.delegation FOR SELECT
    USING (keyturn._sees(tenant, principal));
CREATE POLICY staged_file_visible ON keyturn.staged_file FOR SELECT
    USING (keyturn._sees(tenant, principal));
CREATE POLICY stager_visible ON keyturn.stager FOR SELECT
    USING (keyturn._sees(tenant, principal));
CREATE POLICY evidence_visible ON keyturn.evidence FOR SELECT
    USING (keyturn._sees(tenant, principal));
-- card_link: forced row-level security and no policy: nobody but keyturn's
-- own functions reads the digests of codes and sessions. notify_channel and
-- notification likewise: targets are personal (an address, a device), a
-- webhook's URL and secret are credentials; a person lists their own
-- channels with keyturn.notify_channels(), an operator an action's
-- notifications with keyturn.notifications(). audit_chain: none
-- either; operators read a tenant's head through keyturn.audit_head.
-- keyturn_secret.approval_key: forced row-level security and no policy at all,
-- on top of holding no grants.
ALTER TABLE keyturn_secret.approval_key ENABLE ROW LEVEL SECURITY;
ALTER TABLE keyturn_secret.approval_key FORCE ROW LEVEL SECURITY;


-- ==== sql/040_admin.sql ====

-- Administration: members, grants, tools (docs/sql-api.md, "Administration").
--
-- Two kinds of administrator. The keyturn_admin database role is the
-- platform's: it registers tools (which are global) and manages every
-- tenant, naming the tenant as an argument. A tenant's own `admin` member,
-- calling through the human-facing connection (keyturn_approver) with its
-- identity, manages that one tenant's members and grants, and no other.
-- Every membership or grant change that changes something bumps the
-- principal's authorization epoch.

CREATE OR REPLACE FUNCTION keyturn._require_tool(p_tool text)
RETURNS keyturn.tool
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v keyturn.tool;
BEGIN
    SELECT t.* INTO v FROM keyturn.tool t WHERE t.name = p_tool;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'keyturn: unknown tool %', coalesce(keyturn._quoted(p_tool), 'NULL')
            USING ERRCODE = '42704',
                  HINT = 'Register it first with keyturn.register_tool(name, spec).';
    END IF;
    RETURN v;
END
$$;

-- Raises 42501 unless the caller holds the platform's keyturn_admin role.
-- Membership and grants are authorized by that role alone, never by an
-- identity the caller asserts: a tenant's `admin` member decides and sees
-- the tenant's actions, and administers nothing (an identity is a setting
-- any connection may make, a role is the database's own grant). The
-- refusal names an agent as one (separation of duties).
CREATE OR REPLACE FUNCTION keyturn._require_admin(p_tenant text, p_what text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_caller text := keyturn._calling_role();
BEGIN
    PERFORM keyturn._refuse_nested(p_what);
    IF pg_catalog.pg_has_role(v_caller, 'keyturn_admin', 'USAGE') THEN
        RETURN;
    END IF;
    IF pg_catalog.pg_has_role(v_caller, 'keyturn_agent', 'MEMBER')
       OR pg_catalog.pg_has_role(session_user, 'keyturn_agent', 'USAGE') THEN
        RAISE EXCEPTION 'keyturn: % may not be called by an agent role', p_what
            USING ERRCODE = '42501';
    ELSE
        RAISE EXCEPTION 'keyturn: % needs the keyturn_admin role (tenant %)', p_what, coalesce(keyturn._quoted(p_tenant), 'NULL')
            USING ERRCODE = '42501',
                  HINT = 'Membership and grants are the platform admin''s: call them on a login granted keyturn_admin, never through a person''s identity.';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION keyturn.add_member(tenant text, principal text, role text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_changed boolean;
BEGIN
    PERFORM keyturn._require_admin(add_member.tenant, 'add_member');
    PERFORM keyturn._require_text(add_member.tenant, 'tenant'),
            keyturn._require_text(add_member.principal, 'principal');
    -- One that would print as another could never act (identity refuses
    -- it) and would read as someone else in every list.
    PERFORM keyturn._require_identity_text(add_member.tenant, 'tenant'),
            keyturn._require_identity_text(add_member.principal, 'principal');
    IF add_member.role IS NULL OR add_member.role NOT IN ('member', 'approver', 'admin') THEN
        RAISE EXCEPTION 'keyturn: role must be member, approver or admin, not %',
                coalesce(keyturn._quoted(add_member.role), 'NULL')
            USING ERRCODE = '22023';
    END IF;

    INSERT INTO keyturn.member AS m (tenant, principal, role)
    VALUES (add_member.tenant, add_member.principal, add_member.role)
    ON CONFLICT ON CONSTRAINT member_pkey
    DO UPDATE SET role = EXCLUDED.role, updated_at = EXCLUDED.updated_at
       WHERE m.role IS DISTINCT FROM EXCLUDED.role;
    v_changed := FOUND;

    IF v_changed THEN
        PERFORM keyturn._bump_epoch(add_member.tenant, add_member.principal);
    END IF;
    RETURN v_changed;
END
$$;

CREATE OR REPLACE FUNCTION keyturn.remove_member(tenant text, principal text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_members int;
    v_grants  int;
BEGIN
    PERFORM keyturn._require_admin(remove_member.tenant, 'remove_member');
    DELETE FROM keyturn.tool_grant g
     WHERE g.tenant = remove_member.tenant AND g.principal = remove_member.principal;
    GET DIAGNOSTICS v_grants = ROW_COUNT;
    DELETE FROM keyturn.member m
     WHERE m.tenant = remove_member.tenant AND m.principal = remove_member.principal;
    GET DIAGNOSTICS v_members = ROW_COUNT;
    -- Where the person was reached goes with them: a principal id added
    -- again (shared, handed on) must not bring back the old person's email,
    -- webhook or device. What they left queued is cancelled when it is due.
    DELETE FROM keyturn.notify_channel c
     WHERE c.tenant = remove_member.tenant AND c.principal = remove_member.principal;

    IF v_members + v_grants > 0 THEN
        PERFORM keyturn._bump_epoch(remove_member.tenant, remove_member.principal);
    END IF;
    RETURN v_members + v_grants > 0;
END
$$;

-- Sets the (tenant, principal, tool) grant to exactly the given scope,
-- valid_until and max_uses, with its use count at zero (counted in
-- keyturn.grant_use against the grant's granted_at); the plain
-- three-argument call is a grant without scope or limits. A call that changes
-- none of them changes nothing (and keeps the count); any real change bumps
-- the epoch, so proposals made under the old terms are invalidated.
CREATE OR REPLACE FUNCTION keyturn.grant_tool(tenant text, principal text, tool text, scope jsonb DEFAULT NULL,
                                   valid_until timestamptz DEFAULT NULL, max_uses int DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_scope    jsonb;
    v_changed  boolean;
    v_at       timestamptz;
    v_read     boolean;
    v_upstream boolean;
BEGIN
    PERFORM keyturn._require_admin(grant_tool.tenant, 'grant_tool');
    PERFORM keyturn._require_text(grant_tool.tenant, 'tenant'),
            keyturn._require_text(grant_tool.principal, 'principal');
    PERFORM keyturn._require_tool(grant_tool.tool);
    IF grant_tool.scope IS NOT NULL THEN
        v_scope := keyturn._check_scope(grant_tool.scope);
    END IF;
    IF grant_tool.max_uses IS NOT NULL AND grant_tool.max_uses < 1 THEN
        RAISE EXCEPTION 'keyturn: max_uses must be at least 1, not %', grant_tool.max_uses USING ERRCODE = '22023';
    END IF;
    -- What a read's grant can honor (keyturn._read_grant): a params scope,
    -- and max_targets for an sql read (the rows it answers with); a read is
    -- not counted, and an upstream read resolves no targets.
    SELECT v.kind = 'read', v.executor IS DISTINCT FROM 'sql' INTO v_read, v_upstream
      FROM keyturn.tool t JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
     WHERE t.name = grant_tool.tool;
    IF v_read AND grant_tool.max_uses IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: % is a read tool: a read is not counted, so its grant cannot limit uses (max_uses)', grant_tool.tool
            USING ERRCODE = '22023',
                  HINT = 'Grant it with a scope and valid_until only; max_uses counts proposals of write tools.';
    END IF;
    IF v_read AND v_upstream AND v_scope ? 'max_targets' THEN
        RAISE EXCEPTION 'keyturn: % is an upstream read tool: it resolves no targets, so its grant cannot bound them (max_targets)', grant_tool.tool
            USING ERRCODE = '22023',
                  HINT = 'A params scope bounds an upstream read''s arguments.';
    END IF;

    -- granted_at names the terms the uses count against, so each new terms
    -- get their own, also within one transaction (whose now() stands
    -- still): the clock's, and always later than the terms before. Worked
    -- out here: Citus takes only immutable functions in an upsert's DO
    -- UPDATE, and adding to a timestamptz is not one.
    SELECT greatest(clock_timestamp(), max(g.granted_at) + interval '1 microsecond') INTO v_at
      FROM keyturn.tool_grant g
     WHERE g.tenant = grant_tool.tenant AND g.principal = grant_tool.principal AND g.tool = grant_tool.tool;
    INSERT INTO keyturn.tool_grant AS g (tenant, principal, tool, scope, valid_until, max_uses, granted_at)
    VALUES (grant_tool.tenant, grant_tool.principal, grant_tool.tool, v_scope, grant_tool.valid_until,
            grant_tool.max_uses, v_at)
    ON CONFLICT ON CONSTRAINT tool_grant_pkey
    DO UPDATE SET scope = EXCLUDED.scope, valid_until = EXCLUDED.valid_until, max_uses = EXCLUDED.max_uses,
                  granted_at = EXCLUDED.granted_at
       WHERE (g.scope, g.valid_until, g.max_uses)
             IS DISTINCT FROM (EXCLUDED.scope, EXCLUDED.valid_until, EXCLUDED.max_uses);
    v_changed := FOUND;
    -- The uses are counted in the proposer's row (keyturn.grant_use),
    -- against the grant's granted_at: new terms count from zero. Made here
    -- when there is none, so that proposals find it (a REPEATABLE READ one
    -- could not make it after its snapshot without failing to serialize),
    -- and never touched when there is: an INSERT ... ON CONFLICT DO NOTHING
    -- waits for the row's open updater, a proposal left open (thirteenth
    -- red-team pass).
    PERFORM FROM keyturn.grant_use u
      WHERE u.tenant = grant_tool.tenant AND u.principal = grant_tool.principal AND u.tool = grant_tool.tool;
    IF NOT FOUND THEN
        INSERT INTO keyturn.grant_use (tenant, principal, tool)
        VALUES (grant_tool.tenant, grant_tool.principal, grant_tool.tool)
        ON CONFLICT ON CONSTRAINT grant_use_pkey DO NOTHING;
    END IF;

    IF v_changed THEN
        PERFORM keyturn._bump_epoch(grant_tool.tenant, grant_tool.principal);
    END IF;
    RETURN v_changed;
END
$$;

CREATE OR REPLACE FUNCTION keyturn.revoke_tool(tenant text, principal text, tool text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_changed boolean;
BEGIN
    PERFORM keyturn._require_admin(revoke_tool.tenant, 'revoke_tool');
    PERFORM keyturn._require_tool(revoke_tool.tool);

    DELETE FROM keyturn.tool_grant g
     WHERE g.tenant = revoke_tool.tenant AND g.principal = revoke_tool.principal
       AND g.tool = revoke_tool.tool;
    v_changed := FOUND;

    IF v_changed THEN
        PERFORM keyturn._bump_epoch(revoke_tool.tenant, revoke_tool.principal);
    END IF;
    RETURN v_changed;
END
$$;

CREATE OR REPLACE FUNCTION keyturn.set_tool_enabled(name text, enabled boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('set_tool_enabled');
    PERFORM keyturn._require_tool(set_tool_enabled.name);
    IF set_tool_enabled.enabled IS NULL THEN
        RAISE EXCEPTION 'keyturn: enabled must be true or false' USING ERRCODE = '22023';
    END IF;
    UPDATE keyturn.tool t SET enabled = set_tool_enabled.enabled, updated_at = now()
     WHERE t.name = set_tool_enabled.name AND t.enabled IS DISTINCT FROM set_tool_enabled.enabled;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- A commit that has read the tool enabled (its recheck passed) ends before
    -- this change commits, so none commits after the kill switch returned
    -- (docs/security.md, row 95); one that has not waits for it and fails.
    PERFORM keyturn._await_rechecks(set_tool_enabled.name, NULL, NULL);
    RETURN true;
END
$$;

-- Never errors: anything unknown, disabled or ambiguous is 'unsupported'.
CREATE OR REPLACE FUNCTION keyturn.classify(tool text)
RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(
        (SELECT CASE WHEN t.enabled THEN v.kind::text ELSE 'unsupported' END
           FROM keyturn.tool t
           JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
          WHERE t.name = classify.tool),
        'unsupported')
$$;


-- ==== sql/041_register.sql ====

-- Tool registration (docs/sql-api.md, "Tools").
--
-- A spec is validated whole before anything is written: unknown keys, wrong
-- types and out-of-range values are 22023 with the key named. Each part of
-- the spec has its own function below (scalars, rate_limit, the external
-- part, the sql part); register_tool puts their answers together. sql tools
-- are checked against the catalog here, once, and stored by name.

CREATE OR REPLACE FUNCTION keyturn._spec_choice(p_spec jsonb, p_key text, p_default text, p_allowed text[])
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v jsonb := p_spec -> p_key;
BEGIN
    IF v IS NULL THEN
        RETURN p_default;
    END IF;
    IF jsonb_typeof(v) <> 'string' OR NOT (v #>> '{}') = ANY (p_allowed) THEN
        RAISE EXCEPTION 'keyturn: spec.% must be one of %, not %', p_key,
                array_to_string(p_allowed, ', '), v
            USING ERRCODE = '22023';
    END IF;
    RETURN v #>> '{}';
END
$$;

CREATE OR REPLACE FUNCTION keyturn._spec_string(p_spec jsonb, p_key text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v jsonb := p_spec -> p_key;
BEGIN
    IF v IS NULL THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'string' OR v #>> '{}' = '' THEN
        RAISE EXCEPTION 'keyturn: spec.% must be a non-empty string, not %', p_key, v
            USING ERRCODE = '22023';
    END IF;
    RETURN v #>> '{}';
END
$$;

CREATE OR REPLACE FUNCTION keyturn._spec_positive_int(p_value jsonb, p_what text, p_max int)
RETURNS int
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF jsonb_typeof(p_value) <> 'number' OR (p_value #>> '{}')::numeric <> trunc((p_value #>> '{}')::numeric)
       OR (p_value #>> '{}')::numeric < 1 OR (p_value #>> '{}')::numeric > p_max THEN
        RAISE EXCEPTION 'keyturn: % must be a whole number from 1 to %, not %', p_what, p_max, p_value
            USING ERRCODE = '22023';
    END IF;
    RETURN (p_value #>> '{}')::int;
END
$$;

-- Whether v is more than 0 and at most p_max however the calendar adds it,
-- the one rule for every bound keyturn puts on a length of time (an expiry,
-- a rate window, a standing approval, a link, a reminder). Interval
-- comparison counts a month as 30 days and a year as 360, but adding one
-- counts the calendar, so '120 mons -3593 days' compared as 7 days and
-- lasted 60 (sixteenth red-team pass, docs/security.md row 116): every part
-- must be at least 0, and a month counts as 31 days, a year as 366.
CREATE OR REPLACE FUNCTION keyturn._interval_within(v interval, p_max interval)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN v > interval '0'
   AND extract(year FROM v) >= 0 AND extract(month FROM v) >= 0 AND extract(day FROM v) >= 0
   AND v - make_interval(years => extract(year FROM v)::int, months => extract(month FROM v)::int,
                         days => extract(day FROM v)::int) >= interval '0'
   AND v + (6 * extract(year FROM v) + extract(month FROM v))::int * interval '1 day' <= p_max;

CREATE OR REPLACE FUNCTION keyturn._spec_interval(p_value jsonb, p_what text, p_max interval)
RETURNS interval
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v interval;
BEGIN
    IF jsonb_typeof(p_value) <> 'string' THEN
        RAISE EXCEPTION 'keyturn: % must be an interval string such as ''15 minutes'', not %', p_what, p_value
            USING ERRCODE = '22023';
    END IF;
    BEGIN
        v := (p_value #>> '{}')::interval;
    EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
        RAISE EXCEPTION 'keyturn: % is not a valid interval: %', p_what, p_value
            USING ERRCODE = '22023';
    END;
    IF NOT keyturn._interval_within(v, p_max) THEN
        RAISE EXCEPTION 'keyturn: % must be more than 0 and at most %, without months or years, not %', p_what, p_max, v
            USING ERRCODE = '22023';
    END IF;
    RETURN v;
END
$$;

-- Refuses keys outside p_known, naming them.
CREATE OR REPLACE FUNCTION keyturn._spec_keys(p_obj jsonb, p_what text, p_known text[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    k text;
BEGIN
    FOR k IN SELECT jsonb_object_keys(p_obj) LOOP
        IF NOT k = ANY (p_known) THEN
            RAISE EXCEPTION 'keyturn: unknown % key %', p_what, keyturn._quoted(k)
                USING ERRCODE = '22023',
                      HINT = format('Known keys: %s.', array_to_string(p_known, ', '));
        END IF;
    END LOOP;
END
$$;

-- The column's type as format_type prints it, or 22023 when it is not a plain
-- column of the table (system columns, dropped columns and typos alike).
CREATE OR REPLACE FUNCTION keyturn._spec_column(p_relid oid, p_column jsonb, p_what text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_type text;
BEGIN
    IF jsonb_typeof(p_column) IS DISTINCT FROM 'string' THEN
        RAISE EXCEPTION 'keyturn: % must be a column name, not %', p_what, p_column
            USING ERRCODE = '22023';
    END IF;
    SELECT format_type(a.atttypid, a.atttypmod) INTO v_type
      FROM pg_attribute a
     WHERE a.attrelid = p_relid AND a.attname = p_column #>> '{}'
       AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '';
    IF v_type IS NULL THEN
        RAISE EXCEPTION 'keyturn: % names %, which is not a writable column of %',
                p_what, p_column, p_relid::regclass
            USING ERRCODE = '22023';
    END IF;
    RETURN v_type;
END
$$;

-- A form's spec.sql.where, of a write tool or a read tool (absent: none):
-- its column names, each a column of the table, with their types added to
-- p_types.
CREATE OR REPLACE FUNCTION keyturn._spec_where(p_relid oid, p_sql jsonb, INOUT p_types jsonb, OUT o_where text[])
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    c jsonb;
BEGIN
    o_where := '{}';
    IF p_sql ? 'where' THEN
        IF jsonb_typeof(p_sql -> 'where') <> 'array' THEN
            RAISE EXCEPTION 'keyturn: spec.sql.where must be an array of column names' USING ERRCODE = '22023';
        END IF;
        FOR c IN SELECT jsonb_array_elements(p_sql -> 'where') LOOP
            p_types := p_types || jsonb_build_object(c #>> '{}', keyturn._spec_column(p_relid, c, 'spec.sql.where'));
            o_where := o_where || (c #>> '{}');
        END LOOP;
    END IF;
END
$$;

-- A table and every partition and inheritance child below it: a trigger on
-- a partition runs inside a write to its parent (thirty-second red-team
-- pass), so each is checked as the table.
CREATE OR REPLACE FUNCTION keyturn._table_tree(p_relid oid)
RETURNS SETOF oid
LANGUAGE sql STABLE
AS $$
    WITH RECURSIVE tree (relid) AS (
        SELECT p_relid
        UNION
        SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid
    )
    SELECT relid FROM tree
$$;

-- What an agent owns that a table's policies, column defaults, constraints,
-- indexes, rules and column types use, one row each (the use, the object,
-- its owner): functions (an operator's through its function), relations (a
-- view or table a policy reads) and types (a domain's constraints) run or
-- are read inside an approved write, as the approver, and their owner can
-- change them at will (thirty-third and thirty-fourth red-team passes,
-- docs/security.md row 143). Triggers are check_deployment's own branch.
CREATE OR REPLACE FUNCTION keyturn._agent_owned_uses(p_relid oid)
RETURNS TABLE (what text, obj text, owner oid)
LANGUAGE sql STABLE
AS $$
    WITH RECURSIVE used (what, classid, objid) AS (
        SELECT format('policy %I', p.polname), 'pg_policy'::regclass::oid, p.oid
          FROM pg_policy p WHERE p.polrelid = p_relid
        UNION ALL
        SELECT format('the default of column %I', a.attname), 'pg_attrdef'::regclass::oid, ad.oid
          FROM pg_attrdef ad
          JOIN pg_attribute a ON a.attrelid = ad.adrelid AND a.attnum = ad.adnum
         WHERE ad.adrelid = p_relid
        UNION ALL
        SELECT format('constraint %I', c.conname), 'pg_constraint'::regclass::oid, c.oid
          FROM pg_constraint c WHERE c.conrelid = p_relid
        UNION ALL
        SELECT format('index %s', i.indexrelid::regclass), 'pg_class'::regclass::oid, i.indexrelid
          FROM pg_index i WHERE i.indrelid = p_relid
        UNION ALL
        SELECT format('rule %I', r.rulename), 'pg_rewrite'::regclass::oid, r.oid
          FROM pg_rewrite r WHERE r.ev_class = p_relid
    ), refs (what, classid, objid) AS (
        SELECT u.what, d.refclassid, d.refobjid
          FROM used u
          JOIN pg_depend d ON d.classid = u.classid AND d.objid = u.objid
         WHERE d.refclassid IN ('pg_proc'::regclass, 'pg_class'::regclass, 'pg_type'::regclass, 'pg_operator'::regclass)
           AND NOT (d.refclassid = 'pg_class'::regclass AND d.refobjid = p_relid)
        UNION
        SELECT format('column %I', a.attname), 'pg_type'::regclass::oid, a.atttypid
          FROM pg_attribute a WHERE a.attrelid = p_relid AND a.attnum > 0 AND NOT a.attisdropped
        UNION
        -- An operator runs its function; a domain's base type and an
        -- array's element type are used as the type is.
        SELECT r.what, n.classid, n.objid
          FROM refs r
         CROSS JOIN LATERAL (
                SELECT 'pg_proc'::regclass::oid, o.oprcode::oid
                  FROM pg_operator o WHERE r.classid = 'pg_operator'::regclass AND o.oid = r.objid
                UNION ALL
                SELECT 'pg_type'::regclass::oid, t.typbasetype
                  FROM pg_type t WHERE r.classid = 'pg_type'::regclass AND t.oid = r.objid AND t.typbasetype <> 0
                UNION ALL
                SELECT 'pg_type'::regclass::oid, t.typelem
                  FROM pg_type t WHERE r.classid = 'pg_type'::regclass AND t.oid = r.objid AND t.typelem <> 0
             ) AS n (classid, objid)
    )
    SELECT DISTINCT r.what,
           coalesce(p.oid::regprocedure::text, c.oid::regclass::text, t.oid::regtype::text, o.oid::regoperator::text),
           w.owner
      FROM refs r
      LEFT JOIN pg_proc p ON r.classid = 'pg_proc'::regclass AND p.oid = r.objid
      LEFT JOIN pg_class c ON r.classid = 'pg_class'::regclass AND c.oid = r.objid
      LEFT JOIN pg_type t ON r.classid = 'pg_type'::regclass AND t.oid = r.objid
      LEFT JOIN pg_operator o ON r.classid = 'pg_operator'::regclass AND o.oid = r.objid
     CROSS JOIN LATERAL (SELECT coalesce(p.proowner, c.relowner, t.typowner, o.oprowner)) AS w (owner)
     WHERE keyturn._is_agent_role(w.owner)
$$;

-- What lets an agent change a table other than through an approved form, one
-- line per problem, or nothing: an agent role (a non-superuser member of
-- keyturn_agent) that owns it or its schema, or can act as their owner
-- (ALTER, CREATE TRIGGER on it, DROP, a table of its own in its place), or
-- holds a privilege that writes to it or attaches
-- code to it, or the same of one of its partitions or children. Such a role
-- could put a trigger on the table that runs inside the approved write, as
-- the approver. With p_reads_only, only what lets an
-- agent read it past its row-level security: owning it (an owner may turn
-- row-level security off, and is exempt unless it is forced) or BYPASSRLS.
-- Used by register_tool (which refuses) and check_deployment (which
-- reports).
CREATE OR REPLACE FUNCTION keyturn._agent_table_problems(p_relid oid, p_reads_only boolean DEFAULT false)
RETURNS SETOF text
LANGUAGE sql STABLE
AS $$
    SELECT DISTINCT format('agent role %s %s', quote_ident(r.rolname), p.problem)
      FROM pg_roles r
     CROSS JOIN keyturn._table_tree(p_relid) AS tree (relid)
      JOIN pg_class c ON c.oid = tree.relid
      JOIN pg_namespace n ON n.oid = c.relnamespace
     CROSS JOIN LATERAL (VALUES
         (pg_has_role(r.oid, c.relowner, 'MEMBER'), true,
          format('owns %s or is a member of its owner %s', tree.relid::regclass, c.relowner::regrole)),
         -- A schema's owner may drop any table in it and create its own in
         -- its place (thirty-third red-team pass).
         (pg_has_role(r.oid, n.nspowner, 'MEMBER'), true,
          format('owns the schema %s of %s or is a member of its owner %s', quote_ident(n.nspname), tree.relid::regclass, n.nspowner::regrole)),
         (r.rolbypassrls, true, 'bypasses row-level security (BYPASSRLS)'),
         (has_table_privilege(r.oid, tree.relid, 'INSERT, UPDATE, DELETE, TRUNCATE')
          OR has_any_column_privilege(r.oid, tree.relid, 'INSERT, UPDATE'), false,
          format('may write %s directly', tree.relid::regclass)),
         (has_table_privilege(r.oid, tree.relid, 'TRIGGER'), false,
          format('may create triggers on %s', tree.relid::regclass))
     ) AS p (bad, reads, problem)
     WHERE keyturn._is_agent_role(r.oid) AND p.bad
       AND (p.reads OR NOT p_reads_only)
     ORDER BY 1
$$;

-- The table spec.sql.table names, of one of p_kinds (pg_class.relkind), not
-- temporary; 22023 otherwise. Shared by the write form and the read form
-- (sql/063_mcp.sql).
CREATE OR REPLACE FUNCTION keyturn._spec_table(p_table jsonb, p_kinds "char"[])
RETURNS oid
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_relid oid;
BEGIN
    IF jsonb_typeof(p_table) IS DISTINCT FROM 'string' THEN
        RAISE EXCEPTION 'keyturn: spec.sql.table must name a table, e.g. "crm.deal"' USING ERRCODE = '22023';
    END IF;
    -- to_regclass answers NULL for a table that does not exist, but raises
    -- for text that is no table name at all ("..", "a.b.c.d", "db.s.t"):
    -- both are the same invalid input here.
    BEGIN
        v_relid := to_regclass(p_table #>> '{}');
    EXCEPTION WHEN invalid_name OR syntax_error OR feature_not_supported THEN
        v_relid := NULL;
    END;
    IF v_relid IS NULL OR NOT EXISTS (SELECT 1 FROM pg_class r WHERE r.oid = v_relid AND r.relkind = ANY (p_kinds)) THEN
        RAISE EXCEPTION 'keyturn: spec.sql.table % is not an existing table', p_table
            USING ERRCODE = '22023';
    END IF;
    IF (SELECT n.nspname LIKE 'pg\_temp\_%' OR n.nspname LIKE 'pg\_toast\_temp\_%'
          FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace WHERE r.oid = v_relid) THEN
        RAISE EXCEPTION 'keyturn: spec.sql.table % is a temporary table', p_table
            USING ERRCODE = '22023';
    END IF;
    RETURN v_relid;
END
$$;

-- The type of column p_column of p_relid, when keyturn cannot write a value
-- of it exactly (else NULL): what a person approves is the value the card
-- shows, and the table must store that value or refuse it. keyturn reads a
-- form's values in the column's type without its size and checks each
-- against the column (keyturn._form_fit, keyturn._form_problem); the types
-- below it checks (a domain as its base, an array as its elements). Not a
-- composite type (its fields' sizes apply with no size of its own), a range,
-- "char" or name (cut without a size), money (rounded, and read by
-- lc_monetary), xml (no equality), nor any other (docs/security.md, row 126).
CREATE OR REPLACE FUNCTION keyturn._inexact_type(p_relid oid, p_column text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_declared oid;
    v_type     oid;
    v_array    boolean := false;
    t          record;
BEGIN
    SELECT a.atttypid INTO v_declared FROM pg_attribute a
     WHERE a.attrelid = p_relid AND a.attname = p_column AND a.attnum > 0 AND NOT a.attisdropped;
    v_type := v_declared;
    LOOP
        SELECT y.typtype, y.typbasetype, y.typelem, y.typcategory, y.typname INTO t
          FROM pg_type y WHERE y.oid = v_type;
        EXIT WHEN NOT FOUND;
        IF t.typtype = 'd' THEN
            v_type := t.typbasetype;
        ELSIF t.typcategory = 'A' AND t.typelem <> 0 THEN
            v_array := true;
            v_type := t.typelem;
        ELSE
            EXIT;
        END IF;
    END LOOP;
    -- citext only as the citext extension's own type, not any type so named.
    -- An array of JSON: its text would be read as JSON element by element,
    -- not as the JSON value the card shows.
    IF v_array AND v_type IN ('json'::regtype, 'jsonb'::regtype) THEN
        RETURN format_type(v_declared, NULL);
    END IF;
    IF t.typtype = 'e'
       OR (t.typname = 'citext' AND EXISTS (
             SELECT 1 FROM pg_depend d JOIN pg_extension x ON x.oid = d.refobjid
              WHERE d.classid = 'pg_type'::regclass AND d.objid = v_type AND d.deptype = 'e'
                AND x.extname = 'citext'))
       OR v_type = ANY ('{text,varchar,bpchar,int2,int4,int8,numeric,float4,float8,bool,uuid,date,time,timetz,timestamp,timestamptz,interval,json,jsonb,bytea,inet,cidr,macaddr,macaddr8,bit,varbit}'::regtype[]::oid[]) THEN
        RETURN NULL;
    END IF;
    RETURN format_type(v_declared, NULL);
END
$$;

-- Why p_key does not name one row of p_relid, or NULL. It does when the
-- column is NOT NULL and a valid unique index (not partial, on no expression)
-- is on it alone, or, on a table Citus distributes, on it and the
-- distribution column (Citus puts that column in every unique index, and the
-- tenant's row-level security pins it), under the collation keyturn compares
-- the key in (the column's, where that one is not deterministic); and no
-- child table inherits from it (the write would reach the child's rows,
-- which its index does not cover). With a key that can name two rows, a row
-- that took a target's key and version after the proposal is one the
-- approval writes, and no card showed it (docs/security.md, row 127).
-- register_tool refuses; check_deployment reports what changed since.
CREATE OR REPLACE FUNCTION keyturn._key_problem(p_relid oid, p_key text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_key      int2;
    v_notnull  boolean;
    v_coll     oid;
    v_dist     int2;
    v_distname text;
    v_inexact  text;
BEGIN
    SELECT a.attnum, a.attnotnull, a.attcollation INTO v_key, v_notnull, v_coll
      FROM pg_attribute a
     WHERE a.attrelid = p_relid AND a.attname = p_key AND a.attnum > 0 AND NOT a.attisdropped;
    SELECT a.attnum, c.dist_column INTO v_dist, v_distname
      FROM keyturn._citus_table(p_relid) c
      JOIN pg_attribute a ON a.attrelid = p_relid AND a.attname = c.dist_column;
    v_inexact := keyturn._inexact_type(p_relid, p_key);
    IF v_inexact IS NOT NULL THEN
        RETURN format('key %s of %s is of type %s, which keyturn does not compare exactly',
                      quote_ident(p_key), p_relid::regclass, v_inexact);
    END IF;
    IF NOT v_notnull THEN
        RETURN format('key %s of %s may be NULL, and a row without a key cannot be named: make it NOT NULL',
                      quote_ident(p_key), p_relid::regclass);
    END IF;
    IF (SELECT r.relkind = 'r' FROM pg_class r WHERE r.oid = p_relid)
       AND EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhparent = p_relid) THEN
        RETURN format('%s has child tables (INHERITS), which an approval''s write reaches and its unique index does not cover',
                      p_relid::regclass);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_index i
                WHERE i.indrelid = p_relid AND i.indisunique AND i.indisvalid
                  AND i.indpred IS NULL AND i.indexprs IS NULL
                  AND (SELECT coalesce(bool_and(k = v_key OR k IS NOT DISTINCT FROM v_dist)
                                       AND bool_or(k = v_key
                                                   -- the equality approve compares the key with
                                                   AND (SELECT oc.opcdefault FROM pg_opclass oc
                                                         WHERE oc.oid = i.indclass[n - 1])
                                                   AND (i.indcollation[n - 1] = v_coll
                                                        OR v_coll = 0
                                                        OR (SELECT c.collisdeterministic FROM pg_collation c
                                                             WHERE c.oid = v_coll))),
                                       false)
                         FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS u (k, n)
                        WHERE n <= i.indnkeyatts)) THEN
        RETURN NULL;
    END IF;
    RETURN format('key %s does not name one row of %s: no unique index (not partial, on no expression, in the column''s collation) is on that column alone%s, so an approval could write a row its card never showed',
                  quote_ident(p_key), p_relid::regclass,
                  CASE WHEN v_distname IS NOT NULL
                       THEN format(' or on it and %s, the distribution column', quote_ident(v_distname)) ELSE '' END);
END
$$;

-- The sql part of a spec: {"table", "key", "version", "set", "where"}, checked
-- against the catalog. Returns the stored columns as one jsonb object.
CREATE OR REPLACE FUNCTION keyturn._spec_sql(p_tool text, p_sql jsonb)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    c        jsonb;
    v_relid  oid;
    v_key    text;
    v_verc   text := 'xmin';
    v_set    text[] := '{}';
    v_where  text[] := '{}';
    v_types  jsonb;
    v_bad    text;
BEGIN
    IF p_sql IS NULL OR jsonb_typeof(p_sql) <> 'object' THEN
        RAISE EXCEPTION 'keyturn: sql tool % needs spec.sql = {"table", "key", "version", "set", "where"}', p_tool
            USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._spec_keys(p_sql, 'spec.sql', ARRAY['table', 'key', 'version', 'set', 'where']);
    v_relid := keyturn._spec_table(p_sql -> 'table', '{r,p}');
    v_bad := (SELECT string_agg(p, '; ') FROM keyturn._agent_table_problems(v_relid) p);
    v_bad := concat_ws('; ', v_bad,
                       (SELECT string_agg(format('%s on %s uses %s, owned by agent role %s', u.what, t::regclass, u.obj, u.owner::regrole), '; ')
                          FROM keyturn._table_tree(v_relid) AS t, keyturn._agent_owned_uses(t) u));
    IF v_bad <> '' THEN
        RAISE EXCEPTION 'keyturn: agents could change % outside the approved form: %', v_relid::regclass, v_bad
            USING ERRCODE = '22023',
                  HINT = 'Agent roles may only SELECT a gated table: revoke their write and TRIGGER privileges and make a non-agent role its owner, then register again.';
    END IF;

    v_key := p_sql ->> 'key';
    v_types := jsonb_build_object(v_key, keyturn._spec_column(v_relid, p_sql -> 'key', 'spec.sql.key'));
    IF p_sql ? 'version' AND p_sql -> 'version' IS DISTINCT FROM '"xmin"' THEN
        v_verc := p_sql ->> 'version';
        v_types := v_types || jsonb_build_object(v_verc, keyturn._spec_column(v_relid, p_sql -> 'version', 'spec.sql.version'));
        -- A version column that nothing changes on every write cannot show a
        -- conflicting edit: two proposals against the same before-state would
        -- both pass. keyturn's own write never sets it (set may not name it),
        -- so a trigger must.
        IF NOT EXISTS (SELECT 1 FROM pg_trigger t
                        WHERE t.tgrelid = v_relid AND NOT t.tgisinternal
                          AND (t.tgtype & 2) <> 0      -- BEFORE
                          AND (t.tgtype & 16) <> 0     -- UPDATE
                          AND (t.tgtype & 1) <> 0) THEN -- FOR EACH ROW
            RAISE EXCEPTION 'keyturn: spec.sql.version % is a column that no BEFORE UPDATE trigger on % maintains', v_verc, v_relid::regclass
                USING ERRCODE = '22023',
                      HINT = 'Use "version": "xmin" (the default), or add a BEFORE UPDATE ... FOR EACH ROW trigger that changes the column on every update.';
        END IF;
    ELSE
        v_types := v_types || jsonb_build_object('xmin', 'xid');
    END IF;
    IF jsonb_typeof(p_sql -> 'set') IS DISTINCT FROM 'array' OR jsonb_array_length(p_sql -> 'set') = 0 THEN
        RAISE EXCEPTION 'keyturn: spec.sql.set must be a non-empty array of column names' USING ERRCODE = '22023';
    END IF;
    FOR c IN SELECT jsonb_array_elements(p_sql -> 'set') LOOP
        v_types := v_types || jsonb_build_object(c #>> '{}', keyturn._spec_column(v_relid, c, 'spec.sql.set'));
        IF c #>> '{}' IN (v_key, v_verc) THEN
            RAISE EXCEPTION 'keyturn: spec.sql.set may not include the key or version column %', c
                USING ERRCODE = '22023';
        END IF;
        v_set := v_set || (c #>> '{}');
    END LOOP;
    SELECT w.p_types, w.o_where INTO v_types, v_where FROM keyturn._spec_where(v_relid, p_sql, v_types) w;
    IF cardinality(v_where) = 0 THEN
        RAISE EXCEPTION 'keyturn: spec.sql.where must name at least one column the form may filter on'
            USING ERRCODE = '22023',
                  HINT = 'A form without filters would address the whole table.';
    END IF;
    v_bad := (SELECT string_agg(format('spec.sql.%s names %s, a column of type %s', x.part, quote_ident(x.col), y.t), '; ')
                FROM (SELECT 'set' AS part, s AS col FROM unnest(v_set) s
                      UNION ALL SELECT 'where', w FROM unnest(v_where) w) x
               CROSS JOIN LATERAL keyturn._inexact_type(v_relid, x.col) AS y (t)
               WHERE y.t IS NOT NULL);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: %, whose values keyturn cannot write or compare exactly', v_bad
            USING ERRCODE = '22023',
                  HINT = 'Gate columns of plain types (text, numbers, booleans, uuid, dates and times, json, enums, and domains and arrays of them); a composite''s fields as columns of their own.';
    END IF;
    -- A table Citus distributes (sql/012_citus_catalog.sql); nothing without Citus.
    v_bad := (SELECT string_agg(p, '; ') FROM keyturn._citus_table_problems(v_relid, v_key, v_verc, v_set, v_types) p);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: % cannot be gated this way on Citus: %', v_relid::regclass, v_bad
            USING ERRCODE = '22023',
                  HINT = 'Leave the distribution column out of spec.sql.set, and use key and version columns of a type whose text is the same under every setting (integers, text, uuid; "xmin"); docs/scale-out.md.';
    END IF;
    v_bad := keyturn._key_problem(v_relid, v_key);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: spec.sql.%', v_bad
            USING ERRCODE = '22023',
                  HINT = 'Name a primary key or another unique column as spec.sql.key, or add a unique index on the column.';
    END IF;

    RETURN (SELECT jsonb_build_object(
                'schema', n.nspname, 'table', r.relname, 'key', v_key, 'version', v_verc,
                'set', to_jsonb(v_set), 'where', to_jsonb(v_where), 'types', v_types)
              FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace
             WHERE r.oid = v_relid);
END
$$;

-- The keys keyturnd's smtp adapter mails to (service/src/providers/smtp.rs).
-- Each one an smtp tool's schema declares must be an address (register_tool
-- below), and params carry only the ones it declares (propose,
-- keyturn._undeclared_recipient): so every recipient was checked as a bare
-- address and is one the tool's author meant the person to see.
CREATE OR REPLACE FUNCTION keyturn._smtp_recipient_keys()
RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ARRAY['to', 'cc', 'bcc', 'reply_to']
$$;

-- The external part of a spec: provider, params_schema, targets_param and
-- the attachment keys. Returns {"provider", "params_schema" (normalized),
-- "targets_param", "attachments_param", "attachment_types",
-- "max_attachment_bytes"}.
CREATE OR REPLACE FUNCTION keyturn._spec_external(p_tool text, p_spec jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_provider text := keyturn._spec_string(p_spec, 'provider');
    v_tparam   text := keyturn._spec_string(p_spec, 'targets_param');
    v_aparam   text := keyturn._spec_string(p_spec, 'attachments_param');
    v_types    jsonb := p_spec -> 'attachment_types';
    v_max      bigint := 10 * 1024 * 1024;
    v_schema   jsonb;
BEGIN
    IF v_provider IS NULL OR v_provider !~ '^[a-z][a-z0-9_]*$' THEN
        RAISE EXCEPTION 'keyturn: external tool % needs spec.provider, a lowercase adapter name such as webhook or smtp', p_tool
            USING ERRCODE = '22023';
    END IF;
    v_schema := keyturn._check_params_schema(coalesce(p_spec -> 'params_schema', '{}'));
    IF v_tparam IS NOT NULL AND NOT (v_schema -> 'properties') ? v_tparam THEN
        RAISE EXCEPTION 'keyturn: spec.targets_param % is not a property of params_schema', keyturn._quoted(v_tparam)
            USING ERRCODE = '22023';
    END IF;
    -- Every address the smtp adapter sends to is a bare addr-spec the card
    -- showed as it is: "Ann" <ann@x> display names and quoted local parts
    -- are refused by format: email, so these fields must use it.
    IF v_provider = 'smtp' AND EXISTS (
           SELECT 1 FROM jsonb_each(v_schema -> 'properties') p
            WHERE p.key = ANY (keyturn._smtp_recipient_keys())
              AND NOT (p.value @> '{"type": "string", "format": "email"}'
                       OR p.value @> '{"type": "array", "items": {"type": "string", "format": "email"}}')) THEN
        RAISE EXCEPTION 'keyturn: smtp tool %: params_schema properties to, cc, bcc and reply_to must be {"type": "string", "format": "email"} or arrays of them', p_tool
            USING ERRCODE = '22023',
                  HINT = 'format: email accepts only a bare address (no display name), so what the person approves is where the mail goes.';
    END IF;
    IF v_aparam IS NULL THEN
        IF p_spec ?| ARRAY['attachment_types', 'max_attachment_bytes'] THEN
            RAISE EXCEPTION 'keyturn: spec.attachment_types and spec.max_attachment_bytes need spec.attachments_param'
                USING ERRCODE = '22023';
        END IF;
    ELSE
        IF (v_schema #>> ARRAY['properties', v_aparam, 'type']) IS DISTINCT FROM 'array' THEN
            RAISE EXCEPTION 'keyturn: spec.attachments_param % must be an array property of params_schema', keyturn._quoted(v_aparam)
                USING ERRCODE = '22023';
        END IF;
        IF jsonb_typeof(v_types) IS DISTINCT FROM 'array' OR jsonb_array_length(v_types) = 0
           OR EXISTS (SELECT 1 FROM jsonb_array_elements(v_types) t
                       WHERE jsonb_typeof(t) <> 'string'
                          OR (t #>> '{}') !~ '^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$') THEN
            RAISE EXCEPTION 'keyturn: spec.attachment_types must list the allowed content types, e.g. ["application/pdf"]'
                USING ERRCODE = '22023';
        END IF;
        IF p_spec ? 'max_attachment_bytes' THEN
            v_max := keyturn._spec_positive_int(p_spec -> 'max_attachment_bytes', 'spec.max_attachment_bytes',
                                                keyturn._max_file_bytes()::int);
        END IF;
    END IF;
    RETURN jsonb_build_object('provider', v_provider, 'params_schema', v_schema, 'targets_param', v_tparam,
                              'attachments_param', v_aparam, 'attachment_types', v_types,
                              'max_attachment_bytes', CASE WHEN v_aparam IS NOT NULL THEN v_max END);
END
$$;

-- {"max": N, "per": "<interval>"} → {"max": N, "per": interval text}, or NULL.
CREATE OR REPLACE FUNCTION keyturn._spec_rate_limit(p_rate jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_rate IS NULL THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_rate) <> 'object' OR NOT (p_rate ?& ARRAY['max', 'per']) THEN
        RAISE EXCEPTION 'keyturn: spec.rate_limit must be {"max": N, "per": "<interval>"}'
            USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._spec_keys(p_rate, 'spec.rate_limit', ARRAY['max', 'per']);
    RETURN jsonb_build_object(
        'max', keyturn._spec_positive_int(p_rate -> 'max', 'spec.rate_limit.max', 1000000),
        'per', keyturn._spec_interval(p_rate -> 'per', 'spec.rate_limit.per', interval '366 days')::text);
END
$$;

-- IntervalStyle is pinned so the stored spec reads the same whatever the
-- caller's session settings.
CREATE OR REPLACE FUNCTION keyturn.register_tool(name text, spec jsonb)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET IntervalStyle = 'postgres'
-- The column types it stores are format_type's, which quotes every name
-- under quote_all_identifiers ("jsonb"), and keyturn reads them back
-- (docs/security.md, row 126).
SET quote_all_identifiers = off
AS $$
DECLARE
    v_name      text := register_tool.name;
    k           text;
    v_kind      keyturn.tool_kind;
    v_exec      keyturn.tool_executor;
    v_ext       jsonb;
    v_sql       jsonb;
    v_summary   text;
    v_effect    keyturn.tool_effect;
    v_expires   interval := interval '15 minutes';
    v_retain    keyturn.tool_retain;
    v_approval  keyturn.tool_approval;
    v_max       int := 100;
    v_rate      jsonb;
    v_quorum    int := 1;
    v_delegable boolean := false;
    v_version   int;
    v_normal    jsonb;
    v_set       text[];
    v_where     text[];
    v_att_types text[];
    v_desc      text;
    v_proj      text;
    v_select    text[];
    v_other     text;
BEGIN
    PERFORM keyturn._refuse_nested('register_tool');
    IF keyturn._name_ok(v_name, 63) IS NOT TRUE THEN
        RAISE EXCEPTION 'keyturn: tool name % is not allowed', coalesce(keyturn._quoted(v_name), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'Use ASCII letters, digits, underscores and hyphens in dot-separated parts that each start with a letter, at most 63 characters.';
    END IF;
    IF spec IS NULL OR jsonb_typeof(spec) <> 'object' THEN
        RAISE EXCEPTION 'keyturn: spec must be a JSON object' USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._spec_keys(spec, 'spec',
        ARRAY['kind', 'executor', 'provider', 'params_schema', 'summary', 'effect', 'expires_in',
              'retain', 'approval', 'max_targets', 'targets_param', 'sql', 'rate_limit', 'quorum',
              'delegable', 'attachments_param', 'attachment_types', 'max_attachment_bytes',
              'description', 'projection']);

    -- The words each key takes are the labels of its column's type.
    v_kind     := keyturn._spec_choice(spec, 'kind', 'write', enum_range(NULL::keyturn.tool_kind)::text[]);
    v_exec     := keyturn._spec_choice(spec, 'executor', NULL, enum_range(NULL::keyturn.tool_executor)::text[]);
    v_effect   := keyturn._spec_choice(spec, 'effect', 'irreversible', enum_range(NULL::keyturn.tool_effect)::text[]);
    v_retain   := keyturn._spec_choice(spec, 'retain', 'full', enum_range(NULL::keyturn.tool_retain)::text[]);
    v_approval := keyturn._spec_choice(spec, 'approval', 'self', enum_range(NULL::keyturn.tool_approval)::text[]);
    IF spec ? 'quorum' THEN
        v_quorum := keyturn._spec_positive_int(spec -> 'quorum', 'spec.quorum', 5);
    END IF;
    IF v_quorum > 1 AND v_approval <> 'independent' THEN
        RAISE EXCEPTION 'keyturn: spec.quorum above 1 needs "approval": "independent"'
            USING ERRCODE = '22023',
                  HINT = 'Several people approve only what its proposer may not approve alone.';
    END IF;
    IF spec ? 'delegable' THEN
        IF jsonb_typeof(spec -> 'delegable') <> 'boolean' THEN
            RAISE EXCEPTION 'keyturn: spec.delegable must be true or false' USING ERRCODE = '22023';
        END IF;
        v_delegable := (spec ->> 'delegable')::boolean;
    END IF;
    v_summary  := coalesce(keyturn._spec_string(spec, 'summary'), v_name);
    PERFORM keyturn._check_template(v_summary);
    IF spec ? 'expires_in' THEN
        v_expires := keyturn._spec_interval(spec -> 'expires_in', 'spec.expires_in', interval '7 days');
    END IF;
    IF spec ? 'max_targets' THEN
        v_max := keyturn._spec_positive_int(spec -> 'max_targets', 'spec.max_targets', 10000);
    END IF;
    v_rate := keyturn._spec_rate_limit(spec -> 'rate_limit');
    -- What tools/list tells an agent over MCP (sql/063_mcp.sql); a read
    -- tool's data reaches the agent only through its projection.
    v_desc := keyturn._spec_string(spec, 'description');
    IF length(v_desc) > 2000 THEN
        RAISE EXCEPTION 'keyturn: spec.description is longer than 2000 characters' USING ERRCODE = '22023';
    END IF;
    v_proj := keyturn._spec_string(spec, 'projection');
    IF v_proj IS NOT NULL AND v_kind <> 'read' THEN
        RAISE EXCEPTION 'keyturn: spec.projection is only for read tools' USING ERRCODE = '22023';
    END IF;
    IF v_kind = 'read' AND v_exec IS NOT NULL AND v_proj IS NULL THEN
        RAISE EXCEPTION 'keyturn: read tool % needs spec.projection, the registered projection its data is fenced with', v_name
            USING ERRCODE = '22023',
                  HINT = 'keyturn.register_projection(provider, spec) registers one; an unreviewed integration contributes nothing.';
    END IF;
    IF v_proj IS NOT NULL AND NOT keyturn._name_ok(v_proj, 63) THEN
        RAISE EXCEPTION 'keyturn: spec.projection % is not a projection name', keyturn._quoted(v_proj) USING ERRCODE = '22023';
    END IF;

    IF v_kind = 'read' AND (v_approval <> 'self' OR v_quorum > 1 OR v_delegable) THEN
        RAISE EXCEPTION 'keyturn: a read tool takes no approval settings' USING ERRCODE = '22023';
    END IF;
    IF v_kind = 'write' AND v_exec IS NULL THEN
        RAISE EXCEPTION 'keyturn: write tool % needs spec.executor (sql or external)', v_name
            USING ERRCODE = '22023';
    END IF;
    IF v_exec IS DISTINCT FROM 'external' THEN
        FOREACH k IN ARRAY ARRAY['provider', 'params_schema', 'targets_param', 'attachments_param',
                                 'attachment_types', 'max_attachment_bytes'] LOOP
            IF spec ? k THEN
                RAISE EXCEPTION 'keyturn: spec.% is only for external tools', k USING ERRCODE = '22023';
            END IF;
        END LOOP;
        IF v_retain = 'digest' THEN
            RAISE EXCEPTION 'keyturn: retain = digest is only for external tools'
                USING ERRCODE = '22023',
                      HINT = 'sql tools keep their params: approve re-reads them to run the write.';
        END IF;
    END IF;
    IF v_exec IS DISTINCT FROM 'sql' AND spec ? 'sql' THEN
        RAISE EXCEPTION 'keyturn: spec.sql is only for sql tools' USING ERRCODE = '22023';
    END IF;
    IF v_exec = 'external' THEN
        v_ext := keyturn._spec_external(v_name, spec);
    ELSIF v_exec = 'sql' AND v_kind = 'read' THEN
        v_sql := keyturn._spec_sql_read(v_name, spec -> 'sql');
    ELSIF v_exec = 'sql' THEN
        v_sql := keyturn._spec_sql(v_name, spec -> 'sql');
    END IF;

    v_normal := jsonb_strip_nulls(jsonb_build_object(
        'kind', v_kind, 'executor', v_exec, 'provider', v_ext ->> 'provider',
        'params_schema', v_ext -> 'params_schema',
        'summary', v_summary, 'effect', v_effect, 'expires_in', v_expires::text,
        'retain', v_retain, 'approval', v_approval, 'max_targets', v_max,
        'targets_param', v_ext ->> 'targets_param', 'quorum', v_quorum, 'delegable', v_delegable,
        'attachments_param', v_ext ->> 'attachments_param', 'attachment_types', v_ext -> 'attachment_types',
        'max_attachment_bytes', v_ext -> 'max_attachment_bytes',
        'sql', CASE WHEN v_sql IS NOT NULL THEN jsonb_build_object(
                    'table', format('%I.%I', v_sql ->> 'schema', v_sql ->> 'table'),
                    'key', v_sql -> 'key', 'version', v_sql -> 'version',
                    'set', v_sql -> 'set', 'where', v_sql -> 'where',
                    'select', v_sql -> 'select', 'max_rows', v_sql -> 'max_rows') END,
        'rate_limit', v_rate, 'description', v_desc, 'projection', v_proj));

    -- Two registrations of one name take turns here for the next version.
    -- FOR NO KEY UPDATE, as the name never changes; approval decisions read
    -- this row without a lock (keyturn._invalid_reason), so a new version
    -- waits only for commits rechecking the old one, never for a
    -- transaction left open.
    SELECT t.version + 1 INTO v_version FROM keyturn.tool t WHERE t.name = v_name FOR NO KEY UPDATE;
    IF v_version IS NULL THEN
        v_version := 1;
        SELECT t.name INTO v_other FROM keyturn.tool t WHERE lower(t.name COLLATE "C") = lower(v_name COLLATE "C");
        IF FOUND THEN
            RAISE EXCEPTION 'keyturn: tool name % differs from the tool % only in case', keyturn._quoted(v_name), keyturn._quoted(v_other)
                USING ERRCODE = '22023',
                      HINT = 'A person reads both as one name: register under that name, or under one that differs in more than case.';
        END IF;
        INSERT INTO keyturn.tool (name, version) VALUES (v_name, v_version);
    ELSE
        UPDATE keyturn.tool t SET version = v_version, updated_at = now() WHERE t.name = v_name;
        -- Commits that rechecked the old version end first (docs/security.md, row 95).
        PERFORM keyturn._await_rechecks(v_name, NULL, NULL);
    END IF;

    -- The arrays first: Citus takes no subquery in INSERT ... VALUES (docs/scale-out.md, layout B, step 5).
    IF v_sql IS NOT NULL THEN
        v_set := ARRAY(SELECT jsonb_array_elements_text(v_sql -> 'set'));
        v_where := ARRAY(SELECT jsonb_array_elements_text(v_sql -> 'where'));
        IF v_kind = 'read' THEN
            v_set := NULL;
            v_select := ARRAY(SELECT jsonb_array_elements_text(v_sql -> 'select'));
        END IF;
    END IF;
    IF v_ext ->> 'attachments_param' IS NOT NULL THEN
        v_att_types := ARRAY(SELECT jsonb_array_elements_text(v_ext -> 'attachment_types'));
    END IF;
    INSERT INTO keyturn.tool_version (tool, version, spec, kind, executor, provider, params_schema,
                                      summary, effect, expires_in, retain, approval, quorum, delegable,
                                      max_targets, targets_param, sql_schema, sql_table, sql_key, sql_version,
                                      sql_set, sql_where, sql_types, rate_max, rate_per,
                                      attachments_param, attachment_types, max_attachment_bytes,
                                      description, projection, sql_select, max_rows)
    VALUES (v_name, v_version, v_normal, v_kind, v_exec, v_ext ->> 'provider', v_ext -> 'params_schema',
            v_summary, v_effect, v_expires, v_retain, v_approval, v_quorum, v_delegable, v_max,
            v_ext ->> 'targets_param', v_sql ->> 'schema', v_sql ->> 'table', v_sql ->> 'key',
            v_sql ->> 'version', v_set, v_where,
            v_sql -> 'types', (v_rate ->> 'max')::int, (v_rate ->> 'per')::interval,
            v_ext ->> 'attachments_param', v_att_types, (v_ext ->> 'max_attachment_bytes')::bigint,
            v_desc, v_proj, v_select, (v_sql ->> 'max_rows')::int);
    RETURN v_version;
END
$$;


-- ==== sql/050_propose.sql ====

-- propose (docs/sql-api.md, "Agent").
--
-- keyturn.propose itself is a Rust function (extension/src/gate.rs): it notes the
-- calling role, then runs keyturn._propose as the extension owner. Reads that
-- must honour the caller's row-level security (resolving sql targets) go back
-- through keyturn._exec_as(caller, ...), which switches to the caller's role.

-- Every statement keyturn runs on a business table (resolving targets, the
-- preview read, the approved write) goes through keyturn._exec_as, which
-- switches to the caller's role. These settings change how values are read
-- from and printed to text (a date key, a timestamptz version, a number), so
-- they are pinned for those statements: no session setting can change what a
-- proposal names or what an approval writes.
ALTER FUNCTION keyturn._exec_as(oid, text, jsonb)
    SET DateStyle = 'ISO, MDY'
    SET TimeZone = 'UTC'
    SET IntervalStyle = 'postgres'
    SET extra_float_digits = 1
    SET bytea_output = 'hex'
    -- NULL in an array is NULL or the string by this one, so it is pinned
    -- too (docs/security.md, row 132). Not timezone_abbreviations: setting
    -- it reads and parses a file (some 60 µs a call), and no value keyturn
    -- takes holds an abbreviation (dates and times in ISO 8601 form only).
    SET array_nulls = on;

-- origin: {"conversation_id", "turn_id", "message_id", "assistant_message_id",
-- "evidence": [ids]}, all optional (task tools need the first four).
-- Returns the conversation id (or NULL).
CREATE OR REPLACE FUNCTION keyturn._check_origin(p_origin jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    k text;
BEGIN
    IF jsonb_typeof(p_origin) <> 'object' THEN
        RAISE EXCEPTION 'keyturn: origin must be a JSON object' USING ERRCODE = '22023';
    END IF;
    IF p_origin = '{}' THEN
        RETURN NULL;
    END IF;
    FOR k IN SELECT jsonb_object_keys(p_origin) LOOP
        IF k IN ('conversation_id', 'turn_id', 'message_id', 'assistant_message_id') THEN
            IF jsonb_typeof(p_origin -> k) <> 'string' OR length(p_origin ->> k) NOT BETWEEN 1 AND 200 THEN
                RAISE EXCEPTION 'keyturn: origin.% must be a string of 1 to 200 characters', k
                    USING ERRCODE = '22023';
            END IF;
        ELSIF k = 'evidence' THEN
            IF jsonb_typeof(p_origin -> k) <> 'array' OR jsonb_array_length(p_origin -> k) > 100
               OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_origin -> k) e
                           WHERE jsonb_typeof(e) <> 'string' OR length(e #>> '{}') NOT BETWEEN 1 AND 200) THEN
                RAISE EXCEPTION 'keyturn: origin.evidence must be an array of at most 100 id strings'
                    USING ERRCODE = '22023';
            END IF;
        ELSE
            RAISE EXCEPTION 'keyturn: unknown origin key %', keyturn._quoted(k)
                USING ERRCODE = '22023',
                      HINT = 'origin takes conversation_id, turn_id, message_id, assistant_message_id and evidence.';
        END IF;
    END LOOP;
    RETURN p_origin ->> 'conversation_id';
END
$$;

-- The text that names a tool's table in its statements: by name, looked up
-- again at every use (a table's OID does not survive a dump and restore, and
-- a stale one could name another table). 55000 when it is gone, or owned by
-- an agent's role (one put in its place by the schema's owner included).
CREATE OR REPLACE FUNCTION keyturn._tool_table(p_ver keyturn.tool_version)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_name    text := format('%I.%I', p_ver.sql_schema, p_ver.sql_table);
    v_oid     oid := to_regclass(v_name);
    v_problem text := keyturn._table_problem(v_oid);
BEGIN
    -- A partition or child counts as the table (one attached since its
    -- registration included: thirty-fourth red-team pass); a scan of
    -- pg_inherits only for a table that has any.
    IF v_problem IS NULL AND keyturn._has_children(v_oid) THEN
        v_problem := (SELECT format('has the partition or child %s, owned by an agent''s role, whose code would run inside the approved write', t::regclass)
                        FROM keyturn._table_tree(v_oid) AS t
                       WHERE keyturn._owned_by_agent(t)
                       LIMIT 1);
    END IF;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: the table % of tool % (version %) %', v_name, p_ver.tool, p_ver.version, v_problem
            USING ERRCODE = '55000',
                  HINT = 'Restore or recreate the table, owned by a role that is no agent''s, or register the tool again for the table it should use.';
    END IF;
    RETURN v_name;
END
$$;

-- A form value as the column's type, read from the jsonb parameter $1
-- (never from the statement text), which keyturn._form_arg has made the
-- canonical form of what was hashed. Built in Rust (extension/src/form.rs),
-- as the WHERE clause and the SET list that use it are; inlined where called.
CREATE OR REPLACE FUNCTION keyturn._form_value(p_ver keyturn.tool_version, p_part text, p_column text)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT keyturn._value_expr(p_ver.sql_types, p_part, p_column)
$$;

-- The WHERE clause of an sql tool's form, over the row alias t. Column names
-- come only from the tool's registered lists, so nothing the agent sends is
-- spliced in. Built in Rust (extension/src/form.rs); inlined where called.
CREATE OR REPLACE FUNCTION keyturn._form_where(p_ver keyturn.tool_version, p_form jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT keyturn._where_clause(p_ver.sql_types, p_form)
$$;

CREATE OR REPLACE FUNCTION keyturn._version_expr(p_ver keyturn.tool_version)
RETURNS text
LANGUAGE sql STABLE  -- as format(): STABLE, and no SET clause, so it is inlined
AS $$
    SELECT CASE WHEN p_ver.sql_version = 'xmin' THEN 't.xmin' ELSE format('t.%I', p_ver.sql_version) END
$$;

-- What is wrong with the form {"where": {col: value | [values]}, "set": {col: value}},
-- or NULL. Returned rather than raised, so approve's revalidation needs no
-- subtransaction to catch it. The check is Rust (extension/src/form.rs);
-- this wrapper is inlined where it is called.
CREATE OR REPLACE FUNCTION keyturn._form_error(p_ver keyturn.tool_version, p_form jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT keyturn._form_problem(p_ver.tool, p_ver.sql_where, p_ver.sql_set, p_ver.sql_types, p_form)
$$;

-- Resolves the targets of an sql form as the caller (RLS applies). Returns
-- [{"k": key, "v": version}, ...], 1 to max_targets of them.
CREATE OR REPLACE FUNCTION keyturn._resolve_targets(p_caller oid, p_ver keyturn.tool_version, p_form jsonb)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_sql   text;
    v_rows  jsonb;
    v_n     int;
    v_error text := keyturn._form_error(p_ver, p_form);
    v_arg   jsonb;
    v_fit   text;
    v_unfit text;
BEGIN
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: %', v_error USING ERRCODE = '22023';
    END IF;
    v_arg := keyturn._form_arg(p_form, p_ver.sql_types);
    -- Keys and versions are stored as text written under the settings
    -- _exec_as pins (DateStyle, TimeZone, ...), and compared in the column's
    -- own type at approve, so no session setting changes what they name.
    v_sql := format('SELECT jsonb_build_object(''k'', t.%I::text, ''v'', %s::text) FROM %s AS t WHERE %s ORDER BY t.%I LIMIT %s',
                    p_ver.sql_key, keyturn._version_expr(p_ver), keyturn._tool_table(p_ver),
                    keyturn._form_where(p_ver, p_form), p_ver.sql_key, p_ver.max_targets + 1);
    -- One statement a value, each in a block of its own: a value its
    -- column's type cannot read at all ('lots' for a number) or hold (too
    -- large) is refused below if it filters, and a failed write at approve
    -- if it is set, as any value the business table refuses; it hides no
    -- other value's check (docs/security.md, row 126).
    FOREACH v_fit IN ARRAY coalesce(keyturn._form_fit(p_ver.sql_types, p_form), '{}') LOOP
        BEGIN
            v_unfit := keyturn._exec_as(p_caller, v_fit, v_arg) ->> 0;
        EXCEPTION WHEN data_exception THEN
            v_unfit := NULL;
        END;
        EXIT WHEN v_unfit IS NOT NULL;
    END LOOP;
    IF v_unfit IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: params.% does not fit column % of %: stored, it would not be the value proposed, written as proposed',
                v_unfit, quote_ident(substr(v_unfit, strpos(v_unfit, '.') + 1))
                         || ' (' || (p_ver.sql_types ->> substr(v_unfit, strpos(v_unfit, '.') + 1)) || ')',
                format('%I.%I', p_ver.sql_schema, p_ver.sql_table)
            USING ERRCODE = '22023',
                  HINT = 'Propose a value the column holds as it is (within its length, precision and scale), and an interval or an array as PostgreSQL prints it (02:00:00, {a,b}).';
    END IF;
    BEGIN
        v_rows := keyturn._exec_as(p_caller, v_sql, v_arg);
    EXCEPTION WHEN data_exception THEN
        -- Not SQLERRM: it quotes the value, whole, into the server log
        -- (docs/security.md, row 133).
        RAISE EXCEPTION 'keyturn: params.where holds a value its column in % cannot read (SQLSTATE %)',
                format('%I.%I', p_ver.sql_schema, p_ver.sql_table), SQLSTATE
            USING ERRCODE = '22023',
                  HINT = 'Each value of params.where must be of its column''s type: a number for a number, a date for a date.';
    END;
    v_n := jsonb_array_length(v_rows);
    IF v_n = 0 THEN
        RAISE EXCEPTION 'keyturn: no row of % that you can see matches params.where', format('%I.%I', p_ver.sql_schema, p_ver.sql_table)
            USING ERRCODE = '22023',
                  HINT = 'A write that changes nothing is refused, not approved.';
    ELSIF v_n > p_ver.max_targets THEN
        RAISE EXCEPTION 'keyturn: params.where matches more than % rows of % (max_targets)',
                p_ver.max_targets, format('%I.%I', p_ver.sql_schema, p_ver.sql_table)
            USING ERRCODE = '22023',
                  HINT = 'Narrow the filter, or split the change into several proposals.';
    END IF;
    RETURN v_rows;
END
$$;

-- What is wrong when an smtp tool's params carry a recipient key its schema
-- does not declare (keyturn._smtp_recipient_keys), or NULL: a schema that
-- admits undeclared keys must not let the agent add a cc or bcc that
-- nothing checked as an address, the summary does not name and
-- max_targets does not count (red-team finding, docs/security.md). Asked
-- at propose, and again at approve and at a task action's dispatch (a
-- proposal made before the rule). Any other provider's keys are its own.
-- plpgsql, not sql: a sql function with a subquery is never inlined.
CREATE OR REPLACE FUNCTION keyturn._undeclared_recipient(p_ver keyturn.tool_version, p_params jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RETURN (SELECT format('params.%s is a recipient the smtp tool %s does not declare', k, p_ver.tool)
              FROM unnest(keyturn._smtp_recipient_keys()) AS k
             WHERE p_ver.provider = 'smtp' AND p_params ? k
               AND NOT coalesce(p_ver.params_schema -> 'properties' ? k, false)
             ORDER BY k COLLATE "C" LIMIT 1);
END
$$;

-- The proposing principal's grant for a tool, with its proposer's row
-- (keyturn.grant_use) locked so that its uses and the rate window cannot be
-- raced past (a row lock only keyturn can take: row locks need UPDATE on
-- keyturn's tables, which no role holds, unlike an advisory lock, which any
-- role may take with a guessable key and hold to stall the tenant). The
-- grant row itself is read, not locked: it is the admin's, and a lock on it
-- let a proposal left open stall its revocation (docs/security.md row 101).
-- It is read after the lock, in a statement of its own, so that under READ
-- COMMITTED a proposal that waited for another reads the grant as committed
-- then, not as it was before the wait (a grant narrowed meanwhile was
-- counted against its old terms: thirteenth red-team pass); under
-- REPEATABLE READ it is compared with the committed one. A grant changed
-- after it was read moves the principal's epoch, which invalidates the
-- proposal at approve and fails a covered one at COMMIT. 42501 when there
-- is none, it has ended, or its uses (those counted against the grant made
-- at its granted_at) are spent.
CREATE OR REPLACE FUNCTION keyturn._lock_grant(p_tenant text, p_principal text, p_tool text)
RETURNS keyturn.tool_grant
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    g      keyturn.tool_grant;
    v_at   timestamptz;
    v_uses int;
BEGIN
    FOR i IN 1 .. 2 LOOP
        SELECT u.granted_at, u.uses INTO v_at, v_uses FROM keyturn.grant_use u
         WHERE u.tenant = p_tenant AND u.principal = p_principal AND u.tool = p_tool
           FOR NO KEY UPDATE;
        EXIT WHEN FOUND OR i = 2;
        -- A grant restored without its proposer's row (grant_tool makes
        -- one): made here, once there is a grant to count.
        PERFORM FROM keyturn.tool_grant x
          WHERE x.tenant = p_tenant AND x.principal = p_principal AND x.tool = p_tool;
        EXIT WHEN NOT FOUND;
        INSERT INTO keyturn.grant_use (tenant, principal, tool) VALUES (p_tenant, p_principal, p_tool)
        ON CONFLICT ON CONSTRAINT grant_use_pkey DO NOTHING;
    END LOOP;
    SELECT x.* INTO g FROM keyturn.tool_grant x
     WHERE x.tenant = p_tenant AND x.principal = p_principal AND x.tool = p_tool;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'keyturn: principal % holds no grant for tool % in tenant %', p_principal, p_tool, p_tenant
            USING ERRCODE = '42501',
                  HINT = 'An admin grants tools with keyturn.grant_tool(tenant, principal, tool).';
    END IF;
    -- Under REPEATABLE READ the grant read may be older than one given,
    -- changed or revoked since: decided on committed data, as every
    -- admission is (docs/security.md row 22).
    IF current_setting('transaction_isolation') <> 'read committed'
       AND keyturn._committed_grant_at(p_tenant, p_principal, p_tool)::timestamptz IS DISTINCT FROM
           (CASE WHEN keyturn._grant_live(g.valid_until) THEN g.granted_at END) THEN
        RAISE EXCEPTION 'keyturn: could not serialize access: the grant of tool % to principal % changed after this transaction''s snapshot', p_tool, p_principal
            USING ERRCODE = '40001',
                  HINT = 'Retry the transaction.';
    END IF;
    IF NOT keyturn._grant_live(g.valid_until) THEN
        RAISE EXCEPTION 'keyturn: the grant of tool % to principal % ended at %', p_tool, p_principal, keyturn._utc(g.valid_until)
            USING ERRCODE = '42501',
                  HINT = 'An admin renews it with keyturn.grant_tool(tenant, principal, tool, scope, valid_until, max_uses).';
    END IF;
    IF g.max_uses IS NOT NULL AND v_at IS NOT DISTINCT FROM g.granted_at AND v_uses >= g.max_uses THEN
        RAISE EXCEPTION 'keyturn: the grant of tool % to principal % allows % proposals, all used', p_tool, p_principal, g.max_uses
            USING ERRCODE = '42501',
                  HINT = 'An admin renews it with keyturn.grant_tool(tenant, principal, tool, scope, valid_until, max_uses).';
    END IF;
    RETURN g;
END
$$;

-- Everything propose does for (tenant, principal, session), whoever asks: the
-- agent's propose, and a person's revise (which proposes in the agent's name,
-- with the targets resolved under the reviser's RLS). p_caller is the role
-- that resolves targets. A covering standing approval (or, for a task tool,
-- the person's recorded request) approves the new action in the same
-- transaction.
CREATE OR REPLACE FUNCTION keyturn._propose_for(p_caller oid, p_tenant text, p_principal text, p_session text,
                                     p_tool text, p_params jsonb, p_origin jsonb,
                                     p_revised_from uuid, p_revised_by text)
RETURNS keyturn._proposed
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_tool      keyturn.tool;
    v_ver       keyturn.tool_version;
    v_grant     keyturn.tool_grant;
    v_origin    jsonb := coalesce(p_origin, '{}');
    v_conv      text;
    v_path      text;
    v_err       text;
    v_hash      text;
    v_targets   jsonb := '[]';
    v_count     int := 1;
    v_recent    bigint;
    v_id        uuid := keyturn._uuid_v7();  -- time-ordered: see extension/src/ids.rs
    v_token     text := keyturn._token_new();
    v_now       timestamptz;
    v_keys      text[];
    v_epoch     bigint;
    v_digest    bytea;
    v_binding   bytea;
    v_expires   timestamptz;
    v_summary   text;
    v_request   keyturn.request;
    v_existing  keyturn.action;
    v_claimed   keyturn.action;
    v_deleg     keyturn.delegation;
    v_result    record;
    v_authors   text[] := ARRAY[p_principal];
    v_stored    text;
    v_noted     text;
    v_both      record;
    v_granted   boolean;
    v_delegated boolean;
    v_notified  boolean;
    v_inspected text[];
BEGIN
    -- The tenant's side in one statement: the principal's membership and
    -- the epoch the proposal is bound to (a change after it invalidates the
    -- proposal at approve); whether they hold a grant of the tool, checked
    -- here without a lock (a clear error before any work; locked and checked
    -- again below, where its uses are counted); whether a standing approval
    -- of theirs may cover it; and whether anyone in the tenant is notified.
    -- Without either of the last two, propose asks nothing more about them
    -- (one given or set while this runs is there for the next proposal). No
    -- row: no full identity, or not a member, and
    -- keyturn._membership_missing raises (42501).
    -- (Every table filtered by p_tenant itself, never by m.tenant: Citus
    -- pins each statement of a delegated call by its distribution argument.)
    SELECT coalesce((SELECT e.epoch FROM keyturn.auth_epoch e
                      WHERE e.tenant = p_tenant AND e.principal = p_principal), 0),
           EXISTS (SELECT 1 FROM keyturn.tool_grant g
                    WHERE g.tenant = p_tenant AND g.principal = p_principal AND g.tool = p_tool),
           EXISTS (SELECT 1 FROM keyturn.delegation d
                    WHERE d.tenant = p_tenant AND d.principal = p_principal AND d.tool = p_tool
                      AND d.revoked_at IS NULL),
           EXISTS (SELECT 1 FROM keyturn.notify_channel c WHERE c.tenant = p_tenant)
      INTO v_epoch, v_granted, v_delegated, v_notified
      FROM keyturn.member m
     WHERE m.tenant = p_tenant AND m.principal = p_principal AND p_session IS NOT NULL;
    IF NOT FOUND THEN
        PERFORM keyturn._membership_missing(p_tenant, p_principal, p_session);
    END IF;

    -- The tool and its current version in one statement (on Citus,
    -- reference tables: never joined with a tenant's tables, which a
    -- worker refuses in a delegated call).
    SELECT t AS tool, v AS ver INTO v_both
      FROM keyturn.tool t
      LEFT JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
     WHERE t.name = p_tool;
    IF FOUND THEN
        v_tool := v_both.tool;
        v_ver := v_both.ver;
    END IF;
    IF NOT FOUND OR NOT v_tool.enabled THEN
        RAISE EXCEPTION 'keyturn: tool % is unknown or disabled', coalesce(keyturn._quoted(p_tool), 'NULL')
            USING ERRCODE = '42704',
                  HINT = 'keyturn.classify(tool) says what a tool is; only registered, enabled write tools take proposals.';
    END IF;
    IF v_ver.kind = 'read' THEN
        RAISE EXCEPTION 'keyturn: tool % is read-only and needs no proposal', p_tool
            USING ERRCODE = '22023';
    END IF;
    IF NOT v_granted THEN
        RAISE EXCEPTION 'keyturn: principal % holds no grant for tool % in tenant %', p_principal, p_tool, p_tenant
            USING ERRCODE = '42501',
                  HINT = 'An admin grants tools with keyturn.grant_tool(tenant, principal, tool).';
    END IF;

    -- Each check only where there is something to check: a PERFORM is a
    -- statement the executor starts and ends, an IF's condition is not.
    v_conv := keyturn._check_origin(v_origin);
    IF v_conv IS NOT NULL THEN
        PERFORM keyturn._refuse_ended_conversation(p_tenant, p_principal, v_conv);
    END IF;
    IF v_origin ? 'evidence' THEN
        PERFORM keyturn._check_evidence(p_tenant, p_principal, v_origin);
    END IF;

    IF p_params IS NULL OR jsonb_typeof(p_params) <> 'object' THEN
        RAISE EXCEPTION 'keyturn: params must be a JSON object' USING ERRCODE = '22023';
    END IF;
    -- One parse for the credential scan, the hash and the schema (in that order).
    v_inspected := keyturn._inspected(v_tool.name, p_params,
                       coalesce(CASE WHEN v_ver.executor = 'external' THEN v_ver.params_schema END, 'null'),
                       v_ver.retain = 'digest');
    v_path := v_inspected[1];
    v_hash := v_inspected[2];
    v_err := v_inspected[3];
    IF v_path IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: params hold credential material at %', keyturn._quoted(v_path)
            USING ERRCODE = '22023',
                  HINT = 'Credentials never go through keyturn: the dispatcher holds them. Remove the field.';
    END IF;

    IF v_ver.approval = 'task' THEN
        -- A revision is never approved at its making: a request admits what
        -- the agent proposed in its turn, never params someone else wrote
        -- (a card session's holder, another approver) into a proposal of a
        -- tool that became a task tool meanwhile (fifteenth red-team pass,
        -- docs/security.md row 111).
        IF p_revised_from IS NOT NULL THEN
            RAISE EXCEPTION 'keyturn: tool % is a task tool now; a person''s request admits no revision', v_tool.name
                USING ERRCODE = '42501',
                      HINT = 'Reject the proposal; the agent proposes again in the person''s latest turn.';
        END IF;
        -- The person's request in the chat is the approval; the same request
        -- for the same call again is the same action. A replay is answered
        -- before the checks that admission spent (the grant's uses, the
        -- attachments it bound): it creates nothing.
        v_request := keyturn._task_request(p_tenant, p_principal, p_session, v_origin);
        v_existing := keyturn._task_replay(p_tenant, p_principal, v_request, v_tool.name, v_hash);
        IF v_existing.id IS NOT NULL THEN
            RETURN ROW(v_existing.id, NULL, coalesce(v_existing.summary, v_existing.tool),
                       v_hash, v_existing.expires_at, v_existing.status::text, NULL)::keyturn._proposed;
        END IF;
    END IF;

    IF v_ver.executor = 'external' THEN
        IF v_err IS NOT NULL THEN
            RAISE EXCEPTION 'keyturn: params do not match the schema of %: %', p_tool, v_err
                USING ERRCODE = '22023';
        END IF;
        IF v_ver.provider = 'smtp' THEN
            v_err := keyturn._undeclared_recipient(v_ver, p_params);
            IF v_err IS NOT NULL THEN
                RAISE EXCEPTION 'keyturn: %', v_err
                    USING ERRCODE = '22023',
                          HINT = 'Propose only the recipient keys the tool''s params_schema declares; an admin declares cc, bcc or reply_to as {"type": "string", "format": "email"} (or an array of them) to allow them.';
            END IF;
        END IF;
        IF v_ver.targets_param IS NOT NULL THEN
            v_count := CASE jsonb_typeof(p_params -> v_ver.targets_param)
                           WHEN 'array' THEN jsonb_array_length(p_params -> v_ver.targets_param)
                           WHEN 'string' THEN 1
                           ELSE 0 END;
            IF v_count = 0 OR v_count > v_ver.max_targets THEN
                RAISE EXCEPTION 'keyturn: params.% must name 1 to % targets, not %',
                        v_ver.targets_param, v_ver.max_targets, v_count
                    USING ERRCODE = '22023',
                          HINT = 'max_targets bounds the blast radius of one approval.';
            END IF;
        END IF;
        IF v_ver.attachments_param IS NOT NULL THEN
            PERFORM keyturn._check_attachments(p_tenant, p_principal, v_ver, p_params, p_revised_from);
        END IF;
    ELSE
        v_targets := keyturn._resolve_targets(p_caller, v_ver, p_params);
        v_count := jsonb_array_length(v_targets);
    END IF;

    v_grant := keyturn._lock_grant(p_tenant, p_principal, v_tool.name);
    IF v_grant.scope IS NOT NULL THEN
        v_err := keyturn._scope_violation(v_grant.scope, p_params, v_count);
        -- Its messages quote the value: none of a digest tool's in an error
        -- (the server log keeps every one).
        IF v_err IS NOT NULL AND v_ver.retain = 'digest' THEN
            v_err := '(details withheld: digest retention)';
        END IF;
        IF v_err IS NOT NULL THEN
            RAISE EXCEPTION 'keyturn: outside the scope of the grant of tool % to principal %: %', p_tool, p_principal, v_err
                USING ERRCODE = '42501',
                      HINT = 'Propose within the grant''s scope, or ask an admin to widen it.';
        END IF;
    END IF;

    IF v_ver.rate_max IS NOT NULL THEN
        -- The grant row is locked: concurrent proposals of one (tenant,
        -- principal, tool) count the window one at a time, and each counts
        -- what is committed (a REPEATABLE READ snapshot taken before the
        -- others committed would count none of them).
        v_recent := keyturn._recent_proposals(p_tenant, p_principal, v_tool.name, v_ver.rate_per::text);
        IF v_recent >= v_ver.rate_max THEN
            RAISE EXCEPTION 'keyturn: rate limit of tool % reached: % proposals per %', p_tool, v_ver.rate_max, v_ver.rate_per
                USING ERRCODE = '54000',
                      HINT = 'Wait for the window to pass, or ask an admin to raise spec.rate_limit.';
        END IF;
    END IF;
    IF v_grant.max_uses IS NOT NULL THEN
        -- Counted against the grant as read: a use of an earlier grant of
        -- the pair (other terms) counts for nothing.
        UPDATE keyturn.grant_use u
           SET uses = CASE WHEN u.granted_at IS NOT DISTINCT FROM v_grant.granted_at THEN u.uses + 1 ELSE 1 END,
               granted_at = v_grant.granted_at
         WHERE u.tenant = p_tenant AND u.principal = p_principal AND u.tool = v_tool.name;
    END IF;

    v_now := clock_timestamp();
    v_expires := v_now + v_ver.expires_in;
    v_summary := keyturn._render_summary(v_ver.summary, p_params, v_count);

    -- Every value computed before the INSERT, none in it: Citus refuses a
    -- subquery in an INSERT and evaluates nothing volatile on a shard
    -- (docs/scale-out.md, layout B, step 5).
    v_keys := keyturn._param_keys(p_params);
    IF p_revised_from IS NOT NULL THEN
        SELECT x.authors INTO v_authors FROM keyturn.action x
         WHERE x.id = p_revised_from AND x.tenant = p_tenant;
        IF NOT p_revised_by = ANY (v_authors) THEN
            v_authors := v_authors || p_revised_by;
        END IF;
    END IF;
    v_digest := keyturn._token_digest(v_token);
    -- A digest action keeps nothing that confirms a guess of its params: it
    -- stores (and shows everyone but this call) a MAC of the hash under the
    -- key no role reads, and approve verifies the resubmitted params
    -- against it. The token is bound to what is stored, as issue_token
    -- binds the fresh ones it gives.
    v_stored := CASE WHEN v_ver.retain = 'digest' THEN keyturn._digest_mac(v_hash) ELSE v_hash END;
    v_binding := keyturn._token_binding(v_token, v_id, v_stored, v_expires, v_origin);
    -- A revision written in a card session (opened from a link, whose
    -- holder may not be the person) says so, in its event and on its card.
    v_noted := keyturn._set_event_detail(jsonb_strip_nulls(jsonb_build_object(
        'revised_from', p_revised_from, 'revised_by', p_revised_by,
        'via', CASE WHEN p_revised_from IS NOT NULL AND keyturn._in_card_session() THEN 'card_session' END)));
    INSERT INTO keyturn.action (id, tenant, principal, session, tool, tool_version, executor, approval,
                                retain, params, param_keys, params_hash, summary, origin,
                                conversation_id, epoch, target_count, token_digest, token_binding,
                                idempotency_key, revised_from, revised_by, authors, created_at, expires_at,
                                status, updated_at)
    VALUES (v_id, p_tenant, p_principal, p_session, v_tool.name, v_ver.version, v_ver.executor,
            v_ver.approval, v_ver.retain,
            CASE WHEN v_ver.retain = 'full' THEN p_params END,
            v_keys, v_stored,
            CASE WHEN v_ver.retain = 'full' THEN v_summary END,
            v_origin, v_conv, v_epoch, v_count, v_digest, v_binding,
            'keyturn-' || v_id::text, p_revised_from, p_revised_by, v_authors, v_now, v_expires,
            'pending', v_now);

    INSERT INTO keyturn.action_target (action_id, ord, tenant, principal, key, version)
    SELECT v_id, t.ord, p_tenant, p_principal, t.value ->> 'k', t.value ->> 'v'
      FROM jsonb_array_elements(v_targets) WITH ORDINALITY AS t (value, ord);
    IF v_ver.attachments_param IS NOT NULL THEN
        PERFORM keyturn._bind_attachments(v_id, p_tenant, p_principal, v_ver, p_params, p_revised_from);
    END IF;

    -- Approved at once: by the person's request (task tools), or by a standing
    -- approval that covers it (never for a revision: the person revising is
    -- about to look at it).
    IF v_ver.approval = 'task' THEN
        PERFORM keyturn._set_event_context(jsonb_build_object('request', v_request.message_id));
        v_claimed := keyturn._claim(p_tenant, v_id, v_token, p_principal, v_request.recorded_role,
                                    'task:' || v_request.message_id);
        -- What the request admits commits only while its turn is still the
        -- conversation's latest.
        v_noted := keyturn._turn_at_commit(p_tenant, p_principal, v_request.conversation_id, v_request.turn_id);
        v_result := keyturn._after_claim(to_regrole(v_request.recorded_role)::oid, v_claimed, v_token, p_params, NULL);
        -- The request's approval is this action's alone, not the rest of
        -- the transaction's.
        PERFORM keyturn._set_event_context(NULL);
        RETURN ROW(v_id, v_token, v_summary, v_hash, v_expires, v_result.o_status, NULL)::keyturn._proposed;
    END IF;
    IF p_revised_from IS NULL AND v_delegated THEN
        v_deleg := keyturn._spend_delegation(p_tenant, p_principal, v_epoch, v_ver, p_params, v_count);
        IF v_deleg.id IS NOT NULL THEN
            -- What it covers commits before it ends, or not at all.
            v_noted := keyturn._ends_at_commit(v_deleg.expires_at,
                format('standing approval %s (until %s)', v_deleg.id, keyturn._utc(v_deleg.expires_at)));
            PERFORM keyturn._set_event_context(jsonb_build_object(
                'delegation', v_deleg.id, 'delegated_by', v_deleg.principal));
            v_claimed := keyturn._claim(p_tenant, v_id, v_token, v_deleg.principal, v_deleg.db_role,
                                        'delegation:' || v_deleg.id);
            v_result := keyturn._after_claim(to_regrole(v_deleg.db_role)::oid, v_claimed, v_token, p_params, NULL);
            PERFORM keyturn._set_event_context(NULL);
            RETURN ROW(v_id, v_token, v_summary, v_hash, v_expires, v_result.o_status, v_deleg.id)::keyturn._proposed;
        END IF;
    END IF;

    -- It waits for people now: the notifications of those with a channel
    -- (sql/064_notify.sql). A tenant where nobody set one pays one index
    -- probe, read with the grant above. Not a revision made in a card session: its notification's link
    -- would let whoever holds the first link approve what they wrote
    -- (keyturn._card_claims).
    IF v_notified AND NOT (p_revised_from IS NOT NULL AND keyturn._in_card_session()) THEN
        PERFORM keyturn._record_notifications(v_id, p_tenant);
    END IF;

    RETURN ROW(v_id, v_token, v_summary, v_hash, v_expires, 'pending', NULL)::keyturn._proposed;
END
$$;

CREATE OR REPLACE FUNCTION keyturn._propose(p_caller oid, p_tool text, p_params jsonb, p_origin jsonb)
RETURNS keyturn._proposed
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_principal text := keyturn.current_principal();
    v_noted     text;
BEGIN
    v_noted := keyturn._set_actor(p_caller::regrole::text, v_principal);
    RETURN keyturn._propose_for(
        p_caller, keyturn.current_tenant(), v_principal, keyturn.current_session(),
        p_tool, p_params, p_origin, NULL, NULL);
END
$$;


-- ==== sql/051_approve.sql ====

-- approve, preview and reject (docs/sql-api.md, "Human").
--
-- keyturn.approve / preview / reject are Rust functions (extension/src/gate.rs):
-- they refuse callers that are keyturn_agent members (separation of duties),
-- note the calling role, and run the functions below as the extension owner.
--
-- approve is three steps, each its own function so that standing approvals
-- and task requests (which approve inside propose) share them exactly:
-- the pre-claim checks (_usable_action), the claim (_claim: the row locked
-- while pending, and the approval binding made), and everything after it
-- (_after_claim: expiry, bindings, grants, hash, schema, then the write or the
-- queue), where every failure is a persisted answer, not an error, written
-- with the binding in one UPDATE.

-- approve's pre-claim checks, shared by revise, preview and reject (p_for
-- says which: the grant is needed to approve and to revise). Raises and
-- changes nothing: 42501 for identity, membership, grant and bound context;
-- 55000 when there is no usable proposal (unknown, invisible, wrong token).
-- Why this identity (principal, session, member role) may not act on
-- action a (p_for: approve, revise, reject, preview), or NULL: the approval
-- rule of the tool, in one place for approve and the calls around it, and
-- for issue_token and link_code (which ask as 'approve'). All 42501.
-- p_granted: whether p_principal holds a grant for a's tool, when the
-- caller read it already (keyturn._usable_action, in the statement that
-- reads the action); NULL, and it is read here.
CREATE OR REPLACE FUNCTION keyturn._decide_problem(a keyturn.action, p_principal text, p_session text, p_role text,
                                        p_for text, p_granted boolean DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_for IN ('approve', 'revise')
       AND NOT coalesce(p_granted, keyturn._has_grant(a.tenant, p_principal, a.tool)) THEN
        RETURN format('principal %s holds no grant for tool %s (an admin grants tools with keyturn.grant_tool)',
                      p_principal, a.tool);
    END IF;
    IF a.approval = 'self' AND (a.principal IS DISTINCT FROM p_principal OR a.session IS DISTINCT FROM p_session) THEN
        RETURN format('action %s is approved by the principal it was proposed for, in the same session', a.id);
    END IF;
    IF a.approval = 'independent' AND (a.principal = p_principal OR p_role NOT IN ('approver', 'admin')) THEN
        RETURN format('action %s needs an independent approver: a different principal with role approver or admin', a.id);
    END IF;
    -- Whoever wrote any version of it does not also approve it: a revision
    -- of a revision keeps every earlier author (keyturn.action.authors).
    IF a.approval = 'independent' AND p_for = 'approve' AND p_principal = ANY (a.authors) THEN
        RETURN format('%s wrote a version of action %s; an independent approver who wrote none of it must approve it',
                      p_principal, a.id);
    END IF;
    -- Task actions are approved by the request that admitted them, never by a token.
    IF a.approval = 'task' AND p_for IN ('approve', 'revise') THEN
        RETURN format('action %s is a task action, approved by the request that admitted it', a.id);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION keyturn._usable_action(p_id uuid, p_token text, p_for text)
RETURNS keyturn.action
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_session   text := keyturn.current_session();
    v_read      record;
    v_role      text;
    v_problem   text;
    v_noted     text;
    a           keyturn.action;
BEGIN
    -- One statement: the caller's membership (role and epoch, as
    -- keyturn._membership reads them), the action, and whether the caller
    -- holds a grant for its tool. No row: no full identity, or not a member,
    -- and keyturn._membership_missing raises (42501).
    -- (Every table filtered by v_tenant itself, never by m.tenant: Citus
    -- pins each statement of a delegated call by its distribution argument.)
    SELECT m.role, coalesce((SELECT e.epoch FROM keyturn.auth_epoch e
                              WHERE e.tenant = v_tenant AND e.principal = v_principal), 0) AS epoch,
           -- ROW(x.*), not x: on Citus, in a call delegated to a worker,
           -- x's row type would be its shard's (as in sql/063_mcp.sql).
           ROW(x.*)::keyturn.action AS action,
           CASE WHEN p_for IN ('approve', 'revise') THEN
               (SELECT coalesce(g.valid_until, 'infinity') FROM keyturn.tool_grant g
                 WHERE g.tenant = v_tenant AND g.principal = v_principal AND g.tool = x.tool
                   AND keyturn._grant_live(g.valid_until)) END AS granted_until
      INTO v_read
      FROM keyturn.member m
      LEFT JOIN keyturn.action x ON x.id = p_id AND x.tenant = v_tenant
     WHERE m.tenant = v_tenant AND m.principal = v_principal AND v_session IS NOT NULL;
    IF v_read.role IS NULL THEN
        PERFORM keyturn._membership_missing(v_tenant, v_principal, v_session);
    END IF;
    v_role := v_read.role;
    a := v_read.action;
    IF a.id IS NULL OR a.tenant IS DISTINCT FROM v_tenant
       OR (v_role = 'member' AND a.principal IS DISTINCT FROM v_principal) THEN
        RAISE EXCEPTION 'keyturn: no usable proposal %', coalesce(p_id::text, 'NULL')
            USING ERRCODE = '55000',
                  DETAIL = 'It does not exist, or it is not visible to this identity.';
    END IF;
    v_problem := keyturn._decide_problem(a, v_principal, v_session, v_role, p_for,
                                         v_read.granted_until IS NOT NULL);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: %', v_problem
            USING ERRCODE = '42501',
                  HINT = 'approve, reject, revise and preview follow the tool''s approval rule: the proposer in its session (self), or an approver or admin who wrote none of it (independent).';
    END IF;
    IF p_token IS NULL OR NOT keyturn._ct_eq(a.token_digest, keyturn._token_digest(p_token)) THEN
        RAISE EXCEPTION 'keyturn: wrong token for this action'
            USING ERRCODE = '55000',
                  DETAIL = format('action %s', p_id),
                  HINT = 'Use the token propose returned for this action. A wrong token does not use the proposal up.';
    END IF;
    -- The caller's own membership, role and grant were read on this
    -- transaction's snapshot; a decision (not a preview) commits only if
    -- the caller's authorization is unchanged then (each of those changes
    -- moves the epoch): under REPEATABLE READ a member removed after the
    -- snapshot decides nothing.
    IF p_for <> 'preview' THEN
        v_noted := keyturn._recheck_epoch_at_commit(v_tenant, v_principal, v_read.epoch);
    END IF;
    -- And an approval commits only while the approver's grant lasts
    -- (fourteenth red-team pass, docs/security.md row 108).
    IF p_for = 'approve' AND v_read.granted_until < 'infinity' THEN
        v_noted := keyturn._ends_at_commit(v_read.granted_until,
            format('the grant of tool %s to approver %s (valid until %s)', a.tool, v_principal,
                   keyturn._utc(v_read.granted_until)));
    END IF;
    RETURN a;
END
$$;

-- Why a claimed proposal may no longer run, or NULL. Reads the tool row and
-- the proposer's authorization without a row lock. What must not outlive a
-- change of them is the commit, and the commit reads them again:
-- keyturn._recheck_at_commit notes the tool version and epoch this decision
-- read (and the conversation and the evidence it checked: the commit also
-- fails if the one was cancelled or the other revoked meanwhile,
-- docs/security.md row 104), and the commit, ordered
-- against every change of the tool or epoch by its share
-- lock (docs/security.md, row 95), fails (40001) if either has moved (on
-- Citus, the tool row of this node's placement: keyturn._local_placement).
-- So nothing here waits: no transaction left open stalls a decision or the
-- kill switch, and no decision rests on a read taken before a wait (tenth
-- red-team pass, F1). Under READ COMMITTED each statement reads what is
-- committed when it starts; under REPEATABLE READ or SERIALIZABLE,
-- keyturn._read_as_committed fails the call (40001) if what the snapshot
-- showed is no longer what is committed, before anything is decided or
-- written. (Until row 97 both rows were read FOR KEY SHARE: with one tool
-- approved by many at once, each approval's lock of its one row made a new
-- MultiXact, which every later reader looked up; and the lock never failed
-- on a change of a column outside the key.)
CREATE OR REPLACE FUNCTION keyturn._invalid_reason(a keyturn.action)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_enabled boolean;
    v_version int;
    v_epoch   bigint;
    v_member  boolean;
    v_until   timestamptz;
    v_how     text;
    v_local   regclass;
    v_noted   text;
    v_cited   text[];
BEGIN
    -- Asked first, in Rust: without Citus, approve and begin_dispatch pay
    -- for no call of the plpgsql function per action.
    IF keyturn._citus_present() THEN
        v_local := keyturn._local_placement('keyturn.tool');
    END IF;
    IF v_local IS NULL THEN
        SELECT t.enabled, t.version INTO v_enabled, v_version
          FROM keyturn.tool t WHERE t.name = a.tool;
    ELSE
        -- Citus: this node's placement, which register_tool and
        -- set_tool_enabled change with every other, and which the commit
        -- reads again (keyturn._local_placement).
        EXECUTE format('SELECT t.enabled, t.version FROM %s t WHERE t.name = $1', v_local)
           INTO v_enabled, v_version USING a.tool;
    END IF;
    -- The rest in one statement of its own: the tool tables are reference
    -- tables on Citus, which a worker does not join with a tenant's in a
    -- delegated call.
    SELECT (SELECT e.epoch FROM keyturn.auth_epoch e
             WHERE e.tenant = a.tenant AND e.principal = a.principal),
           EXISTS (SELECT 1 FROM keyturn.member m WHERE m.tenant = a.tenant AND m.principal = a.principal),
           (SELECT coalesce(g.valid_until, 'infinity') FROM keyturn.tool_grant g
             WHERE g.tenant = a.tenant AND g.principal = a.principal AND g.tool = a.tool
               AND keyturn._grant_live(g.valid_until))
      INTO v_epoch, v_member, v_until;
    -- Under REPEATABLE READ or SERIALIZABLE, what was just read is the
    -- snapshot's: 40001 unless it is still what is committed (a no-op at
    -- READ COMMITTED; an expression, not a statement).
    v_noted := keyturn._read_as_committed(a.tool, v_enabled, v_version, a.tenant, a.principal,
                                          coalesce(v_epoch, 0));
    IF v_enabled IS NOT TRUE THEN
        RETURN format('tool %s is disabled', a.tool);
    END IF;
    IF v_version <> a.tool_version THEN
        RETURN format('tool %s changed from version %s to %s', a.tool, a.tool_version, v_version);
    END IF;
    IF coalesce(v_epoch, 0) <> a.epoch THEN
        RETURN format('the authorization of principal %s changed (epoch %s, now %s)', a.principal, a.epoch, coalesce(v_epoch, 0));
    END IF;
    IF NOT v_member THEN
        RETURN format('principal %s is no longer a member of tenant %s', a.principal, a.tenant);
    END IF;
    IF v_until IS NULL THEN
        RETURN format('principal %s no longer holds a grant for tool %s', a.principal, a.tool);
    END IF;
    -- A grant that ends by time ends what it admitted at its end: this
    -- transaction does not commit past it (keyturn._ends_at_commit).
    IF v_until <> 'infinity' THEN
        v_noted := keyturn._ends_at_commit(v_until,
            format('the grant of tool %s to principal %s (valid until %s)', a.tool, a.principal,
                   keyturn._utc(v_until)));
    END IF;
    IF a.conversation_id IS NOT NULL THEN
        v_how := keyturn._ended_how(a.tenant, a.principal, a.conversation_id);
        IF v_how IS NOT NULL THEN
            RETURN format('conversation %s was %s', a.conversation_id, v_how);
        END IF;
    END IF;
    -- Evidence revoked since: whatever propose admitted, nothing runs on it
    -- (revoke_evidence invalidates what is pending; this covers what was
    -- approved meanwhile, and a revocation that raced the proposal).
    IF a.origin ? 'evidence' THEN
        v_cited := ARRAY(SELECT jsonb_array_elements_text(a.origin -> 'evidence'));
        v_how := keyturn._evidence_revoked(a.tenant, v_cited);
        IF v_how IS NOT NULL THEN
            RETURN format('the evidence it cites (%s) was revoked', v_how);
        END IF;
    END IF;
    -- A call with plain arguments (no subquery): plpgsql evaluates it
    -- without a statement of its own.
    v_noted := keyturn._recheck_at_commit(a.tool, a.tool_version, a.tenant, a.principal, a.epoch,
                                          a.conversation_id, v_cited);
    RETURN NULL;
END
$$;

-- Persists a terminal outcome and returns it: after the claim, failures are
-- answers, not errors. The claim's approval binding (a, made by _claim) is
-- written with the outcome: one row version per approve.
--
-- The steps of approve and propose return keyturn._outcome (and
-- keyturn._proposed), one row as a composite, and call one another in
-- expressions (RETURN keyturn._settle(...)), and the Rust functions that
-- return '' are assigned, not PERFORMed: an expression is evaluated without
-- the executor, where each RETURN QUERY, PERFORM and SELECT INTO is a
-- statement it starts and ends (docs/benchmarks.md, statements per flow).
CREATE OR REPLACE FUNCTION keyturn._settle(a keyturn.action, p_status keyturn.status, p_result jsonb, p_detail jsonb)
RETURNS keyturn._outcome
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now   timestamptz := clock_timestamp();
    v_noted text;
BEGIN
    v_noted := keyturn._set_event_detail(p_detail);
    UPDATE keyturn.action x
       SET updated_at = v_now, status = p_status, result = p_result,
           approved_by = a.approved_by, approved_role = a.approved_role, approved_at = a.approved_at,
           approved_via = a.approved_via, approval_mac = a.approval_mac
     WHERE x.id = a.id AND x.tenant = a.tenant;
    RETURN ROW(a.id, p_status::text, p_result)::keyturn._outcome;
END
$$;

-- A time as keyturn's own messages print it, whatever the session's
-- DateStyle and TimeZone: ISO 8601 in UTC.
CREATE OR REPLACE FUNCTION keyturn._utc(p_at timestamptz)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE  -- as to_char() is: inlined
AS $$
    SELECT to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

-- Runs the business UPDATE of an sql tool as p_runas (the approving role,
-- under its RLS), on the stored targets at their stored versions, in a
-- subtransaction. Keys and versions compare in the columns' own types, and
-- every value written is the canonical text of what was hashed.
CREATE OR REPLACE FUNCTION keyturn._execute_sql(p_runas oid, a keyturn.action, p_ver keyturn.tool_version)
RETURNS keyturn._outcome
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_arg     jsonb;
    v_set     text[];
    v_sql     text;
    v_rows    jsonb;
    v_n       int := -1;
    v_bad     jsonb;
BEGIN
    v_arg := keyturn._form_arg(a.params, p_ver.sql_types) || jsonb_build_object(
        'targets', (SELECT jsonb_agg(jsonb_build_object('k', t.key, 'v', t.version) ORDER BY t.ord)
                      FROM keyturn.action_target t WHERE t.action_id = a.id AND t.tenant = a.tenant));

    -- {the SET list, the postcondition over u, the columns RETURNING names}
    v_set := keyturn._set_clauses(p_ver.sql_types, a.params);

    -- RETURNING names plain columns only, and the checks and the jsonb are
    -- built over the CTE: Citus refuses any non-IMMUTABLE function in the
    -- RETURNING clause of a write to a distributed table (docs/scale-out.md).
    -- The key is never in set, so the column names cannot collide.
    v_sql := format(
        'WITH u AS (UPDATE %s AS t SET %s FROM jsonb_to_recordset($1->''targets'') AS x (k text, v text) '
        'WHERE t.%I = x.k::%s AND %s = x.v::%s AND %s '
        'RETURNING t.%I, %s) '
        'SELECT jsonb_build_object(''key'', u.%I::text, ''ok'', %s) FROM u',
        keyturn._tool_table(p_ver), v_set[1],
        p_ver.sql_key, p_ver.sql_types ->> p_ver.sql_key,
        keyturn._version_expr(p_ver), p_ver.sql_types ->> p_ver.sql_version,
        keyturn._form_where(p_ver, a.params), p_ver.sql_key, v_set[3], p_ver.sql_key, v_set[2]);

    BEGIN
        v_rows := keyturn._exec_as(p_runas, v_sql, v_arg);
        v_n := jsonb_array_length(v_rows);
        IF v_n <> a.target_count THEN
            RAISE EXCEPTION 'target count mismatch' USING ERRCODE = 'KT409';
        END IF;
        v_bad := keyturn._written_keys(v_rows, true);
        IF v_bad IS NOT NULL THEN
            RAISE EXCEPTION 'postcondition failed' USING ERRCODE = 'KT417';
        END IF;
    EXCEPTION
        -- Transient failures are raised, never persisted: the claim rolls back
        -- with them and the proposal stays pending for another try. Only a
        -- definite failure of the write (a constraint, an RLS check, a
        -- trigger's error) uses the approval up.
        WHEN transaction_rollback OR lock_not_available OR query_canceled
             OR insufficient_resources OR operator_intervention OR system_error
             OR internal_error THEN
            RAISE;
        WHEN SQLSTATE 'KT409' THEN
            RETURN keyturn._settle(a, 'conflict',
                jsonb_build_object('reason', 'targets changed since the proposal; propose again to see the new state',
                                   'expected', a.target_count, 'matched', v_n),
                jsonb_build_object('expected', a.target_count, 'matched', v_n));
        WHEN SQLSTATE 'KT417' THEN
            RETURN keyturn._settle(a, 'failed',
                jsonb_build_object('reason', 'postcondition failed: targets do not hold the approved values after the write (a trigger changed them?); rolled back',
                                   'keys', v_bad),
                jsonb_build_object('reason', 'postcondition failed'));
        WHEN OTHERS THEN
            RETURN keyturn._settle(a, 'failed',
                jsonb_build_object('reason', 'the business write failed and was rolled back',
                                   'sqlstate', SQLSTATE, 'message', SQLERRM),
                jsonb_build_object('reason', 'business write failed', 'sqlstate', SQLSTATE));
    END;

    RETURN keyturn._settle(a, 'succeeded',
        jsonb_build_object('rows', v_n, 'keys', keyturn._written_keys(v_rows, false)),
        jsonb_build_object('rows', v_n));
END
$$;

-- The claim: the proposal row, locked on (id, pending, the token's digest),
-- with the approval binding made in memory: who approved, as which role,
-- when and how, under a MAC with the approval key. _settle writes it with
-- the outcome, in the one UPDATE that moves the status. Of N concurrent
-- claims one gets the row; the others wait for its transaction, find the
-- row no longer pending, and get NULL (all columns). NULL also for a wrong
-- token (the caller checked it already; a race with a revise or a reject
-- lands here too).
CREATE OR REPLACE FUNCTION keyturn._claim(p_tenant text, p_id uuid, p_token text, p_by text, p_role text, p_via text)
RETURNS keyturn.action
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_at timestamptz := clock_timestamp();
    a    keyturn.action;
BEGIN
    SELECT x.* INTO a FROM keyturn.action x
     WHERE x.id = p_id AND x.tenant = p_tenant AND x.status = 'pending'
       AND keyturn._ct_eq(x.token_digest, keyturn._token_digest(p_token))
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN a;
    END IF;
    a.approved_by := p_by;
    a.approved_role := p_role;
    a.approved_at := v_at;
    a.approved_via := p_via;
    a.approval_mac := keyturn._approval_mac(a.id, a.params_hash, p_by, p_role, v_at, p_via);
    RETURN a;
END
$$;

-- Everything after the claim, in order, each failure persisted and returned:
-- expiry, the token binding, what invalidates (tool, membership, grant,
-- epoch, origin), the params hash (of the stored params, and of resubmitted
-- ones), the schema; then the sql write as p_runas, or the queue. p_ver:
-- the action's tool version when the caller read it already (a version never
-- changes once a proposal can name it), else it is read here.
CREATE OR REPLACE FUNCTION keyturn._after_claim(p_runas oid, a keyturn.action, p_token text, p_params jsonb,
                                     p_given_hash text, p_ver keyturn.tool_version DEFAULT NULL)
RETURNS keyturn._outcome
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_ver    keyturn.tool_version;
    v_params jsonb;
    v_reason text;
    v_err    text;
    v_now    timestamptz;
    v_plain  text;
    v_noted  text;
BEGIN
    IF clock_timestamp() > a.expires_at THEN
        RETURN keyturn._settle(a, 'expired',
            jsonb_build_object('reason', format('the proposal expired at %s', keyturn._utc(a.expires_at))),
            jsonb_build_object('reason', 'expired'));
    END IF;
    -- An approval is one when it commits: not after the proposal expired
    -- (fourteenth red-team pass, docs/security.md row 108).
    v_noted := keyturn._ends_at_commit(a.expires_at,
        format('proposal %s (it expired at %s)', a.id, keyturn._utc(a.expires_at)));
    -- A digest action stores only a MAC of its params hash: the params
    -- resubmitted now (or proposed in this call: a task request, a standing
    -- approval) must be the ones it was made of, checked where a changed
    -- hash is (after the token's binding and the invalidations).
    IF a.retain = 'digest' THEN
        v_plain := coalesce(p_given_hash, keyturn.params_hash(a.tool, p_params));
    END IF;
    -- The token is bound to the stored params hash and origin (the
    -- conversation column is the origin's, read from it at propose); a digest
    -- proposal made by 0.2.0 bound it to the plain hash, which v_plain now is.
    IF (NOT keyturn._token_binds(p_token, a.id, a.params_hash, a.expires_at, a.origin, a.token_binding)
        AND NOT (a.retain = 'digest'
                 AND keyturn._token_binds(p_token, a.id, v_plain, a.expires_at, a.origin, a.token_binding)))
       OR a.conversation_id IS DISTINCT FROM a.origin ->> 'conversation_id' THEN
        RETURN keyturn._settle(a, 'rejected_tampered',
            jsonb_build_object('reason', 'the stored proposal no longer matches what the token was issued for'),
            jsonb_build_object('reason', 'token binding mismatch'));
    END IF;
    v_reason := keyturn._invalid_reason(a);
    IF v_reason IS NOT NULL THEN
        RETURN keyturn._settle(a, 'invalidated',
            jsonb_build_object('reason', v_reason), jsonb_build_object('reason', v_reason));
    END IF;

    IF a.retain = 'digest' AND NOT keyturn._params_hash_matches(a.retain, a.params_hash, v_plain) THEN
        RETURN keyturn._settle(a, 'rejected_tampered',
            jsonb_build_object('reason', 'the resubmitted params differ from what was proposed'),
            jsonb_build_object('reason', 'resubmitted params hash mismatch'));
    END IF;
    IF a.retain = 'full' THEN
        IF keyturn.params_hash(a.tool, a.params) <> a.params_hash THEN
            RETURN keyturn._settle(a, 'rejected_tampered',
                jsonb_build_object('reason', 'the stored params no longer match the proposal hash'),
                jsonb_build_object('reason', 'stored params hash mismatch'));
        END IF;
        v_params := a.params;
    ELSE
        v_params := p_params;
    END IF;
    IF p_given_hash IS NOT NULL AND NOT keyturn._params_hash_matches(a.retain, a.params_hash, p_given_hash) THEN
        RETURN keyturn._settle(a, 'rejected_tampered',
            jsonb_build_object('reason', 'the resubmitted params differ from what was proposed'),
            jsonb_build_object('reason', 'resubmitted params hash mismatch'));
    END IF;

    IF p_ver.tool IS NULL THEN
        SELECT v.* INTO v_ver FROM keyturn.tool_version v WHERE v.tool = a.tool AND v.version = a.tool_version;
    ELSE
        v_ver := p_ver;
    END IF;
    IF a.executor = 'external' THEN
        v_err := coalesce(keyturn._params_errors(v_ver.params_schema, v_params),
                          keyturn._undeclared_recipient(v_ver, v_params));
    ELSE
        v_err := keyturn._form_error(v_ver, v_params);
    END IF;
    IF v_err IS NOT NULL THEN
        RETURN keyturn._settle(a, 'invalidated',
            -- Validator messages quote the offending values: never store them for
            -- digest actions (docs/concepts.md, "Digest retention").
            jsonb_build_object('reason', 'params no longer pass the tool''s schema: '
                               || CASE WHEN a.retain = 'digest' THEN '(details withheld: digest retention)'
                                       ELSE v_err END),
            jsonb_build_object('reason', 'schema revalidation failed'));
    END IF;

    IF a.executor = 'sql' THEN
        RETURN keyturn._execute_sql(p_runas, a, v_ver);
    END IF;

    IF a.retain = 'digest' THEN
        INSERT INTO keyturn.staged_payload (action_id, tenant, principal, params)
        VALUES (a.id, a.tenant, a.principal, v_params);
    END IF;
    v_noted := keyturn._set_event_detail('{}');
    v_now := clock_timestamp();
    UPDATE keyturn.action x
       SET updated_at = v_now, status = 'queued', next_attempt_at = v_now,
           approved_by = a.approved_by, approved_role = a.approved_role, approved_at = a.approved_at,
           approved_via = a.approved_via, approval_mac = a.approval_mac
     WHERE x.id = a.id AND x.tenant = a.tenant;
    RETURN ROW(a.id, 'queued', NULL)::keyturn._outcome;
END
$$;

CREATE OR REPLACE FUNCTION keyturn._approve(p_caller oid, p_id uuid, p_token text, p_params jsonb)
RETURNS keyturn._outcome
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_principal text := keyturn.current_principal();
    a           keyturn.action;
    v_claimed   keyturn.action;
    v_given     text;
    v_ver       keyturn.tool_version;
    v_noted     text;
BEGIN
    v_noted := keyturn._set_actor(p_caller::regrole::text, v_principal);
    a := keyturn._usable_action(p_id, p_token, 'approve');

    IF a.status <> 'pending' THEN
        -- A replay: the stored outcome, nothing run or charged twice.
        RETURN ROW(a.id, a.status::text, a.result)::keyturn._outcome;
    END IF;
    IF a.retain = 'digest' AND p_params IS NULL THEN
        RAISE EXCEPTION 'keyturn: action % keeps only a digest; approve must resubmit the reviewed params', p_id
            USING ERRCODE = '22023';
    END IF;
    IF a.executor = 'sql' THEN
        v_noted := keyturn._refuse_rls_bypass(p_caller);
    END IF;
    IF p_params IS NOT NULL THEN
        -- Hash before the claim: an unhashable payload raises and changes nothing.
        v_given := keyturn.params_hash(a.tool, p_params);
    END IF;

    SELECT v.* INTO v_ver FROM keyturn.tool_version v
     WHERE v.tool = a.tool AND v.version = a.tool_version;
    IF v_ver.quorum > 1 THEN
        RETURN keyturn._vote(p_caller, a, p_token, p_params, v_given, v_ver.quorum);
    END IF;

    v_claimed := keyturn._claim(a.tenant, p_id, p_token, v_principal, p_caller::regrole::text, 'approve');
    IF v_claimed.id IS NULL THEN
        SELECT x.* INTO a FROM keyturn.action x WHERE x.id = p_id AND x.tenant = a.tenant;
        RETURN ROW(a.id, a.status::text, a.result)::keyturn._outcome;
    END IF;
    RETURN keyturn._after_claim(p_caller, v_claimed, p_token, p_params, v_given, v_ver);
END
$$;

-- With p_params (a digest action's reviewed fields, which the link brings
-- and the card cannot hash against a stored MAC), also whether they are the
-- proposed ones, while it is pending; fields that are not end it
-- rejected_tampered, as approving with them would: the token's holder gets
-- one guess, as from approve, never an oracle. (A caller on the human side's
-- own SQL connection could roll the penalty back with a savepoint, as it
-- could approve's: that connection is the application, which is trusted to
-- assert identities and holds the params it proposed. Over HTTP each call
-- commits.)
-- How revision a was written: 'card_session' when in a card opened from a
-- link (its creation event says so: sql/050_propose.sql), else NULL.
CREATE OR REPLACE FUNCTION keyturn._revised_via(a keyturn.action)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN (SELECT e.detail ->> 'via' FROM keyturn.event e
             WHERE e.action_id = a.id AND e.tenant = a.tenant AND e.from_status IS NULL
             ORDER BY e.id LIMIT 1);
END
$$;

-- p's members whose value is not JSON null; what is inside them is left as
-- it is.
CREATE OR REPLACE FUNCTION keyturn._without_null_members(p jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}'::jsonb)
              FROM jsonb_each(p) e WHERE e.value <> 'null'::jsonb);
END
$$;

CREATE OR REPLACE FUNCTION keyturn._preview(p_caller oid, p_id uuid, p_token text, p_params jsonb)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a         keyturn.action;
    v_ver     keyturn.tool_version;
    v_sql     text;
    v_rows    jsonb := '[]';
    v_after   jsonb;
    v_targets jsonb;
    v_route   text := '';
    v_match   boolean;
    v_now     timestamptz;
    v_result  jsonb := jsonb_build_object('reason', 'the params shown for review differ from what was proposed');
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, keyturn.current_principal());
    a := keyturn._usable_action(p_id, p_token, 'preview');
    -- Only while it waits for a decision, where a wrong guess ends it: on a
    -- decided action a check would cost nothing and could be repeated.
    IF p_params IS NOT NULL AND a.status = 'pending' THEN
        v_match := keyturn._params_hash_matches(a.retain, a.params_hash, keyturn.params_hash(a.tool, p_params));
        IF NOT v_match AND a.status = 'pending' THEN
            PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'previewed params hash mismatch'));
            -- Computed first: Citus refuses a volatile function in an UPDATE.
            v_now := clock_timestamp();
            UPDATE keyturn.action x
               SET updated_at = v_now, status = 'rejected_tampered',
                   result = v_result
             WHERE x.id = a.id AND x.tenant = a.tenant AND x.status = 'pending'
            RETURNING x.* INTO a;
            IF NOT FOUND THEN
                SELECT x.* INTO a FROM keyturn.action x WHERE x.id = p_id AND x.tenant = a.tenant;
            END IF;
        END IF;
    END IF;
    SELECT v.* INTO v_ver FROM keyturn.tool_version v WHERE v.tool = a.tool AND v.version = a.tool_version;

    IF a.executor = 'sql' THEN
        -- On a table Citus distributes, the form's value of its distribution
        -- column too, when the form names one: the read then stays on the
        -- shard that holds the targets, as the write does (on one node, and
        -- for a form that names none, nothing is added).
        SELECT format(' AND t.%I = %s', c.dist_column, keyturn._form_value(v_ver, 'where', c.dist_column))
          INTO v_route
          FROM keyturn._citus_table(keyturn._tool_table(v_ver)::regclass) c
         WHERE c.dist_column IS NOT NULL AND jsonb_typeof(a.params -> 'where' -> c.dist_column) IN ('string', 'number');
        -- Current values of the columns to be set, read as the approver (RLS
        -- applies), beside the values the write would store.
        v_sql := format(
            'SELECT jsonb_build_object(''key'', t.%I::text, ''before'', jsonb_build_object(%s)) '
            'FROM %s AS t WHERE t.%I = ANY (ARRAY(SELECT jsonb_array_elements_text($1->''keys''))::%s[])%s',
            v_ver.sql_key,
            (SELECT string_agg(format('%L, to_jsonb(t.%I)', s.key, s.key), ', ' ORDER BY s.key)
               FROM jsonb_object_keys(a.params -> 'set') s (key)),
            keyturn._tool_table(v_ver), v_ver.sql_key, v_ver.sql_types ->> v_ver.sql_key, coalesce(v_route, ''));
        v_rows := keyturn._exec_as(p_caller, v_sql, jsonb_build_object('keys',
            (SELECT jsonb_agg(t.key) FROM keyturn.action_target t WHERE t.action_id = a.id AND t.tenant = a.tenant),
            'where', a.params -> 'where'));
        v_after := keyturn._form_arg(a.params, v_ver.sql_types) -> 'set';
        SELECT jsonb_agg(jsonb_build_object(
                   'key', t.key,
                   'before', (SELECT r -> 'before' FROM jsonb_array_elements(v_rows) r WHERE r ->> 'key' = t.key LIMIT 1),
                   'after', v_after) ORDER BY t.ord)
          INTO v_targets
          FROM keyturn.action_target t WHERE t.action_id = a.id AND t.tenant = a.tenant;
    END IF;

    -- Only the card's own absent members are left out: jsonb_strip_nulls
    -- would reach into params and targets and hide a write's NULL
    -- (docs/security.md, row 78).
    RETURN keyturn._without_null_members(jsonb_build_object(
        'action_id', a.id,
        'summary', coalesce(a.summary, a.tool),
        'tool', a.tool,
        'effect', v_ver.effect,
        'executor', a.executor,
        'approval', a.approval,
        'status', a.status,
        'expires_at', a.expires_at,
        'retain', a.retain,
        'target_count', a.target_count,
        'param_keys', to_jsonb(a.param_keys),
        'params', a.params,
        'params_hash', a.params_hash,
        'params_match', v_match,
        'origin', a.origin,
        'evidence', CASE WHEN a.origin ? 'evidence' THEN keyturn._cited_evidence(a.tenant, a.origin) END,
        'result', a.result,
        'revised_from', a.revised_from,
        'revised_via', CASE WHEN a.revised_from IS NOT NULL THEN keyturn._revised_via(a) END,
        'quorum', CASE WHEN v_ver.quorum > 1 THEN v_ver.quorum END,
        'votes', CASE WHEN v_ver.quorum > 1 THEN keyturn._votes(a.id, a.tenant, a.tool) END,
        'targets', v_targets));
END
$$;

CREATE OR REPLACE FUNCTION keyturn._reject(p_caller oid, p_id uuid, p_token text, p_reason text)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a        keyturn.action;
    v_status keyturn.status;
    v_now    timestamptz := clock_timestamp();
    -- Computed first: Citus refuses a COALESCE beside a function that is
    -- not immutable in a distributed UPDATE.
    v_result jsonb := jsonb_strip_nulls(jsonb_build_object('reason', coalesce(p_reason, 'rejected by the approver')));
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, keyturn.current_principal());
    a := keyturn._usable_action(p_id, p_token, 'reject');
    PERFORM keyturn._set_event_detail(jsonb_strip_nulls(jsonb_build_object('reason', p_reason)));
    UPDATE keyturn.action x
       SET updated_at = v_now, status = 'rejected', result = v_result
     WHERE x.id = p_id AND x.tenant = a.tenant AND x.status = 'pending'
    RETURNING x.status INTO v_status;
    IF NOT FOUND THEN
        SELECT x.status INTO v_status FROM keyturn.action x WHERE x.id = p_id AND x.tenant = a.tenant;
    END IF;
    RETURN v_status::text;
END
$$;


-- ==== sql/052_session.sql ====

-- Logout, conversation cancellation, status and audit (docs/sql-api.md).

-- Logout: cancels the caller's pending, queued and leased actions of a
-- session (its own, or p_session). For end_session and end_session_for
-- (p_what names the call).
CREATE OR REPLACE FUNCTION keyturn._end_session(p_what text, p_session text)
RETURNS int
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_session   text := keyturn.current_session();
    v_target    text;
    v_n         int;
    v_now       timestamptz := clock_timestamp();
BEGIN
    PERFORM keyturn._refuse_nested(p_what);
    PERFORM keyturn._set_actor(keyturn._calling_role(), v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, v_session);
    v_target := coalesce(p_session, v_session);
    PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'session ended'));
    UPDATE keyturn.action a
       SET updated_at = v_now, status = 'cancelled', result = jsonb_build_object('reason', 'the session ended'),
           lease_id = NULL, leased_by = NULL, lease_expires_at = NULL
     WHERE a.id IN (SELECT o.action_id FROM keyturn.open_action o
                     WHERE o.tenant = v_tenant AND o.principal = v_principal AND o.session = v_target)
       AND a.tenant = v_tenant AND a.principal = v_principal AND a.session = v_target
       AND a.status IN ('pending', 'queued', 'leased');
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

CREATE OR REPLACE FUNCTION keyturn.end_session(session text DEFAULT NULL)
RETURNS int
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._end_session('end_session', end_session.session)
$$;

-- Ends a conversation for the caller's principal: cancelled (it was stopped)
-- or archived (it ended normally). Either way it starts no new actions, and
-- its pending, queued and leased actions are cancelled; calls already
-- executing finish. A conversation ends once: the first word stays.
CREATE OR REPLACE FUNCTION keyturn._end_conversation(p_conversation text, p_how text, p_what text)
RETURNS int
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_n         int;
    v_now       timestamptz := clock_timestamp();
BEGIN
    PERFORM keyturn._refuse_nested(p_what);
    PERFORM keyturn._set_actor(keyturn._calling_role(), v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    PERFORM keyturn._require_text(p_conversation, 'conversation_id');

    INSERT INTO keyturn.cancelled_origin (tenant, principal, conversation_id, how)
    VALUES (v_tenant, v_principal, p_conversation, p_how)
    ON CONFLICT ON CONSTRAINT cancelled_origin_pkey DO NOTHING;

    PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'conversation ' || p_how));
    UPDATE keyturn.action a
       SET updated_at = v_now, status = 'cancelled',
           result = jsonb_build_object('reason', 'the conversation was ' || p_how),
           lease_id = NULL, leased_by = NULL, lease_expires_at = NULL
     WHERE a.id IN (SELECT o.action_id FROM keyturn.open_action o
                     WHERE o.tenant = v_tenant AND o.principal = v_principal
                       AND o.conversation_id = p_conversation)
       AND a.tenant = v_tenant AND a.principal = v_principal
       AND a.conversation_id = p_conversation
       AND a.status IN ('pending', 'queued', 'leased');
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

CREATE OR REPLACE FUNCTION keyturn.cancel_origin(conversation_id text)
RETURNS int
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._end_conversation(cancel_origin.conversation_id, 'cancelled', 'cancel_origin')
$$;

CREATE OR REPLACE FUNCTION keyturn.archive_conversation(conversation_id text)
RETURNS int
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._end_conversation(archive_conversation.conversation_id, 'archived', 'archive_conversation')
$$;

-- 55000 when the conversation a proposal comes from has ended for its
-- principal, as committed (keyturn._ended_how reads past a REPEATABLE READ
-- snapshot: an archive committed after it still ends the conversation).
CREATE OR REPLACE FUNCTION keyturn._refuse_ended_conversation(p_tenant text, p_principal text, p_conversation text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_how text;
BEGIN
    IF p_conversation IS NULL THEN
        RETURN;
    END IF;
    v_how := keyturn._ended_how(p_tenant, p_principal, p_conversation);
    IF v_how IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: conversation % was %; it can start no new actions', keyturn._quoted(p_conversation), v_how
            USING ERRCODE = '55000';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION keyturn._action_status(p_id uuid)
RETURNS TABLE (o_action_id uuid, o_tool text, o_status text, o_summary text, o_attempts int, o_result jsonb,
               o_created_at timestamptz, o_expires_at timestamptz, o_updated_at timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_role      text;
BEGIN
    v_role := keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    RETURN QUERY
        SELECT a.id, a.tool, a.status::text, coalesce(a.summary, a.tool), a.attempts, a.result,
               a.created_at, a.expires_at, a.updated_at
          FROM keyturn.action a
         WHERE a.id = p_id AND a.tenant = v_tenant
           AND (v_role IN ('approver', 'admin') OR a.principal = v_principal);
END
$$;

-- Visible rows only: the same rule as RLS (own tenant; a member its own actions).
CREATE OR REPLACE FUNCTION keyturn.action_status(action_id uuid)
RETURNS TABLE (action_id uuid, tool text, status text, summary text, attempts int, result jsonb,
               created_at timestamptz, expires_at timestamptz, updated_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._refuse_nested('action_status');
    SELECT * FROM keyturn._action_status($1)
$$;

-- What the caller may see of an action's history: superusers and operators
-- (who reconcile across tenants by role; events hold no param values) see
-- every event; anyone else what row-level security on keyturn.event would
-- show its identity (nothing without identity).
CREATE OR REPLACE FUNCTION keyturn.audit(action_id uuid)
RETURNS TABLE (at timestamptz, db_role text, principal text, from_status text, to_status text, detail jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_all       boolean;
    v_tenant    text;
    v_principal text;
BEGIN
    PERFORM keyturn._refuse_nested('audit');
    v_all := pg_has_role(keyturn._calling_role(), 'keyturn_operator', 'USAGE');
    -- Whether the caller may see it is decided once, here, not per event: on
    -- Citus the events are read on the tenant's shard, where a function may
    -- not query distributed tables again.
    SELECT a.tenant, a.principal INTO v_tenant, v_principal
      FROM keyturn.action a WHERE a.id = audit.action_id;  -- by id alone: operators audit across tenants
    IF NOT FOUND OR NOT (v_all OR keyturn._sees(v_tenant, v_principal)) THEN
        RETURN;
    END IF;
    RETURN QUERY
        SELECT e.at, e.db_role, e.principal, e.from_status::text, e.to_status::text, e.detail
          FROM keyturn.event e
         WHERE e.action_id = audit.action_id AND e.tenant = v_tenant
         ORDER BY e.id;
    -- Then the events of this transaction, written into the chain at its
    -- commit (docs/audit.md): a transaction sees its own, as it sees its
    -- own status changes.
    RETURN QUERY
        SELECT n.at, n.db_role, n.principal, n.from_status, n.to_status, n.detail::jsonb
          FROM keyturn._noted_events(audit.action_id) n;
END
$$;

-- The session and conversation calls with the caller's tenant named (another
-- tenant: 42501; none: 22023), the forms Citus can send whole to the
-- tenant's worker (docs/scale-out.md, layout B), as propose_for and
-- approve_for.
CREATE OR REPLACE FUNCTION keyturn.end_session_for(tenant text, session text DEFAULT NULL)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_other_tenant('end_session_for', end_session_for.tenant);
    RETURN keyturn._end_session('end_session_for', end_session_for.session);
END
$$;

CREATE OR REPLACE FUNCTION keyturn.cancel_origin_for(tenant text, conversation_id text)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_other_tenant('cancel_origin_for', cancel_origin_for.tenant);
    RETURN keyturn._end_conversation(cancel_origin_for.conversation_id, 'cancelled', 'cancel_origin_for');
END
$$;

CREATE OR REPLACE FUNCTION keyturn.archive_conversation_for(tenant text, conversation_id text)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_other_tenant('archive_conversation_for', archive_conversation_for.tenant);
    RETURN keyturn._end_conversation(archive_conversation_for.conversation_id, 'archived',
                                     'archive_conversation_for');
END
$$;


-- ==== sql/053_ceremony.sql ====

-- The approval ceremony (docs/sql-api.md, "The approval ceremony"): the
-- queue, batch approval, M-of-N quorum, edit before approve.
--
-- keyturn.pending, keyturn.approve_many and keyturn.revise are Rust entry
-- points (extension/src/gate/human.rs) that refuse agents and run the
-- functions below as the extension owner, like approve.

-- The caller's queue: the visible pending actions (a member its own, an
-- approver or admin the tenant's), soonest expiry first. Never a token. A
-- quorum action's votes are counted for each row by a statement of its own:
-- on Citus the query runs on the tenant's shards, where a function may not
-- query distributed tables again.
CREATE OR REPLACE FUNCTION keyturn._pending(p_caller oid, p_max_rows int)
RETURNS TABLE (o_action_id uuid, o_tool text, o_summary text, o_effect text, o_approval text,
               o_principal text, o_created_at timestamptz, o_expires_at timestamptz,
               o_votes int, o_quorum int)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_role      text;
    v_now       timestamptz := clock_timestamp();
BEGIN
    v_role := keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    IF p_max_rows IS NULL OR p_max_rows NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'keyturn: max_rows must be from 1 to 1000, not %', p_max_rows
            USING ERRCODE = '22023';
    END IF;
    FOR o_action_id, o_tool, o_summary, o_effect, o_approval, o_principal, o_created_at, o_expires_at, o_quorum IN
        SELECT a.id, a.tool, coalesce(a.summary, a.tool), v.effect, a.approval, a.principal,
               a.created_at, a.expires_at, v.quorum
          FROM keyturn.open_action o
          JOIN keyturn.action a ON a.id = o.action_id AND a.tenant = o.tenant
          JOIN keyturn.tool_version v ON v.tool = a.tool AND v.version = a.tool_version
         WHERE o.status = 'pending' AND o.tenant = v_tenant
           AND (v_role IN ('approver', 'admin') OR o.principal = v_principal)
           AND a.status = 'pending' AND o.expires_at > v_now
         ORDER BY o.expires_at, o.action_id
         LIMIT p_max_rows
    LOOP
        o_votes := CASE WHEN o_quorum > 1 THEN keyturn._votes(o_action_id, v_tenant, o_tool) ELSE 0 END;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The votes that count for a quorum action: one per principal, from voters
-- who are still approvers or admins of its tenant, still hold the tool's
-- grant (o_until: its end, 'infinity' for none), and whose authorization
-- has not changed since they voted.
-- plpgsql, not sql: Citus cannot plan an SQL function's parameter in a
-- statement on distributed tables (layout B, docs/scale-out.md).
CREATE OR REPLACE FUNCTION keyturn._counted_votes(p_id uuid, p_tenant text, p_tool text)
RETURNS TABLE (o_principal text, o_epoch bigint, o_until timestamptz)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
        SELECT v.principal, v.epoch, v.until
          FROM (SELECT x.principal, x.epoch,
                       (SELECT coalesce(g.valid_until, 'infinity') FROM keyturn.tool_grant g
                         WHERE g.tenant = p_tenant AND g.principal = x.principal AND g.tool = p_tool
                           AND keyturn._grant_live(g.valid_until)) AS until
                  FROM keyturn.vote x
                  JOIN keyturn.member m ON m.tenant = p_tenant AND m.principal = x.principal
                 WHERE x.action_id = p_id AND x.tenant = p_tenant AND m.role IN ('approver', 'admin')
                   AND keyturn._epoch(p_tenant, x.principal) = x.epoch) v
         WHERE v.until IS NOT NULL;
END
$$;

CREATE OR REPLACE FUNCTION keyturn._votes(p_id uuid, p_tenant text, p_tool text)
RETURNS int
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN (SELECT count(*)::int FROM keyturn._counted_votes(p_id, p_tenant, p_tool));
END
$$;

-- approve for a tool with quorum > 1: the caller's vote (already past
-- approve's pre-claim checks). The action row is locked first, so votes,
-- vetoes and claims of one action happen one at a time: of two last votes
-- at once, the second sees the first and performs the claim exactly once.
-- A vote that cannot stand -- past the expiry, or for other params than
-- were proposed -- performs the claim at once, and the claim's checks answer
-- it (expired, rejected_tampered).
CREATE OR REPLACE FUNCTION keyturn._vote(p_caller oid, a keyturn.action, p_token text, p_params jsonb,
                              p_given_hash text, p_quorum int)
RETURNS keyturn._outcome
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_principal text := keyturn.current_principal();
    v_claimed   keyturn.action;
    v_new       boolean;
    v_votes     int;
    v_voter     text;
    v_epoch     bigint;
    v_until     timestamptz;
    v_noted     text;
    v_now       timestamptz;
    v_out       keyturn._outcome;
BEGIN
    SELECT x.* INTO a FROM keyturn.action x WHERE x.id = a.id AND x.tenant = a.tenant FOR NO KEY UPDATE;
    IF a.status <> 'pending' THEN
        RETURN ROW(a.id, a.status::text, a.result)::keyturn._outcome;
    END IF;
    -- The token was checked before this lock: one replaced while the vote
    -- waited for it (issue_token from the queue) is the wrong token now,
    -- and counts for nothing (docs/security.md, row 134).
    IF NOT keyturn._ct_eq(a.token_digest, keyturn._token_digest(p_token)) THEN
        RAISE EXCEPTION 'keyturn: wrong token for this action'
            USING ERRCODE = '55000',
                  DETAIL = format('action %s: its token was replaced while this vote waited', a.id),
                  HINT = 'Take the action''s current token (the card or the queue gives a fresh one) and vote again.';
    END IF;
    IF clock_timestamp() <= a.expires_at
       AND (p_given_hash IS NULL OR keyturn._params_hash_matches(a.retain, a.params_hash, p_given_hash)) THEN
        INSERT INTO keyturn.vote (action_id, principal, tenant, action_principal, epoch, db_role)
        VALUES (a.id, v_principal, a.tenant, a.principal, keyturn._epoch(a.tenant, v_principal),
                p_caller::regrole::text)
        ON CONFLICT ON CONSTRAINT vote_pkey DO NOTHING;
        v_new := FOUND;
        -- A vote changes the action row, not only locks it: a concurrent
        -- voter whose REPEATABLE READ snapshot predates this vote then fails
        -- to serialize (40001) instead of counting without it, which left a
        -- met quorum pending (twelfth red-team pass; isolation spec quorum-rr).
        IF v_new THEN
            v_now := clock_timestamp();
            UPDATE keyturn.action x SET updated_at = v_now
             WHERE x.id = a.id AND x.tenant = a.tenant;
        END IF;
        v_votes := keyturn._votes(a.id, a.tenant, a.tool);
        IF v_new THEN
            PERFORM keyturn._append_event(a.id, a.tenant, a.principal, p_caller::regrole::text, v_principal,
                                          'pending', 'pending', jsonb_build_object('vote', v_votes, 'quorum', p_quorum)
                                                                || coalesce(keyturn._event_detail()::jsonb, '{}'));
        END IF;
        IF v_votes < p_quorum THEN
            RETURN ROW(a.id, 'pending', jsonb_build_object('votes', v_votes, 'quorum', p_quorum))::keyturn._outcome;
        END IF;
    END IF;
    -- The votes that met the quorum were counted on this transaction's
    -- snapshot: it commits only if each voter's authorization is unchanged
    -- then (a voter removed since, under REPEATABLE READ, counts for nothing).
    IF v_votes >= p_quorum THEN
        FOR v_voter, v_epoch, v_until IN
            SELECT c.o_principal, c.o_epoch, c.o_until FROM keyturn._counted_votes(a.id, a.tenant, a.tool) c
        LOOP
            v_noted := keyturn._recheck_epoch_at_commit(a.tenant, v_voter, v_epoch);
            IF v_until < 'infinity' THEN
                v_noted := keyturn._ends_at_commit(v_until,
                    format('the grant of tool %s to voter %s (valid until %s)', a.tool, v_voter, keyturn._utc(v_until)));
            END IF;
        END LOOP;
    END IF;
    -- The quorum is this claim's context alone: taken off once it settled.
    PERFORM keyturn._set_event_context(jsonb_build_object('quorum', p_quorum));
    v_claimed := keyturn._claim(a.tenant, a.id, p_token, v_principal, p_caller::regrole::text, 'quorum');
    v_out := keyturn._after_claim(p_caller, v_claimed, p_token, p_params, p_given_hash);
    PERFORM keyturn._set_event_context(NULL);
    RETURN v_out;
END
$$;

-- items: a JSON array of 1 to 100 {"action_id", "token", "params"?}; 22023
-- for anything else, before anything is done.
CREATE OR REPLACE FUNCTION keyturn._check_batch_items(p_items jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    e jsonb;
    i int := 0;
BEGIN
    IF p_items IS NULL OR jsonb_typeof(p_items) <> 'array'
       OR jsonb_array_length(p_items) NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'keyturn: items must be a JSON array of 1 to 100 {"action_id", "token", "params"?} objects'
            USING ERRCODE = '22023';
    END IF;
    FOR e IN SELECT jsonb_array_elements(p_items) LOOP
        IF jsonb_typeof(e) <> 'object' OR NOT (e ?& ARRAY['action_id', 'token'])
           OR EXISTS (SELECT 1 FROM jsonb_object_keys(e) k WHERE k NOT IN ('action_id', 'token', 'params'))
           OR jsonb_typeof(e -> 'action_id') <> 'string' OR jsonb_typeof(e -> 'token') <> 'string'
           OR (e ? 'params' AND jsonb_typeof(e -> 'params') NOT IN ('object', 'null'))
           OR (e ->> 'action_id') !~ '^[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}$' THEN
            RAISE EXCEPTION 'keyturn: items[%] must be {"action_id": "<uuid>", "token": "<token>", "params"?: {...}}', i
                USING ERRCODE = '22023';
        END IF;
        i := i + 1;
    END LOOP;
END
$$;

-- One card for several proposals: each element is exactly approve, with its
-- own claim, in the order given, in its own subtransaction, so one element
-- never changes another's outcome. A refusal before the claim is answered
-- (status 'refused', result {"sqlstate", "message"}) and leaves that
-- proposal pending; so is a transient failure of its write (it rolled back
-- with the element). A cancel or statement timeout still ends the call.
CREATE OR REPLACE FUNCTION keyturn._approve_many(p_caller oid, p_items jsonb)
RETURNS TABLE (o_action_id uuid, o_status text, o_result jsonb)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    e        jsonb;
    v_id     uuid;
    v_status text;
    v_result jsonb;
    v_state  text;
    v_msg    text;
BEGIN
    PERFORM keyturn._check_batch_items(p_items);
    PERFORM keyturn._require_member(keyturn.current_tenant(), keyturn.current_principal(),
                                    keyturn.current_session());
    PERFORM keyturn._set_event_context(jsonb_build_object('batch', gen_random_uuid()));
    FOR e IN SELECT x FROM jsonb_array_elements(p_items) x LOOP
        v_id := (e ->> 'action_id')::uuid;
        BEGIN
            SELECT r.o_status, r.o_result INTO v_status, v_result
              FROM keyturn._approve(p_caller, v_id, e ->> 'token', nullif(e -> 'params', 'null')) r;
        EXCEPTION
            WHEN query_canceled OR internal_error THEN
                RAISE;
            WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;
                v_status := 'refused';
                v_result := jsonb_build_object('sqlstate', v_state, 'message', v_msg);
        END;
        RETURN QUERY SELECT v_id, v_status, v_result;
    END LOOP;
    PERFORM keyturn._set_event_context(NULL);
END
$$;

-- Edit before approve: the pending proposal becomes 'superseded' and a new
-- one, with the same tool, principal, session and origin and the edited
-- params, takes its place -- validated exactly as propose validates, with
-- its sql targets resolved as the reviser, under its RLS, and its own hash,
-- token and expiry. What the person approves next is exactly what runs.
-- Only from pending (else 55000); a racing approve or revise waits on the
-- row lock and then finds it no longer pending.
CREATE OR REPLACE FUNCTION keyturn._revise(p_caller oid, p_id uuid, p_token text, p_params jsonb)
RETURNS TABLE (o_action_id uuid, o_token text, o_summary text, o_params_hash text, o_expires_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_principal text := keyturn.current_principal();
    a           keyturn.action;
    v_new       record;
    v_now       timestamptz;
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    a := keyturn._usable_action(p_id, p_token, 'revise');
    SELECT x.* INTO a FROM keyturn.action x WHERE x.id = p_id AND x.tenant = a.tenant FOR NO KEY UPDATE;
    IF a.status <> 'pending' THEN
        RAISE EXCEPTION 'keyturn: only a pending proposal can be revised; % is %', p_id, a.status
            USING ERRCODE = '55000';
    END IF;
    SELECT * INTO v_new
      FROM keyturn._propose_for(p_caller, a.tenant, a.principal, a.session, a.tool, p_params,
                                a.origin, a.id, v_principal);
    PERFORM keyturn._set_event_detail(jsonb_build_object('superseded_by', v_new.o_action_id,
                                                         'revised_by', v_principal));
    v_now := clock_timestamp();
    UPDATE keyturn.action x
       SET updated_at = v_now, status = 'superseded',
           result = jsonb_build_object('superseded_by', v_new.o_action_id)
     WHERE x.id = a.id AND x.tenant = a.tenant;
    RETURN QUERY SELECT v_new.o_action_id, v_new.o_token, v_new.o_summary, v_new.o_params_hash,
                        v_new.o_expires_at;
END
$$;


-- ==== sql/054_delegation.sql ====

-- Standing approvals (docs/sql-api.md, "Scoped grants and standing
-- approvals"): a person says once "approve these for me" -- this tool,
-- within this scope, this many times, for this long -- and propose approves
-- what the standing approval covers in the same transaction. The database
-- counts the uses: one conditional UPDATE spends each, so no concurrency,
-- retry or second process ever approves more than max_uses.
--
-- keyturn.delegate, keyturn.revoke_delegation and keyturn.delegations are
-- Rust entry points (extension/src/gate/human.rs): the separation of duties
-- of approve applies, since a standing approval is an approval.

-- Why a tool version may not be approved by a standing approval, or NULL.
-- STABLE, as format() is, so that it is inlined: declared IMMUTABLE it was
-- not, and every propose parsed and planned its body again (~0.07 ms, a tenth
-- of a propose; tests/dba/catalog.sql holds every SQL function to this).
CREATE OR REPLACE FUNCTION keyturn._not_delegable(p_ver keyturn.tool_version)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN p_ver.approval = 'independent' THEN 'it needs an independent approver'
        WHEN p_ver.quorum > 1 THEN format('it needs %s approvers', p_ver.quorum)
        WHEN p_ver.approval = 'task' THEN 'its approval is the request in the chat'
        WHEN p_ver.effect = 'irreversible' AND NOT p_ver.delegable
            THEN 'its effect is irreversible (a tool may allow it with "delegable": true)'
    END
$$;

CREATE OR REPLACE FUNCTION keyturn._delegate(p_caller oid, p_tool text, p_scope jsonb, p_max_uses int,
                                  p_valid_for interval)
RETURNS uuid
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_ver       keyturn.tool_version;
    v_why       text;
    v_scope     jsonb;
    v_id        uuid := keyturn._uuid_v7();
    v_now       timestamptz;
    v_epoch     bigint;
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    PERFORM keyturn._require_tool(p_tool);
    SELECT v.* INTO v_ver FROM keyturn.tool t
      JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
     WHERE t.name = p_tool;
    IF NOT keyturn._has_grant(v_tenant, v_principal, p_tool) THEN
        RAISE EXCEPTION 'keyturn: principal % holds no grant for tool % in tenant %', v_principal, p_tool, v_tenant
            USING ERRCODE = '42501',
                  HINT = 'A standing approval covers only what its principal may itself approve.';
    END IF;
    IF p_max_uses IS NULL OR p_max_uses NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'keyturn: max_uses must be from 1 to 1000, not %', p_max_uses USING ERRCODE = '22023';
    END IF;
    IF keyturn._interval_within(p_valid_for, interval '7 days') IS NOT TRUE THEN
        RAISE EXCEPTION 'keyturn: valid_for must be more than 0 and at most 7 days, without months or years, not %', p_valid_for
            USING ERRCODE = '22023';
    END IF;
    v_why := keyturn._not_delegable(v_ver);
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: tool % cannot be approved by a standing approval: %', p_tool, v_why
            USING ERRCODE = '22023';
    END IF;
    IF p_scope IS NULL THEN
        RAISE EXCEPTION 'keyturn: scope is required' USING ERRCODE = '22023',
            HINT = 'A standing approval covers a call only when its scope names every params path the call carries, e.g. {"params": {"set.stage": {"eq": "won"}, "where.id": {"any": true}}}.';
    END IF;
    v_scope := keyturn._check_scope(p_scope);
    IF v_ver.executor = 'sql' THEN
        -- Its writes will run as this role, under its RLS.
        PERFORM keyturn._refuse_rls_bypass(p_caller);
    END IF;
    v_now := clock_timestamp();
    v_epoch := keyturn._epoch(v_tenant, v_principal);
    INSERT INTO keyturn.delegation (id, tenant, principal, tool, tool_version, scope, max_uses, epoch, db_role,
                                    created_at, expires_at)
    VALUES (v_id, v_tenant, v_principal, p_tool, v_ver.version, v_scope, p_max_uses, v_epoch,
            p_caller::regrole::text, v_now, v_now + p_valid_for);
    RETURN v_id;
END
$$;

-- Ends a standing approval: its own principal, or an admin of its tenant.
-- False when it is unknown, invisible, or already revoked.
--
-- It never waits long for the one who uses it: a covered proposal holds the
-- row (its use) until its transaction ends, and an agent that leaves that
-- transaction open would hold the person's revocation (twelfth red-team
-- pass). Past lock_timeout the principal's authorization epoch moves
-- instead, which nobody holds: every standing approval of the principal
-- ends with it (each is bound to the epoch it was given under), its pending
-- proposals are invalidated, and the open transaction's covered write
-- cannot commit (its commit rechecks the epoch). Broader than asked, never
-- later.
CREATE OR REPLACE FUNCTION keyturn._revoke_delegation(p_caller oid, p_id uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '2s'
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_role      text;
    d           keyturn.delegation;
    v_now       timestamptz := clock_timestamp();
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    v_role := keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    SELECT x.* INTO d FROM keyturn.delegation x
     WHERE x.id = p_id AND x.tenant = v_tenant
       AND (v_role IN ('approver', 'admin') OR x.principal = v_principal);
    IF NOT FOUND OR d.revoked_at IS NOT NULL THEN
        RETURN false;
    END IF;
    IF d.principal <> v_principal AND v_role <> 'admin' THEN
        RAISE EXCEPTION 'keyturn: only its principal or an admin of tenant % may revoke standing approval %', v_tenant, p_id
            USING ERRCODE = '42501';
    END IF;
    BEGIN
        UPDATE keyturn.delegation x SET revoked_at = v_now
         WHERE x.id = p_id AND x.tenant = v_tenant AND x.revoked_at IS NULL;
        RETURN FOUND;
    EXCEPTION WHEN lock_not_available THEN
        PERFORM keyturn._bump_epoch(d.tenant, d.principal);
        RETURN true;
    END;
END
$$;

-- Why a standing approval covers nothing any more, or NULL while it is
-- live: the one statement of what "live" means, for _spend_delegation's
-- choice and for delegations()' answer. p_tool_version is the tool's
-- current version (read by the caller: on Citus keyturn.tool is a reference
-- table, read in a statement of its own).
CREATE OR REPLACE FUNCTION keyturn._delegation_ended(d keyturn.delegation, p_tool_version int, p_epoch bigint,
                                          p_at timestamptz)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN CASE
        WHEN d.revoked_at IS NOT NULL THEN 'revoked'
        WHEN d.expires_at <= p_at THEN 'expired'
        WHEN d.uses >= d.max_uses THEN 'its uses are spent'
        WHEN p_tool_version IS DISTINCT FROM d.tool_version
            THEN format('the tool changed from version %s to %s; a new version needs a new standing approval',
                        d.tool_version, coalesce(p_tool_version::text, 'none'))
        WHEN p_epoch IS DISTINCT FROM d.epoch THEN 'the authorization of its principal changed'
        WHEN to_regrole(d.db_role) IS NULL THEN format('its role %s no longer exists', d.db_role)
        WHEN pg_has_role(d.db_role, 'keyturn_agent', 'MEMBER')
            THEN format('its role %s is now a member of keyturn_agent', d.db_role)
    END;
END
$$;

CREATE OR REPLACE FUNCTION keyturn._delegations()
RETURNS TABLE (o_delegation_id uuid, o_principal text, o_tool text, o_scope jsonb, o_max_uses int,
               o_uses int, o_expires_at timestamptz, o_revoked boolean, o_tool_version int, o_ended text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_role      text;
    v_now       timestamptz := clock_timestamp();
    d           keyturn.delegation;
    v_version   int;
BEGIN
    v_role := keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    FOR d IN
        SELECT x.* FROM keyturn.delegation x
         WHERE x.tenant = v_tenant AND (v_role IN ('approver', 'admin') OR x.principal = v_principal)
         ORDER BY x.created_at, x.id
    LOOP
        SELECT t.version INTO v_version FROM keyturn.tool t WHERE t.name = d.tool;
        RETURN QUERY SELECT d.id, d.principal, d.tool, d.scope, d.max_uses, d.uses, d.expires_at,
                            d.revoked_at IS NOT NULL, d.tool_version,
                            keyturn._delegation_ended(d, v_version, keyturn._epoch(d.tenant, d.principal), v_now);
    END LOOP;
END
$$;

-- The live standing approval of the proposing principal that covers a new
-- proposal, with one of its uses spent, or NULL. Live: as
-- keyturn._delegation_ended says (not revoked, not past its end, uses left,
-- given for this tool version, the delegator's authorization unchanged, its
-- role still there and still no agent), and the tool version one a standing
-- approval may approve. Covers: its scope names every path the params carry
-- (keyturn._scope_uncovered). The use is spent by one conditional UPDATE:
-- concurrent proposals wait on the row, and the one that finds the uses gone
-- is simply not covered (under REPEATABLE READ: fails to serialize).
CREATE OR REPLACE FUNCTION keyturn._spend_delegation(p_tenant text, p_principal text, p_epoch bigint,
                                          p_ver keyturn.tool_version, p_params jsonb, p_count int)
RETURNS keyturn.delegation
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    c     keyturn.delegation;
    d     keyturn.delegation;
    v_now timestamptz;
BEGIN
    IF keyturn._not_delegable(p_ver) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    v_now := clock_timestamp();
    FOR c IN
        SELECT x.* FROM keyturn.delegation x
         WHERE x.tenant = p_tenant AND x.principal = p_principal AND x.tool = p_ver.tool
           AND x.tool_version = p_ver.version AND x.revoked_at IS NULL AND x.expires_at > v_now
           AND x.uses < x.max_uses AND x.epoch = p_epoch
         ORDER BY x.expires_at, x.id
    LOOP
        CONTINUE WHEN keyturn._delegation_ended(c, p_ver.version, p_epoch, v_now) IS NOT NULL;
        CONTINUE WHEN keyturn._scope_uncovered(c.scope, p_params, p_count) IS NOT NULL;
        v_now := clock_timestamp();
        UPDATE keyturn.delegation x SET uses = x.uses + 1
         WHERE x.id = c.id AND x.tenant = c.tenant AND x.uses < x.max_uses AND x.revoked_at IS NULL
           AND x.expires_at > v_now
        RETURNING x.* INTO d;
        IF FOUND THEN
            RETURN d;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;


-- ==== sql/055_task.sql ====

-- Task-only effects (docs/sql-api.md, "Task-only effects"): for a tool with
-- approval = 'task', the owner's explicit request in the chat is the
-- approval. The human side records the person's message
-- (keyturn.record_request, a Rust entry point that refuses agents: an agent
-- cannot record a human request); propose admits a task call only for the
-- latest recorded turn of a live conversation of the same principal and
-- session, and approves it at once. Before execution the origin, grants,
-- tool version, epoch and schema are checked again.

CREATE OR REPLACE FUNCTION keyturn._record_request(p_caller oid, p_conversation text, p_turn text, p_message text,
                                        p_text_sha256 text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_session   text := keyturn.current_session();
    r           keyturn.request;
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, v_session);
    PERFORM keyturn._check_origin(jsonb_build_object('conversation_id', p_conversation,
                                                     'turn_id', p_turn, 'message_id', p_message));
    IF p_conversation IS NULL OR p_turn IS NULL OR p_message IS NULL THEN
        RAISE EXCEPTION 'keyturn: conversation_id, turn_id and message_id are required' USING ERRCODE = '22023';
    END IF;
    IF p_text_sha256 IS NULL OR p_text_sha256 !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'keyturn: text_sha256 must be the lowercase hex SHA-256 of the message text'
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO keyturn.request (tenant, principal, message_id, session, conversation_id, turn_id,
                                 text_sha256, recorded_role)
    VALUES (v_tenant, v_principal, p_message, v_session, p_conversation, p_turn, p_text_sha256,
            p_caller::regrole::text)
    ON CONFLICT ON CONSTRAINT request_pkey DO NOTHING;
    IF FOUND THEN
        RETURN true;
    END IF;
    SELECT x.* INTO r FROM keyturn.request x
     WHERE x.tenant = v_tenant AND x.principal = v_principal AND x.message_id = p_message;
    IF (r.session, r.conversation_id, r.turn_id, r.text_sha256)
       IS DISTINCT FROM (v_session, p_conversation, p_turn, p_text_sha256) THEN
        RAISE EXCEPTION 'keyturn: message % was already recorded with other values', p_message
            USING ERRCODE = '22023',
                  HINT = 'A message is recorded once; a new message needs a new message_id.';
    END IF;
    RETURN false;
END
$$;

-- The recorded request a task proposal cites as its approval, with a new
-- row version written (so the admissions of one request happen one at a
-- time, under any isolation level). 42501 without a human
-- source: no origin message, or one not recorded for this tenant, principal
-- and session, in this conversation and turn; 55000 when the turn is not the
-- conversation's latest (the person has moved on). The conversation being
-- live was checked before, as for every proposal.
CREATE OR REPLACE FUNCTION keyturn._task_request(p_tenant text, p_principal text, p_session text, p_origin jsonb)
RETURNS keyturn.request
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r        keyturn.request;
    v_latest text;
BEGIN
    IF NOT (p_origin ?& ARRAY['conversation_id', 'turn_id', 'message_id']) THEN
        RAISE EXCEPTION 'keyturn: no human source: a task tool needs origin conversation_id, turn_id and message_id of the person''s request'
            USING ERRCODE = '42501';
    END IF;
    IF NOT p_origin ? 'assistant_message_id' THEN
        RAISE EXCEPTION 'keyturn: a task tool needs origin assistant_message_id, the reply that carries the call'
            USING ERRCODE = '22023';
    END IF;
    -- An UPDATE, not FOR NO KEY UPDATE: a REPEATABLE READ admission whose
    -- snapshot predates a concurrent admission of the same request waits for
    -- a mere lock and then goes on without seeing that admission's action
    -- (a second action for the same call, an eleventh for the request). A
    -- row version written after its snapshot makes it fail to serialize
    -- (40001) instead; READ COMMITTED waits and reads the new state.
    UPDATE keyturn.request x SET recorded_at = x.recorded_at
     WHERE x.tenant = p_tenant AND x.principal = p_principal AND x.message_id = p_origin ->> 'message_id'
    RETURNING x.* INTO r;
    IF NOT FOUND OR r.session IS DISTINCT FROM p_session
       OR r.conversation_id IS DISTINCT FROM p_origin ->> 'conversation_id'
       OR r.turn_id IS DISTINCT FROM p_origin ->> 'turn_id' THEN
        RAISE EXCEPTION 'keyturn: no human source: message % was not recorded for this principal and session in conversation %, turn %',
                keyturn._quoted(p_origin ->> 'message_id'), keyturn._quoted(p_origin ->> 'conversation_id'), keyturn._quoted(p_origin ->> 'turn_id')
            USING ERRCODE = '42501',
                  HINT = 'The human side records the person''s message with keyturn.record_request before the agent proposes.';
    END IF;
    IF to_regrole(r.recorded_role) IS NULL THEN
        RAISE EXCEPTION 'keyturn: the role % that recorded message % no longer exists', r.recorded_role, r.message_id
            USING ERRCODE = '42501';
    END IF;
    -- Separation of duties when the request is used, not only when it was
    -- recorded: a role that has since become an agent records nothing.
    IF pg_has_role(r.recorded_role, 'keyturn_agent', 'MEMBER') THEN
        RAISE EXCEPTION 'keyturn: the role % that recorded message % is now a member of keyturn_agent; its requests admit nothing', r.recorded_role, r.message_id
            USING ERRCODE = '42501',
                  HINT = 'The person records the request again through a role that is not an agent.';
    END IF;
    -- What is committed, whatever the snapshot: a turn recorded after a
    -- REPEATABLE READ snapshot still makes this one stale.
    v_latest := keyturn._latest_turn(p_tenant, p_principal, r.conversation_id);
    IF v_latest IS DISTINCT FROM r.turn_id THEN
        RAISE EXCEPTION 'keyturn: turn % is no longer the latest of conversation % (now %)', r.turn_id, r.conversation_id, v_latest
            USING ERRCODE = '55000',
                  HINT = 'A request admits effects only while it is the conversation''s latest turn.';
    END IF;
    RETURN r;
END
$$;

-- The action this request already admitted for the same call (tool and
-- params hash), which propose returns instead of a second one; NULL when
-- there is none. 54000 beyond 10 task actions for one request.
CREATE OR REPLACE FUNCTION keyturn._task_replay(p_tenant text, p_principal text, r keyturn.request, p_tool text,
                                     p_hash text)
RETURNS keyturn.action
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    a   keyturn.action;
    v_n int;
BEGIN
    SELECT x.* INTO a FROM keyturn.action x
     WHERE x.tenant = p_tenant AND x.principal = p_principal AND x.approval = 'task'
       AND x.origin ->> 'message_id' = r.message_id AND x.tool = p_tool
       AND keyturn._params_hash_matches(x.retain, x.params_hash, p_hash)
     ORDER BY x.created_at LIMIT 1;
    IF FOUND THEN
        RETURN a;
    END IF;
    SELECT count(*) INTO v_n FROM keyturn.action x
     WHERE x.tenant = p_tenant AND x.principal = p_principal AND x.approval = 'task'
       AND x.origin ->> 'message_id' = r.message_id;
    IF v_n >= 10 THEN
        RAISE EXCEPTION 'keyturn: request % has admitted % task actions, the most one request may', r.message_id, v_n
            USING ERRCODE = '54000',
                  HINT = 'A request in the chat starts at most 10 effects; the person can ask again.';
    END IF;
    RETURN NULL;
END
$$;


-- ==== sql/056_files.sql ====

-- Private attachments (docs/sql-api.md, "Private attachments"): the bytes are
-- staged in keyturn.staged_file by the invoking principal, bound to the one
-- action whose params name them (their metadata is part of the params, so of
-- the hash), verified at propose and re-hashed at begin_dispatch, read by
-- the dispatcher only while that action is executing under its lease, and
-- deleted in the transaction that gives the action a final status (a
-- reconciled uncertain one included), or by the sweep a day after staging
-- when nothing ever bound them.

-- Most a tool may allow per attachment.
CREATE OR REPLACE FUNCTION keyturn._max_file_bytes()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT 25 * 1024 * 1024::bigint
$$;

-- What one principal may have staged and waiting (bound to no final action):
-- 20 files, 100 MiB.
CREATE OR REPLACE FUNCTION keyturn._max_staged_files()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 20 $$;

CREATE OR REPLACE FUNCTION keyturn._max_staged_bytes()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 100::bigint * 1024 * 1024 $$;

-- The files and bytes a principal has staged and waiting, as committed (and
-- this transaction's own): files go with their action's final status, so
-- every row still there counts.
CREATE OR REPLACE FUNCTION keyturn._staged_quota(p_tenant text, p_principal text)
RETURNS TABLE (files bigint, bytes bigint)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v text := keyturn._committed_staged(p_tenant, p_principal);
BEGIN
    RETURN QUERY SELECT split_part(v, ' ', 1)::bigint, split_part(v, ' ', 2)::bigint;
END
$$;

CREATE OR REPLACE FUNCTION keyturn.stage_file(content bytea, filename text, content_type text)
RETURNS TABLE (file_id uuid, sha256 text, size bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_id        uuid := keyturn._uuid_v7();
    v_hash      text;
    v_problem   text;
    v_now       timestamptz;
    v_files     bigint;
    v_bytes     bigint;
BEGIN
    PERFORM keyturn._refuse_nested('stage_file');
    PERFORM keyturn._set_actor(keyturn._calling_role(), v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    v_problem := keyturn._filename_problem(stage_file.filename);
    IF stage_file.filename IS NULL OR v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: filename %', coalesce(v_problem, 'is required')
            USING ERRCODE = '22023',
                  HINT = 'A filename is 1 to 255 bytes without a path separator (/ or \), a control, bidi control or invisible character.';
    END IF;
    IF stage_file.content_type IS NULL
       OR stage_file.content_type !~ '^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$' THEN
        RAISE EXCEPTION 'keyturn: content_type must be a lowercase type/subtype such as application/pdf, not %',
                coalesce(keyturn._quoted(stage_file.content_type), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF stage_file.content IS NULL OR length(stage_file.content) = 0
       OR length(stage_file.content) > keyturn._max_file_bytes() THEN
        RAISE EXCEPTION 'keyturn: a staged file holds 1 byte to % bytes, not %', keyturn._max_file_bytes(),
                coalesce(length(stage_file.content), 0)
            USING ERRCODE = '22023';
    END IF;
    -- The quota: files and bytes of this principal not yet gone with a final
    -- status, counted one staging at a time (the stager row is locked;
    -- under REPEATABLE READ a staging committed after the snapshot makes
    -- this fail to serialize) on what is committed.
    v_now := clock_timestamp();
    INSERT INTO keyturn.stager AS x (tenant, principal, last_staged_at) VALUES (v_tenant, v_principal, v_now)
    ON CONFLICT ON CONSTRAINT stager_pkey DO UPDATE SET last_staged_at = EXCLUDED.last_staged_at;
    SELECT q.files, q.bytes INTO v_files, v_bytes FROM keyturn._staged_quota(v_tenant, v_principal) q;
    IF v_files + 1 > keyturn._max_staged_files()
       OR v_bytes + length(stage_file.content) > keyturn._max_staged_bytes() THEN
        RAISE EXCEPTION 'keyturn: principal % has % staged files of % bytes waiting; at most % files and % bytes may wait',
                v_principal, v_files, v_bytes, keyturn._max_staged_files(), keyturn._max_staged_bytes()
            USING ERRCODE = '54000',
                  HINT = 'Files go when the action they are bound to ends, and unbound ones a day after staging.';
    END IF;
    v_hash := encode(sha256(stage_file.content), 'hex');
    INSERT INTO keyturn.staged_file (id, tenant, principal, filename, content_type, size, sha256, content)
    VALUES (v_id, v_tenant, v_principal, stage_file.filename, stage_file.content_type,
            length(stage_file.content), v_hash, stage_file.content);
    RETURN QUERY SELECT v_id, v_hash, length(stage_file.content)::bigint;
END
$$;

-- The attachments a params object names, as (ord, file_id, metadata): 22023
-- unless params.<attachments_param> is an array of
-- {"file_id", "sha256", "filename", "content_type", "size"}.
CREATE OR REPLACE FUNCTION keyturn._attachments(p_ver keyturn.tool_version, p_params jsonb)
RETURNS TABLE (ord bigint, file_id uuid, meta jsonb)
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_list jsonb := coalesce(p_params -> p_ver.attachments_param, '[]');
BEGIN
    IF jsonb_typeof(v_list) <> 'array' OR EXISTS (
           SELECT 1 FROM jsonb_array_elements(v_list) e
            WHERE jsonb_typeof(e) <> 'object'
               OR NOT (e ?& ARRAY['file_id', 'sha256', 'filename', 'content_type', 'size'])
               OR EXISTS (SELECT 1 FROM jsonb_object_keys(e) k
                           WHERE k NOT IN ('file_id', 'sha256', 'filename', 'content_type', 'size'))
               OR jsonb_typeof(e -> 'file_id') <> 'string'
               OR (e ->> 'file_id') !~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
               -- Typed here, at propose: an integer written as one (14,
               -- never 14.0 or "14"), 64 lowercase hex digits, a name that
               -- reads as itself. What passes can be cast later without
               -- failing after the approval (docs/security.md, row 24).
               OR jsonb_typeof(e -> 'size') <> 'number' OR (e ->> 'size') !~ '^[0-9]{1,15}$'
               OR jsonb_typeof(e -> 'sha256') <> 'string' OR (e ->> 'sha256') !~ '^[0-9a-f]{64}$'
               OR jsonb_typeof(e -> 'filename') <> 'string'
               OR keyturn._filename_problem(e ->> 'filename') IS NOT NULL
               OR jsonb_typeof(e -> 'content_type') <> 'string') THEN
        RAISE EXCEPTION 'keyturn: params.% must be an array of {"file_id", "sha256", "filename", "content_type", "size"}',
                p_ver.attachments_param
            USING ERRCODE = '22023',
                  HINT = 'Repeat what stage_file returned: file_id a uuid, sha256 64 lowercase hex digits, size an integer, filename and content_type as staged.';
    END IF;
    RETURN QUERY SELECT e.ord, (e.value ->> 'file_id')::uuid, e.value
                   FROM jsonb_array_elements(v_list) WITH ORDINALITY AS e (value, ord);
END
$$;

-- propose's checks of every attachment: staged by this (tenant, principal)
-- and not bound to another action (55000; a revision takes over the files of
-- the proposal it revises), metadata equal to the staged
-- file's, an allowed type, within the size bound (else 22023).
CREATE OR REPLACE FUNCTION keyturn._check_attachments(p_tenant text, p_principal text, p_ver keyturn.tool_version,
                                           p_params jsonb, p_revised_from uuid)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    x record;
    f keyturn.staged_file;
BEGIN
    IF (SELECT count(*) <> count(DISTINCT t.file_id) FROM keyturn._attachments(p_ver, p_params) t) THEN
        RAISE EXCEPTION 'keyturn: params.% names a file twice', p_ver.attachments_param USING ERRCODE = '22023';
    END IF;
    FOR x IN SELECT * FROM keyturn._attachments(p_ver, p_params) LOOP
        SELECT s.* INTO f FROM keyturn.staged_file s WHERE s.id = x.file_id AND s.tenant = p_tenant;
        IF NOT FOUND OR f.tenant <> p_tenant OR f.principal <> p_principal THEN
            RAISE EXCEPTION 'keyturn: attachment % was not staged by this principal', x.file_id
                USING ERRCODE = '22023',
                      HINT = 'Stage the bytes with keyturn.stage_file(content, filename, content_type) first.';
        END IF;
        IF f.action_id IS DISTINCT FROM NULL AND f.action_id IS DISTINCT FROM p_revised_from THEN
            RAISE EXCEPTION 'keyturn: attachment % already belongs to action %', x.file_id, f.action_id
                USING ERRCODE = '55000',
                      HINT = 'A staged file goes with one action; stage it again for another.';
        END IF;
        IF (x.meta ->> 'sha256', x.meta ->> 'filename', x.meta ->> 'content_type', (x.meta ->> 'size')::numeric)
           IS DISTINCT FROM (f.sha256, f.filename, f.content_type, f.size::numeric) THEN
            RAISE EXCEPTION 'keyturn: the metadata of attachment % differ from the staged file (sha256, filename, content_type, size)', x.file_id
                USING ERRCODE = '22023';
        END IF;
        IF NOT f.content_type = ANY (p_ver.attachment_types) THEN
            RAISE EXCEPTION 'keyturn: attachment % is %, which tool % does not take (it takes %)', x.file_id,
                    f.content_type, p_ver.tool, array_to_string(p_ver.attachment_types, ', ')
                USING ERRCODE = '22023';
        END IF;
        IF f.size > p_ver.max_attachment_bytes THEN
            RAISE EXCEPTION 'keyturn: attachment % has % bytes; tool % takes at most %', x.file_id, f.size,
                    p_ver.tool, p_ver.max_attachment_bytes
                USING ERRCODE = '22023';
        END IF;
    END LOOP;
END
$$;

-- Binds the checked attachments to the new action, all or none (55000 when
-- a concurrent proposal bound one first). A revision moves the files it
-- keeps from the proposal it supersedes, whose final status then deletes
-- only the ones it dropped.
CREATE OR REPLACE FUNCTION keyturn._bind_attachments(p_action uuid, p_tenant text, p_principal text,
                                          p_ver keyturn.tool_version, p_params jsonb, p_revised_from uuid)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_ids uuid[] := ARRAY(SELECT t.file_id FROM keyturn._attachments(p_ver, p_params) t);
    v_n   int;
BEGIN
    UPDATE keyturn.staged_file s SET action_id = p_action
     WHERE s.id = ANY (v_ids) AND (s.action_id IS NULL OR s.action_id = p_revised_from)
       AND s.tenant = p_tenant AND s.principal = p_principal;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n <> cardinality(v_ids) THEN
        RAISE EXCEPTION 'keyturn: an attachment of this proposal was bound to another action meanwhile'
            USING ERRCODE = '55000';
    END IF;
END
$$;

-- Why the bytes bound to an action can no longer be sent as approved, or
-- NULL: a file changed in storage (its SHA-256 is recomputed), or is gone.
-- Asked of metadata that reads (keyturn._attachments_unreadable NULL:
-- keyturn._begin_check asks that first).
CREATE OR REPLACE FUNCTION keyturn._attachment_problem(a keyturn.action, p_ver keyturn.tool_version, p_params jsonb)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_bad uuid;
BEGIN
    IF p_ver.attachments_param IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT t.file_id INTO v_bad
      FROM keyturn._attachments(p_ver, p_params) t
      LEFT JOIN keyturn.staged_file s ON s.id = t.file_id AND s.tenant = a.tenant AND s.action_id = a.id
     WHERE s.id IS NULL OR encode(sha256(s.content), 'hex') <> t.meta ->> 'sha256'
     LIMIT 1;
    IF FOUND THEN
        RETURN format('attachment %s is missing or changed in storage since it was approved', v_bad);
    END IF;
    RETURN NULL;
END
$$;

-- Why the approved params' attachment metadata cannot be read, or NULL:
-- metadata propose would refuse now, left by an older keyturn or written
-- around its checks. No attempt could ever send such an action, so
-- begin_dispatch ends it failed (keyturn._begin_check) rather than fail
-- the dispatcher's whole batch at every lease. The message names no value.
CREATE OR REPLACE FUNCTION keyturn._attachments_unreadable(p_ver keyturn.tool_version, p_params jsonb)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_ver.attachments_param IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM count(*) FROM keyturn._attachments(p_ver, p_params);
    RETURN NULL;
EXCEPTION WHEN invalid_parameter_value OR data_exception THEN
    RETURN 'the approved attachments'' metadata cannot be read (' || SQLERRM || ')';
END
$$;

-- Which files the dispatcher must send with an action, from the approved
-- params: the one place that knows a tool's attachments_param, so keyturnd
-- never guesses from the params' shape. Leased or executing under that lease
-- (else 55000); no rows when the tool takes no attachments. For attachments
-- and attachments_for (p_what names the call); p_tenant as in
-- keyturn._lease.
CREATE OR REPLACE FUNCTION keyturn._attachments_of(p_what text, p_tenant text, p_id uuid, p_lease uuid)
RETURNS TABLE (param text, ord int, file_id uuid, sha256 text, filename text, content_type text, size bigint)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    a keyturn.action;
    v keyturn.tool_version;
BEGIN
    PERFORM keyturn._refuse_nested(p_what);
    -- The plain call names no tenant: the row found names it.
    SELECT x.* INTO a FROM keyturn.action x WHERE x.id = p_id AND (p_tenant IS NULL OR x.tenant = p_tenant);
    PERFORM keyturn._raise_lease_problem(keyturn._lease_problem(a, p_id, p_lease, '{leased,executing}', false));
    SELECT t.* INTO v FROM keyturn.tool_version t WHERE t.tool = a.tool AND t.version = a.tool_version;
    IF v.attachments_param IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT v.attachments_param, t.ord::int, t.file_id, t.meta ->> 'sha256', t.meta ->> 'filename',
           t.meta ->> 'content_type', (t.meta ->> 'size')::bigint
      FROM keyturn._attachments(v, coalesce(a.params, (SELECT s.params FROM keyturn.staged_payload s
                                                         WHERE s.action_id = a.id AND s.tenant = a.tenant))) t
     ORDER BY t.ord;
END
$$;

CREATE OR REPLACE FUNCTION keyturn.attachments(action_id uuid, lease_id uuid)
RETURNS TABLE (param text, ord int, file_id uuid, sha256 text, filename text, content_type text, size bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM keyturn._attachments_of('attachments', NULL, attachments.action_id, attachments.lease_id)
$$;

-- The bytes of one attachment, for the dispatcher building the provider's
-- request in memory: only while the action is executing under that lease
-- (else 55000), and only a file bound to it. For file_content and
-- file_content_for, as keyturn._attachments_of.
CREATE OR REPLACE FUNCTION keyturn._file_content_of(p_what text, p_tenant text, p_id uuid, p_lease uuid, p_file uuid)
RETURNS bytea
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    a keyturn.action;
    v bytea;
BEGIN
    PERFORM keyturn._refuse_nested(p_what);
    -- The plain call names no tenant: the row found names it.
    SELECT x.* INTO a FROM keyturn.action x WHERE x.id = p_id AND (p_tenant IS NULL OR x.tenant = p_tenant);
    PERFORM keyturn._raise_lease_problem(keyturn._lease_problem(a, p_id, p_lease, '{executing}', false));
    SELECT s.content INTO v FROM keyturn.staged_file s
     WHERE s.id = p_file AND s.tenant = a.tenant AND s.action_id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'keyturn: file % is not an attachment of action %', p_file, p_id
            USING ERRCODE = '55000',
                  HINT = 'keyturn.attachments(action_id, lease_id) lists the files of an action.';
    END IF;
    RETURN v;
END
$$;

CREATE OR REPLACE FUNCTION keyturn.file_content(action_id uuid, lease_id uuid, file_id uuid)
RETURNS bytea
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._file_content_of('file_content', NULL, file_content.action_id, file_content.lease_id,
                                    file_content.file_id)
$$;


-- ==== sql/057_fence.sql ====

-- Read-side fencing (docs/fencing.md): data from a connected app reaches a
-- prompt only as a fenced, projected block. An admin registers, per
-- provider, the fields its data may contribute (keyturn.register_projection,
-- versioned like tools); keyturn.fence keeps only those, cuts each string to
-- its bound, redacts credential-shaped values, neutralizes control, bidi and
-- marker characters, and wraps the result between fresh random markers that
-- the guard text names. An unreviewed integration contributes nothing.

CREATE OR REPLACE FUNCTION keyturn.register_projection(provider text, spec jsonb)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_spec    jsonb;
    v_version int;
    v_other   text;
BEGIN
    PERFORM keyturn._refuse_nested('register_projection');
    IF keyturn._name_ok(register_projection.provider, 63) IS NOT TRUE THEN
        RAISE EXCEPTION 'keyturn: provider name % is not allowed', coalesce(keyturn._quoted(register_projection.provider), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'Use ASCII letters, digits, underscores and hyphens in dot-separated parts that each start with a letter, at most 63 characters.';
    END IF;
    v_spec := keyturn._check_projection(register_projection.spec);
    SELECT p.version + 1 INTO v_version FROM keyturn.projection p
     WHERE p.provider = register_projection.provider FOR UPDATE;
    IF v_version IS NULL THEN
        v_version := 1;
        SELECT p.provider INTO v_other FROM keyturn.projection p
         WHERE lower(p.provider COLLATE "C") = lower(register_projection.provider COLLATE "C");
        IF FOUND THEN
            RAISE EXCEPTION 'keyturn: provider name % differs from the projection % only in case',
                    keyturn._quoted(register_projection.provider), keyturn._quoted(v_other)
                USING ERRCODE = '22023',
                      HINT = 'A person reads both as one name: register under that name, or under one that differs in more than case.';
        END IF;
        INSERT INTO keyturn.projection (provider, version) VALUES (register_projection.provider, 1);
    ELSE
        UPDATE keyturn.projection p SET version = v_version, updated_at = now()
         WHERE p.provider = register_projection.provider;
    END IF;
    INSERT INTO keyturn.projection_version (provider, version, spec)
    VALUES (register_projection.provider, v_version, v_spec);
    RETURN v_version;
END
$$;

-- Records evidence for the calling identity, by the trusted side: a person's
-- record_evidence, or fence recording what it handed an agent. 22023 for a
-- kind, reference or hash outside their shapes.
CREATE OR REPLACE FUNCTION keyturn._record_evidence(p_caller oid, p_tenant text, p_principal text, p_kind text, p_ref text,
                                         p_sha256 text)
RETURNS uuid
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_id uuid := keyturn._uuid_v7();
BEGIN
    IF p_kind IS NULL OR p_kind !~ '^[a-z][a-z0-9_.-]{0,63}$' THEN
        RAISE EXCEPTION 'keyturn: evidence kind must be 1 to 64 lowercase letters, digits, _ . or -, starting with a letter'
            USING ERRCODE = '22023';
    END IF;
    IF p_ref IS NULL OR length(p_ref) NOT BETWEEN 1 AND 2000 OR p_ref ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'keyturn: evidence ref must be 1 to 2000 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    IF p_sha256 IS NULL OR p_sha256 !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'keyturn: evidence sha256 must be 64 lowercase hex digits' USING ERRCODE = '22023';
    END IF;
    INSERT INTO keyturn.evidence (id, tenant, principal, kind, ref, sha256, recorded_role, recorded_at)
    VALUES (v_id, p_tenant, p_principal, p_kind, p_ref, p_sha256, p_caller::regrole::text, clock_timestamp());
    RETURN v_id;
END
$$;

-- Human side: evidence the person saw (a document, a message, a record),
-- which a proposal may cite.
CREATE OR REPLACE FUNCTION keyturn._record_evidence_for_caller(p_caller oid, p_kind text, p_ref text, p_sha256 text)
RETURNS uuid
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    RETURN keyturn._record_evidence(p_caller, v_tenant, v_principal, p_kind, p_ref, p_sha256);
END
$$;

-- Ends a piece of evidence, by the principal that recorded it: it can be
-- cited no more, and the pending proposals of that principal that cite it
-- are invalidated. False when it is unknown, another's, or ended already.
CREATE OR REPLACE FUNCTION keyturn.revoke_evidence(id uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_now       timestamptz := clock_timestamp();
    v_id        text := revoke_evidence.id::text;
BEGIN
    PERFORM keyturn._refuse_nested('revoke_evidence');
    PERFORM keyturn._set_actor(keyturn._calling_role(), v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    UPDATE keyturn.evidence e SET revoked_at = v_now
     WHERE e.id = revoke_evidence.id AND e.tenant = v_tenant AND e.principal = v_principal
       AND e.revoked_at IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'evidence ' || v_id || ' was revoked'));
    UPDATE keyturn.action a
       SET updated_at = v_now, status = 'invalidated',
           result = jsonb_build_object('reason', 'evidence ' || v_id || ' it cited was revoked')
     WHERE a.id IN (SELECT o.action_id FROM keyturn.open_action o
                     WHERE o.tenant = v_tenant AND o.principal = v_principal AND o.status = 'pending')
       AND a.tenant = v_tenant AND a.principal = v_principal AND a.status = 'pending'
       AND a.origin -> 'evidence' ? v_id;
    RETURN true;
END
$$;

-- 22023 unless every evidence id of a proposal's origin names live evidence
-- recorded for this tenant and principal: an agent cannot cite what nobody
-- recorded, what another principal recorded, or what was revoked.
CREATE OR REPLACE FUNCTION keyturn._check_evidence(p_tenant text, p_principal text, p_origin jsonb)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_id  text;
    v_ok  boolean;
BEGIN
    FOR v_id IN SELECT jsonb_array_elements_text(coalesce(p_origin -> 'evidence', '[]')) LOOP
        -- Exactly as keyturn returned it: revoke_evidence and the checks
        -- after it match the id's text, so another spelling of the same
        -- uuid would escape them.
        v_ok := v_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$';
        IF v_ok THEN
            -- As committed, whatever the isolation level (a revocation
            -- after this transaction's snapshot counts), and with no lock an
            -- open agent transaction could hold against revoke_evidence;
            -- approve and begin_dispatch check again (keyturn._invalid_reason).
            v_ok := keyturn._evidence_usable(p_tenant, p_principal, v_id);
        END IF;
        IF v_ok IS NOT TRUE THEN
            RAISE EXCEPTION 'keyturn: origin.evidence names %, which is no evidence recorded for this principal (unknown, another''s, or revoked)',
                    keyturn._quoted(v_id)
                USING ERRCODE = '22023',
                      HINT = 'Cite the evidence_id keyturn.fence returned, or one the person recorded with keyturn.record_evidence, spelled as returned (lower-case, hyphenated).';
        END IF;
    END LOOP;
END
$$;

-- What a proposal cites, for the card: each piece's kind, reference and
-- hash, whether it was revoked since, and who recorded it: the role, and
-- whether that role is an agent's. An agent may call fence itself, with
-- data it chose: such evidence proves what was fenced at its call, not
-- where the data came from, and the card says so (red-team finding,
-- docs/security.md). A role dropped since counts as an agent's: nothing
-- vouches for it.
CREATE OR REPLACE FUNCTION keyturn._cited_evidence(p_tenant text, p_origin jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN coalesce((
        SELECT jsonb_agg(jsonb_build_object('evidence_id', e.id, 'kind', e.kind, 'ref', e.ref, 'sha256', e.sha256,
                                            'revoked', e.revoked_at IS NOT NULL,
                                            'recorded_role', e.recorded_role,
                                            'by_agent', coalesce((SELECT pg_has_role(r.oid, 'keyturn_agent', 'MEMBER')
                                                                    FROM pg_roles r WHERE r.rolname = e.recorded_role),
                                                                 true)) ORDER BY c.ord)
          FROM jsonb_array_elements_text(coalesce(p_origin -> 'evidence', '[]')) WITH ORDINALITY AS c (id, ord)
          JOIN keyturn.evidence e ON e.id::text = lower(c.id) AND e.tenant = p_tenant), '[]');
END
$$;

CREATE OR REPLACE FUNCTION keyturn.fence(provider text, data jsonb)
RETURNS TABLE (guard text, reference text, marker text, evidence_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_spec      jsonb;
    v_version   int;
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    f           record;
    v_evidence  uuid;
BEGIN
    PERFORM keyturn._refuse_nested('fence');
    SELECT v.spec, v.version INTO v_spec, v_version FROM keyturn.projection p
      JOIN keyturn.projection_version v ON v.provider = p.provider AND v.version = p.version
     WHERE p.provider = fence.provider;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'keyturn: no projection is registered for provider %', coalesce(keyturn._quoted(fence.provider), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'An unreviewed integration contributes nothing: an admin registers the fields it may contribute with keyturn.register_projection(provider, spec).';
    END IF;
    IF fence.data IS NULL THEN
        RAISE EXCEPTION 'keyturn: data must be a JSON value' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO f FROM keyturn._fence(fence.provider, v_spec, fence.data);
    -- What was fenced, as evidence the agent may cite: recorded by keyturn
    -- (the trusted side), for the calling identity when there is one: the
    -- provider and projection version, and the SHA-256 of the fenced JSON
    -- line the model reads (the reference without its per-call markers).
    IF v_tenant IS NOT NULL AND v_principal IS NOT NULL
       AND EXISTS (SELECT 1 FROM keyturn.member m WHERE m.tenant = v_tenant AND m.principal = v_principal) THEN
        v_evidence := keyturn._record_evidence(keyturn._calling_role()::regrole::oid, v_tenant, v_principal, 'fence',
                          format('%s@%s', fence.provider, v_version),
                          encode(sha256(convert_to(split_part(f.reference, E'\n', 2), 'UTF8')), 'hex'));
    END IF;
    RETURN QUERY SELECT f.guard, f.reference, f.marker, v_evidence;
END
$$;


-- ==== sql/058_links.sql ====

-- Links that carry no credential (docs/http.md, "Card links"), and fresh
-- tokens for the person's queue.
--
-- A link to the approval card used to carry the token, and keyturnd's card
-- took the person's JWT from it too: browsers keep every URL they open in
-- their history database, its sync and the address bar's suggestions, so
-- anyone who read those could act as the person until the JWT expired. A
-- link now carries a one-time code instead: keyturn.link_code makes it for a
-- person who may decide every action it names, keyturnd redeems it once
-- (keyturn.redeem_link_code) for a card session of at most 15 minutes scoped
-- to those actions, with a fresh token for each, and after that the URL
-- holds nothing that works. keyturn.issue_token gives a person a fresh
-- token for a pending action from the queue (pending) or the console,
-- without any link. Only SHA-256 digests of codes and sessions are stored.
--
-- keyturn.link_code and keyturn.issue_token are Rust entry points
-- (extension/src/gate/human.rs) that refuse agents, like approve.

-- A fresh token for a pending proposal, bound like the first (to the
-- stored params hash); the previous token stops working. NULL when the
-- proposal is no longer pending.
CREATE OR REPLACE FUNCTION keyturn._fresh_token(a keyturn.action)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_token   text := keyturn._token_new();
    v_digest  bytea;
    v_binding bytea;
BEGIN
    v_digest := keyturn._token_digest(v_token);
    v_binding := keyturn._token_binding(v_token, a.id, a.params_hash, a.expires_at, a.origin);
    UPDATE keyturn.action x SET token_digest = v_digest, token_binding = v_binding
     WHERE x.id = a.id AND x.tenant = a.tenant AND x.status = 'pending';
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN v_token;
END
$$;

-- The pending action p_id of the caller's tenant, locked, for an identity
-- that may decide it (the approval rule of keyturn._decide_problem). Unknown,
-- invisible or not to be decided by this identity: 42501, the same answer
-- for each (a link or a token reveals nothing of an action the caller may
-- not decide); decided already: 55000.
CREATE OR REPLACE FUNCTION keyturn._decidable(p_tenant text, p_principal text, p_session text, p_role text, p_id uuid,
                                   p_what text)
RETURNS keyturn.action
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    a         keyturn.action;
    v_problem text;
BEGIN
    SELECT x.* INTO a FROM keyturn.action x WHERE x.id = p_id AND x.tenant = p_tenant FOR NO KEY UPDATE;
    IF FOUND AND NOT (p_role = 'member' AND a.principal IS DISTINCT FROM p_principal) THEN
        v_problem := keyturn._decide_problem(a, p_principal, p_session, p_role, 'approve');
    END IF;
    IF NOT FOUND OR (p_role = 'member' AND a.principal IS DISTINCT FROM p_principal) OR v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: % may not decide action %', p_principal, coalesce(p_id::text, 'NULL')
            USING ERRCODE = '42501',
                  DETAIL = coalesce(v_problem, 'It does not exist, or it is not visible to this identity.'),
                  HINT = format('%s is for a person who may approve the action: the proposer in its session (self), or an approver or admin who wrote none of it (independent).', p_what);
    END IF;
    IF a.status <> 'pending' THEN
        RAISE EXCEPTION 'keyturn: action % is %, not pending; there is nothing left to decide', p_id, a.status
            USING ERRCODE = '55000';
    END IF;
    RETURN a;
END
$$;

CREATE OR REPLACE FUNCTION keyturn._issue_token(p_caller oid, p_id uuid)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_session   text := keyturn.current_session();
    v_role      text;
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    v_role := keyturn._require_member(v_tenant, v_principal, v_session);
    RETURN keyturn._fresh_token(keyturn._decidable(v_tenant, v_principal, v_session, v_role, p_id, 'issue_token'));
END
$$;

-- A one-time code for a link to these actions, for the calling identity
-- (the human side for its own principal; the dispatcher, for the person it
-- asserts: keyturnd's MCP elicitation, the agent's person). It expires at
-- the earliest of its ttl and the actions' expiry. The card session it is
-- redeemed for runs as the caller's role; a code the dispatcher made, as
-- keyturnd's card role.
--
-- The dispatcher asserts whatever identity it likes, and keyturnd redeems
-- codes for anyone who brings one to POST /card/session: so whoever holds
-- the dispatcher's login can make a code for any person who may decide an
-- action, and decide it as them (twelfth red-team pass, docs/security.md
-- row 52). By default that is the dispatcher's remit, as a mail server
-- carrying a notification's link holds its card. With
-- keyturn.strict_dispatcher_links on, a dispatcher's code is only what the
-- elicitation needs: for one action, its proposer, in the session it
-- proposed in (a self decision), once (card_link_elicits_idx, so no
-- isolation level makes a second), within keyturn._elicit_window() of the
-- proposal. (A notification's code is minted by the database from its own
-- row, for the person it waits for: sql/064_notify.sql.)
--
-- In either mode the dispatcher makes no code for a revision written in a
-- card session: the session could have been opened from a code of the
-- dispatcher's own, so its login alone would write the params and then
-- decide them (fourteenth red-team pass, docs/security.md row 106; the
-- class of row 75, below: such a revision is decided where the person is
-- signed in). With the strict setting, no code for any revision: a
-- revision is never a fresh proposal of the agent's.

-- How long after a proposal keyturnd's MCP elicitation may still make its
-- card link: the elicitation follows the propose at once.
CREATE OR REPLACE FUNCTION keyturn._elicit_window()
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT interval '2 minutes' $$;

CREATE OR REPLACE FUNCTION keyturn._link_code(p_caller oid, p_ids uuid[], p_ttl interval)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_session   text := keyturn.current_session();
    v_role      text;
    v_id        uuid;
    a           keyturn.action;
    v_now       timestamptz := clock_timestamp();
    v_expires   timestamptz;
    v_dispatcher boolean;
    v_strict    boolean;
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    v_role := keyturn._require_member(v_tenant, v_principal, v_session);
    IF p_ids IS NULL OR cardinality(p_ids) NOT BETWEEN 1 AND 100 OR array_position(p_ids, NULL) IS NOT NULL
       OR (SELECT count(DISTINCT x) FROM unnest(p_ids) x) <> cardinality(p_ids) THEN
        RAISE EXCEPTION 'keyturn: action_ids must list 1 to 100 distinct action ids'
            USING ERRCODE = '22023';
    END IF;
    IF keyturn._interval_within(p_ttl, interval '1 day') IS NOT TRUE THEN
        RAISE EXCEPTION 'keyturn: ttl must be more than 0 and at most 1 day, without months or years, not %', p_ttl
            USING ERRCODE = '22023',
                  HINT = 'A link is opened soon or not at all; the person can ask for a new one from the queue.';
    END IF;
    v_expires := v_now + p_ttl;
    v_dispatcher := pg_has_role(p_caller, 'keyturn_dispatcher', 'MEMBER');
    v_strict := v_dispatcher AND keyturn._strict_dispatcher_links();
    FOREACH v_id IN ARRAY p_ids LOOP
        a := keyturn._decidable(v_tenant, v_principal, v_session, v_role, v_id, 'link_code');
        IF v_strict AND (cardinality(p_ids) <> 1
                             OR a.principal IS DISTINCT FROM v_principal OR a.session IS DISTINCT FROM v_session
                             OR a.created_at < v_now - keyturn._elicit_window()
                             OR a.revised_from IS NOT NULL) THEN
            PERFORM keyturn._refuse_dispatcher_link(v_id);
        END IF;
        IF v_dispatcher AND a.revised_from IS NOT NULL AND EXISTS (
               SELECT 1 FROM keyturn.event e
                WHERE e.action_id = a.id AND e.tenant = a.tenant AND e.from_status IS NULL
                  AND e.detail ->> 'via' = 'card_session') THEN
            RAISE EXCEPTION 'keyturn: the dispatcher may not make a link to action %, a revision written in a card session', v_id
                USING ERRCODE = '42501',
                      DETAIL = 'A card session''s holder may not be its person, and what it wrote is not its to decide.',
                      HINT = 'The person decides it where they are signed in: the queue, the console, their app.';
        END IF;
        v_expires := least(v_expires, a.expires_at);
    END LOOP;
    IF NOT v_dispatcher THEN
        RETURN keyturn._mint_link(v_tenant, v_principal, v_session, p_caller::regrole::text, p_ids, v_now,
                                  v_expires);
    END IF;
    IF NOT v_strict THEN
        RETURN keyturn._mint_link(v_tenant, v_principal, v_session, NULL, p_ids, v_now, v_expires);
    END IF;
    BEGIN
        RETURN keyturn._mint_link(v_tenant, v_principal, v_session, NULL, p_ids, v_now, v_expires, p_ids[1]);
    EXCEPTION WHEN unique_violation OR serialization_failure THEN
        PERFORM keyturn._refuse_dispatcher_link(p_ids[1]);
    END;
END
$$;

CREATE OR REPLACE FUNCTION keyturn._refuse_dispatcher_link(p_id uuid)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RAISE EXCEPTION 'keyturn: the dispatcher may not make a link to action %', p_id
        USING ERRCODE = '42501',
              DETAIL = 'With keyturn.strict_dispatcher_links on, a dispatcher''s code is for one action, its proposer in its session, once, within '
                       || keyturn._elicit_window() || ' of the proposal, never a revision (keyturnd''s MCP elicitation).',
              HINT = 'The person asks for a link (keyturn.link_code) or opens the action from their queue.';
END
$$;

-- A new one-time code for a card link to p_ids, for that identity, until
-- p_expires; only its digest is stored. The callers have checked that the
-- person may decide every action: keyturn._link_code, and a notification's
-- message (sql/064_notify.sql), whose card runs as the role its person set
-- the channel as.
CREATE OR REPLACE FUNCTION keyturn._mint_link(p_tenant text, p_principal text, p_session text, p_db_role text, p_ids uuid[],
                                   p_now timestamptz, p_expires timestamptz, p_elicits uuid DEFAULT NULL,
                                   p_notification uuid DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_code   text := keyturn._token_new();
    v_digest bytea;
BEGIN
    v_digest := keyturn._token_digest(v_code);
    INSERT INTO keyturn.card_link (code_digest, tenant, principal, session, db_role, action_ids, created_at,
                                   expires_at, elicits, notification)
    VALUES (v_digest, p_tenant, p_principal, p_session, p_db_role, p_ids, p_now, p_expires, p_elicits,
            p_notification);
    RETURN v_code;
END
$$;

-- A card session's calls assert the link's person with claims marked as a
-- card session's (keyturn._card_claims and keyturn._in_card_session, in
-- extension/src/identity.rs, which reads request.jwt.claims for everything
-- else).
--
-- A link travels through mail servers, a team's chat channel, push services
-- and a locked phone's notification shade, so its holder may not be its
-- person. It may decide what the link names, as shown; it must not write
-- what it then decides. A card session may revise its actions, but the
-- revision is not the session's to approve (card_session lists the link's
-- actions alone) and no notification, so no new link, is made for it
-- (keyturn._propose): the person decides it where they are signed in (the
-- queue, the console, their app). Before this, a link's holder revised a
-- self action to any params and approved the revision in the same session
-- (docs/security.md, row 75).

-- keyturnd's POST /card/session: the code's card session, once. No rows for
-- a code that is unknown, used or expired, or for action ids other than the
-- code's (in any order): nothing changes then. Otherwise the code is used
-- up, and the answer is the session's bearer (stored only as a digest), its
-- end (15 minutes at most), a fresh token for each action that is still
-- pending and the person may still decide, the role the session's calls run
-- as (NULL: keyturnd's card role), and the claims that assert the person.
CREATE OR REPLACE FUNCTION keyturn.redeem_link_code(code text, action_ids uuid[])
RETURNS TABLE (session text, expires_at timestamptz, tokens jsonb, db_role text, claims jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    l         keyturn.card_link;
    a         keyturn.action;
    v_role    text;
    v_now     timestamptz := clock_timestamp();
    v_bearer  text := 'kts_' || keyturn._token_new();
    v_digest  bytea;
    v_until   timestamptz;
    v_tokens  jsonb := '{}';
    v_token   text;
    v_id      uuid;
BEGIN
    PERFORM keyturn._refuse_nested('redeem_link_code');
    IF redeem_link_code.code IS NULL OR redeem_link_code.action_ids IS NULL THEN
        RETURN;
    END IF;
    v_digest := keyturn._token_digest(redeem_link_code.code);
    SELECT x.* INTO l FROM keyturn.card_link x
     WHERE x.code_digest = v_digest  -- by code alone: the code is the one thing the link holds
       FOR UPDATE;
    IF NOT FOUND OR l.redeemed_at IS NOT NULL OR l.expires_at <= v_now
       OR ARRAY(SELECT DISTINCT x FROM unnest(redeem_link_code.action_ids) x ORDER BY 1)
          IS DISTINCT FROM ARRAY(SELECT x FROM unnest(l.action_ids) x ORDER BY 1) THEN
        RETURN;
    END IF;
    SELECT m.role INTO v_role FROM keyturn.member m WHERE m.tenant = l.tenant AND m.principal = l.principal;
    FOREACH v_id IN ARRAY l.action_ids LOOP
        SELECT x.* INTO a FROM keyturn.action x WHERE x.id = v_id AND x.tenant = l.tenant FOR NO KEY UPDATE;
        CONTINUE WHEN NOT FOUND OR a.status <> 'pending' OR v_role IS NULL
                      OR keyturn._decide_problem(a, l.principal, l.session, v_role, 'approve') IS NOT NULL;
        v_token := keyturn._fresh_token(a);
        v_tokens := v_tokens || jsonb_build_object(v_id::text, v_token);
    END LOOP;
    v_until := v_now + interval '15 minutes';
    v_digest := keyturn._token_digest(v_bearer);
    UPDATE keyturn.card_link x
       SET redeemed_at = v_now, session_digest = v_digest, session_expires_at = v_until
     WHERE x.code_digest = l.code_digest AND x.tenant = l.tenant;
    RETURN QUERY SELECT v_bearer, v_until, v_tokens, l.db_role, keyturn._card_claims(l.tenant, l.principal, l.session);
END
$$;

-- keyturnd's check of a card session's bearer, on every /rpc call that
-- carries one: the role its calls run as (NULL: keyturnd's card role), the
-- claims that assert the person, and the actions it is for; no rows once
-- it has ended or for any other bearer.
CREATE OR REPLACE FUNCTION keyturn.card_session(bearer text)
RETURNS TABLE (db_role text, claims jsonb, action_ids uuid[], expires_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_digest bytea;
BEGIN
    IF card_session.bearer IS NULL OR left(card_session.bearer, 4) <> 'kts_' THEN
        RETURN;
    END IF;
    v_digest := keyturn._token_digest(card_session.bearer);
    -- The link's actions alone: never a revision made in the session (see
    -- keyturn._card_claims).
    RETURN QUERY
        SELECT l.db_role, keyturn._card_claims(l.tenant, l.principal, l.session), l.action_ids, l.session_expires_at
          FROM keyturn.card_link l
         WHERE l.session_digest = v_digest  -- by digest alone: the bearer is all keyturnd has
           AND l.session_expires_at > clock_timestamp();
END
$$;


-- ==== sql/059_audit.sql ====

-- The audit log's hash chain (docs/audit.md). Each tenant's events form one
-- chain: an event stores prev_hash (the previous event's hash; 64 zeros for
-- the first) and hash, the lowercase hex SHA-256 of the RFC 8785 form of the
-- event: the JSON object of all its columns but hash, prev_hash included, as
-- to_jsonb prints them with TimeZone = UTC (exactly what audit_export
-- gives). keyturn.audit_chain holds each tenant's head: its event count and
-- last hash.
--
-- Events are written when their transaction commits, under a lock of
-- keyturn's own on the tenant's chain held for the commit alone
-- (extension/src/audit.rs says why and how).

-- keyturn._event_hash(jsonb), the hash of an event given as the JSON object
-- of its columns, is Rust (extension/src/audit.rs): the one definition the
-- commit hashes with too (keyturn-core's audit::event_hash).

-- The 64 zeros the first event of a chain names as its predecessor.
CREATE OR REPLACE FUNCTION keyturn._chain_start()
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT repeat('0', 64) $$;

-- Whether action a still is what event detail d, of an event to status
-- p_to, committed to (the lifecycle trigger writes the commitments:
-- extension/src/lifecycle.rs, `commitments`): its tool and tool version;
-- the MAC of its params hash (and its params still hash to it, where kept,
-- unless approve found they did not and ended it rejected_tampered); its
-- approval binding's MAC, null for none (and the binding still verifies:
-- who approved, as which role, when, how); at a final status, that status
-- and the MACs of its result's and receipt's jsonb text, null for none. A
-- key d does not hold (an event of 0.2.0, a status change that commits to
-- nothing) is not compared.
CREATE OR REPLACE FUNCTION keyturn._commitments_kept(a keyturn.action, d jsonb, p_to keyturn.status)
RETURNS boolean
LANGUAGE plpgsql STABLE  -- not sql: the MACs are volatile, so no inlining
AS $$
BEGIN
    RETURN (NOT d ? 'tool' OR d ->> 'tool' IS NOT DISTINCT FROM a.tool)
       AND (NOT d ? 'tool_version' OR d ->> 'tool_version' IS NOT DISTINCT FROM a.tool_version::text)
       AND (NOT d ? 'params_mac'
            OR (d ->> 'params_mac' IS NOT DISTINCT FROM keyturn._commitment('params_hash', a.params_hash)
                AND (a.params IS NULL OR a.retain = 'digest' OR a.status = 'rejected_tampered'
                     OR keyturn.params_hash(a.tool, a.params) IS NOT DISTINCT FROM a.params_hash)))
       AND (NOT d ? 'approval_mac'
            OR (d ->> 'approval_mac' IS NOT DISTINCT FROM encode(a.approval_mac, 'hex')
                AND (a.approval_mac IS NULL
                     OR keyturn._approval_valid(a.id, a.params_hash, a.approved_by, a.approved_role,
                                                a.approved_at, a.approved_via, a.approval_mac))))
       AND (NOT d ? 'result_mac'
            OR (p_to = a.status
                AND d ->> 'result_mac' IS NOT DISTINCT FROM keyturn._commitment('result', a.result::text)
                AND d ->> 'receipt_mac' IS NOT DISTINCT FROM keyturn._commitment('receipt', a.receipt::text)));
END
$$;

-- When action a's row calls for a commitment none of its events holds, and
-- its first event committed to anything (0.3.0's): an approval binding no
-- event committed to, or a final status no event ended it with (a status,
-- an approval rewritten in the row alone), the id of its last event, after
-- which the row and the chain part. NULL when none is missing.
CREATE OR REPLACE FUNCTION keyturn._commitment_missing(a keyturn.action)
RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_last bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM keyturn.event x
                    WHERE x.action_id = a.id AND x.tenant = a.tenant AND x.detail ? 'params_mac') THEN
        RETURN NULL;
    END IF;
    SELECT max(x.id) INTO v_last FROM keyturn.event x WHERE x.action_id = a.id AND x.tenant = a.tenant;
    IF (a.approval_mac IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM keyturn.event x
                         WHERE x.action_id = a.id AND x.tenant = a.tenant
                           AND x.detail ->> 'approval_mac' = encode(a.approval_mac, 'hex')))
       OR (keyturn._is_final(a.status)
           AND NOT EXISTS (SELECT 1 FROM keyturn.event x
                            WHERE x.action_id = a.id AND x.tenant = a.tenant
                              AND x.to_status = a.status AND x.detail ? 'result_mac')) THEN
        RETURN v_last;
    END IF;
    RETURN NULL;
END
$$;

-- Recomputes a tenant's chain. ok is false at the first event that no longer
-- verifies (first_bad: its id): changed (its hash is not of its columns),
-- reordered, inserted, or after a deleted one (its prev_hash names no event
-- before it); or when the events stop before the head says (a deleted tail,
-- first_bad NULL) or go on past it (first_bad: the first event past the
-- head). events: how many verified. Triggers off or not, any role: the chain
-- is arithmetic over the rows. What it cannot see is a chain rewritten from
-- some point on together with the head: compare the head with one anchored
-- elsewhere (keyturn.audit_head, docs/audit.md).
-- Then the actions: ok is false, first_bad the first event whose
-- commitments its action no longer keeps (keyturn._commitments_kept), or
-- the last event of an action whose row calls for a commitment none holds
-- (keyturn._commitment_missing), whichever comes first, when an action's
-- params, approval, status or outcome was rewritten under a chain that
-- verifies. An action no longer stored is not compared.
CREATE OR REPLACE FUNCTION keyturn.verify_audit(tenant text)
RETURNS TABLE (ok boolean, events bigint, first_bad bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET TimeZone = 'UTC'
AS $$
DECLARE
    e       record;
    v_prev  text := keyturn._chain_start();
    v_n     bigint := 0;
    v_head  keyturn.audit_chain;
    v_kept  record;
    v_bad   bigint;
BEGIN
    PERFORM keyturn._refuse_nested('verify_audit');
    PERFORM keyturn._require_text(verify_audit.tenant, 'tenant');
    SELECT c.* INTO v_head FROM keyturn.audit_chain c WHERE c.tenant = verify_audit.tenant;
    FOR e IN
        SELECT x.id, x.prev_hash, x.hash, to_jsonb(x) AS j
          FROM keyturn.event x WHERE x.tenant = verify_audit.tenant ORDER BY x.id
    LOOP
        IF e.prev_hash IS DISTINCT FROM v_prev OR e.hash IS DISTINCT FROM keyturn._event_hash(e.j)
           OR v_n >= coalesce(v_head.events, 0) THEN
            RETURN QUERY SELECT false, v_n, e.id;
            RETURN;
        END IF;
        v_prev := e.hash;
        v_n := v_n + 1;
    END LOOP;
    IF v_n <> coalesce(v_head.events, 0) OR v_prev IS DISTINCT FROM coalesce(v_head.head, keyturn._chain_start()) THEN
        RETURN QUERY SELECT false, v_n, NULL::bigint;
        RETURN;
    END IF;
    -- Compared here, not in the query: the MACs read the key, which on
    -- Citus a query already on a shard cannot.
    FOR v_kept IN
        SELECT x.id, x.detail, x.to_status, ROW(a.*)::keyturn.action AS a
          FROM keyturn.event x
          JOIN keyturn.action a ON a.id = x.action_id AND a.tenant = verify_audit.tenant
         WHERE x.tenant = verify_audit.tenant
           AND x.detail ?| ARRAY['tool', 'tool_version', 'params_mac', 'approval_mac', 'result_mac', 'receipt_mac']
         ORDER BY x.id
    LOOP
        IF NOT keyturn._commitments_kept(v_kept.a, v_kept.detail, v_kept.to_status) THEN
            v_bad := least(v_bad, v_kept.id);
        END IF;
        IF v_kept.detail ? 'params_mac' THEN
            v_bad := least(v_bad, keyturn._commitment_missing(v_kept.a));
        END IF;
    END LOOP;
    IF v_bad IS NOT NULL THEN
        RETURN QUERY SELECT false, v_n, v_bad;
        RETURN;
    END IF;
    RETURN QUERY SELECT true, v_n, NULL::bigint;
END
$$;

-- A tenant's events since a time, each as one JSON object of all its
-- columns, prev_hash and hash included, oldest first: what keyturnd
-- audit-verify checks offline, one object a line.
CREATE OR REPLACE FUNCTION keyturn.audit_export(tenant text, since timestamptz DEFAULT '-infinity')
RETURNS SETOF jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET TimeZone = 'UTC'
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('audit_export');
    PERFORM keyturn._require_text(audit_export.tenant, 'tenant');
    -- The chain runs in commit order, and a transaction open across since
    -- commits its earlier events after later ones: the export is the
    -- contiguous tail from the first event (in the chain's order) made at
    -- or after since, so it verifies from its first line's prev_hash.
    RETURN QUERY
        SELECT to_jsonb(x) FROM keyturn.event x
         WHERE x.tenant = audit_export.tenant
           AND x.id >= (SELECT min(f.id) FROM keyturn.event f
                         WHERE f.tenant = audit_export.tenant AND f.at >= coalesce(audit_export.since, '-infinity'))
         ORDER BY x.id;
END
$$;

-- A tenant's head: how many events its chain holds and the last one's hash,
-- to publish or store elsewhere (docs/audit.md, "Anchoring"). A tenant with
-- no event yet: 0 and the 64 zeros.
CREATE OR REPLACE FUNCTION keyturn.audit_head(tenant text)
RETURNS TABLE (events bigint, hash text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('audit_head');
    PERFORM keyturn._require_text(audit_head.tenant, 'tenant');
    RETURN QUERY
        SELECT coalesce(max(c.events), 0), coalesce(max(c.head), keyturn._chain_start())
          FROM keyturn.audit_chain c WHERE c.tenant = audit_head.tenant;
END
$$;


-- ==== sql/060_dispatch.sql ====

-- The dispatcher and operator protocol (docs/sql-api.md, "Dispatcher").
--
-- keyturnd only moves rows the database has released (queued), and only calls a
-- provider after begin_dispatch has committed 'executing'. Authorized by role
-- alone (keyturn_dispatcher, keyturn_operator); no tenant identity, all tenants.

-- How many provider attempts an action gets: a retry reported for the last
-- one fails the action. Said once, here.
CREATE OR REPLACE FUNCTION keyturn._max_attempts()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 3 $$;

CREATE OR REPLACE FUNCTION keyturn._retry_backoff(p_attempts int)
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    -- After attempt n (counted at begin_dispatch): 2 s, 4 s, 8 s, ... capped at
    -- 5 minutes; at least 1 s, growing with attempts.
    SELECT make_interval(secs => least(300, power(2, greatest(p_attempts, 1))))
$$;

-- The due actions lease takes, locked FOR UPDATE (SKIP LOCKED) until the
-- caller's transaction ends: the first p_max in (next_attempt_at, id) order
-- whose tool has one of p_providers (NULL = any).
--
-- The plan must be an ordered scan of open_action_due_idx that stops after
-- p_max rows. A queue's statistics are always stale (20,000 rows arrive and
-- leave between two autovacuum naps), and with a stale small estimate the
-- planner prefers reading every due row and sorting them, which makes each
-- lease cost O(queue length). Without sort and bitmap paths the ordered index
-- scan is the only plan left. The settings live on this one function, so the
-- statements lease runs afterwards (its UPDATE and the triggers it fires) are
-- planned as usual.
--
-- That plan does not depend on the parameters, so it is planned once per
-- backend (force_generic_plan). Planned per call with the actual p_now, the
-- planner probed the end of open_action_due_idx for the column's true
-- maximum, walking the index entries every drained row leaves dead: about a
-- fifth of a lease call's time in the drain's profile (tests/bench/BENCHMARKS.md).
CREATE OR REPLACE FUNCTION keyturn._due(p_now timestamptz, p_max int, p_providers text[])
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE
ROWS 16
SET enable_sort = off
SET enable_bitmapscan = off
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    SELECT a.id FROM keyturn.open_action o
      JOIN keyturn.action a ON a.id = o.action_id AND a.tenant = o.tenant
     WHERE o.status = 'queued' AND o.next_attempt_at <= p_now
       -- The work list finds the rows; the status on the locked action row
       -- (rechecked after a wait) is what decides.
       AND a.status = 'queued' AND a.next_attempt_at <= p_now
       AND (p_providers IS NULL OR EXISTS (
                SELECT 1 FROM keyturn.tool_version v
                 WHERE v.tool = a.tool AND v.version = a.tool_version
                   AND v.provider = ANY (p_providers)))
     ORDER BY o.next_attempt_at, o.action_id
     LIMIT p_max
       FOR UPDATE OF a SKIP LOCKED;
END
$$;

-- keyturn._due for one tenant: its due actions, locked FOR UPDATE SKIP
-- LOCKED, in lease's order. The ordered scan of open_action_due_idx reads
-- past other tenants' due rows; on Citus those are only the few tenants
-- that share the shard. The tool versions of the providers asked for are
-- read first, by a statement of their own: Citus refuses a statement of a
-- delegated call that joins a reference table (tool_version) to the
-- tenant's shards.
CREATE OR REPLACE FUNCTION keyturn._due_for(p_tenant text, p_now timestamptz, p_max int, p_providers text[])
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE
ROWS 16
SET enable_sort = off
SET enable_bitmapscan = off
AS $$
DECLARE
    v_versions text[];
BEGIN
    IF p_providers IS NOT NULL THEN
        v_versions := ARRAY(SELECT v.tool || ':' || v.version FROM keyturn.tool_version v
                             WHERE v.provider = ANY (p_providers));
    END IF;
    RETURN QUERY
    SELECT a.id FROM keyturn.open_action o
      JOIN keyturn.action a ON a.id = o.action_id AND a.tenant = o.tenant
     WHERE o.tenant = p_tenant AND a.tenant = p_tenant
       AND o.status = 'queued' AND o.next_attempt_at <= p_now
       AND a.status = 'queued' AND a.next_attempt_at <= p_now
       AND (v_versions IS NULL OR a.tool || ':' || a.tool_version = ANY (v_versions))
     ORDER BY o.next_attempt_at, o.action_id
     LIMIT p_max
       FOR UPDATE OF a SKIP LOCKED;
END
$$;

-- lease and lease_for (p_what names the call): the due actions of every
-- tenant (keyturn._due) or of p_tenant (keyturn._due_for), locked, leased,
-- and returned as lease returns them.
--
-- p_tenant: NULL for lease, whose batch spans tenants, so each statement
-- finds its rows by id alone; the tenant for lease_for
-- (sql/062_dispatch_for.sql). Written "p_tenant IS NULL OR x.tenant =
-- p_tenant" so that one statement serves both: planned for a tenant, the
-- condition folds to "x.tenant = <the tenant>", which is what Citus needs
-- to pin the statement to that tenant's shard. So no caller on the
-- tenant's path may force a generic plan, in which it would not fold.
CREATE OR REPLACE FUNCTION keyturn._lease(p_what text, p_tenant text, p_worker text, p_max_jobs int, p_lease_for interval,
                               p_providers text[])
RETURNS TABLE (action_id uuid, lease_id uuid, tenant text, tool text, provider text, params jsonb,
               idempotency_key text, attempt int)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now       timestamptz := clock_timestamp();
    v_ids       uuid[];
    v_forged    uuid[];
    v_tenants   text[];
    v_leases    uuid[];
    v_tools     text[];
    v_versions  int[];
    v_providers text[];
    v_max       int;
BEGIN
    PERFORM keyturn._check_lease_args(p_worker, p_max_jobs, p_lease_for);
    PERFORM keyturn._refuse_nested(p_what);
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    -- Notifications first (sql/064_notify.sql): they are few, and a person
    -- waits for each. Actions take the slots left.
    RETURN QUERY SELECT * FROM keyturn._lease_notifications(p_tenant, p_worker, p_max_jobs, p_lease_for,
                                                            p_providers, v_now);
    GET DIAGNOSTICS v_max = ROW_COUNT;
    v_max := p_max_jobs - v_max;
    IF v_max < 1 THEN
        RETURN;
    END IF;
    IF p_tenant IS NULL THEN
        v_ids := ARRAY(SELECT keyturn._due(v_now, v_max, p_providers));
    ELSE
        v_ids := ARRAY(SELECT keyturn._due_for(p_tenant, v_now, v_max, p_providers));
    END IF;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;
    -- A queued row that no approval produced (a table write, a tampered
    -- restore) is never leased: it is invalidated, visibly, instead. The rows
    -- are locked, so what is read here is what is updated: the check, and the
    -- new lease ids, are read first because the UPDATEs, like every UPDATE of
    -- keyturn's tables, call no volatile function (docs/scale-out.md, layout
    -- B, step 5).
    SELECT coalesce(array_agg(a.id) FILTER (WHERE NOT c.valid), '{}'),
           coalesce(array_agg(a.id) FILTER (WHERE c.valid), '{}'),
           coalesce(array_agg(a.tenant) FILTER (WHERE c.valid), '{}'),
           coalesce(array_agg(gen_random_uuid()) FILTER (WHERE c.valid), '{}'),
           coalesce(array_agg(DISTINCT a.tool) FILTER (WHERE c.valid), '{}')
      INTO v_forged, v_ids, v_tenants, v_leases, v_tools
      FROM keyturn.action a
     CROSS JOIN LATERAL (SELECT keyturn._approval_valid(a.id, a.params_hash, a.approved_by, a.approved_role,
                                                        a.approved_at, a.approved_via, a.approval_mac) AS valid) c
     WHERE a.id = ANY (v_ids) AND (p_tenant IS NULL OR a.tenant = p_tenant);
    -- Each job's provider, read by a statement of its own: Citus refuses a
    -- statement of a delegated call that joins a reference table
    -- (tool_version) to the tenant's shards.
    SELECT array_agg(v.tool), array_agg(v.version), array_agg(v.provider)
      INTO v_tools, v_versions, v_providers
      FROM keyturn.tool_version v WHERE v.tool = ANY (v_tools);
    IF cardinality(v_forged) > 0 THEN
        PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'no valid approval', 'worker', p_worker));
        UPDATE keyturn.action a
           SET updated_at = v_now, status = 'invalidated',
               result = jsonb_build_object('reason', 'no approval produced this queued action; it is never dispatched')
         WHERE a.id = ANY (v_forged) AND (p_tenant IS NULL OR a.tenant = p_tenant);
    END IF;
    PERFORM keyturn._set_event_detail(jsonb_build_object('worker', p_worker));
    RETURN QUERY
    WITH leased AS (
        UPDATE keyturn.action a
           SET updated_at = v_now, status = 'leased', lease_id = u.lease,
               leased_by = p_worker, lease_expires_at = v_now + p_lease_for
          FROM unnest(v_ids, v_tenants, v_leases) AS u (id, tenant, lease)
         WHERE a.id = u.id AND a.tenant = u.tenant AND (p_tenant IS NULL OR a.tenant = p_tenant)
        RETURNING a.*
    )
    SELECT l.id, l.lease_id, l.tenant, l.tool, v.provider, coalesce(l.params, s.params),
           l.idempotency_key, l.attempts + 1
      FROM leased l
      JOIN unnest(v_tools, v_versions, v_providers) AS v (tool, version, provider)
        ON v.tool = l.tool AND v.version = l.tool_version
      LEFT JOIN keyturn.staged_payload s ON s.action_id = l.id AND s.tenant = l.tenant
                                        AND (p_tenant IS NULL OR s.tenant = p_tenant)
     ORDER BY l.next_attempt_at, l.id;
END
$$;

-- providers (keyturn's addition to the dispatcher protocol): only actions whose tool's provider is
-- in the list, so a worker never leases what it has no adapter for; NULL = all.
-- lease(worker, max_jobs, lease_for) is the documented signature; the
-- overload with providers (keyturnd's, with NULL for every provider) has
-- no defaults, so that each call names one of the two unambiguously.
-- Planned once per backend (the note before keyturn.begin_dispatch).
CREATE OR REPLACE FUNCTION keyturn.lease(worker text, max_jobs int DEFAULT 16, lease_for interval DEFAULT '30 seconds')
RETURNS TABLE (action_id uuid, lease_id uuid, tenant text, tool text, provider text, params jsonb,
               idempotency_key text, attempt int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY SELECT * FROM keyturn._lease('lease', NULL, lease.worker, lease.max_jobs, lease.lease_for, NULL);
END
$$;

CREATE OR REPLACE FUNCTION keyturn.lease(worker text, max_jobs int, lease_for interval, providers text[])
RETURNS TABLE (action_id uuid, lease_id uuid, tenant text, tool text, provider text, params jsonb,
               idempotency_key text, attempt int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY SELECT * FROM keyturn._lease('lease', NULL, lease.worker, lease.max_jobs, lease.lease_for,
                                              lease.providers);
END
$$;

-- Why a dispatcher call may not act on this job under this lease, or NULL:
-- the one place for these rules, shared by the single calls (which raise it
-- as 55000), the batch calls (which answer it per element) and the
-- notifications the same calls carry (sql/064_notify.sql; p_what names the
-- kind of job). The job's row is locked FOR UPDATE; p_found: there is one,
-- p_status, p_lease_id and p_lease_expires_at are its columns; p_live: the
-- lease must not have lapsed.
CREATE OR REPLACE FUNCTION keyturn._lease_problem_of(p_what text, p_id uuid, p_found boolean, p_status keyturn.status,
                                          p_lease_id uuid, p_lease_expires_at timestamptz, p_lease uuid,
                                          p_statuses keyturn.status[], p_live boolean)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF NOT p_found OR p_lease_id IS DISTINCT FROM p_lease OR NOT p_status = ANY (p_statuses) THEN
        RETURN format('keyturn: %s %s is not %s under lease %s (its status is %s)',
                      p_what, coalesce(p_id::text, 'NULL'), array_to_string(p_statuses, ' or '),
                      coalesce(p_lease::text, 'NULL'), coalesce(p_status::text, 'unknown'));
    END IF;
    IF p_live AND p_lease_expires_at <= clock_timestamp() THEN
        RETURN format('keyturn: the lease on %s %s lapsed at %s; do not call the provider, the sweep requeues it',
                      p_what, p_id, keyturn._utc(p_lease_expires_at));
    END IF;
    RETURN NULL;
END
$$;

-- keyturn._lease_problem_of for an action: a is its row, locked FOR UPDATE
-- (all NULL when there is none).
CREATE OR REPLACE FUNCTION keyturn._lease_problem(a keyturn.action, p_id uuid, p_lease uuid,
                                       p_statuses keyturn.status[], p_live boolean)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN keyturn._lease_problem_of('action', p_id, a.id IS NOT NULL, a.status, a.lease_id, a.lease_expires_at,
                                     p_lease, p_statuses, p_live);
END
$$;

-- complete's version: also only 'retry' may hand back a job never begun.
CREATE OR REPLACE FUNCTION keyturn._complete_problem_of(p_what text, p_id uuid, p_found boolean, p_status keyturn.status,
                                             p_lease_id uuid, p_lease_expires_at timestamptz, p_lease uuid,
                                             p_outcome text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    -- 'executing' under this lease is accepted even past the lease's expiry:
    -- a known outcome beats an unknown one.
    RETURN coalesce(
        keyturn._lease_problem_of(p_what, p_id, p_found, p_status, p_lease_id, p_lease_expires_at, p_lease,
                                  '{leased,executing}', p_status = 'leased'),
        CASE WHEN p_status = 'leased' AND p_outcome <> 'retry' THEN
            format('keyturn: %s %s was never dispatched; only ''retry'' can hand it back (call begin_dispatch before the provider)',
                   p_what, p_id)
        END);
END
$$;

CREATE OR REPLACE FUNCTION keyturn._complete_problem(a keyturn.action, p_id uuid, p_lease uuid, p_outcome text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN keyturn._complete_problem_of('action', p_id, a.id IS NOT NULL, a.status, a.lease_id, a.lease_expires_at,
                                        p_lease, p_outcome);
END
$$;

-- What complete makes of an outcome, for an action and a notification
-- alike: the new status of a job that was p_current after p_attempts
-- attempts, the delay before a requeued one is due again (a job handed back
-- from leased: retry_after, else at once; after an attempt: retry_after,
-- else the backoff; capped at a day either way: a provider cannot park a
-- job for a year), and the result it is given. Inlined.
CREATE OR REPLACE FUNCTION keyturn._outcome_status(p_current keyturn.status, p_outcome text, p_attempts int)
RETURNS keyturn.status
LANGUAGE sql STABLE PARALLEL SAFE  -- as a cast to an enum is: inlined
AS $$
    SELECT CASE WHEN p_current = 'leased' THEN 'queued'
                WHEN p_outcome = 'succeeded' THEN 'succeeded'
                WHEN p_outcome = 'failed' THEN 'failed'
                WHEN p_outcome = 'unknown' THEN 'uncertain'
                WHEN p_attempts < keyturn._max_attempts() THEN 'queued'
                ELSE 'failed'
           END::keyturn.status
$$;

CREATE OR REPLACE FUNCTION keyturn._outcome_delay(p_current keyturn.status, p_delay interval, p_attempts int)
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT least(CASE WHEN p_current = 'leased' THEN coalesce(p_delay, interval '0')
                      ELSE coalesce(p_delay, keyturn._retry_backoff(p_attempts)) END,
                 interval '1 day')
$$;

CREATE OR REPLACE FUNCTION keyturn._outcome_result(p_status keyturn.status, p_outcome text)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE  -- as jsonb_build_object is
AS $$
    SELECT CASE
               WHEN p_status = 'failed' AND p_outcome = 'retry'
                   THEN jsonb_build_object('reason', 'the provider asked to retry after the third attempt')
               WHEN p_status = 'uncertain'
                   THEN jsonb_build_object('reason', 'the provider call''s outcome is unknown; an operator must reconcile it')
               ELSE jsonb_build_object('outcome', p_outcome)
           END
$$;

-- Raises 55000 with a dispatcher call's problem, if there is one.
CREATE OR REPLACE FUNCTION keyturn._raise_lease_problem(p_problem text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_problem IS NOT NULL THEN
        RAISE EXCEPTION '%', p_problem
            USING ERRCODE = '55000',
                  HINT = 'Lease it again; never call the provider without a successful begin_dispatch.';
    END IF;
END
$$;

-- Why an action leased to the caller must not be dispatched (reason NULL:
-- it may be), and whether that ends it failed rather than invalidated.
-- Invalidated: no approval produced it, or something approve checked no
-- longer holds (keyturn._invalid_reason), or its attachments are gone or
-- changed in storage, or (a task action, approved by a request rather than
-- by a person looking at it) its params no longer pass the tool's schema,
-- checked right before they leave. Failed, when nothing else is wrong: a
-- deterministic failure after the approval (its approved attachments'
-- metadata cannot be read), which no attempt could ever get past, so
-- begin_dispatch ends it with the reason and sends nothing, instead of a
-- lease that lapses into the same problem again and again.
-- One function for both, so an action's tool version and params are read
-- once (BENCHMARKS.md, section 23).
CREATE OR REPLACE FUNCTION keyturn._begin_check(a keyturn.action)
RETURNS keyturn._begun
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_reason     text;
    v_unreadable text;
    v_ver        keyturn.tool_version;
    v_params     jsonb;
BEGIN
    IF NOT keyturn._approval_valid(a.id, a.params_hash, a.approved_by, a.approved_role,
                                   a.approved_at, a.approved_via, a.approval_mac) THEN
        RETURN ROW('no approval produced this action; it is never dispatched', false);
    END IF;
    v_reason := keyturn._invalid_reason(a);
    IF v_reason IS NOT NULL THEN
        RETURN ROW(v_reason, false);
    END IF;
    SELECT v.* INTO v_ver FROM keyturn.tool_version v WHERE v.tool = a.tool AND v.version = a.tool_version;
    v_params := coalesce(a.params, (SELECT s.params FROM keyturn.staged_payload s
                                     WHERE s.action_id = a.id AND s.tenant = a.tenant));
    IF v_ver.attachments_param IS NOT NULL THEN
        v_unreadable := keyturn._attachments_unreadable(v_ver, v_params);
        IF v_unreadable IS NULL THEN
            v_reason := keyturn._attachment_problem(a, v_ver, v_params);
        END IF;
    END IF;
    IF v_reason IS NULL AND a.approval = 'task'
       AND coalesce(keyturn._params_errors(v_ver.params_schema, v_params),
                    keyturn._undeclared_recipient(v_ver, v_params)) IS NOT NULL THEN
        v_reason := 'params no longer pass the tool''s schema';
    END IF;
    IF v_reason IS NOT NULL THEN
        RETURN ROW(v_reason, false);
    END IF;
    RETURN ROW(v_unreadable, v_unreadable IS NOT NULL);
END
$$;

-- begin_dispatch of distinct actions, each under its lease, as one statement
-- of each kind for all of them: the row locks, the checks, the status
-- UPDATE (executing; invalidated with the reason it may no longer run; failed
-- with the reason it never can) and the attempt INSERT.
-- The one implementation of begin_dispatch: the single call is a set of
-- one, keyturn.begin_dispatch_many runs sets (sql/061_dispatch_batch.sql).
-- Answers each element (p_ords: its place in the caller's batch) with
-- dispatch, or with the lease problem that left it unchanged.
--
-- p_tenant: NULL for begin_dispatch and begin_dispatch_many (by id alone,
-- the dispatcher's calls name no tenant); the tenant for their _for forms,
-- as keyturn._lease explains. The plain calls plan it once per backend
-- (their force_generic_plan): with the arrays known, a custom plan's
-- estimate is always lower than the generic one's, so plpgsql planned every
-- statement again on every call, which cost a one-job step more than
-- running them (tests/bench/BENCHMARKS.md). Every plan is index lookups by
-- id, whatever the arrays hold.
CREATE OR REPLACE FUNCTION keyturn._begin_set(p_tenant text, p_ords int[], p_ids uuid[], p_leases uuid[])
RETURNS TABLE (ord int, dispatch boolean, problem text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_ords     int[];
    v_ids      uuid[];
    v_tenants  text[];
    v_problems text[];
    v_reasons  text[];
    v_details  text[];
    v_statuses keyturn.status[];
    v_results  jsonb[];
    v_now      timestamptz;
BEGIN
    -- Notifications, told by their id (sql/064_notify.sql), are begun by
    -- keyturn._notify_begin_set; a batch of actions alone never gets there.
    IF EXISTS (SELECT 1 FROM unnest(p_ids) x WHERE keyturn._is_notification(x)) THEN
        RETURN QUERY SELECT * FROM keyturn._begin_mixed(p_tenant, p_ords, p_ids, p_leases);
        RETURN;
    END IF;
    -- What the UPDATE writes is computed here too: Citus refuses a function
    -- that is not immutable (a cast to keyturn.status, jsonb_build_object)
    -- inside a CASE of an UPDATE.
    SELECT array_agg(v.ord), array_agg(v.id), array_agg(v.tenant), array_agg(v.problem), array_agg(v.reason),
           array_agg(CASE WHEN v.problem IS NOT NULL THEN NULL
                          WHEN v.reason IS NULL
                          THEN jsonb_build_object('attempt', v.attempts + 1, 'worker', v.leased_by)::text
                          ELSE jsonb_build_object('reason', v.reason)::text END),
           array_agg(CASE WHEN v.reason IS NULL THEN 'executing'
                          WHEN v.failed THEN 'failed'
                          ELSE 'invalidated' END::keyturn.status),
           array_agg(CASE WHEN v.reason IS NOT NULL THEN jsonb_build_object('reason', v.reason) END)
      INTO v_ords, v_ids, v_tenants, v_problems, v_reasons, v_details, v_statuses, v_results
      FROM (SELECT c.*, (c.checked).reason, coalesce((c.checked).failed, false) AS failed
              FROM (SELECT e.ord, e.id, (l.a).tenant, p.problem, (l.a).attempts, (l.a).leased_by,
                   CASE WHEN p.problem IS NULL THEN keyturn._begin_check(l.a) END AS checked
              FROM unnest(p_ords, p_ids, p_leases) AS e (ord, id, lease)
              -- Each row locked as it is read (in the batch's order, as the
              -- single calls one after another would), so the checks see it
              -- as it is locked.
              -- The row found names the tenant for every statement after
              -- this one. ROW(x.*): on a Citus shard x is of the shard's
              -- row type, which keyturn's functions do not take.
              LEFT JOIN LATERAL (SELECT ROW(x.*)::keyturn.action AS a FROM keyturn.action x
                                  WHERE x.id = e.id AND (p_tenant IS NULL OR x.tenant = p_tenant) FOR UPDATE) l ON true
             CROSS JOIN LATERAL (SELECT keyturn._lease_problem(l.a, e.id, e.lease, '{leased}', true) AS problem) p
             -- OFFSET 0: c stays a subquery, so its check runs once an
             -- action, not once for each of its fields v reads (as in
             -- keyturn._complete_set).
            OFFSET 0) c) v;
    PERFORM keyturn._set_event_details(v_ids, v_details);
    v_now := clock_timestamp();
    WITH done AS (
        UPDATE keyturn.action x
           SET updated_at = v_now,
               status = u.status,
               attempts = x.attempts + CASE WHEN u.reason IS NULL THEN 1 ELSE 0 END,
               dispatched_at = CASE WHEN u.reason IS NULL THEN v_now ELSE x.dispatched_at END,
               result = CASE WHEN u.reason IS NULL THEN x.result ELSE u.result END,
               lease_id = CASE WHEN u.reason IS NULL THEN x.lease_id END,
               leased_by = CASE WHEN u.reason IS NULL THEN x.leased_by END,
               lease_expires_at = CASE WHEN u.reason IS NULL THEN x.lease_expires_at END
          FROM unnest(v_ids, v_tenants, v_problems, v_reasons, v_statuses, v_results)
               AS u (id, tenant, problem, reason, status, result)
         WHERE x.id = u.id AND x.tenant = u.tenant AND u.problem IS NULL AND (p_tenant IS NULL OR x.tenant = p_tenant)
           AND x.id = ANY (v_ids)
     RETURNING x.id, x.attempts, x.tenant, x.principal, x.lease_id, x.leased_by, x.status)
    INSERT INTO keyturn.attempt (action_id, attempt, tenant, principal, lease_id, worker, started_at)
    SELECT d.id, d.attempts, d.tenant, d.principal, d.lease_id, d.leased_by, v_now
      FROM done d WHERE d.status = 'executing';
    RETURN QUERY
    SELECT v.ord, v.problem IS NULL AND v.reason IS NULL, v.problem
      FROM unnest(v_ords, v_problems, v_reasons) AS v (ord, problem, reason)
     ORDER BY v.ord;
END
$$;

-- The dispatcher's plain calls (lease, begin and complete, single and
-- batched, and keyturn._due) are planned once per backend
-- (force_generic_plan): a keyturnd connection runs them thousands of times
-- with the same shape, and with a batch's arrays known plpgsql's custom plan
-- always looked cheaper, so it planned again on every call (for a one-job
-- lease, a third of the call's time: tests/bench/BENCHMARKS.md, section
-- 19). Their _for forms are not: on Citus their plans must fold the tenant
-- to a constant (keyturn._lease). A generic plan is made from the
-- statistics of the moment and kept: made while a table was empty (a new
-- installation's keyturn.attempt), it read that table whole in every later
-- call, and the first drain of 20,000 actions ran at a third of the speed
-- of the next (tests/bench/BENCHMARKS.md).
-- Every statement they run finds its rows by key, so sequential scans are
-- off for them, and each UPDATE joined to the batch's arrays also names the
-- ids as an index condition (x.id = ANY (v_ids)), so that the plan kept
-- reads only the batch's rows in either join order.
CREATE OR REPLACE FUNCTION keyturn.begin_dispatch(action_id uuid, lease_id uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    r record;
BEGIN
    PERFORM keyturn._refuse_nested('begin_dispatch');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    SELECT * INTO r FROM keyturn._begin_set(NULL, '{1}', ARRAY[begin_dispatch.action_id],
                                            ARRAY[begin_dispatch.lease_id]);
    PERFORM keyturn._raise_lease_problem(r.problem);
    RETURN r.dispatch;
END
$$;

-- What is wrong with complete's arguments (a 22023 message), or NULL: the
-- outcome word, a negative delay, a receipt keyturn cannot store. Checked
-- before anything is read or locked; complete raises it, complete_many
-- answers it for its element.
CREATE OR REPLACE FUNCTION keyturn._complete_args_error(p_outcome text, p_retry_after interval, p_receipt jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    -- complete's outcomes: every attempt outcome but lapsed, which only the
    -- sweep records.
    IF p_outcome IS NULL OR p_outcome = 'lapsed'
       OR NOT p_outcome = ANY (enum_range(NULL::keyturn.attempt_outcome)::text[]) THEN
        RETURN format('keyturn: outcome must be succeeded, failed, retry or unknown, not %s',
                      coalesce(keyturn._quoted(p_outcome), 'NULL'));
    END IF;
    IF p_retry_after IS NOT NULL AND p_retry_after < interval '0' THEN
        RETURN 'keyturn: retry_after must not be negative';
    END IF;
    RETURN keyturn._receipt_problem(p_receipt);
END
$$;

-- complete of distinct actions, as one statement of each kind for all of
-- them: the row locks, the checks, the attempt UPDATE and the status UPDATE.
-- The one implementation of complete: the single call is a set of one,
-- keyturn.complete_many runs sets (sql/061_dispatch_batch.sql). Answers each
-- element (p_ords: its place in the caller's batch) with its new status, or
-- with the problem that left it unchanged: '22023 ...' for its arguments
-- (keyturn._complete_args_error: the outcome word, the delay, a receipt
-- keyturn cannot store), '55000 ...' for its lease or status.
--
-- A job handed back before any provider call ('retry' while 'leased') is
-- queued again without counting an attempt, due after retry_after (else at
-- once); any other outcome closes the attempt. retry_after is capped at a
-- day on both paths: a provider cannot park an approved action for a year.
--
-- p_tenant, and the plans, as in keyturn._begin_set.
CREATE OR REPLACE FUNCTION keyturn._complete_set(p_tenant text, p_ords int[], p_ids uuid[], p_leases uuid[], p_outcomes text[],
                                      p_receipts jsonb[], p_retry_after interval[])
RETURNS TABLE (ord int, status text, problem text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_ords     int[];
    v_ids      uuid[];
    v_tenants  text[];
    v_problems text[];
    v_statuses keyturn.status[];
    v_back     boolean[];
    v_outcomes keyturn.attempt_outcome[];
    v_receipts jsonb[];
    v_delays   interval[];
    v_attempts int[];
    v_details  text[];
    v_results  jsonb[];
    v_next     timestamptz[];
    v_now      timestamptz;
BEGIN
    -- Notifications, as in keyturn._begin_set.
    IF EXISTS (SELECT 1 FROM unnest(p_ids) x WHERE keyturn._is_notification(x)) THEN
        RETURN QUERY SELECT * FROM keyturn._complete_mixed(p_tenant, p_ords, p_ids, p_leases, p_outcomes, p_receipts,
                                                           p_retry_after);
        RETURN;
    END IF;
    -- What the UPDATEs write is computed before them, as in
    -- keyturn._begin_set: Citus refuses a function that is not immutable
    -- inside a CASE of an UPDATE.
    SELECT array_agg(v.ord), array_agg(v.id), array_agg(v.tenant), array_agg(v.problem), array_agg(v.status),
           array_agg(v.back),
           -- Typed here, not in the UPDATE: Citus refuses a stable function
           -- (enum_in) with column references in an UPDATE's SET. An
           -- element with a problem changes nothing, and its outcome may be
           -- no attempt outcome at all.
           array_agg(CASE WHEN v.problem IS NULL THEN v.outcome::keyturn.attempt_outcome END),
           array_agg(v.receipt), array_agg(v.delay),
           array_agg(v.attempts),
           array_agg(CASE WHEN v.problem IS NOT NULL THEN NULL
                          WHEN v.back THEN jsonb_build_object('handed_back', true)::text
                          ELSE jsonb_strip_nulls(jsonb_build_object(
                                   'outcome', v.outcome, 'attempt', v.attempts,
                                   'retry_in', CASE WHEN v.status = 'queued' THEN v.delay::text END))::text END),
           array_agg(keyturn._outcome_result(v.status, v.outcome))
      INTO v_ords, v_ids, v_tenants, v_problems, v_statuses, v_back, v_outcomes, v_receipts, v_delays,
           v_attempts, v_details, v_results
      FROM (SELECT e.ord, e.id, (l.a).tenant, p.problem, e.outcome, (l.a).attempts,
                   (l.a).status = 'leased' AS back,
                   CASE WHEN p.problem IS NULL THEN keyturn._redact(coalesce(e.receipt, '{}')) END AS receipt,
                   keyturn._outcome_delay((l.a).status, e.delay, (l.a).attempts) AS delay,
                   keyturn._outcome_status((l.a).status, e.outcome, (l.a).attempts) AS status
              FROM unnest(p_ords, p_ids, p_leases, p_outcomes, p_receipts, p_retry_after)
                   AS e (ord, id, lease, outcome, receipt, delay)
             -- OFFSET 0 here, in p and in v: a subquery the planner pulls up
             -- has its columns' expressions copied into every place that
             -- names them, and each copy runs: _complete_args_error ran five
             -- times an element, _complete_problem four and _outcome_status
             -- three (the drain's profile). Kept as subqueries, each runs once.
             CROSS JOIN LATERAL (SELECT keyturn._complete_args_error(e.outcome, e.delay, e.receipt) AS arg_error
                                 OFFSET 0) g
              -- Each row locked as it is read, in the batch's order, and only
              -- for an element whose arguments are right: the others change
              -- nothing. ROW(x.*), as in keyturn._begin_set.
              LEFT JOIN LATERAL (SELECT ROW(x.*)::keyturn.action AS a FROM keyturn.action x
                                  WHERE x.id = e.id AND (p_tenant IS NULL OR x.tenant = p_tenant)
                                    AND g.arg_error IS NULL FOR UPDATE) l ON true
             CROSS JOIN LATERAL (
                   SELECT coalesce('22023 ' || g.arg_error,
                                   '55000 ' || keyturn._complete_problem(l.a, e.id, e.lease, e.outcome)) AS problem
                   OFFSET 0) p
            OFFSET 0) v;
    v_now := clock_timestamp();
    v_next := ARRAY(SELECT v_now + u.delay FROM unnest(v_delays) WITH ORDINALITY AS u (delay, o) ORDER BY u.o);
    UPDATE keyturn.attempt t
       SET finished_at = v_now, outcome = u.outcome, receipt = u.receipt
      FROM unnest(v_ids, v_tenants, v_problems, v_back, v_attempts, v_outcomes, v_receipts)
           AS u (id, tenant, problem, back, attempt, outcome, receipt)
     WHERE t.action_id = u.id AND t.tenant = u.tenant AND t.attempt = u.attempt
       AND u.problem IS NULL AND NOT u.back AND (p_tenant IS NULL OR t.tenant = p_tenant)
       AND t.action_id = ANY (v_ids);  -- see the note before keyturn.begin_dispatch
    PERFORM keyturn._set_event_details(v_ids, v_details);
    UPDATE keyturn.action x
       SET updated_at = v_now, status = u.status,
           receipt = CASE WHEN u.back THEN x.receipt ELSE u.receipt END,
           result = CASE WHEN u.status = 'queued' THEN x.result ELSE u.result END,
           next_attempt_at = CASE WHEN u.status = 'queued' THEN u.next END,
           lease_id = CASE WHEN u.status = 'queued' THEN NULL ELSE x.lease_id END,
           leased_by = CASE WHEN u.status = 'queued' THEN NULL ELSE x.leased_by END,
           lease_expires_at = CASE WHEN u.status = 'queued' THEN NULL ELSE x.lease_expires_at END
      FROM unnest(v_ids, v_tenants, v_problems, v_statuses, v_back, v_outcomes, v_receipts, v_next, v_results)
           AS u (id, tenant, problem, status, back, outcome, receipt, next, result)
     WHERE x.id = u.id AND x.tenant = u.tenant AND u.problem IS NULL AND (p_tenant IS NULL OR x.tenant = p_tenant)
       AND x.id = ANY (v_ids);
    RETURN QUERY
    SELECT v.ord, CASE WHEN v.problem IS NULL THEN v.status::text END, v.problem
      FROM unnest(v_ords, v_problems, v_statuses) AS v (ord, problem, status)
     ORDER BY v.ord;
END
$$;

CREATE OR REPLACE FUNCTION keyturn.complete(action_id uuid, lease_id uuid, outcome text, receipt jsonb DEFAULT '{}',
                                 retry_after interval DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    v_error text := keyturn._complete_args_error(complete.outcome, complete.retry_after, complete.receipt);
    r       record;
BEGIN
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._refuse_nested('complete');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    SELECT * INTO r FROM keyturn._complete_set(NULL, '{1}', ARRAY[complete.action_id], ARRAY[complete.lease_id],
                                               ARRAY[complete.outcome], ARRAY[complete.receipt],
                                               ARRAY[complete.retry_after]);
    -- Only a lease problem is left: the arguments were checked above.
    PERFORM keyturn._raise_lease_problem(substr(r.problem, 7));
    RETURN r.status;
END
$$;

-- The sweep: pending past expiry -> expired, leased with a lapsed lease ->
-- queued, executing with a lapsed lease -> uncertain, and staged files no
-- proposal bound a day after staging deleted. p_tenant: NULL for sweep
-- (every tenant), the tenant for sweep_for, as keyturn._lease explains.
CREATE OR REPLACE FUNCTION keyturn._sweep(p_tenant text)
RETURNS TABLE (expired int, requeued int, uncertain int, files int)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_expired   int;
    v_requeued  int;
    v_uncertain int;
    v_files     int;
    v_notes     record;
    v_now       timestamptz := clock_timestamp();  -- an index condition, unlike clock_timestamp()
BEGIN
    PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'expired before approval'));
    UPDATE keyturn.action a
       SET updated_at = v_now, status = 'expired', result = jsonb_build_object('reason', 'the proposal expired before approval')
     WHERE (a.id, a.tenant) IN (SELECT x.id, x.tenant FROM keyturn.open_action o
                                JOIN keyturn.action x ON x.id = o.action_id AND x.tenant = o.tenant
                                WHERE o.status = 'pending' AND o.expires_at < v_now
                                  AND x.status = 'pending'
                                  AND (p_tenant IS NULL OR (o.tenant = p_tenant AND x.tenant = p_tenant))
                                FOR UPDATE OF x SKIP LOCKED)
       AND (p_tenant IS NULL OR a.tenant = p_tenant);
    GET DIAGNOSTICS v_expired = ROW_COUNT;

    PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'lease lapsed before dispatch'));
    UPDATE keyturn.action a
       SET updated_at = v_now, status = 'queued', next_attempt_at = v_now,
           lease_id = NULL, leased_by = NULL, lease_expires_at = NULL
     WHERE (a.id, a.tenant) IN (SELECT x.id, x.tenant FROM keyturn.open_action o
                                JOIN keyturn.action x ON x.id = o.action_id AND x.tenant = o.tenant
                                WHERE o.status IN ('leased', 'executing') AND o.lease_expires_at < v_now
                                  AND x.status = 'leased' AND x.lease_expires_at < v_now
                                  AND (p_tenant IS NULL OR (o.tenant = p_tenant AND x.tenant = p_tenant))
                                FOR UPDATE OF x SKIP LOCKED)
       AND (p_tenant IS NULL OR a.tenant = p_tenant);
    GET DIAGNOSTICS v_requeued = ROW_COUNT;

    PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'lease lapsed while executing'));
    WITH lapsed AS (
        UPDATE keyturn.action a
           SET updated_at = v_now, status = 'uncertain',
               result = jsonb_build_object('reason', 'the dispatcher''s lease lapsed during the provider call; the outcome is unknown and is never retried automatically')
         WHERE (a.id, a.tenant) IN (SELECT x.id, x.tenant FROM keyturn.open_action o
                                    JOIN keyturn.action x ON x.id = o.action_id AND x.tenant = o.tenant
                                    WHERE o.status IN ('leased', 'executing') AND o.lease_expires_at < v_now
                                      AND x.status = 'executing' AND x.lease_expires_at < v_now
                                      AND (p_tenant IS NULL OR (o.tenant = p_tenant AND x.tenant = p_tenant))
                                    FOR UPDATE OF x SKIP LOCKED)
           AND (p_tenant IS NULL OR a.tenant = p_tenant)
        RETURNING a.id, a.tenant, a.attempts
    ), closed AS (
        UPDATE keyturn.attempt t SET finished_at = v_now, outcome = 'lapsed'
          FROM lapsed
         WHERE t.action_id = lapsed.id AND t.tenant = lapsed.tenant AND t.attempt = lapsed.attempts
           AND t.outcome IS NULL AND (p_tenant IS NULL OR t.tenant = p_tenant)
        RETURNING 1
    )
    SELECT count(*) INTO v_uncertain FROM lapsed;

    DELETE FROM keyturn.staged_file s
     WHERE (s.id, s.tenant) IN (SELECT f.id, f.tenant FROM keyturn.staged_file f
                                WHERE f.action_id IS NULL AND f.staged_at < v_now - interval '24 hours'
                                  AND (p_tenant IS NULL OR f.tenant = p_tenant)
                                FOR UPDATE SKIP LOCKED)
       AND (p_tenant IS NULL OR s.tenant = p_tenant);
    GET DIAGNOSTICS v_files = ROW_COUNT;

    -- Notifications: their lapsed leases by the same rules, counted with the
    -- actions' (sql/064_notify.sql).
    SELECT * INTO v_notes FROM keyturn._sweep_notifications(p_tenant, v_now);
    RETURN QUERY SELECT v_expired, v_requeued + v_notes.requeued, v_uncertain + v_notes.uncertain, v_files;
END
$$;

CREATE OR REPLACE FUNCTION keyturn.sweep()
RETURNS TABLE (expired int, requeued int, uncertain int, files int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('sweep');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    RETURN QUERY SELECT * FROM keyturn._sweep(NULL);
END
$$;

-- reconcile, and reconcile_for (p_what names the call): p_tenant as in
-- keyturn._lease.
CREATE OR REPLACE FUNCTION keyturn._reconcile(p_what text, p_tenant text, p_id uuid, p_outcome text, p_note text)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    a        keyturn.action;
    v_now    timestamptz := clock_timestamp();
    v_status keyturn.status;
    v_added  jsonb;
    v_tenant text := p_tenant;
BEGIN
    IF p_outcome IS NULL OR p_outcome NOT IN ('succeeded', 'failed') THEN
        RAISE EXCEPTION 'keyturn: reconcile outcome must be succeeded or failed, not %',
                coalesce(keyturn._quoted(p_outcome), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._refuse_nested(p_what);
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    IF keyturn._is_notification(p_id) THEN
        RETURN keyturn._reconcile_notification(p_tenant, p_id, p_outcome, p_note);
    END IF;
    -- Operators reconcile across tenants: the plain call names none, so it
    -- reads the tenant first, without a lock, then locks the row in its
    -- tenant. On Citus a lock by id alone would reach every shard, which
    -- Citus refuses (0A000): this way the plain call answers an action that
    -- is not uncertain as on one node (55000), and an uncertain one is
    -- refused by the lifecycle trigger, naming reconcile_for. Planned only
    -- when run: never in reconcile_for, which names its tenant.
    IF v_tenant IS NULL THEN
        SELECT x.tenant INTO v_tenant FROM keyturn.action x
         WHERE x.id = p_id;  -- by id alone: the plain call names no tenant
    END IF;
    SELECT x.* INTO a FROM keyturn.action x
     WHERE x.id = p_id AND x.tenant = v_tenant FOR UPDATE;
    IF NOT FOUND OR a.status <> 'uncertain' THEN
        RAISE EXCEPTION 'keyturn: only an uncertain action can be reconciled; % is %',
                p_id, coalesce(a.status::text, 'unknown')
            USING ERRCODE = '55000';
    END IF;
    PERFORM keyturn._set_event_detail(jsonb_strip_nulls(jsonb_build_object(
        'reconciled', p_outcome, 'note', p_note)));
    -- Computed first: Citus refuses a function that is not immutable in an
    -- UPDATE's expression that holds a COALESCE.
    v_status := p_outcome::keyturn.status;
    v_added := jsonb_strip_nulls(jsonb_build_object('reconciled', p_outcome, 'note', p_note,
                                                    'by', keyturn._calling_role()));
    UPDATE keyturn.action x
       SET updated_at = v_now, status = v_status, result = coalesce(x.result, '{}') || v_added
     WHERE x.id = a.id AND x.tenant = a.tenant;
    RETURN p_outcome;
END
$$;

CREATE OR REPLACE FUNCTION keyturn.reconcile(action_id uuid, outcome text, note text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN keyturn._reconcile('reconcile', NULL, reconcile.action_id, reconcile.outcome, reconcile.note);
END
$$;

-- The operator's queue of what keyturn cannot decide. safe_to_decide_after:
-- the end of the last attempt's lease, after which no keyturnd starts or
-- continues that provider call (it starts none past its lease's deadline
-- and bounds each by it), so an operator who asks the provider then sees
-- all there will be; not_sent_by_dispatcher: keyturnd's own account that
-- the last attempt sent nothing (keyturn.record_not_sent), which makes
-- failed the likely answer.
CREATE OR REPLACE FUNCTION keyturn.uncertain_actions()
RETURNS TABLE (action_id uuid, tenant text, tool text, attempts int, dispatched_at timestamptz, receipt jsonb,
               safe_to_decide_after timestamptz, not_sent_by_dispatcher boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('uncertain_actions');
    -- With the uncertain notifications (sql/064_notify.sql), whose tool is
    -- keyturn.notify.<channel>.
    RETURN QUERY
    SELECT u.* FROM (
        SELECT a.id, a.tenant, a.tool, a.attempts, a.dispatched_at, a.receipt, a.lease_expires_at,
               coalesce(t.dispatcher_account = 'not_sent', false)
          FROM keyturn.open_action o
          JOIN keyturn.action a ON a.id = o.action_id AND a.tenant = o.tenant
          LEFT JOIN keyturn.attempt t ON t.action_id = a.id AND t.tenant = a.tenant AND t.attempt = a.attempts
         WHERE o.status = 'uncertain' AND a.status = 'uncertain'
        UNION ALL
        SELECT * FROM keyturn._uncertain_notifications()) u
     ORDER BY 5, 1;
END
$$;

-- record_not_sent, and record_not_sent_for (p_what names the call): p_tenant
-- as in keyturn._lease. keyturnd's account that the attempt under p_lease
-- sent nothing (its provider call never started), for an action the sweep
-- made uncertain before keyturnd's complete(…, 'retry') arrived. It decides
-- nothing: the action stays uncertain, for an operator. Taken (true) only
-- for the uncertain action's last attempt under that lease, once: the same
-- account again is true and writes nothing; anything else is false and
-- changes nothing.
CREATE OR REPLACE FUNCTION keyturn._record_not_sent(p_what text, p_tenant text, p_id uuid, p_lease uuid, p_receipt jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    a         keyturn.action;
    v_taken   text;
BEGIN
    PERFORM keyturn._refuse_nested(p_what);
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    IF p_receipt IS NULL OR jsonb_typeof(p_receipt) <> 'object' THEN
        RAISE EXCEPTION 'keyturn: receipt must be a JSON object' USING ERRCODE = '22023';
    END IF;
    IF keyturn._is_notification(p_id) THEN
        RETURN keyturn._record_notification_not_sent(p_tenant, p_id, p_lease, p_receipt);
    END IF;
    SELECT x.* INTO a FROM keyturn.action x
     WHERE x.id = p_id AND (p_tenant IS NULL OR x.tenant = p_tenant)  -- the plain call: by id alone
       FOR UPDATE;
    IF NOT FOUND OR a.status <> 'uncertain' THEN
        RETURN false;
    END IF;
    v_taken := keyturn._attempt_not_sent(a.id, a.tenant, a.attempts, p_lease, p_receipt);
    IF v_taken = 'written' THEN
        PERFORM keyturn._append_event(a.id, a.tenant, a.principal, keyturn._calling_role(), NULL, 'uncertain',
                                      'uncertain', jsonb_build_object('dispatcher_account', 'not_sent',
                                                                      'attempt', a.attempts, 'lease_id', p_lease));
    END IF;
    RETURN v_taken <> 'refused';
END
$$;

-- The dispatcher's account that attempt p_attempt of the job p_id (an
-- action's or a notification's) sent nothing, kept on the attempt once:
-- 'written' now, 'kept' already (the same account again), 'refused' when
-- that attempt is not under p_lease. The caller has checked that the job is
-- uncertain, and writes the event.
CREATE OR REPLACE FUNCTION keyturn._attempt_not_sent(p_id uuid, p_tenant text, p_attempt int, p_lease uuid, p_receipt jsonb)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    t         keyturn.attempt;
    v_receipt jsonb;
BEGIN
    SELECT x.* INTO t FROM keyturn.attempt x
     WHERE x.action_id = p_id AND x.tenant = p_tenant AND x.attempt = p_attempt FOR UPDATE;
    IF NOT FOUND OR t.lease_id IS DISTINCT FROM p_lease THEN
        RETURN 'refused';
    END IF;
    IF t.dispatcher_account IS NOT NULL THEN
        RETURN 'kept';
    END IF;
    v_receipt := keyturn._redact(p_receipt);
    UPDATE keyturn.attempt x SET dispatcher_account = 'not_sent', dispatcher_receipt = v_receipt
     WHERE x.action_id = t.action_id AND x.tenant = t.tenant AND x.attempt = t.attempt;
    RETURN 'written';
END
$$;

CREATE OR REPLACE FUNCTION keyturn.record_not_sent(action_id uuid, lease_id uuid, receipt jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN keyturn._record_not_sent('record_not_sent', NULL, record_not_sent.action_id, record_not_sent.lease_id,
                                    record_not_sent.receipt);
END
$$;

-- An action's attempts, for the operator deciding an uncertain outcome:
-- who tried when, what came back (receipts are stored redacted). plpgsql,
-- not sql: Citus cannot plan a parameter of an SQL function's statement on
-- distributed tables.
CREATE OR REPLACE FUNCTION keyturn.attempts(action_id uuid)
RETURNS TABLE (attempt int, worker text, started_at timestamptz, finished_at timestamptz, outcome text,
               receipt jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('attempts');
    RETURN QUERY
    SELECT t.attempt, t.worker, t.started_at, t.finished_at, t.outcome::text, t.receipt
      FROM keyturn.attempt t
     WHERE t.action_id = attempts.action_id  -- by id alone: operators reconcile across tenants
     ORDER BY t.attempt;
END
$$;


-- ==== sql/061_dispatch_batch.sql ====

-- Batched dispatcher calls (an addition to the dispatcher calls,
-- docs/sql-api.md, "Dispatcher").
--
-- keyturn.begin_dispatch_many and keyturn.complete_many do, per element,
-- exactly what keyturn.begin_dispatch and keyturn.complete do, because they
-- run the same code: keyturn._begin_set and keyturn._complete_set
-- (sql/060_dispatch.sql), which the single calls run on a set of one. A
-- batch is one statement of each kind (the row locks, the checks, the
-- UPDATEs, the INSERT) instead of one per element, and one durable commit
-- covers it instead of one commit per action. begin_dispatch_many is still
-- committed before any provider call: keyturnd calls a provider only for the
-- elements it answered dispatch = true, after the COMMIT.
--
-- One bad element never fails the batch: every condition under which the
-- single call raises for one action (22023: unknown outcome word, negative
-- retry_after, a receipt keyturn cannot store, checked before any lock;
-- 55000: unknown action, wrong or lapsed lease, wrong status, checked on the
-- row locked FOR UPDATE) is answered in the element's `error` column as
-- '<SQLSTATE> <message>', with nothing changed for it.
--
-- Errors about the batch as a whole (NULL or unequal arrays, more than 1000
-- elements) raise 22023, changing nothing. Anything unexpected (a statement
-- timeout, a serialization failure, a deadlock) raises as usual and rolls the
-- whole batch back; the caller may retry the same batch.
--
-- Rows are answered in input order, one per element. A batch that names an
-- action more than once runs in rounds (keyturn._batch_rounds, in
-- extension/src/args.rs with the checks of the arrays), every
-- action's first occurrence in the first, its second in the next, so the
-- second occurrence sees the first one's effect, as calls one after another
-- would.

-- The elements of p_arr at the positions p_idx, in that order: a round's
-- share of a batch.
CREATE OR REPLACE FUNCTION keyturn._batch_pick(p_arr anyarray, p_idx int[])
RETURNS anyarray
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RETURN ARRAY(SELECT p_arr[u.i] FROM unnest(p_idx) WITH ORDINALITY AS u (i, o) ORDER BY u.o);
END
$$;

-- A batch of begin_dispatch, in rounds when it names an action twice:
-- begin_dispatch_many's answers. p_tenant as in keyturn._begin_set.
CREATE OR REPLACE FUNCTION keyturn._begin_many(p_tenant text, p_ids uuid[], p_leases uuid[])
RETURNS TABLE (action_id uuid, dispatch boolean, error text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n        int;
    v_rounds int[];
    v_idx    int[];
    v_ords   int[] := '{}';
    v_disp   boolean[] := '{}';
    v_errors text[] := '{}';
BEGIN
    n := keyturn._batch_check_arrays(cardinality(p_ids), cardinality(p_leases), 'action_ids and lease_ids');
    v_rounds := keyturn._batch_rounds(p_ids);
    IF v_rounds IS NULL THEN
        RETURN QUERY
        SELECT p_ids[b.ord], b.dispatch, '55000 ' || b.problem
          FROM keyturn._begin_set(p_tenant, ARRAY(SELECT generate_series(1, n)), p_ids, p_leases) b
         ORDER BY b.ord;
        RETURN;
    END IF;
    FOR r IN 1 .. (SELECT max(x) FROM unnest(v_rounds) x) LOOP
        v_idx := ARRAY(SELECT i FROM generate_subscripts(v_rounds, 1) i WHERE v_rounds[i] = r ORDER BY i);
        SELECT v_ords || array_agg(b.ord), v_disp || array_agg(b.dispatch),
               v_errors || array_agg('55000 ' || b.problem)
          INTO v_ords, v_disp, v_errors
          FROM keyturn._begin_set(p_tenant, v_idx, keyturn._batch_pick(p_ids, v_idx),
                                  keyturn._batch_pick(p_leases, v_idx)) b;
    END LOOP;
    RETURN QUERY
    SELECT p_ids[b.ord], b.dispatch, b.error
      FROM unnest(v_ords, v_disp, v_errors) AS b (ord, dispatch, error)
     ORDER BY b.ord;
END
$$;

-- keyturn.begin_dispatch_many(action_ids, lease_ids): per pair, exactly
-- keyturn.begin_dispatch. dispatch = true: now 'executing', call the provider.
-- dispatch = false, error NULL: invalidated (never call the provider).
-- dispatch = false, error '55000 ...': refused, nothing changed (never call
-- the provider; the lease lapses or has lapsed and the sweep requeues it).
-- Planned once per backend, as begin_dispatch.
CREATE OR REPLACE FUNCTION keyturn.begin_dispatch_many(action_ids uuid[], lease_ids uuid[])
RETURNS TABLE (action_id uuid, dispatch boolean, error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('begin_dispatch_many');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    RETURN QUERY SELECT * FROM keyturn._begin_many(NULL, begin_dispatch_many.action_ids,
                                                   begin_dispatch_many.lease_ids);
END
$$;

-- A batch of complete, in rounds when it names an action twice:
-- complete_many's answers. p_tenant as in keyturn._begin_set.
CREATE OR REPLACE FUNCTION keyturn._complete_many(p_tenant text, p_ids uuid[], p_leases uuid[], p_outcomes text[],
                                       p_receipts jsonb[], p_retry_after interval[])
RETURNS TABLE (action_id uuid, status text, error text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n          int;
    v_rounds   int[];
    v_idx      int[];
    v_ords     int[] := '{}';
    v_statuses text[] := '{}';
    v_errors   text[] := '{}';
BEGIN
    n := keyturn._batch_check_arrays(cardinality(p_ids), cardinality(p_leases), 'action_ids and lease_ids');
    PERFORM keyturn._batch_check_arrays(n, cardinality(p_outcomes), 'action_ids and outcomes');
    PERFORM keyturn._batch_check_arrays(n, cardinality(p_receipts), 'action_ids and receipts');
    PERFORM keyturn._batch_check_arrays(n, cardinality(p_retry_after), 'action_ids and retry_after');
    v_rounds := keyturn._batch_rounds(p_ids);
    IF v_rounds IS NULL THEN
        RETURN QUERY
        SELECT p_ids[c.ord], c.status, c.problem
          FROM keyturn._complete_set(p_tenant, ARRAY(SELECT generate_series(1, n)), p_ids, p_leases,
                                     p_outcomes, p_receipts, p_retry_after) c
         ORDER BY c.ord;
        RETURN;
    END IF;
    FOR r IN 1 .. (SELECT max(x) FROM unnest(v_rounds) x) LOOP
        v_idx := ARRAY(SELECT i FROM generate_subscripts(v_rounds, 1) i WHERE v_rounds[i] = r ORDER BY i);
        SELECT v_ords || array_agg(c.ord), v_statuses || array_agg(c.status), v_errors || array_agg(c.problem)
          INTO v_ords, v_statuses, v_errors
          FROM keyturn._complete_set(p_tenant, v_idx, keyturn._batch_pick(p_ids, v_idx),
                                     keyturn._batch_pick(p_leases, v_idx),
                                     keyturn._batch_pick(p_outcomes, v_idx),
                                     keyturn._batch_pick(p_receipts, v_idx),
                                     keyturn._batch_pick(p_retry_after, v_idx)) c;
    END LOOP;
    RETURN QUERY
    SELECT p_ids[c.ord], c.status, c.error
      FROM unnest(v_ords, v_statuses, v_errors) AS c (ord, status, error)
     ORDER BY c.ord;
END
$$;

-- keyturn.complete_many(action_ids, lease_ids, outcomes, receipts, retry_after):
-- per element, exactly keyturn.complete (a NULL receipt is '{}', a NULL
-- retry_after the database's backoff, as there). status = the new status and
-- error NULL; or status NULL and error '<SQLSTATE> ...' (55000 wrong/lapsed
-- lease or status, e.g. already swept to uncertain; 22023 bad outcome word,
-- negative retry_after, or a receipt keyturn cannot store) with nothing
-- changed for that element. Planned once per backend, as complete.
CREATE OR REPLACE FUNCTION keyturn.complete_many(action_ids uuid[], lease_ids uuid[], outcomes text[],
                                      receipts jsonb[], retry_after interval[])
RETURNS TABLE (action_id uuid, status text, error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('complete_many');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    RETURN QUERY SELECT * FROM keyturn._complete_many(NULL, complete_many.action_ids, complete_many.lease_ids,
                                                      complete_many.outcomes, complete_many.receipts,
                                                      complete_many.retry_after);
END
$$;


-- ==== sql/062_dispatch_for.sql ====

-- The dispatcher's and the operator's calls with the tenant named (an
-- addition to the dispatcher protocol, docs/sql-api.md, "Dispatching tenant
-- by tenant").
--
-- Once keyturn's own tables are distributed by tenant (Citus, layout B,
-- docs/scale-out.md), every call that changes an action must run whole on
-- the worker that holds its tenant's shards: the lifecycle trigger fires
-- there, and it writes the event only in the backend that ran keyturn's
-- call. keyturn.citus_distribute() registers each call below with Citus so
-- that it is sent there (force_delegation), and Citus then pins every
-- statement of the call to that tenant. So each takes the tenant first, and
-- keyturnd, which asks keyturn.dispatch_by_tenant() at start, finds the
-- tenants with work due (tenants_due) and calls them tenant by tenant.
--
-- Each is its plain form with every statement limited to the tenant named:
-- the plain and the tenant-explicit forms run the same code
-- (keyturn._lease, _begin_many, _complete_many, _sweep, _reconcile,
-- _attachments_of, _file_content_of), whose statements say "p_tenant IS
-- NULL OR x.tenant = p_tenant". Only the due scan is a query of its own
-- (keyturn._due_for, sql/060_dispatch.sql). An element of another tenant is answered as an
-- unknown action (55000); nothing of another tenant is read or changed.
--
-- Authorized by role alone, as the plain calls: the dispatcher's and the
-- operator's calls act for every tenant, and the tenant only routes. A call
-- without its tenant is refused (22023, keyturn._require_tenant, in Rust:
-- extension/src/route_guard.rs, one rule for every _for call): a NULL would
-- mean every tenant to the statements it shares with the plain call.

-- The tenants with dispatcher work due, oldest work first: to_lease counts
-- the queued actions due now whose tool's provider is in providers (NULL =
-- any) and the notifications due on those providers, to_sweep what the
-- sweep would move on or delete (pending past expiry, a lease lapsed, an
-- unbound file a day old). A plain read of every
-- shard without locks: a hint of where to call lease_for and sweep_for,
-- which decide on the locked rows.
CREATE OR REPLACE FUNCTION keyturn.tenants_due(providers text[] DEFAULT NULL, max_tenants int DEFAULT 100)
RETURNS TABLE (tenant text, to_lease bigint, to_sweep bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    IF tenants_due.max_tenants IS NULL OR tenants_due.max_tenants NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'keyturn: max_tenants must be from 1 to 10000, not %', tenants_due.max_tenants
            USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._refuse_nested('tenants_due');
    RETURN QUERY
    SELECT d.tenant, sum(d.lease)::bigint, sum(d.sweep)::bigint
      FROM (SELECT o.tenant, 1 AS lease, 0 AS sweep, o.next_attempt_at AS due
              FROM keyturn.open_action o
              JOIN keyturn.action a ON a.id = o.action_id AND a.tenant = o.tenant
             WHERE o.status = 'queued' AND o.next_attempt_at <= v_now AND a.status = 'queued'
               AND (tenants_due.providers IS NULL OR EXISTS (
                        SELECT 1 FROM keyturn.tool_version v
                         WHERE v.tool = a.tool AND v.version = a.tool_version
                           AND v.provider = ANY (tenants_due.providers)))
            UNION ALL
            SELECT o.tenant, 0, 1, o.expires_at FROM keyturn.open_action o
             WHERE o.status = 'pending' AND o.expires_at < v_now
            UNION ALL
            SELECT o.tenant, 0, 1, o.lease_expires_at FROM keyturn.open_action o
             WHERE o.status IN ('leased', 'executing') AND o.lease_expires_at < v_now
            UNION ALL
            SELECT f.tenant, 0, 1, f.staged_at FROM keyturn.staged_file f
             WHERE f.action_id IS NULL AND f.staged_at < v_now - interval '24 hours'
            -- Notifications (sql/064_notify.sql): due, and lapsed leases.
            UNION ALL
            SELECT n.tenant, 1, 0, n.next_attempt_at FROM keyturn.notification n
             WHERE n.status = 'queued' AND n.next_attempt_at <= v_now
               AND (tenants_due.providers IS NULL OR keyturn._notify_provider(n.channel) = ANY (tenants_due.providers))
            UNION ALL
            SELECT n.tenant, 0, 1, n.lease_expires_at FROM keyturn.notification n
             WHERE n.status IN ('leased', 'executing') AND n.lease_expires_at < v_now) d
     GROUP BY d.tenant
     ORDER BY min(d.due), d.tenant
     LIMIT tenants_due.max_tenants;
END
$$;

-- in_tenant, since "tenant" names a column it returns.
CREATE OR REPLACE FUNCTION keyturn.lease_for(in_tenant text, worker text, max_jobs int DEFAULT 16,
                                  lease_for interval DEFAULT '30 seconds', providers text[] DEFAULT NULL)
RETURNS TABLE (action_id uuid, lease_id uuid, tenant text, tool text, provider text, params jsonb,
               idempotency_key text, attempt int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(lease_for.in_tenant, 'lease_for');
    RETURN QUERY SELECT * FROM keyturn._lease('lease_for', lease_for.in_tenant, lease_for.worker, lease_for.max_jobs,
                                              lease_for.lease_for, lease_for.providers);
END
$$;

CREATE OR REPLACE FUNCTION keyturn.begin_dispatch_for(tenant text, action_id uuid, lease_id uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r record;
BEGIN
    PERFORM keyturn._require_tenant(begin_dispatch_for.tenant, 'begin_dispatch_for');
    PERFORM keyturn._refuse_nested('begin_dispatch_for');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    SELECT * INTO r FROM keyturn._begin_set(begin_dispatch_for.tenant, '{1}', ARRAY[begin_dispatch_for.action_id],
                                            ARRAY[begin_dispatch_for.lease_id]);
    PERFORM keyturn._raise_lease_problem(r.problem);
    RETURN r.dispatch;
END
$$;

CREATE OR REPLACE FUNCTION keyturn.begin_dispatch_many_for(tenant text, action_ids uuid[], lease_ids uuid[])
RETURNS TABLE (action_id uuid, dispatch boolean, error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(begin_dispatch_many_for.tenant, 'begin_dispatch_many_for');
    PERFORM keyturn._refuse_nested('begin_dispatch_many_for');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    RETURN QUERY SELECT * FROM keyturn._begin_many(begin_dispatch_many_for.tenant, begin_dispatch_many_for.action_ids,
                                                   begin_dispatch_many_for.lease_ids);
END
$$;

CREATE OR REPLACE FUNCTION keyturn.complete_for(tenant text, action_id uuid, lease_id uuid, outcome text,
                                     receipt jsonb DEFAULT '{}', retry_after interval DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_error text := keyturn._complete_args_error(complete_for.outcome, complete_for.retry_after, complete_for.receipt);
    r       record;
BEGIN
    PERFORM keyturn._require_tenant(complete_for.tenant, 'complete_for');
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._refuse_nested('complete_for');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    SELECT * INTO r FROM keyturn._complete_set(complete_for.tenant, '{1}', ARRAY[complete_for.action_id],
                                               ARRAY[complete_for.lease_id], ARRAY[complete_for.outcome],
                                               ARRAY[complete_for.receipt], ARRAY[complete_for.retry_after]);
    -- Only a lease problem is left: the arguments were checked above.
    PERFORM keyturn._raise_lease_problem(substr(r.problem, 7));
    RETURN r.status;
END
$$;

CREATE OR REPLACE FUNCTION keyturn.complete_many_for(tenant text, action_ids uuid[], lease_ids uuid[], outcomes text[],
                                          receipts jsonb[], retry_after interval[])
RETURNS TABLE (action_id uuid, status text, error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(complete_many_for.tenant, 'complete_many_for');
    PERFORM keyturn._refuse_nested('complete_many_for');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    RETURN QUERY SELECT * FROM keyturn._complete_many(complete_many_for.tenant, complete_many_for.action_ids,
                                                      complete_many_for.lease_ids, complete_many_for.outcomes,
                                                      complete_many_for.receipts, complete_many_for.retry_after);
END
$$;

CREATE OR REPLACE FUNCTION keyturn.sweep_for(tenant text)
RETURNS TABLE (expired int, requeued int, uncertain int, files int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(sweep_for.tenant, 'sweep_for');
    PERFORM keyturn._refuse_nested('sweep_for');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    RETURN QUERY SELECT * FROM keyturn._sweep(sweep_for.tenant);
END
$$;

CREATE OR REPLACE FUNCTION keyturn.attachments_for(tenant text, action_id uuid, lease_id uuid)
RETURNS TABLE (param text, ord int, file_id uuid, sha256 text, filename text, content_type text, size bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(attachments_for.tenant, 'attachments_for');
    RETURN QUERY SELECT * FROM keyturn._attachments_of('attachments_for', attachments_for.tenant,
                                                       attachments_for.action_id, attachments_for.lease_id);
END
$$;

CREATE OR REPLACE FUNCTION keyturn.file_content_for(tenant text, action_id uuid, lease_id uuid, file_id uuid)
RETURNS bytea
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(file_content_for.tenant, 'file_content_for');
    RETURN keyturn._file_content_of('file_content_for', file_content_for.tenant, file_content_for.action_id,
                                    file_content_for.lease_id, file_content_for.file_id);
END
$$;

CREATE OR REPLACE FUNCTION keyturn.reconcile_for(tenant text, action_id uuid, outcome text, note text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(reconcile_for.tenant, 'reconcile_for');
    RETURN keyturn._reconcile('reconcile_for', reconcile_for.tenant, reconcile_for.action_id,
                              reconcile_for.outcome, reconcile_for.note);
END
$$;

CREATE OR REPLACE FUNCTION keyturn.record_not_sent_for(tenant text, action_id uuid, lease_id uuid, receipt jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(record_not_sent_for.tenant, 'record_not_sent_for');
    RETURN keyturn._record_not_sent('record_not_sent_for', record_not_sent_for.tenant, record_not_sent_for.action_id,
                                    record_not_sent_for.lease_id, record_not_sent_for.receipt);
END
$$;


-- ==== sql/063_mcp.sql ====

-- keyturn over MCP (docs/mcp.md): what keyturnd's /mcp asks the database.
--
-- keyturnd decides nothing here either. Which tools an agent sees and how
-- they are described (keyturn.mcp_tools), what a read tool returns
-- (keyturn.read: selected as the agent, under its RLS, fenced), whether an
-- upstream read may run (keyturn.upstream_read), what an action's status
-- tells its agent (keyturn.mcp_action_status) and whether a client's retry
-- is the call it proposed (keyturn.mcp_resume) and what its task is
-- (keyturn.mcp_task), how a tool discovered on an
-- upstream MCP server is registered (keyturn.register_discovered_tool:
-- disabled, classified fail-closed, its definition hashed) and what a
-- changed upstream definition does to an approved call
-- (keyturn.check_upstream_tool: nothing is sent, the action is invalidated)
-- are all answered here.

-- The sql part of a read tool's spec: {"table", "key", "select": [columns],
-- "where": [columns], "max_rows": n}, checked against the catalog like a
-- write form's. Returns what keyturn._spec_sql returns, with select and
-- max_rows and without set and version.
CREATE OR REPLACE FUNCTION keyturn._spec_sql_read(p_tool text, p_sql jsonb)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    c        jsonb;
    v_relid  oid;
    v_key    text;
    v_select text[] := '{}';
    v_where  text[] := '{}';
    v_types  jsonb;
    v_max    int := 50;
    v_bad    text;
BEGIN
    IF p_sql IS NULL OR jsonb_typeof(p_sql) <> 'object' THEN
        RAISE EXCEPTION 'keyturn: sql read tool % needs spec.sql = {"table", "key", "select", "where", "max_rows"}', p_tool
            USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._spec_keys(p_sql, 'spec.sql of a read tool', ARRAY['table', 'key', 'select', 'where', 'max_rows']);
    -- A table, as for a write: a view selects with its owner's rights, past
    -- the caller's row-level security, and a materialized view has none.
    v_relid := keyturn._spec_table(p_sql -> 'table', '{r,p}');
    v_bad := (SELECT string_agg(p, '; ') FROM keyturn._agent_table_problems(v_relid, true) p);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: agents could read % past its row-level security: %', v_relid::regclass, v_bad
            USING ERRCODE = '22023',
                  HINT = 'Make a role that is no agent the table''s owner, and take BYPASSRLS from agent roles, then register again.';
    END IF;
    v_key := p_sql ->> 'key';
    v_types := jsonb_build_object(v_key, keyturn._spec_column(v_relid, p_sql -> 'key', 'spec.sql.key'));
    IF jsonb_typeof(p_sql -> 'select') IS DISTINCT FROM 'array' OR jsonb_array_length(p_sql -> 'select') = 0 THEN
        RAISE EXCEPTION 'keyturn: spec.sql.select must be a non-empty array of column names' USING ERRCODE = '22023';
    END IF;
    FOR c IN SELECT jsonb_array_elements(p_sql -> 'select') LOOP
        v_types := v_types || jsonb_build_object(c #>> '{}', keyturn._spec_column(v_relid, c, 'spec.sql.select'));
        IF c #>> '{}' = ANY (v_select) THEN
            RAISE EXCEPTION 'keyturn: spec.sql.select names % twice', c USING ERRCODE = '22023';
        END IF;
        v_select := v_select || (c #>> '{}');
    END LOOP;
    -- A read form may have no filter: it reads the first max_rows rows the
    -- agent can see, by key.
    SELECT w.p_types, w.o_where INTO v_types, v_where FROM keyturn._spec_where(v_relid, p_sql, v_types) w;
    IF p_sql ? 'max_rows' THEN
        v_max := keyturn._spec_positive_int(p_sql -> 'max_rows', 'spec.sql.max_rows', 1000);
    END IF;
    RETURN (SELECT jsonb_build_object(
                'schema', n.nspname, 'table', r.relname, 'key', v_key,
                'select', to_jsonb(v_select), 'where', to_jsonb(v_where), 'types', v_types,
                'max_rows', v_max)
              FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace
             WHERE r.oid = v_relid);
END
$$;

-- The JSON Schema of one value of a column of type p_type, for an agent:
-- what it should send (keyturn casts text to the column's type either way).
CREATE OR REPLACE FUNCTION keyturn._mcp_value_schema(p_type text)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE
        WHEN p_type IN ('smallint', 'integer', 'bigint') THEN '{"type": "integer"}'::jsonb
        WHEN p_type IN ('real', 'double precision') OR p_type LIKE 'numeric%' THEN '{"type": "number"}'::jsonb
        WHEN p_type = 'boolean' THEN '{"type": "boolean"}'::jsonb
        WHEN p_type IN ('json', 'jsonb') THEN '{}'::jsonb
        ELSE '{"type": "string"}'::jsonb END
$$;

-- A form's where part: each column one value or a list of 1 to 1000.
CREATE OR REPLACE FUNCTION keyturn._mcp_where_schema(v keyturn.tool_version)
RETURNS jsonb
-- plpgsql: a SQL function of a row type with subqueries is never inlined.
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RETURN jsonb_build_object(
            'type', 'object',
            'properties', coalesce((
                SELECT jsonb_object_agg(c, jsonb_build_object('anyOf', jsonb_build_array(
                           keyturn._mcp_value_schema(v.sql_types ->> c),
                           jsonb_build_object('type', 'array', 'items', keyturn._mcp_value_schema(v.sql_types ->> c),
                                              'minItems', 1, 'maxItems', 1000))))
                  FROM unnest(v.sql_where) AS c), '{}'),
            'additionalProperties', false);
END
$$;

-- What tools/list gives as a tool's inputSchema: an external tool's
-- params_schema; an sql write tool's form {"where", "set"} with the columns
-- it may filter on and set; an sql read tool's {"where"}.
CREATE OR REPLACE FUNCTION keyturn._mcp_input_schema(v keyturn.tool_version)
RETURNS jsonb
-- plpgsql: a SQL function of a row type with subqueries is never inlined.
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RETURN CASE
            WHEN v.executor = 'external' THEN v.params_schema
            -- A read tool for agents' own queries: listed, but it reads
            -- nothing over MCP (keyturn._readable).
            WHEN v.kind = 'read' AND v.executor IS NULL THEN coalesce(v.params_schema, '{"type": "object"}')
            WHEN v.kind = 'read' THEN jsonb_build_object(
                'type', 'object',
                'properties', jsonb_build_object('where', keyturn._mcp_where_schema(v)),
                'additionalProperties', false)
            ELSE jsonb_build_object(
                'type', 'object',
                'properties', jsonb_build_object(
                    'where', keyturn._mcp_where_schema(v) || '{"minProperties": 1}',
                    'set', jsonb_build_object(
                        'type', 'object',
                        'properties', coalesce((SELECT jsonb_object_agg(c, keyturn._mcp_value_schema(v.sql_types ->> c))
                                                  FROM unnest(v.sql_set) AS c), '{}'),
                        'additionalProperties', false, 'minProperties', 1)),
                'required', '["where", "set"]'::jsonb,
                'additionalProperties', false) END;
END
$$;

-- A tool's MCP annotations: readOnlyHint true only for a read tool; a write
-- tool is destructive unless its effect is reversible, and never
-- idempotent (each call is a new proposal); open world when keyturnd
-- carries it out beyond the database.
CREATE OR REPLACE FUNCTION keyturn._mcp_annotations(v keyturn.tool_version)
RETURNS jsonb
-- plpgsql: a SQL function of a row type with subqueries is never inlined.
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RETURN CASE WHEN v.kind = 'read'
                    THEN jsonb_build_object('readOnlyHint', true, 'openWorldHint', v.executor IS NOT DISTINCT FROM 'external')
                    ELSE jsonb_build_object('readOnlyHint', false, 'destructiveHint', v.effect <> 'reversible',
                                            'idempotentHint', false, 'openWorldHint', v.executor = 'external') END;
END
$$;

-- Agent: the tools the calling principal may call over MCP, by name:
-- enabled and granted to it (a grant that has not ended); upstream names
-- the upstream MCP server of a discovered tool. A read tool without an
-- executor is listed too, as every granted tool is, and a call of it
-- answers that it reads nothing (keyturn._readable).
CREATE OR REPLACE FUNCTION keyturn.mcp_tools()
RETURNS TABLE (name text, kind text, description text, input_schema jsonb, annotations jsonb, upstream text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
BEGIN
    PERFORM keyturn._refuse_nested('mcp_tools');
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    RETURN QUERY
    -- ROW(v.*), not v: on layout B (Citus) this query runs on the worker
    -- that holds the tenant's tool_grant shard, rewritten to the shards,
    -- where v's row type would be the shard's and neither function takes it.
    SELECT t.name, v.kind::text, coalesce(v.description, v.summary),
           keyturn._mcp_input_schema(ROW(v.*)::keyturn.tool_version),
           keyturn._mcp_annotations(ROW(v.*)::keyturn.tool_version), v.upstream
      FROM keyturn.tool_grant g
      JOIN keyturn.tool t ON t.name = g.tool
      JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
     WHERE g.tenant = v_tenant AND g.principal = v_principal
       AND keyturn._grant_live(g.valid_until)
       AND t.enabled
     ORDER BY t.name;
END
$$;

-- The enabled read tool p_tool for a read by the calling identity, with its
-- current version: 42704 unknown, disabled or not a read tool; 42501 no
-- identity, membership or grant; 22023 it has no executor (a read tool for
-- the agent's own queries) or its projection is not registered (nothing is
-- read).
CREATE OR REPLACE FUNCTION keyturn._readable(p_tenant text, p_principal text, p_tool text)
RETURNS keyturn.tool_version
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v keyturn.tool_version;
BEGIN
    PERFORM keyturn._require_member(p_tenant, p_principal, keyturn.current_session());
    SELECT x.* INTO v FROM keyturn.tool t
      JOIN keyturn.tool_version x ON x.tool = t.name AND x.version = t.version
     WHERE t.name = p_tool AND t.enabled AND x.kind = 'read';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'keyturn: % is no enabled read tool', coalesce(keyturn._quoted(p_tool), 'NULL')
            USING ERRCODE = '42704',
                  HINT = 'keyturn.mcp_tools() lists the tools this principal may call.';
    END IF;
    IF NOT keyturn._has_grant(p_tenant, p_principal, v.tool) THEN
        RAISE EXCEPTION 'keyturn: principal % holds no grant for tool % in tenant %', p_principal, p_tool, p_tenant
            USING ERRCODE = '42501',
                  HINT = 'An admin grants tools with keyturn.grant_tool(tenant, principal, tool).';
    END IF;
    IF v.executor IS NULL THEN
        RAISE EXCEPTION 'keyturn: read tool % has no executor: keyturn reads nothing for it', p_tool
            USING ERRCODE = '22023',
                  HINT = 'It marks reads the agent makes with its own queries. An admin registers a version with an sql read spec (executor sql, projection, sql) for it to read over MCP.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM keyturn.projection p WHERE p.provider = v.projection) THEN
        RAISE EXCEPTION 'keyturn: no projection is registered for provider %, the projection of read tool %',
                keyturn._quoted(v.projection), p_tool
            USING ERRCODE = '22023',
                  HINT = 'An unreviewed integration contributes nothing: an admin registers the fields it may contribute with keyturn.register_projection(provider, spec).';
    END IF;
    RETURN v;
END
$$;

-- The grant of read tool v held to what a read can honor, with arguments
-- p_args (and, once known, the rows p_rows it answers with): its params scope
-- holds for the arguments, as propose holds a write's params to it, and its
-- max_targets bounds the rows one sql read may answer with. A read changes
-- nothing and is not counted, so a grant that limits uses, or targets of an
-- upstream read (which resolves none), cannot be honored: it fails closed
-- (keyturn.grant_tool refuses to make one, but a tool granted as a write
-- may become a read in a later version). Returns the scope's max_targets.
-- 42501 for each, naming what failed.
CREATE OR REPLACE FUNCTION keyturn._read_grant(p_tenant text, p_principal text, v keyturn.tool_version,
                                    p_args jsonb, p_rows int DEFAULT NULL)
RETURNS int
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    g     keyturn.tool_grant;
    v_err text;
BEGIN
    SELECT x.* INTO g FROM keyturn.tool_grant x
     WHERE x.tenant = p_tenant AND x.principal = p_principal AND x.tool = v.tool;
    IF g.max_uses IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: the grant of read tool % to principal % limits its uses (max_uses %), which a read cannot honor: reads are not counted',
                v.tool, p_principal, g.max_uses
            USING ERRCODE = '42501',
                  HINT = 'An admin grants it again without max_uses: keyturn.grant_tool(tenant, principal, tool, scope, valid_until).';
    END IF;
    IF g.scope ? 'max_targets' AND v.executor IS DISTINCT FROM 'sql' THEN
        RAISE EXCEPTION 'keyturn: the grant of read tool % to principal % bounds its targets (max_targets), which an upstream read cannot honor: it resolves none',
                v.tool, p_principal
            USING ERRCODE = '42501',
                  HINT = 'An admin grants it again without max_targets; a params scope bounds an upstream read''s arguments.';
    END IF;
    v_err := keyturn._scope_violation(g.scope, p_args, p_rows);
    IF v_err IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: outside the scope of the grant of tool % to principal %: %', v.tool, p_principal, v_err
            USING ERRCODE = '42501',
                  HINT = 'Read within the grant''s scope, or ask an admin to widen it.';
    END IF;
    RETURN (g.scope ->> 'max_targets')::int;
END
$$;

-- What is wrong with a read form {"where": {col: value | [values]}}, or NULL.
CREATE OR REPLACE FUNCTION keyturn._read_form_error(v keyturn.tool_version, p_args jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    k text;
    x jsonb;
BEGIN
    IF p_args IS NULL OR jsonb_typeof(p_args) <> 'object'
       OR EXISTS (SELECT 1 FROM jsonb_object_keys(p_args) j WHERE j <> 'where')
       OR (p_args ? 'where' AND jsonb_typeof(p_args -> 'where') <> 'object') THEN
        RETURN format('arguments of read tool %s must be {"where": {...}} or {}', v.tool);
    END IF;
    FOR k, x IN SELECT e.key, e.value FROM jsonb_each(coalesce(p_args -> 'where', '{}')) e LOOP
        IF NOT k = ANY (v.sql_where) THEN
            RETURN format('tool %s may not filter on %s (filterable columns: %s)',
                          v.tool, keyturn._quoted(k), coalesce(nullif(array_to_string(v.sql_where, ', '), ''), 'none'));
        END IF;
        IF jsonb_typeof(x) = 'array' THEN
            IF jsonb_array_length(x) NOT BETWEEN 1 AND 1000
               OR EXISTS (SELECT 1 FROM jsonb_array_elements(x) y
                           WHERE jsonb_typeof(y) NOT IN ('string', 'number', 'boolean')) THEN
                RETURN format('where.%s must list 1 to 1000 strings, numbers or booleans', k);
            END IF;
        ELSIF jsonb_typeof(x) NOT IN ('string', 'number', 'boolean') THEN
            RETURN format('where.%s must be a string, number, boolean or a list of them', k);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- Agent: runs the sql read tool p_tool with its form as the caller (its
-- role, under its row-level security: keyturn._exec_as), at most max_rows
-- rows by key, and returns exactly what keyturn.fence gives for the tool's
-- projection and {"rows": [{column: value}, ...]} (the evidence it records
-- included). No approval: a read changes nothing.
CREATE OR REPLACE FUNCTION keyturn.read(tool text, arguments jsonb DEFAULT '{}')
RETURNS TABLE (guard text, reference text, marker text, evidence_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_caller    oid := keyturn._calling_role()::regrole::oid;
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v           keyturn.tool_version;
    v_args      jsonb := coalesce(read.arguments, '{}');
    v_err       text;
    v_sql       text;
    v_rows      jsonb;
    v_max       int;
    v_table     text;
BEGIN
    PERFORM keyturn._refuse_nested('read');
    v := keyturn._readable(v_tenant, v_principal, read.tool);
    IF v.executor IS DISTINCT FROM 'sql' THEN
        RAISE EXCEPTION 'keyturn: % is an upstream read tool; keyturnd calls it (keyturn.upstream_read)', read.tool
            USING ERRCODE = '22023';
    END IF;
    v_err := keyturn._read_form_error(v, v_args);
    IF v_err IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: %', v_err USING ERRCODE = '22023';
    END IF;
    v_max := keyturn._read_grant(v_tenant, v_principal, v, v_args);
    -- Its owner reads past row-level security that is not forced, and may
    -- turn it off: a table an agent's role owns serves nothing
    -- (keyturn._tool_table), nor does one whose owner's role the caller is
    -- a member of (thirty-second red-team pass, docs/security.md row 143).
    v_table := keyturn._tool_table(v);
    IF pg_has_role(v_caller, (SELECT c.relowner FROM pg_class c WHERE c.oid = v_table::regclass), 'MEMBER') THEN
        RAISE EXCEPTION 'keyturn: the caller owns % or is a member of its owner, and would read it past its row-level security', v_table
            USING ERRCODE = '42501',
                  HINT = 'An admin makes a role that is no agent the table''s owner.';
    END IF;
    -- Column names only from the tool's registered lists; values only from
    -- the parameter (keyturn._form_where), never spliced in.
    v_sql := format('SELECT jsonb_build_object(%s) FROM %s AS t WHERE %s ORDER BY t.%I LIMIT %s',
                    (SELECT string_agg(format('%L, t.%I', c, c), ', ' ORDER BY o)
                       FROM unnest(v.sql_select) WITH ORDINALITY AS s (c, o)),
                    v_table,
                    coalesce(nullif(keyturn._form_where(v, jsonb_build_object('where', coalesce(v_args -> 'where', '{}'))), ''), 'true'),
                    v.sql_key, v.max_rows);
    BEGIN
        v_rows := keyturn._exec_as(v_caller, v_sql,
                                   keyturn._form_arg(jsonb_build_object('where', coalesce(v_args -> 'where', '{}')),
                                                     v.sql_types));
    EXCEPTION WHEN data_exception THEN
        -- Not SQLERRM, which quotes the value into the server log (row 133).
        RAISE EXCEPTION 'keyturn: where holds a value its column in % cannot read (SQLSTATE %)',
                format('%I.%I', v.sql_schema, v.sql_table), SQLSTATE
            USING ERRCODE = '22023';
    END;
    -- More rows than the grant's max_targets: refused, not cut (as a write
    -- that resolves too many targets is).
    IF jsonb_array_length(v_rows) > v_max THEN
        PERFORM keyturn._read_grant(v_tenant, v_principal, v, v_args, jsonb_array_length(v_rows));
    END IF;
    RETURN QUERY SELECT f.guard, f.reference, f.marker, f.evidence_id
                   FROM keyturn.fence(v.projection, jsonb_build_object('rows', v_rows)) f;
END
$$;

-- Agent: whether the calling identity may call the upstream read tool
-- p_tool with these arguments (checked against its params schema, and for
-- credential material), and what keyturnd calls: the upstream, the tool's
-- name there, and the projection that fences what comes back
-- (keyturn.fence).
CREATE OR REPLACE FUNCTION keyturn.upstream_read(tool text, arguments jsonb DEFAULT '{}')
RETURNS TABLE (upstream text, upstream_tool text, projection text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v       keyturn.tool_version;
    v_path  text;
    v_err   text;
BEGIN
    PERFORM keyturn._refuse_nested('upstream_read');
    v := keyturn._readable(keyturn.current_tenant(), keyturn.current_principal(), upstream_read.tool);
    IF v.upstream IS NULL OR v.executor IS DISTINCT FROM 'external' THEN
        RAISE EXCEPTION 'keyturn: % is not an upstream read tool (keyturn.read runs sql read tools)', upstream_read.tool
            USING ERRCODE = '22023';
    END IF;
    IF upstream_read.arguments IS NULL OR jsonb_typeof(upstream_read.arguments) <> 'object' THEN
        RAISE EXCEPTION 'keyturn: arguments must be a JSON object' USING ERRCODE = '22023';
    END IF;
    SELECT i.credential_path, i.schema_errors INTO v_path, v_err
      FROM keyturn._inspect_params(v.tool, upstream_read.arguments, v.params_schema) i;
    IF v_path IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: arguments hold credential material at %', keyturn._quoted(v_path)
            USING ERRCODE = '22023',
                  HINT = 'Credentials never go through keyturn: keyturnd holds the upstream''s.';
    END IF;
    IF v_err IS NOT NULL THEN
        RAISE EXCEPTION 'keyturn: arguments do not match the schema of %: %', upstream_read.tool, v_err
            USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._read_grant(keyturn.current_tenant(), keyturn.current_principal(), v, upstream_read.arguments);
    RETURN QUERY SELECT v.upstream, v.upstream_tool, v.projection;
END
$$;

-- Agent: the status of an action of the calling principal (and, once final,
-- its result); no row for an action of another principal or tenant, or
-- none at all, so that an agent learns nothing of what is not its own.
CREATE OR REPLACE FUNCTION keyturn.mcp_action_status(action_id uuid)
RETURNS TABLE (status text, result jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('mcp_action_status');
    RETURN QUERY SELECT o.status, o.result FROM keyturn._mcp_own_action(mcp_action_status.action_id, NULL, NULL) o;
END
$$;

-- Agent: the action a write call proposed, for the client's retry of that
-- call (a 2026-07-28 client answering keyturn's input_required with the
-- request state it was given, the action's id): a row only when the retry
-- is the same call, by the same principal: the same tool and the params
-- proposed (for a digest action, whose params are not kept: the same tool
-- in the session that proposed it). Anything else (a forged or stale
-- state, other arguments) gets no row, and keyturnd refuses the retry;
-- nothing is proposed again.
CREATE OR REPLACE FUNCTION keyturn.mcp_resume(action_id uuid, tool text, params jsonb)
RETURNS SETOF keyturn.mcp_action
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('mcp_resume');
    RETURN QUERY SELECT * FROM keyturn._mcp_own_action(action_id, tool, params);
END
$$;

-- Agent: an action the calling principal proposed as an MCP task (a client
-- that declared the Tasks extension): what tasks/get, tasks/update and
-- tasks/cancel ask of it. No row for anything else.
CREATE OR REPLACE FUNCTION keyturn.mcp_task(action_id uuid)
RETURNS SETOF keyturn.mcp_action
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('mcp_task');
    RETURN QUERY SELECT * FROM keyturn._mcp_own_action(action_id, NULL, NULL);
END
$$;

-- The calling principal's own action (with p_tool, only if it is of that
-- tool and p_params are its params). A digest action's params are kept only
-- as a MAC, so an answer that depended on them would confirm guesses of
-- them to any session of the principal, as many as it liked (twelfth
-- red-team pass, docs/security.md row 103): a digest action is matched by
-- its tool and the session that proposed it, never by params, and named by
-- its tool alone.
CREATE OR REPLACE FUNCTION keyturn._mcp_own_action(p_id uuid, p_tool text, p_params jsonb)
RETURNS SETOF keyturn.mcp_action
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
BEGIN
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    RETURN QUERY
    SELECT a.status::text, CASE WHEN keyturn._is_final(a.status) THEN a.result END,
           -- A digest action keeps no summary: only its tool is named.
           coalesce(a.summary, a.tool),
           a.expires_at, a.created_at, a.updated_at, a.session = keyturn.current_session()
      FROM keyturn.action a
     WHERE a.id = p_id AND a.tenant = v_tenant AND a.principal = v_principal
       AND (p_tool IS NULL
            OR (a.tool = p_tool
                AND CASE WHEN a.retain = 'digest' THEN a.session = keyturn.current_session()
                         ELSE keyturn._params_hash_matches(a.retain, a.params_hash,
                                                           keyturn.params_hash(p_tool, p_params)) END));
END
$$;

-- Dispatcher: registers one tool of the upstream MCP server p_upstream, the
-- JSON object of that tool as the upstream's tools/list gave it, as
-- <upstream>.<tool>: executor external, provider mcp, its inputSchema as
-- params schema (keyturn._upstream_tool), a read tool only when
-- p_trust_annotations and its definition says readOnlyHint: true (its
-- projection then named like the tool). The SHA-256 of the RFC 8785 form of
-- the definition is stored with the version. An unchanged definition
-- changes nothing; a new tool or a changed definition is a new version,
-- registered disabled: an admin reviews and enables it (a changed
-- definition could have turned a write into a read). A tool of that name
-- that was not discovered on this upstream is never replaced (42501).
-- Returns the tool's current version.
CREATE OR REPLACE FUNCTION keyturn.register_discovered_tool(upstream text, definition jsonb, trust_annotations boolean)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_up      text := register_discovered_tool.upstream;
    v_info    jsonb;
    v_name    text;
    v_cur     keyturn.tool_version;
    v_version int;
    v_known   boolean;
BEGIN
    PERFORM keyturn._refuse_nested('register_discovered_tool');
    IF keyturn._name_ok(v_up, 30) IS NOT TRUE OR strpos(v_up, '.') > 0 THEN
        RAISE EXCEPTION 'keyturn: upstream name % is not allowed', coalesce(keyturn._quoted(v_up), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'Use 1 to 30 ASCII letters, digits, underscores and hyphens, starting with a letter.';
    END IF;
    IF definition IS NULL OR jsonb_typeof(definition) <> 'object' OR trust_annotations IS NULL THEN
        RAISE EXCEPTION 'keyturn: definition must be the JSON object of one tool, and trust_annotations true or false'
            USING ERRCODE = '22023';
    END IF;
    v_info := keyturn._upstream_tool(definition, trust_annotations);
    v_name := v_up || '.' || (v_info ->> 'tool');
    IF NOT keyturn._name_ok(v_name, 63) THEN
        RAISE EXCEPTION 'keyturn: upstream tool % cannot be named % in keyturn', keyturn._quoted(v_info ->> 'tool'), keyturn._quoted(v_name)
            USING ERRCODE = '22023',
                  HINT = 'keyturn tool names are ASCII letters, digits, underscores and hyphens in dot-separated parts that each start with a letter, at most 63 characters.';
    END IF;
    SELECT x.* INTO v_cur FROM keyturn.tool t
      JOIN keyturn.tool_version x ON x.tool = t.name AND x.version = t.version
     WHERE t.name = v_name;
    v_known := FOUND;
    IF FOUND AND v_cur.upstream IS DISTINCT FROM v_up THEN
        RAISE EXCEPTION 'keyturn: tool % exists and was not discovered on upstream %; it is left as it is', v_name, v_up
            USING ERRCODE = '42501';
    END IF;
    IF FOUND AND v_cur.upstream_schema_sha256 = v_info ->> 'sha256' AND v_cur.kind::text = v_info ->> 'kind' THEN
        RETURN v_cur.version;
    END IF;
    -- An upstream lists as many tools as it likes, under new names or with
    -- new definitions at every discovery if it wants, and each is a row of
    -- the catalog every tenant reads and no one can remove: at most 1,000
    -- tools an upstream, and 2,000 versions an hour (thirtieth and
    -- thirty-first red-team passes, docs/security.md row 142).
    IF NOT v_known AND (SELECT count(*) FROM keyturn.tool t
                          JOIN keyturn.tool_version x ON x.tool = t.name AND x.version = t.version
                         WHERE x.upstream = v_up) >= 1000 THEN
        RAISE EXCEPTION 'keyturn: upstream % has 1000 tools registered, the most an upstream may; % is not registered',
                v_up, keyturn._quoted(v_name)
            USING ERRCODE = '54000',
                  HINT = 'An upstream that lists this many tools, or new names at every discovery, is misbehaving: remove it from keyturnd''s configuration.';
    END IF;
    -- And as many bytes: a definition is at most 64 KiB, an upstream's
    -- versions of the last hour 16 MiB as stored (thirty-second pass).
    IF octet_length(definition::text) > 65536 THEN
        RAISE EXCEPTION 'keyturn: the definition of % is % bytes, over the 65536 a tool may have; it is not registered',
                keyturn._quoted(v_name), octet_length(definition::text)
            USING ERRCODE = '54000';
    END IF;
    IF (SELECT count(*) >= 2000
               OR coalesce(sum(pg_column_size(x.spec) + pg_column_size(x.params_schema)
                               + coalesce(pg_column_size(x.description), 0)), 0) > 16777216
          FROM keyturn.tool_version x
         WHERE x.upstream = v_up AND x.created_at > now() - interval '1 hour') THEN
        RAISE EXCEPTION 'keyturn: upstream % registered 2000 tool versions or 16 MiB of them in the last hour, the most an upstream may; % is left as it is',
                v_up, keyturn._quoted(v_name)
            USING ERRCODE = '54000',
                  HINT = 'An upstream whose definitions change this often is misbehaving: remove it from keyturnd''s configuration. Until a new version is registered, calls of the changed tool are invalidated, nothing sent.';
    END IF;
    v_version := keyturn.register_tool(v_name, jsonb_strip_nulls(jsonb_build_object(
        'kind', v_info ->> 'kind', 'executor', 'external', 'provider', 'mcp',
        'params_schema', v_info -> 'params_schema',
        'summary', format('Call %s on %s', v_info ->> 'tool', v_up),
        'description', v_info ->> 'description',
        'projection', CASE WHEN v_info ->> 'kind' = 'read' THEN v_name END)));
    UPDATE keyturn.tool_version x
       SET upstream = v_up, upstream_tool = v_info ->> 'tool', upstream_schema_sha256 = v_info ->> 'sha256'
     WHERE x.tool = v_name AND x.version = v_version;
    -- A new tool waits for an admin. A changed one keeps its enabled flag,
    -- as register_tool keeps it, while it stays a write (every call still
    -- waits for a person, who sees the new version's summary); a read, which
    -- runs without anyone's approval, is disabled again, so a changed
    -- description or a flip to read-only is reviewed before an agent reads
    -- through it.
    IF NOT v_known OR v_info ->> 'kind' = 'read' THEN
        UPDATE keyturn.tool t SET enabled = false WHERE t.name = v_name;
        PERFORM keyturn._await_rechecks(v_name, NULL, NULL); -- row 95, as set_tool_enabled
    END IF;
    RETURN v_version;
END
$$;

-- The lowercase hex SHA-256 of the RFC 8785 form of a definition; NULL for
-- one that has none (a number without an exact form), which matches nothing.
CREATE OR REPLACE FUNCTION keyturn._definition_sha256(p_definition jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RETURN encode(sha256(convert_to(keyturn.canonical_json(p_definition), 'UTF8')), 'hex');
EXCEPTION WHEN invalid_parameter_value THEN
    RETURN NULL;
END
$$;

-- keyturn.check_upstream_tool(_for): p_tenant NULL for the plain call.
CREATE OR REPLACE FUNCTION keyturn._check_upstream_tool(p_what text, p_tenant text, p_id uuid, p_lease uuid,
                                             p_definition jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    a        keyturn.action;
    v        keyturn.tool_version;
    v_live   text := keyturn._definition_sha256(p_definition);
    v_now    timestamptz;
    v_rcpt   jsonb;
BEGIN
    PERFORM keyturn._refuse_nested(p_what);
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    SELECT x.* INTO a FROM keyturn.action x
     WHERE x.id = p_id AND (p_tenant IS NULL OR x.tenant = p_tenant)  -- the plain call: by id alone, as complete
       FOR UPDATE;
    -- Accepted past the lease's expiry, as complete: nothing was sent yet.
    PERFORM keyturn._raise_lease_problem(keyturn._lease_problem(a, p_id, p_lease, '{executing}', false));
    SELECT x.* INTO v FROM keyturn.tool_version x WHERE x.tool = a.tool AND x.version = a.tool_version;
    IF v.upstream_schema_sha256 IS NOT NULL AND v.upstream_schema_sha256 = v_live
       AND p_definition ->> 'name' = v.upstream_tool THEN
        RETURN true;
    END IF;
    v_now := clock_timestamp();
    v_rcpt := jsonb_build_object('error', 'the upstream tool''s live definition differs from the approved one; nothing was sent',
                                 'sent', false, 'approved_schema_sha256', v.upstream_schema_sha256,
                                 'live_schema_sha256', v_live);
    UPDATE keyturn.attempt t SET finished_at = v_now, outcome = 'failed', receipt = v_rcpt
     WHERE t.action_id = a.id AND t.tenant = a.tenant AND t.attempt = a.attempts;
    PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'upstream tool definition changed',
                                                         'attempt', a.attempts));
    UPDATE keyturn.action x
       SET updated_at = v_now, status = 'invalidated', receipt = v_rcpt,
           result = jsonb_build_object('reason', 'the upstream tool''s definition changed since the version this action was approved for; nothing was sent')
     WHERE x.id = a.id AND x.tenant = a.tenant;
    RETURN false;
END
$$;

-- Dispatcher, right before an upstream MCP call: whether the upstream's
-- live definition of the tool (the JSON object its tools/list gives now) is
-- the one the action's tool version was registered from. If not, nothing
-- may be sent: the action becomes invalidated (its attempt failed, not
-- sent) and the answer is false. 55000 unless the action is executing under
-- that lease.
CREATE OR REPLACE FUNCTION keyturn.check_upstream_tool(action_id uuid, lease_id uuid, definition jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN keyturn._check_upstream_tool('check_upstream_tool', NULL, check_upstream_tool.action_id,
                                        check_upstream_tool.lease_id, check_upstream_tool.definition);
END
$$;

-- Dispatcher: check_upstream_tool for the tenant named, the form Citus
-- delegates to the tenant's worker (docs/scale-out.md, layout B).
CREATE OR REPLACE FUNCTION keyturn.check_upstream_tool_for(tenant text, action_id uuid, lease_id uuid, definition jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(check_upstream_tool_for.tenant, 'check_upstream_tool_for');
    RETURN keyturn._check_upstream_tool('check_upstream_tool_for', check_upstream_tool_for.tenant,
                                        check_upstream_tool_for.action_id, check_upstream_tool_for.lease_id,
                                        check_upstream_tool_for.definition);
END
$$;


-- ==== sql/064_notify.sql ====

-- Reaching people (docs/notifications.md): a person's channels
-- (keyturn.set_notify), the notifications keyturn records when an action
-- starts to wait for them, and how the dispatcher carries them.
--
-- A notification is one of keyturn's own effects: a message leaves keyturn
-- for a person as an external action's call leaves it for a provider, and it
-- must be as honest: never sent twice, never lost without anyone knowing. So
-- notifications travel through the dispatcher's own calls (lease,
-- begin_dispatch, complete, their batch and tenant-explicit forms, sweep,
-- uncertain_actions, reconcile, record_not_sent, attempts), and the rules
-- those calls apply are written once and shared (sql/060_dispatch.sql):
-- keyturn._lease_problem_of, _complete_problem_of, _complete_args_error,
-- _outcome_status, _outcome_delay, _outcome_result, _max_attempts,
-- _retry_backoff, _attempt_not_sent. keyturnd leases them with the providers
-- it has for them (notify.email, notify.webhook, notify.webpush), and needs
-- nothing else of its own but those adapters: the same loop, journal and
-- recovery carry them. An uncertain notification waits in the operator's
-- queue like an uncertain action.
--
-- Why a table of their own, not actions of internal tools. An action is a
-- proposal a person approves: its row's token and binding, params hash,
-- epoch, the grant its proposer holds, the approval MAC that lease and
-- begin_dispatch verify, the usage row of its success, all serve that, and a
-- trigger lets it past 'pending' only with a person's approval. A
-- notification has none of it. As an action it would be a queued row no
-- person approved, which is exactly what lease refuses as forged; keyturn
-- would need a way to mint approvals without a person, and metering, the
-- queue and the audit's status chain would each need an exception. The
-- protocol is what the two share, so the protocol is what is shared: the
-- rules above, the attempt rows (keyed by the notification's id), and an id
-- the calls route by without a lookup (keyturn._is_notification), so a batch
-- of actions pays nothing for them.
--
-- Who is notified, when, and what the message says are decided here: the
-- people an action waits for (keyturn._waits_for), checked again at lease,
-- at begin and when the message is made, so nothing is sent for an action
-- that was decided, expired or cancelled first; the one reminder; the hourly
-- cap, past which notices wait for one digest; the message's text, with a
-- fresh one-time link code and never params, a token or a JWT.

-- Whether an id is a notification's: a UUID of version 8 (a v7 whose version
-- nibble keyturn._notification_id changed); every action id is a v7 (or, from
-- before 0.2.0, a v4).
CREATE OR REPLACE FUNCTION keyturn._is_notification(p_id uuid)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT substr(p_id::text, 15, 1) = '8'
$$;

-- The provider a notification of this channel is leased for: keyturnd
-- passes these names to lease for the channels it can send.
CREATE OR REPLACE FUNCTION keyturn._notify_provider(p_channel keyturn.channel)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE  -- as an enum's text is: inlined
AS $$
    SELECT 'notify.' || p_channel::text
$$;

-- ---- The person's channels ----

-- The links a person's channel was sent, ended: the unopened codes its
-- notifications carried and the card sessions they opened. Whoever read the
-- channel (a chat webhook that leaked, an inbox handed on) could otherwise
-- decide the person's pending actions with them after the person removed
-- the channel or pointed it elsewhere (docs/security.md, row 138). Returns
-- how many ended.
CREATE OR REPLACE FUNCTION keyturn._end_channel_links(p_tenant text, p_principal text, p_channel keyturn.channel)
RETURNS int
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_n int;
BEGIN
    -- Every attempt's code (each carried one), opened or not.
    DELETE FROM keyturn.card_link l
     USING keyturn.notification n
     WHERE n.tenant = p_tenant AND n.principal = p_principal AND n.channel = p_channel
       AND l.tenant = p_tenant AND l.notification = n.id;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

-- set_notify: one target per channel for the caller's principal, replacing
-- the one before (and ending the links sent to it, when the target
-- changes). Settings: remind_before (an interval, more than 0 and at
-- most 7 days; 5 minutes by default), max_per_hour (1 to 1000; 100 by
-- default: a bound on a runaway agent, not on a busy person, who sets it
-- lower for a quieter phone), and for a webhook its own secret (whsec_…; without one keyturnd
-- signs with KEYTURN_NOTIFY_WEBHOOK_SECRET). Anything else, or a target
-- outside its channel's rule (keyturn-core's notify module): 22023. The
-- caller's role is kept: the card its notifications open runs as it.
CREATE OR REPLACE FUNCTION keyturn._set_notify(p_caller oid, p_channel text, p_target text, p_settings jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_settings  jsonb := coalesce(p_settings, '{}');
    v_channels  text[] := enum_range(NULL::keyturn.channel)::text[];
    v_key       text;
    v_target    text;
    v_remind    interval := interval '5 minutes';
    v_max       int := 100;
    v_secret    text;
    v_role      text := p_caller::regrole::text;
    v_now       timestamptz := clock_timestamp();
    v_old       text;
BEGIN
    PERFORM keyturn._set_actor(v_role, v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    IF p_channel IS NULL OR NOT p_channel = ANY (v_channels) THEN
        RAISE EXCEPTION 'keyturn: channel must be one of %, not %', array_to_string(v_channels, ', '),
                coalesce(keyturn._quoted(p_channel), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_target IS NULL THEN
        RAISE EXCEPTION 'keyturn: a % channel needs its target', p_channel USING ERRCODE = '22023';
    END IF;
    v_target := keyturn._notify_target(p_channel, p_target);
    IF jsonb_typeof(v_settings) <> 'object' THEN
        RAISE EXCEPTION 'keyturn: settings must be a JSON object' USING ERRCODE = '22023';
    END IF;
    FOR v_key IN SELECT k FROM jsonb_object_keys(v_settings) k ORDER BY 1 LOOP
        IF NOT (v_key IN ('remind_before', 'max_per_hour') OR (v_key = 'secret' AND p_channel = 'webhook')) THEN
            RAISE EXCEPTION 'keyturn: unknown setting % for a % channel', keyturn._quoted(v_key), p_channel
                USING ERRCODE = '22023',
                      HINT = 'Settings: remind_before (an interval), max_per_hour (a number), and for a webhook secret (whsec_…).';
        END IF;
    END LOOP;
    IF v_settings ? 'remind_before' THEN
        IF jsonb_typeof(v_settings -> 'remind_before') <> 'string' THEN
            RAISE EXCEPTION 'keyturn: remind_before must be an interval, as text' USING ERRCODE = '22023';
        END IF;
        BEGIN
            v_remind := (v_settings ->> 'remind_before')::interval;
        EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
            RAISE EXCEPTION 'keyturn: remind_before is not an interval: %', keyturn._quoted(v_settings ->> 'remind_before')
                USING ERRCODE = '22023';
        END;
        IF NOT keyturn._interval_within(v_remind, interval '7 days') THEN
            RAISE EXCEPTION 'keyturn: remind_before must be more than 0 and at most 7 days, without months or years, not %', v_remind
                USING ERRCODE = '22023';
        END IF;
    END IF;
    IF v_settings ? 'max_per_hour' THEN
        IF jsonb_typeof(v_settings -> 'max_per_hour') <> 'number'
           OR (v_settings ->> 'max_per_hour') !~ '^[0-9]{1,4}$'
           OR (v_settings ->> 'max_per_hour')::int NOT BETWEEN 1 AND 1000 THEN
            RAISE EXCEPTION 'keyturn: max_per_hour must be a whole number from 1 to 1000' USING ERRCODE = '22023';
        END IF;
        v_max := (v_settings ->> 'max_per_hour')::int;
    END IF;
    IF v_settings ? 'secret' THEN
        IF jsonb_typeof(v_settings -> 'secret') <> 'string' THEN
            RAISE EXCEPTION 'keyturn: secret must be a string (whsec_…)' USING ERRCODE = '22023';
        END IF;
        v_secret := v_settings ->> 'secret';
        PERFORM keyturn._check_webhook_secret(v_secret);
    END IF;
    SELECT c.target INTO v_old FROM keyturn.notify_channel c
     WHERE c.tenant = v_tenant AND c.principal = v_principal AND c.channel = p_channel::keyturn.channel
       FOR UPDATE;
    IF v_old IS DISTINCT FROM v_target THEN
        PERFORM keyturn._end_channel_links(v_tenant, v_principal, p_channel::keyturn.channel);
    END IF;
    INSERT INTO keyturn.notify_channel AS c (tenant, principal, channel, target, remind_before, max_per_hour, secret,
                                              db_role, created_at, updated_at)
    VALUES (v_tenant, v_principal, p_channel::keyturn.channel, v_target, v_remind, v_max, v_secret, v_role, v_now,
            v_now)
    ON CONFLICT (tenant, principal, channel)
    DO UPDATE SET target = EXCLUDED.target, remind_before = EXCLUDED.remind_before,
                  max_per_hour = EXCLUDED.max_per_hour, secret = EXCLUDED.secret, db_role = EXCLUDED.db_role,
                  updated_at = EXCLUDED.updated_at;
END
$$;

-- The caller's channels, as the caller may see them: a URL's scheme and host
-- only (a Slack or Teams workflow URL's path is its secret; a push endpoint's
-- names the device), whether a webhook signs with a secret of its own, never
-- the secret.
CREATE OR REPLACE FUNCTION keyturn._notify_channels(p_caller oid)
RETURNS TABLE (o_channel text, o_target text, o_remind_before interval, o_max_per_hour int, o_own_secret boolean,
               o_db_role text, o_updated_at timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
BEGIN
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    RETURN QUERY
    SELECT c.channel::text, keyturn._notify_target_hint(c.channel::text, c.target), c.remind_before,
           c.max_per_hour, c.secret IS NOT NULL, c.db_role, c.updated_at
      FROM keyturn.notify_channel c
     WHERE c.tenant = v_tenant AND c.principal = v_principal
     ORDER BY c.channel;
END
$$;

-- Removes one of the caller's channels: true if there was one. Its
-- notifications not yet sent are cancelled when they come due, and the
-- links already sent to it end.
CREATE OR REPLACE FUNCTION keyturn._remove_notify(p_caller oid, p_channel text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    -- The name is made a channel first, and the column compared as it is:
    -- Citus refuses a DELETE on a distributed table (layout B) whose WHERE
    -- calls a STABLE function on a column (c.channel::text is enum_out). A
    -- name that is no channel matches no row, as the text comparison did.
    IF p_channel IS NULL OR NOT p_channel = ANY (enum_range(NULL::keyturn.channel)::text[]) THEN
        RETURN false;
    END IF;
    DELETE FROM keyturn.notify_channel c
     WHERE c.tenant = v_tenant AND c.principal = v_principal AND c.channel = p_channel::keyturn.channel;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM keyturn._end_channel_links(v_tenant, v_principal, p_channel::keyturn.channel);
    RETURN true;
END
$$;

-- revoke_links: every link code of the caller's principal not yet opened,
-- and every card session one opened, ended (a person who fears a link
-- reached someone else); how many.
CREATE OR REPLACE FUNCTION keyturn._revoke_links(p_caller oid)
RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_n         int;
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    DELETE FROM keyturn.card_link l WHERE l.tenant = v_tenant AND l.principal = v_principal;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

-- ---- Who is waited for ----

-- Why action a does not (or no longer) wait for p_principal, or NULL: the
-- one rule for whom a notification reaches, applied when it is recorded,
-- leased, begun and when its message is made. The action is pending and not
-- expired; the person is a member who may decide it by approve's rule
-- (keyturn._decide_problem: the proposer in its session for self, an
-- approver or admin who wrote none of it and holds the tool's grant for
-- independent and quorum tools) and has not voted on it yet. a.id NULL: the
-- action is not there.
CREATE OR REPLACE FUNCTION keyturn._waits_for(a keyturn.action, p_principal text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_role text;
BEGIN
    IF a.id IS NULL THEN
        RETURN 'the action is not there';
    END IF;
    IF a.status <> 'pending' THEN
        RETURN format('the action is %s', a.status);
    END IF;
    IF a.expires_at <= clock_timestamp() THEN
        RETURN 'the action expired';
    END IF;
    SELECT m.role INTO v_role FROM keyturn.member m WHERE m.tenant = a.tenant AND m.principal = p_principal;
    IF v_role IS NULL THEN
        RETURN format('%s is not a member of %s', p_principal, a.tenant);
    END IF;
    IF EXISTS (SELECT 1 FROM keyturn.vote x
                WHERE x.action_id = a.id AND x.tenant = a.tenant AND x.principal = p_principal) THEN
        RETURN format('%s has voted on it', p_principal);
    END IF;
    -- The action's own session: a self action is decided in it, and no
    -- other rule reads the session.
    RETURN keyturn._decide_problem(a, p_principal, a.session, v_role, 'approve');
END
$$;

-- Records the notifications of an action that has started to wait (propose
-- calls it for a pending proposal, in a tenant where someone set a channel):
-- for each person it waits for and each of their channels, a notice due now
-- and the reminder, due remind_before its expiry if that is still ahead.
-- Then wakes the dispatcher. Returns how many it recorded. One row each
-- (notification_once_idx): a second call records nothing.
CREATE OR REPLACE FUNCTION keyturn._record_notifications(p_id uuid, p_tenant text)
RETURNS int
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    a        keyturn.action;
    c        record;
    v_now    timestamptz := clock_timestamp();
    v_due    timestamptz;
    v_id     uuid;
    v_last   text;
    v_waits  boolean := false;
    v_n      int := 0;
BEGIN
    SELECT x.* INTO a FROM keyturn.action x WHERE x.id = p_id AND x.tenant = p_tenant;
    -- A self action waits for its proposer alone; the others for the
    -- tenant's approvers and admins, each checked by keyturn._waits_for.
    FOR c IN
        SELECT n.principal, n.channel, n.remind_before FROM keyturn.notify_channel n
         WHERE n.tenant = p_tenant
           AND (n.principal = a.principal
                OR (a.approval <> 'self'
                    AND n.principal IN (SELECT m.principal FROM keyturn.member m
                                         WHERE m.tenant = p_tenant AND m.role IN ('approver', 'admin'))))
         ORDER BY n.principal, n.channel
    LOOP
        IF c.principal IS DISTINCT FROM v_last THEN
            v_last := c.principal;
            v_waits := keyturn._waits_for(a, c.principal) IS NULL;
        END IF;
        CONTINUE WHEN NOT v_waits;
        v_id := keyturn._notification_id();
        INSERT INTO keyturn.notification (id, tenant, principal, channel, kind, action_id, status, next_attempt_at,
                                          created_at, updated_at)
        VALUES (v_id, p_tenant, c.principal, c.channel, 'notice', p_id, 'queued', v_now, v_now, v_now)
        ON CONFLICT DO NOTHING;
        v_n := v_n + 1;
        v_due := a.expires_at - c.remind_before;
        IF v_due > v_now THEN
            v_id := keyturn._notification_id();
            INSERT INTO keyturn.notification (id, tenant, principal, channel, kind, action_id, status,
                                              next_attempt_at, created_at, updated_at)
            VALUES (v_id, p_tenant, c.principal, c.channel, 'reminder', p_id, 'queued', v_due, v_now, v_now)
            ON CONFLICT DO NOTHING;
            v_n := v_n + 1;
        END IF;
    END LOOP;
    IF v_n > 0 AND current_setting('keyturn.notify')::boolean THEN
        PERFORM pg_notify('keyturn_dispatch', '');
    END IF;
    RETURN v_n;
END
$$;

-- Why notification n must not be sent now, or NULL: its person removed the
-- channel, or its action no longer waits for them (for a digest: none of the
-- actions it carries still does).
CREATE OR REPLACE FUNCTION keyturn._notification_problem(n keyturn.notification)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    a         keyturn.action;
    v_id      uuid;
BEGIN
    PERFORM 1 FROM keyturn.notify_channel c
      WHERE c.tenant = n.tenant AND c.principal = n.principal AND c.channel = n.channel;
    IF NOT FOUND THEN
        RETURN format('%s removed the %s channel', n.principal, n.channel);
    END IF;
    IF n.kind <> 'digest' THEN
        SELECT x.* INTO a FROM keyturn.action x WHERE x.id = n.action_id AND x.tenant = n.tenant;
        RETURN keyturn._waits_for(a, n.principal);
    END IF;
    FOR v_id IN SELECT b.action_id FROM keyturn.notification b
                 WHERE b.batched_into = n.id AND b.tenant = n.tenant ORDER BY b.action_id LOOP
        SELECT x.* INTO a FROM keyturn.action x WHERE x.id = v_id AND x.tenant = n.tenant;
        IF keyturn._waits_for(a, n.principal) IS NULL THEN
            RETURN NULL;
        END IF;
    END LOOP;
    RETURN 'none of the actions it carries waits for the person any more';
END
$$;

-- ---- The dispatcher's calls, for notifications ----

-- How many of one tenant's notifications may be leased or executing at
-- once (keyturn._lease_notifications).
CREATE OR REPLACE FUNCTION keyturn._notify_in_flight()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 2 $$;

-- lease's part (keyturn._lease calls it first): the due notifications of the
-- channels p_providers names (NULL: every channel), at most p_max, locked
-- FOR UPDATE SKIP LOCKED in (next_attempt_at, id) order. Each is checked
-- first: one whose action no longer waits for its person is cancelled; a
-- notice or reminder past its person's hourly cap on that channel is
-- batched into the channel's digest (made if there is none, due when the
-- hour's first one leaves the window); the rest are leased and returned as
-- lease returns jobs: tool keyturn.notify, provider notify.<channel>,
-- params naming the notification, idempotency key keyturn-notify-<id>. The
-- channel row is locked while the cap is counted, so two dispatchers count
-- one person's notifications one at a time. p_tenant as in keyturn._lease.
-- A share of the dispatcher, not all of it: a person's endpoint that never
-- answers holds a slot for a whole call timeout, and notifications come
-- first, so one tenant's person (and their agent's burst of proposals) had
-- every slot all tenants share (docs/security.md, row 136). A lease gives
-- notifications at most half its jobs (at least one); a person with one
-- notification leased or executing gets no other until it ends (one
-- member's stalled endpoint had held the tenant's whole share, and their
-- colleagues' notifications waited behind it), and a tenant with
-- keyturn._notify_in_flight() gets no more: their others wait in the
-- queue, and everyone else's are leased past them.
CREATE OR REPLACE FUNCTION keyturn._lease_notifications(p_tenant text, p_worker text, p_max int, p_lease_for interval,
                                             p_providers text[], p_now timestamptz)
RETURNS TABLE (action_id uuid, lease_id uuid, tenant text, tool text, provider text, params jsonb,
               idempotency_key text, attempt int)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_channels keyturn.channel[];
    n          keyturn.notification;
    v_max      int;
    v_problem  text;
    v_lease    uuid;
    v_digest   uuid;
    v_recent   bigint;
    v_full     text[];
    v_busy     jsonb;
    v_left     int := greatest(1, p_max / 2);
BEGIN
    v_channels := ARRAY(SELECT c FROM unnest(enum_range(NULL::keyturn.channel)) c
                         WHERE p_providers IS NULL OR keyturn._notify_provider(c) = ANY (p_providers));
    IF p_max < 1 OR cardinality(v_channels) = 0 THEN
        RETURN;
    END IF;
    -- The tenants with their share in flight already, and the people with
    -- one in flight: [[tenant, principal], …].
    v_full := ARRAY(SELECT x.tenant FROM keyturn.notification x
                     WHERE x.status IN ('leased', 'executing') AND (p_tenant IS NULL OR x.tenant = p_tenant)
                     GROUP BY x.tenant HAVING count(*) >= keyturn._notify_in_flight());
    v_busy := coalesce((SELECT jsonb_agg(DISTINCT jsonb_build_array(x.tenant, x.principal))
                          FROM keyturn.notification x
                         WHERE x.status IN ('leased', 'executing') AND (p_tenant IS NULL OR x.tenant = p_tenant)),
                       '[]');
    FOR n IN
        SELECT x.* FROM keyturn.notification x
         WHERE x.status = 'queued' AND x.next_attempt_at <= p_now AND x.channel = ANY (v_channels)
           AND (p_tenant IS NULL OR x.tenant = p_tenant) AND x.tenant <> ALL (v_full)
           AND NOT v_busy @> jsonb_build_array(jsonb_build_array(x.tenant, x.principal))
         ORDER BY x.next_attempt_at, x.id
         LIMIT p_max
           FOR UPDATE SKIP LOCKED
    LOOP
        SELECT c.max_per_hour INTO v_max FROM keyturn.notify_channel c
         WHERE c.tenant = n.tenant AND c.principal = n.principal AND c.channel = n.channel
           FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND AND EXISTS (SELECT 1 FROM keyturn.notify_channel c
                                  WHERE c.tenant = n.tenant AND c.principal = n.principal AND c.channel = n.channel) THEN
            -- Its person is changing the channel, in a transaction still
            -- open: left queued for a later lease, never waited for, and
            -- due a little later, so that a burst of them does not fill
            -- every lease's first rows. A person's open transaction had
            -- held every tenant's lease (docs/security.md, row 140).
            UPDATE keyturn.notification x SET next_attempt_at = p_now + interval '5 seconds', updated_at = p_now
             WHERE x.id = n.id AND x.tenant = n.tenant;
            CONTINUE;
        END IF;
        v_problem := keyturn._notification_problem(n);
        IF v_problem IS NOT NULL THEN
            UPDATE keyturn.notification x
               SET status = 'cancelled', result = jsonb_build_object('reason', v_problem), updated_at = p_now
             WHERE x.id = n.id AND x.tenant = n.tenant;
            CONTINUE;
        END IF;
        IF n.kind <> 'digest' THEN
            -- Sent in the last hour, and leased (in this call or another
            -- not yet begun).
            SELECT count(*) INTO v_recent FROM keyturn.notification x
             WHERE x.tenant = n.tenant AND x.principal = n.principal AND x.channel = n.channel
               AND (x.dispatched_at > p_now - interval '1 hour' OR x.status = 'leased');
            IF v_recent >= v_max THEN
                v_digest := keyturn._digest_for(n, p_now);
                UPDATE keyturn.notification x
                   SET status = 'superseded', batched_into = v_digest,
                       result = jsonb_build_object('batched_into', v_digest), updated_at = p_now
                 WHERE x.id = n.id AND x.tenant = n.tenant;
                CONTINUE;
            END IF;
        END IF;
        -- Past the lease's share, or of a person or tenant that took theirs
        -- in it: checked above (cancelled, held for the digest), not leased.
        IF v_left < 1 OR n.tenant = ANY (v_full)
           OR v_busy @> jsonb_build_array(jsonb_build_array(n.tenant, n.principal)) THEN
            CONTINUE;
        END IF;
        v_lease := gen_random_uuid();
        UPDATE keyturn.notification x
           SET status = 'leased', lease_id = v_lease, leased_by = p_worker, lease_expires_at = p_now + p_lease_for,
               updated_at = p_now
         WHERE x.id = n.id AND x.tenant = n.tenant;
        v_left := v_left - 1;
        v_busy := v_busy || jsonb_build_array(jsonb_build_array(n.tenant, n.principal));
        IF (SELECT count(*) FROM keyturn.notification x
             WHERE x.tenant = n.tenant AND x.status IN ('leased', 'executing')) >= keyturn._notify_in_flight() THEN
            v_full := v_full || n.tenant;
        END IF;
        action_id := n.id;
        lease_id := v_lease;
        tenant := n.tenant;
        tool := 'keyturn.notify';
        provider := keyturn._notify_provider(n.channel);
        params := jsonb_strip_nulls(jsonb_build_object('notification', n.id, 'kind', n.kind, 'channel', n.channel,
                                                       'action_id', n.action_id));
        idempotency_key := 'keyturn-notify-' || n.id::text;
        attempt := n.attempts + 1;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The queued digest of n's person and channel, made if there is none: due
-- an hour after the first notification the cap counted was sent (or, not
-- yet begun, now), when the cap has room again. The caller holds the
-- channel row's lock.
CREATE OR REPLACE FUNCTION keyturn._digest_for(n keyturn.notification, p_now timestamptz)
RETURNS uuid
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_id  uuid;
    v_due timestamptz;
BEGIN
    SELECT x.id INTO v_id FROM keyturn.notification x
     WHERE x.tenant = n.tenant AND x.principal = n.principal AND x.channel = n.channel
       AND x.kind = 'digest' AND x.status = 'queued';
    IF FOUND THEN
        RETURN v_id;
    END IF;
    SELECT coalesce(min(coalesce(x.dispatched_at, p_now)), p_now) + interval '1 hour' INTO v_due
      FROM keyturn.notification x
     WHERE x.tenant = n.tenant AND x.principal = n.principal AND x.channel = n.channel
       AND (x.dispatched_at > p_now - interval '1 hour' OR x.status = 'leased');
    v_id := keyturn._notification_id();
    INSERT INTO keyturn.notification (id, tenant, principal, channel, kind, status, next_attempt_at, created_at,
                                      updated_at)
    VALUES (v_id, n.tenant, n.principal, n.channel, 'digest', 'queued', v_due, p_now, p_now);
    RETURN v_id;
END
$$;

-- keyturn._begin_set and _complete_set hand a batch that holds notifications
-- here: its actions go back to them (a batch of actions alone), its
-- notifications to keyturn._notify_begin_set and _notify_complete_set, and
-- the answers keep each element's place (ord).
CREATE OR REPLACE FUNCTION keyturn._begin_mixed(p_tenant text, p_ords int[], p_ids uuid[], p_leases uuid[])
RETURNS TABLE (ord int, dispatch boolean, problem text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_ords   int[];
    v_ids    uuid[];
    v_leases uuid[];
    v_nords  int[];
    v_nids   uuid[];
    v_nlease uuid[];
BEGIN
    SELECT array_agg(e.o) FILTER (WHERE NOT e.n), array_agg(e.i) FILTER (WHERE NOT e.n),
           array_agg(e.l) FILTER (WHERE NOT e.n),
           array_agg(e.o) FILTER (WHERE e.n), array_agg(e.i) FILTER (WHERE e.n), array_agg(e.l) FILTER (WHERE e.n)
      INTO v_ords, v_ids, v_leases, v_nords, v_nids, v_nlease
      FROM (SELECT u.o, u.i, u.l, coalesce(keyturn._is_notification(u.i), false) AS n
              FROM unnest(p_ords, p_ids, p_leases) AS u (o, i, l)) e;
    IF v_ids IS NOT NULL THEN
        RETURN QUERY SELECT * FROM keyturn._begin_set(p_tenant, v_ords, v_ids, v_leases);
    END IF;
    RETURN QUERY SELECT * FROM keyturn._notify_begin_set(p_tenant, v_nords, v_nids, v_nlease);
END
$$;

CREATE OR REPLACE FUNCTION keyturn._complete_mixed(p_tenant text, p_ords int[], p_ids uuid[], p_leases uuid[],
                                        p_outcomes text[], p_receipts jsonb[], p_retry_after interval[])
RETURNS TABLE (ord int, status text, problem text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_a record;
    v_n record;
BEGIN
    SELECT array_agg(e.o) AS ords, array_agg(e.i) AS ids, array_agg(e.l) AS leases, array_agg(e.oc) AS outcomes,
           array_agg(e.r) AS receipts, array_agg(e.d) AS delays
      INTO v_a
      FROM unnest(p_ords, p_ids, p_leases, p_outcomes, p_receipts, p_retry_after) AS e (o, i, l, oc, r, d)
     WHERE NOT coalesce(keyturn._is_notification(e.i), false);
    SELECT array_agg(e.o) AS ords, array_agg(e.i) AS ids, array_agg(e.l) AS leases, array_agg(e.oc) AS outcomes,
           array_agg(e.r) AS receipts, array_agg(e.d) AS delays
      INTO v_n
      FROM unnest(p_ords, p_ids, p_leases, p_outcomes, p_receipts, p_retry_after) AS e (o, i, l, oc, r, d)
     WHERE coalesce(keyturn._is_notification(e.i), false);
    IF v_a.ids IS NOT NULL THEN
        RETURN QUERY SELECT * FROM keyturn._complete_set(p_tenant, v_a.ords, v_a.ids, v_a.leases, v_a.outcomes,
                                                          v_a.receipts, v_a.delays);
    END IF;
    RETURN QUERY SELECT * FROM keyturn._notify_complete_set(p_tenant, v_n.ords, v_n.ids, v_n.leases, v_n.outcomes,
                                                             v_n.receipts, v_n.delays);
END
$$;

-- begin_dispatch for notifications, element by element in the batch's
-- order (as calls one after another would, so a notification named twice
-- sees its first begin): the lease rule (keyturn._lease_problem_of) answered
-- as a problem; then, checked on the locked row, a notification whose action
-- no longer waits for its person (keyturn._notification_problem) is
-- cancelled and answered dispatch = false, as an invalidated action is; the
-- rest become executing, with an attempt row, and dispatch = true. p_tenant
-- as in keyturn._begin_set.
CREATE OR REPLACE FUNCTION keyturn._notify_begin_set(p_tenant text, p_ords int[], p_ids uuid[], p_leases uuid[])
RETURNS TABLE (ord int, dispatch boolean, problem text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n         keyturn.notification;
    v_problem text;
    v_reason  text;
    v_now     timestamptz;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_ids), 0) LOOP
        ord := p_ords[i];
        SELECT x.* INTO n FROM keyturn.notification x
         WHERE x.id = p_ids[i] AND (p_tenant IS NULL OR x.tenant = p_tenant) FOR UPDATE;
        v_problem := keyturn._lease_problem_of('notification', p_ids[i], FOUND, n.status, n.lease_id,
                                               n.lease_expires_at, p_leases[i], '{leased}', true);
        IF v_problem IS NOT NULL THEN
            dispatch := false;
            problem := v_problem;
            RETURN NEXT;
            CONTINUE;
        END IF;
        v_reason := keyturn._notification_problem(n);
        v_now := clock_timestamp();
        problem := NULL;
        IF v_reason IS NOT NULL THEN
            UPDATE keyturn.notification x
               SET status = 'cancelled', result = jsonb_build_object('reason', v_reason), lease_id = NULL,
                   leased_by = NULL, lease_expires_at = NULL, updated_at = v_now
             WHERE x.id = n.id AND x.tenant = n.tenant;
            dispatch := false;
        ELSE
            UPDATE keyturn.notification x
               SET status = 'executing', attempts = n.attempts + 1, dispatched_at = v_now, updated_at = v_now
             WHERE x.id = n.id AND x.tenant = n.tenant;
            INSERT INTO keyturn.attempt (action_id, attempt, tenant, principal, lease_id, worker, started_at)
            VALUES (n.id, n.attempts + 1, n.tenant, n.principal, n.lease_id, n.leased_by, v_now);
            dispatch := true;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

-- complete for notifications, element by element: the arguments
-- (keyturn._complete_args_error, 22023) and the lease
-- (keyturn._complete_problem_of, 55000) answered as problems; otherwise the
-- outcome becomes the status, delay and result complete gives an action
-- (keyturn._outcome_status, _outcome_delay, _outcome_result), the attempt is
-- closed (not for a hand-back), and a notification that was sent, failed
-- or is now uncertain is an event on its action's timeline.
CREATE OR REPLACE FUNCTION keyturn._notify_complete_set(p_tenant text, p_ords int[], p_ids uuid[], p_leases uuid[],
                                             p_outcomes text[], p_receipts jsonb[], p_retry_after interval[])
RETURNS TABLE (ord int, status text, problem text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n         keyturn.notification;
    v_problem text;
    v_back    boolean;
    v_status  keyturn.status;
    v_delay   interval;
    v_receipt jsonb;
    v_result  jsonb;
    v_next    timestamptz;
    v_now     timestamptz;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_ids), 0) LOOP
        ord := p_ords[i];
        status := NULL;
        v_problem := keyturn._complete_args_error(p_outcomes[i], p_retry_after[i], p_receipts[i]);
        IF v_problem IS NOT NULL THEN
            problem := '22023 ' || v_problem;
            RETURN NEXT;
            CONTINUE;
        END IF;
        SELECT x.* INTO n FROM keyturn.notification x
         WHERE x.id = p_ids[i] AND (p_tenant IS NULL OR x.tenant = p_tenant) FOR UPDATE;
        v_problem := keyturn._complete_problem_of('notification', p_ids[i], FOUND, n.status, n.lease_id,
                                                  n.lease_expires_at, p_leases[i], p_outcomes[i]);
        IF v_problem IS NOT NULL THEN
            problem := '55000 ' || v_problem;
            RETURN NEXT;
            CONTINUE;
        END IF;
        v_back := n.status = 'leased';
        v_status := keyturn._outcome_status(n.status, p_outcomes[i], n.attempts);
        v_delay := keyturn._outcome_delay(n.status, p_retry_after[i], n.attempts);
        v_receipt := keyturn._redact(coalesce(p_receipts[i], '{}'));
        v_result := keyturn._outcome_result(v_status, p_outcomes[i]);
        v_now := clock_timestamp();
        IF v_back THEN
            v_receipt := n.receipt;
        ELSE
            UPDATE keyturn.attempt t
               SET finished_at = v_now, outcome = p_outcomes[i]::keyturn.attempt_outcome, receipt = v_receipt
             WHERE t.action_id = n.id AND t.tenant = n.tenant AND t.attempt = n.attempts;
        END IF;
        IF v_status = 'queued' THEN
            v_next := v_now + v_delay;
            v_result := n.result;
            UPDATE keyturn.notification x
               SET status = v_status, receipt = v_receipt, next_attempt_at = v_next, lease_id = NULL,
                   leased_by = NULL, lease_expires_at = NULL, updated_at = v_now
             WHERE x.id = n.id AND x.tenant = n.tenant;
        ELSE
            UPDATE keyturn.notification x
               SET status = v_status, receipt = v_receipt, result = v_result, updated_at = v_now
             WHERE x.id = n.id AND x.tenant = n.tenant;
            PERFORM keyturn._notification_event(n, v_status::text,
                                                jsonb_build_object('outcome', p_outcomes[i], 'attempt', n.attempts));
        END IF;
        status := v_status::text;
        problem := NULL;
        RETURN NEXT;
    END LOOP;
END
$$;

-- A notification that was sent (or may have been, or failed, or was
-- reconciled), as an event in the tenant's chain (keyturn._append_event),
-- one for each action it is about: keyed by the notification's own id, not
-- the action's, so an action's audit stays its status changes and votes
-- (a notice is not a status change, and a pending-to-pending row is a vote:
-- docs/audit.md); the action's status as both ends, the action and the
-- notification in its detail. keyturn.notifications(action_id) lists them.
CREATE OR REPLACE FUNCTION keyturn._notification_event(n keyturn.notification, p_status text, p_detail jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_id        uuid;
    v_principal text;
    v_status    text;
BEGIN
    FOREACH v_id IN ARRAY (CASE WHEN n.kind = 'digest' THEN coalesce(n.covers, '{}') ELSE ARRAY[n.action_id] END) LOOP
        SELECT x.principal, x.status::text INTO v_principal, v_status FROM keyturn.action x
         WHERE x.id = v_id AND x.tenant = n.tenant;
        CONTINUE WHEN NOT FOUND;
        PERFORM keyturn._append_event(n.id, n.tenant, v_principal, keyturn._calling_role(), NULL, v_status, v_status,
                                      jsonb_build_object('notification', jsonb_build_object(
                                          'id', n.id, 'action_id', v_id, 'kind', n.kind, 'channel', n.channel,
                                          'to', n.principal, 'status', p_status) || coalesce(p_detail, '{}')));
    END LOOP;
END
$$;

-- The sweep's part (keyturn._sweep calls it): a lapsed lease of a
-- notification never begun goes back to queued; one begun is uncertain, its
-- attempt lapsed, never sent again automatically; and a queued notification
-- whose action is no longer pending is cancelled (lease would find it so).
-- p_tenant as in keyturn._lease.
CREATE OR REPLACE FUNCTION keyturn._sweep_notifications(p_tenant text, p_now timestamptz)
RETURNS TABLE (requeued int, uncertain int)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n keyturn.notification;
BEGIN
    UPDATE keyturn.notification x
       SET status = 'queued', lease_id = NULL, leased_by = NULL, lease_expires_at = NULL, updated_at = p_now
     WHERE (x.id, x.tenant) IN (SELECT y.id, y.tenant FROM keyturn.notification y
                                WHERE y.status = 'leased' AND y.lease_expires_at < p_now
                                  AND (p_tenant IS NULL OR y.tenant = p_tenant)
                                FOR UPDATE SKIP LOCKED)
       AND (p_tenant IS NULL OR x.tenant = p_tenant);
    GET DIAGNOSTICS requeued = ROW_COUNT;

    uncertain := 0;
    FOR n IN SELECT y.* FROM keyturn.notification y
              WHERE y.status = 'executing' AND y.lease_expires_at < p_now
                AND (p_tenant IS NULL OR y.tenant = p_tenant)
                FOR UPDATE SKIP LOCKED LOOP
        UPDATE keyturn.notification x
           SET status = 'uncertain', updated_at = p_now,
               result = jsonb_build_object('reason', 'the dispatcher''s lease lapsed while it was sending; whether the person got it is unknown, and it is never sent again automatically')
         WHERE x.id = n.id AND x.tenant = n.tenant;
        UPDATE keyturn.attempt t SET finished_at = p_now, outcome = 'lapsed'
         WHERE t.action_id = n.id AND t.tenant = n.tenant AND t.attempt = n.attempts AND t.outcome IS NULL;
        PERFORM keyturn._notification_event(n, 'uncertain', jsonb_build_object('attempt', n.attempts,
                                                                               'reason', 'lease lapsed while sending'));
        uncertain := uncertain + 1;
    END LOOP;

    UPDATE keyturn.notification x
       SET status = 'cancelled', result = jsonb_build_object('reason', 'the action no longer waits'), updated_at = p_now
     WHERE (x.id, x.tenant) IN (SELECT y.id, y.tenant FROM keyturn.notification y
                                JOIN keyturn.action a ON a.id = y.action_id AND a.tenant = y.tenant
                                WHERE y.status = 'queued' AND (a.status <> 'pending' OR a.expires_at < p_now)
                                  AND (p_tenant IS NULL OR (y.tenant = p_tenant AND a.tenant = p_tenant))
                                FOR UPDATE OF y SKIP LOCKED)
       AND (p_tenant IS NULL OR x.tenant = p_tenant);
    RETURN NEXT;
END
$$;

-- The uncertain notifications, as keyturn.uncertain_actions lists them.
CREATE OR REPLACE FUNCTION keyturn._uncertain_notifications()
RETURNS TABLE (action_id uuid, tenant text, tool text, attempts int, dispatched_at timestamptz, receipt jsonb,
               safe_to_decide_after timestamptz, not_sent_by_dispatcher boolean)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT n.id, n.tenant, 'keyturn.notify.' || n.channel::text, n.attempts, n.dispatched_at, n.receipt,
           n.lease_expires_at, coalesce(t.dispatcher_account = 'not_sent', false)
      FROM keyturn.notification n
      LEFT JOIN keyturn.attempt t ON t.action_id = n.id AND t.tenant = n.tenant AND t.attempt = n.attempts
     WHERE n.status = 'uncertain';
END
$$;

-- reconcile of an uncertain notification (keyturn._reconcile routes it
-- here, the outcome checked): as for an action, the tenant is read first
-- when the plain call names none, then the row is locked in it.
CREATE OR REPLACE FUNCTION keyturn._reconcile_notification(p_tenant text, p_id uuid, p_outcome text, p_note text)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n        keyturn.notification;
    v_tenant text := p_tenant;
    v_now    timestamptz := clock_timestamp();
    v_status keyturn.status := p_outcome::keyturn.status;
    v_added  jsonb;
BEGIN
    IF v_tenant IS NULL THEN
        SELECT x.tenant INTO v_tenant FROM keyturn.notification x
         WHERE x.id = p_id;  -- by id alone: the plain call names no tenant
    END IF;
    SELECT x.* INTO n FROM keyturn.notification x WHERE x.id = p_id AND x.tenant = v_tenant FOR UPDATE;
    IF NOT FOUND OR n.status <> 'uncertain' THEN
        RAISE EXCEPTION 'keyturn: only an uncertain notification can be reconciled; % is %',
                p_id, coalesce(n.status::text, 'unknown')
            USING ERRCODE = '55000';
    END IF;
    v_added := jsonb_strip_nulls(jsonb_build_object('reconciled', p_outcome, 'note', p_note,
                                                    'by', keyturn._calling_role()));
    UPDATE keyturn.notification x
       SET status = v_status, result = coalesce(n.result, '{}') || v_added, updated_at = v_now
     WHERE x.id = n.id AND x.tenant = n.tenant;
    PERFORM keyturn._notification_event(n, p_outcome, jsonb_strip_nulls(jsonb_build_object(
        'reconciled', p_outcome, 'note', p_note)));
    RETURN p_outcome;
END
$$;

-- record_not_sent of a notification (keyturn._record_not_sent routes it
-- here): the same account, kept on its last attempt
-- (keyturn._attempt_not_sent), an event on its action's timeline.
CREATE OR REPLACE FUNCTION keyturn._record_notification_not_sent(p_tenant text, p_id uuid, p_lease uuid, p_receipt jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n       keyturn.notification;
    v_taken text;
BEGIN
    SELECT x.* INTO n FROM keyturn.notification x
     WHERE x.id = p_id AND (p_tenant IS NULL OR x.tenant = p_tenant)  -- the plain call: by id alone
       FOR UPDATE;
    IF NOT FOUND OR n.status <> 'uncertain' THEN
        RETURN false;
    END IF;
    v_taken := keyturn._attempt_not_sent(n.id, n.tenant, n.attempts, p_lease, p_receipt);
    IF v_taken = 'written' THEN
        PERFORM keyturn._notification_event(n, 'uncertain', jsonb_build_object(
            'dispatcher_account', 'not_sent', 'attempt', n.attempts, 'lease_id', p_lease));
    END IF;
    RETURN v_taken <> 'refused';
END
$$;

-- ---- The message ----

-- What a notification says of an action: the server-written summary (for a
-- digest-retained action, which keeps none, the tool's name: pending() shows
-- the same), whole in a notice or a reminder (the renderer already shared
-- the summary's length among its values, so a cut here could hide the one
-- that decides, an amount at the end); a digest's lines at most p_max
-- characters, each pointing to the card.
CREATE OR REPLACE FUNCTION keyturn._notify_summary(p_summary text, p_tool text, p_max int)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_max IS NOT NULL AND length(coalesce(p_summary, p_tool)) > p_max
                THEN left(coalesce(p_summary, p_tool), p_max - 1) || '…'
                ELSE coalesce(p_summary, p_tool) END
$$;

-- notification_message and notification_message_for (p_what names the
-- call; p_tenant as in keyturn._lease): what the notification under this
-- lease says, for the dispatcher to send now, once begin_dispatch has made
-- it executing and while its lease is live (else 55000, as file_content).
--
-- send = false (reason says why) when nothing is to be sent after all: the
-- person removed the channel, or the action stopped waiting for them since
-- the begin. Otherwise: the channel, its target and a webhook's own secret;
-- the kind; title and body, plain text, and actions (a JSON array of
-- {action_id, summary, tool, effect, expires_at}) for renderers; and a card
-- link: a fresh one-time code (keyturn._mint_link) for link_action_ids, for
-- this person, whose card runs as the role they set the channel as, valid
-- until the first of those actions expires (at most a day). One message per
-- attempt (a second call is 55000), and its code replaces the unredeemed
-- code of the attempt before: the dispatcher's login, which carries the
-- message, cannot keep a spare code while it delivers another. Only the
-- code's digest is kept. Never params, a token or a JWT.
--
-- A digest lists every action still waiting among those it carries
-- (waiting counts them) and links those one card can hold: at most 100,
-- and self actions of one session only (a card works in one session; the
-- others are counted and wait in the person's queue).
CREATE OR REPLACE FUNCTION keyturn._notification_message(p_what text, p_tenant text, p_id uuid, p_lease uuid)
RETURNS TABLE (send boolean, reason text, channel text, target text, secret text, kind text, title text,
               body text, actions jsonb, link_action_ids uuid[], code text, code_expires_at timestamptz,
               waiting int)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n          keyturn.notification;
    c          keyturn.notify_channel;
    a          keyturn.action;
    v_ids      uuid[];
    v_id       uuid;
    v_reason   text;
    v_session  text;
    v_link     uuid[] := '{}';
    v_items    jsonb := '[]';
    v_lines    text[] := '{}';
    v_waiting  int := 0;
    v_effect   text;
    v_summary  text;
    v_now      timestamptz := clock_timestamp();
    v_expires  timestamptz := clock_timestamp() + interval '1 day';
    v_title    text;
    v_code     text;
BEGIN
    PERFORM keyturn._refuse_nested(p_what);
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    SELECT x.* INTO n FROM keyturn.notification x
     WHERE x.id = p_id AND (p_tenant IS NULL OR x.tenant = p_tenant)  -- the plain call: by id alone
       FOR NO KEY UPDATE;
    PERFORM keyturn._raise_lease_problem(keyturn._lease_problem_of('notification', p_id, FOUND, n.status, n.lease_id,
                                                                   n.lease_expires_at, p_lease, '{executing}', true));
    IF n.link_attempt IS NOT DISTINCT FROM n.attempts THEN
        RAISE EXCEPTION 'keyturn: the message of notification % attempt % was written already', n.id, n.attempts
            USING ERRCODE = '55000',
                  HINT = 'One message, and one link, per attempt: send the one read, or record the attempt''s outcome (retry if nothing was sent).';
    END IF;
    -- Shared, until this transaction ends: a set_notify or remove_notify
    -- of the channel waits for the code made here, and ends it (docs/
    -- security.md, row 138). One under way is never waited for (row 140):
    -- the message is not read now, keyturnd records a retry, and the next
    -- attempt reads the new target or the removal.
    BEGIN
        SELECT x.* INTO c FROM keyturn.notify_channel x
         WHERE x.tenant = n.tenant AND x.principal = n.principal AND x.channel = n.channel
           FOR SHARE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'keyturn: % is changing their % channel; its message is not read now', n.principal, n.channel
            USING ERRCODE = '55P03',
                  HINT = 'Record the attempt as retry: nothing was sent. The next attempt reads the channel as its person left it.';
    END;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, format('%s removed the %s channel', n.principal, n.channel), n.channel::text,
                            NULL::text, NULL::text, n.kind::text, NULL::text, NULL::text, NULL::jsonb, NULL::uuid[],
                            NULL::text, NULL::timestamptz, 0;
        RETURN;
    END IF;
    IF n.kind = 'digest' THEN
        v_ids := ARRAY(SELECT b.action_id FROM keyturn.notification b
                        WHERE b.batched_into = n.id AND b.tenant = n.tenant ORDER BY b.created_at, b.action_id);
    ELSE
        v_ids := ARRAY[n.action_id];
    END IF;
    FOREACH v_id IN ARRAY v_ids LOOP
        CONTINUE WHEN v_id = ANY (v_link);
        SELECT x.* INTO a FROM keyturn.action x WHERE x.id = v_id AND x.tenant = n.tenant;
        v_reason := keyturn._waits_for(a, n.principal);
        CONTINUE WHEN v_reason IS NOT NULL;
        v_waiting := v_waiting + 1;
        IF a.approval = 'self' THEN
            CONTINUE WHEN v_session IS NOT NULL AND v_session <> a.session;
            v_session := a.session;
        END IF;
        CONTINUE WHEN cardinality(v_link) >= 100;
        SELECT v.effect::text INTO v_effect FROM keyturn.tool_version v
         WHERE v.tool = a.tool AND v.version = a.tool_version;
        v_summary := keyturn._notify_summary(a.summary, a.tool, CASE WHEN n.kind = 'digest' THEN 300 END);
        v_link := v_link || a.id;
        v_expires := least(v_expires, a.expires_at);
        v_items := v_items || jsonb_build_array(jsonb_build_object(
            'action_id', a.id, 'summary', v_summary, 'tool', a.tool, 'effect', v_effect,
            'expires_at', keyturn._utc(a.expires_at)));
        v_lines := v_lines || format(E'%s\nTool: %s · Effect: %s · Expires: %s UTC', v_summary, a.tool, v_effect,
                                     to_char(a.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'));
    END LOOP;
    IF cardinality(v_link) = 0 THEN
        RETURN QUERY SELECT false, coalesce(v_reason, 'no action it is about waits for the person'),
                            n.channel::text, NULL::text, NULL::text, n.kind::text, NULL::text, NULL::text,
                            NULL::jsonb, NULL::uuid[], NULL::text, NULL::timestamptz, 0;
        RETURN;
    END IF;
    -- A card of no self action works in a session of its own.
    v_session := coalesce(v_session, 'notification:' || n.id::text);
    IF n.kind = 'digest' THEN
        UPDATE keyturn.notification x SET covers = v_link, updated_at = v_now
         WHERE x.id = n.id AND x.tenant = n.tenant;
        v_title := CASE WHEN v_waiting = 1 THEN '1 action waits for you'
                        ELSE format('%s actions wait for you', v_waiting) END;
    ELSIF n.kind = 'reminder' THEN
        v_title := 'Reminder, expires soon: ' || (v_items -> 0 ->> 'summary');
    ELSE
        v_title := 'Approval needed: ' || (v_items -> 0 ->> 'summary');
    END IF;
    -- The attempt before's code, unless the person opened it, ends here.
    DELETE FROM keyturn.card_link l
     WHERE l.code_digest = n.link_digest AND l.tenant = n.tenant AND l.redeemed_at IS NULL;
    v_code := keyturn._mint_link(n.tenant, n.principal, v_session, c.db_role, v_link, v_now, v_expires,
                                 p_notification => n.id);
    UPDATE keyturn.notification x SET link_digest = keyturn._token_digest(v_code), link_attempt = n.attempts
     WHERE x.id = n.id AND x.tenant = n.tenant;
    RETURN QUERY SELECT true, NULL::text, n.channel::text, c.target, c.secret, n.kind::text, v_title,
                        array_to_string(v_lines, E'\n\n'), v_items, v_link, v_code, v_expires, v_waiting;
END
$$;

CREATE OR REPLACE FUNCTION keyturn.notification_message(notification_id uuid, lease_id uuid)
RETURNS TABLE (send boolean, reason text, channel text, target text, secret text, kind text, title text,
               body text, actions jsonb, link_action_ids uuid[], code text, code_expires_at timestamptz,
               waiting int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM keyturn._notification_message('notification_message', NULL,
                                                             notification_message.notification_id,
                                                             notification_message.lease_id);
END
$$;

CREATE OR REPLACE FUNCTION keyturn.notification_message_for(tenant text, notification_id uuid, lease_id uuid)
RETURNS TABLE (send boolean, reason text, channel text, target text, secret text, kind text, title text,
               body text, actions jsonb, link_action_ids uuid[], code text, code_expires_at timestamptz,
               waiting int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(notification_message_for.tenant, 'notification_message_for');
    RETURN QUERY SELECT * FROM keyturn._notification_message('notification_message_for',
                                                             notification_message_for.tenant,
                                                             notification_message_for.notification_id,
                                                             notification_message_for.lease_id);
END
$$;

-- The operator's view of an action's notifications (the console's
-- timeline): the notices and reminders about it and the digests that
-- carried them, with their status, attempts and receipts (stored redacted),
-- never a target or secret.
CREATE OR REPLACE FUNCTION keyturn.notifications(action_id uuid)
RETURNS TABLE (notification_id uuid, tenant text, principal text, channel text, kind text, status text,
               attempts int, created_at timestamptz, due_at timestamptz, dispatched_at timestamptz,
               receipt jsonb, result jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('notifications');
    RETURN QUERY
    SELECT n.id, n.tenant, n.principal, n.channel::text, n.kind::text, n.status::text, n.attempts, n.created_at,
           n.next_attempt_at, n.dispatched_at, n.receipt, n.result
      FROM keyturn.notification n
     WHERE n.action_id = notifications.action_id  -- by id alone: operators act across tenants
        OR n.id IN (SELECT b.batched_into FROM keyturn.notification b
                     WHERE b.action_id = notifications.action_id AND b.batched_into IS NOT NULL)
     ORDER BY n.created_at, n.id;
END
$$;


-- ==== sql/068_console.sql ====

-- What the operator console reads (docs/card.md, "The operator console"):
-- actions by status with counts, a filtered list of actions, the tools with
-- their versions and enabled state, and the standing approvals, for the
-- operator and the platform administrator, across tenants as
-- uncertain_actions is.
--
-- None returns a param value or a summary: a summary is written from the
-- params, and an operator reconciles by role across tenants without seeing
-- what the people of a tenant proposed (the events, attempts and receipts
-- they already read hold no values either). A person's own queue is
-- keyturn.pending, with the card.
--
-- The filters are plain arguments, each NULL for "any"; the time range is on
-- created_at, half-open [since, until).

-- The checks every console read makes first: not nested in another keyturn
-- call, the operator or the platform administrator (others: 42501), and
-- filters that make sense (22023). The reads are SQL functions, whose
-- arguments may share the names of the columns they return; each makes
-- this call as its first statement, before its query runs.
CREATE OR REPLACE FUNCTION keyturn._console(p_what text, p_status text, p_since timestamptz, p_until timestamptz,
                                 p_max_rows int)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_role text := keyturn._calling_role();
BEGIN
    PERFORM keyturn._refuse_nested(p_what);
    IF NOT (pg_has_role(v_role, 'keyturn_operator', 'USAGE') OR pg_has_role(v_role, 'keyturn_admin', 'USAGE')) THEN
        RAISE EXCEPTION 'keyturn: % is for the operator console', p_what
            USING ERRCODE = '42501',
                  HINT = 'Call it as a role in keyturn_operator or keyturn_admin.';
    END IF;
    IF p_since IS NOT NULL AND p_until IS NOT NULL AND p_since >= p_until THEN
        RAISE EXCEPTION 'keyturn: since (%) must be before until (%)', p_since, p_until
            USING ERRCODE = '22023';
    END IF;
    IF p_max_rows IS NULL OR p_max_rows NOT BETWEEN 1 AND 500 THEN
        RAISE EXCEPTION 'keyturn: max_rows must be 1 to 500, not %', coalesce(p_max_rows::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_status IS NOT NULL AND NOT p_status = ANY (enum_range(NULL::keyturn.status)::text[]) THEN
        RAISE EXCEPTION 'keyturn: % is not a status', keyturn._quoted(p_status)
            USING ERRCODE = '22023',
                  HINT = format('One of %s.', array_to_string(enum_range(NULL::keyturn.status)::text[], ', '));
    END IF;
END
$$;

-- How many actions are in each status (every status, zeros included), of
-- the actions that match the filters.
CREATE OR REPLACE FUNCTION keyturn.action_counts(tenant text DEFAULT NULL, tool text DEFAULT NULL,
                                      since timestamptz DEFAULT NULL, until timestamptz DEFAULT NULL)
RETURNS TABLE (status text, actions bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._console('action_counts', NULL, action_counts.since, action_counts.until, 1);
    WITH counted AS (
        SELECT a.status, count(*) AS n
          FROM keyturn.action a
         WHERE (action_counts.tenant IS NULL OR a.tenant = action_counts.tenant)
           AND (action_counts.tool IS NULL OR a.tool = action_counts.tool)
           AND (action_counts.since IS NULL OR a.created_at >= action_counts.since)
           AND (action_counts.until IS NULL OR a.created_at < action_counts.until)
         GROUP BY a.status)
    SELECT s::text, coalesce(c.n, 0)
      FROM unnest(enum_range(NULL::keyturn.status)) WITH ORDINALITY AS e (s, ord)
      LEFT JOIN counted c ON c.status = e.s
     ORDER BY e.ord
$$;

-- The actions that match, newest first, at most max_rows (1 to 500); one
-- action by its id with id.
CREATE OR REPLACE FUNCTION keyturn.find_actions(status text DEFAULT NULL, tenant text DEFAULT NULL, tool text DEFAULT NULL,
                                     since timestamptz DEFAULT NULL, until timestamptz DEFAULT NULL,
                                     id uuid DEFAULT NULL, max_rows int DEFAULT 50)
RETURNS TABLE (action_id uuid, tenant text, tool text, tool_version int, status text, principal text,
               session text, approval text, retain text, attempts int, created_at timestamptz,
               updated_at timestamptz, expires_at timestamptz, approved_by text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._console('find_actions', find_actions.status, find_actions.since, find_actions.until,
                            find_actions.max_rows);
    SELECT a.id, a.tenant, a.tool, a.tool_version, a.status::text, a.principal, a.session,
           a.approval::text, a.retain::text, a.attempts, a.created_at, a.updated_at, a.expires_at,
           a.approved_by
      FROM keyturn.action a
     WHERE (find_actions.id IS NULL OR a.id = find_actions.id)
       AND (find_actions.status IS NULL OR a.status = find_actions.status::keyturn.status)
       AND (find_actions.tenant IS NULL OR a.tenant = find_actions.tenant)
       AND (find_actions.tool IS NULL OR a.tool = find_actions.tool)
       AND (find_actions.since IS NULL OR a.created_at >= find_actions.since)
       AND (find_actions.until IS NULL OR a.created_at < find_actions.until)
     ORDER BY a.created_at DESC, a.id
     LIMIT find_actions.max_rows
$$;

-- Every tool with its current version's class, whether it is enabled, and
-- whether the caller may throw the kill switch (keyturn.set_tool_enabled,
-- the platform administrator's), so the console offers it only then.
CREATE OR REPLACE FUNCTION keyturn.tools()
RETURNS TABLE (tool text, version int, enabled boolean, kind text, executor text, effect text,
               approval text, quorum int, retain text, delegable boolean, expires_in interval,
               updated_at timestamptz, may_switch boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._console('tools', NULL, NULL, NULL, 1);
    SELECT t.name, t.version, t.enabled, v.kind::text, v.executor::text, v.effect::text,
           v.approval::text, v.quorum, v.retain::text, v.delegable, v.expires_in, t.updated_at,
           has_function_privilege(keyturn._calling_role(), 'keyturn.set_tool_enabled(text, boolean)', 'EXECUTE')
      FROM keyturn.tool t
      JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
     ORDER BY t.name
$$;

-- Every standing approval (of one tenant with tenant), newest first, with
-- why it no longer covers anything (ended, NULL while it is live). Scopes
-- are shown: they are what a person allowed, not what an agent proposed.
CREATE OR REPLACE FUNCTION keyturn.standing_approvals(tenant text DEFAULT NULL)
RETURNS TABLE (delegation_id uuid, tenant text, principal text, tool text, tool_version int, scope jsonb,
               uses int, max_uses int, created_at timestamptz, expires_at timestamptz,
               revoked_at timestamptz, ended text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._console('standing_approvals', NULL, NULL, NULL, 1);
    SELECT d.id, d.tenant, d.principal, d.tool, d.tool_version, d.scope, d.uses, d.max_uses,
           d.created_at, d.expires_at, d.revoked_at,
           keyturn._delegation_ended(d, t.version, keyturn._epoch(d.tenant, d.principal), clock_timestamp())
      FROM keyturn.delegation d
      LEFT JOIN keyturn.tool t ON t.name = d.tool
     WHERE standing_approvals.tenant IS NULL OR d.tenant = standing_approvals.tenant
     ORDER BY d.created_at DESC, d.id
$$;


-- ==== sql/070_deployment.sql ====

-- keyturn.check_deployment(): what a live database gets wrong (docs/operations.md,
-- "Checking a deployment").
--
-- keyturn's rules hold inside its functions; some depend on how the
-- database around them is set up. This lists every such problem it can see,
-- one row each: 'error' breaks a guarantee keyturn states, 'warning' weakens
-- one or needs a person to confirm it is intended.

-- The tables the current version of some sql tool writes. plpgsql, not sql:
-- an SQL function would be inlined into check_deployment's query, and Citus
-- refuses a query whose distributed tables (keyturn's, on layout B) appear
-- only once the planner has inlined it.
CREATE OR REPLACE FUNCTION keyturn._gated_tables()
RETURNS TABLE (relid oid, kind keyturn.tool_kind, tools text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT to_regclass(format('%I.%I', v.sql_schema, v.sql_table))::oid, v.kind,
           string_agg(v.tool, ', ' ORDER BY v.tool)
      FROM keyturn.tool t
      JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
     WHERE v.executor = 'sql' AND to_regclass(format('%I.%I', v.sql_schema, v.sql_table)) IS NOT NULL
     GROUP BY 1, 2;
END
$$;

CREATE OR REPLACE FUNCTION keyturn.check_deployment()
RETURNS TABLE (severity text, object text, problem text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET quote_all_identifiers = off  -- types compared as register_tool printed them
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('check_deployment');
    IF NOT pg_has_role(keyturn._calling_role(), 'keyturn_admin', 'USAGE') THEN
        RAISE EXCEPTION 'keyturn: check_deployment needs a superuser or the keyturn_admin role'
            USING ERRCODE = '42501';
    END IF;
    RETURN QUERY
    WITH problems (severity, object, problem) AS (
        -- Agents that can change a gated table other than through the form,
        -- or attach code that runs inside an approved write.
        SELECT 'error', g.relid::regclass::text,
               p || ' (gated by ' || g.tools || '); an agent could run code as the approver inside an approved write'
          FROM keyturn._gated_tables() g, keyturn._agent_table_problems(g.relid) p
         WHERE g.kind = 'write'
        UNION ALL
        -- Agents that read a read tool's table past its row-level security,
        -- and tables read without any.
        SELECT 'error', g.relid::regclass::text,
               p || ' (read by ' || g.tools || '); an agent reads it past its row-level security'
          FROM keyturn._gated_tables() g, keyturn._agent_table_problems(g.relid, true) p
         WHERE g.kind = 'read'
        UNION ALL
        SELECT 'warning', g.relid::regclass::text,
               format('row-level security is off on %s (read by %s): an agent reads every tenant''s rows of it',
                      g.relid::regclass, g.tools)
          FROM keyturn._gated_tables() g
          JOIN pg_class c ON c.oid = g.relid
         WHERE g.kind = 'read' AND NOT c.relrowsecurity
        UNION ALL
        -- An agent that may create roles may, on PostgreSQL 15 and earlier,
        -- grant itself any role that is not a superuser, an approver's too.
        SELECT 'error', r.rolname::text,
               'agent role has CREATEROLE: it can make itself or a new login a member of an approver role, and approve its own proposals'
          FROM pg_roles r
         WHERE r.rolcreaterole AND keyturn._is_agent_role(r.oid)
        UNION ALL
        -- Code on gated tables.
        SELECT CASE WHEN n.nspname LIKE 'pg\_temp\_%' OR keyturn._is_agent_role(f.proowner)
                    THEN 'error' ELSE 'warning' END,
               f.oid::regprocedure::text,
               CASE WHEN n.nspname LIKE 'pg\_temp\_%'
                        THEN format('trigger %s on %s calls a function in a temporary schema', tg.tgname, tree.relid::regclass)
                    WHEN keyturn._is_agent_role(f.proowner)
                        THEN format('trigger %s on %s calls a function owned by agent role %s', tg.tgname, tree.relid::regclass, f.proowner::regrole)
                    ELSE format('trigger function of %s on %s is SECURITY DEFINER without a pinned search_path', tg.tgname, tree.relid::regclass)
               END
          FROM keyturn._gated_tables() g
         CROSS JOIN keyturn._table_tree(g.relid) AS tree (relid)
          JOIN pg_trigger tg ON tg.tgrelid = tree.relid AND NOT tg.tgisinternal
          JOIN pg_proc f ON f.oid = tg.tgfoid
          JOIN pg_namespace n ON n.oid = f.pronamespace
         WHERE g.kind = 'write'
           AND (n.nspname LIKE 'pg\_temp\_%'
                OR keyturn._is_agent_role(f.proowner)
                OR (f.prosecdef AND NOT coalesce(array_to_string(f.proconfig, ',') LIKE '%search_path=%', false)))
        UNION ALL
        -- What an agent owns that a gated table's policies, column defaults,
        -- constraints, indexes, rules and column types use: it runs inside
        -- the approved write, as the approver, as a trigger's function
        -- would (thirty-third and thirty-fourth red-team passes).
        SELECT 'error', u.obj,
               format('%s on %s uses %s, owned by agent role %s', u.what, tree.relid::regclass, u.obj, u.owner::regrole)
          FROM keyturn._gated_tables() g
         CROSS JOIN keyturn._table_tree(g.relid) AS tree (relid)
         CROSS JOIN LATERAL keyturn._agent_owned_uses(tree.relid) u
         WHERE g.kind = 'write'
        UNION ALL
        -- Keys that can name two rows (a unique index dropped since).
        SELECT 'error', format('tool %s', v.tool), k
          FROM keyturn.tool t
          JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
         CROSS JOIN LATERAL keyturn._key_problem(to_regclass(format('%I.%I', v.sql_schema, v.sql_table)), v.sql_key) k
         WHERE v.executor = 'sql' AND to_regclass(format('%I.%I', v.sql_schema, v.sql_table)) IS NOT NULL
           AND k IS NOT NULL
        UNION ALL
        -- Columns whose type changed since the tool was registered: its
        -- checks read the type it was registered with (docs/security.md,
        -- row 126).
        SELECT 'error', format('tool %s', v.tool),
               format('column %s of %I.%I is %s now, and was %s when the tool was registered, whose checks read that type',
                      quote_ident(c.col), v.sql_schema, v.sql_table,
                      coalesce(format_type(a.atttypid, a.atttypmod), 'gone'), c.registered)
          FROM keyturn.tool t
          JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
         CROSS JOIN LATERAL jsonb_each_text(v.sql_types) AS c (col, registered)
          LEFT JOIN pg_attribute a ON a.attrelid = to_regclass(format('%I.%I', v.sql_schema, v.sql_table))
                                  AND a.attname = c.col AND a.attnum > 0 AND NOT a.attisdropped
         WHERE v.executor = 'sql' AND to_regclass(format('%I.%I', v.sql_schema, v.sql_table)) IS NOT NULL
           AND c.col <> 'xmin'
           AND format_type(a.atttypid, a.atttypmod) IS DISTINCT FROM c.registered
        UNION ALL
        -- Version columns nothing maintains.
        SELECT 'warning', format('tool %s', v.tool),
               format('version column %s of %I.%I is not changed by any BEFORE UPDATE trigger, so a conflicting edit may go unseen',
                      v.sql_version, v.sql_schema, v.sql_table)
          FROM keyturn.tool t
          JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
         WHERE v.executor = 'sql' AND v.sql_version <> 'xmin'
           AND NOT EXISTS (SELECT 1 FROM pg_trigger tg
                            WHERE tg.tgrelid = to_regclass(format('%I.%I', v.sql_schema, v.sql_table))
                              AND NOT tg.tgisinternal AND (tg.tgtype & 2) <> 0 AND (tg.tgtype & 16) <> 0
                              AND (tg.tgtype & 1) <> 0)
        UNION ALL
        -- Logins that serve both sides.
        SELECT 'error', r.rolname::text,
               'login inherits both keyturn_agent and keyturn_approver: a process holding it proposes and approves; make it NOINHERIT or split it'
          FROM pg_roles r
         WHERE r.rolcanlogin AND NOT r.rolsuper
           AND pg_has_role(r.oid, 'keyturn_agent', 'USAGE') AND pg_has_role(r.oid, 'keyturn_approver', 'USAGE')
        UNION ALL
        SELECT 'warning', r.rolname::text,
               'login may SET ROLE to both an agent and an approver role (NOINHERIT, as a PostgREST authenticator): make sure the agent''s process can never choose the approver role'
          FROM pg_roles r
         WHERE r.rolcanlogin AND NOT r.rolsuper
           AND pg_has_role(r.oid, 'keyturn_agent', 'MEMBER') AND pg_has_role(r.oid, 'keyturn_approver', 'MEMBER')
           AND NOT (pg_has_role(r.oid, 'keyturn_agent', 'USAGE') AND pg_has_role(r.oid, 'keyturn_approver', 'USAGE'))
        UNION ALL
        -- Roles that bypass row-level security on keyturn's side.
        SELECT 'warning', r.rolname::text,
               format('role bypasses row-level security and is a member of %s: it sees every tenant''s rows in keyturn''s tables it may read',
                      CASE WHEN pg_has_role(r.oid, 'keyturn_agent', 'MEMBER') THEN 'keyturn_agent' ELSE 'keyturn_approver' END)
          FROM pg_roles r
         WHERE r.rolbypassrls AND NOT r.rolsuper
           AND (pg_has_role(r.oid, 'keyturn_agent', 'MEMBER') OR pg_has_role(r.oid, 'keyturn_approver', 'MEMBER'))
        UNION ALL
        -- Identity that is not transaction-local by default.
        SELECT 'error',
               format('setting %s', split_part(cfg, '=', 1)),
               format('set by ALTER %s ... SET: every connection of %s starts with this identity, and a pooler hands it to the next client',
                      CASE WHEN s.setrole = 0 THEN 'DATABASE' ELSE 'ROLE' END,
                      CASE WHEN s.setrole = 0 THEN coalesce((SELECT datname FROM pg_database WHERE oid = s.setdatabase)::text, 'every database')
                           ELSE s.setrole::regrole::text END)
          FROM pg_db_role_setting s, unnest(s.setconfig) cfg
         WHERE split_part(cfg, '=', 1) IN ('keyturn.tenant', 'keyturn.principal', 'keyturn.session', 'request.jwt.claims')
           AND (s.setdatabase = 0 OR s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database()))
        UNION ALL
        SELECT 'error', format('setting %s', c.name),
               format('set in %s: every connection starts with this identity', coalesce(c.sourcefile, c.source))
          FROM pg_settings c
         WHERE c.name IN ('keyturn.tenant', 'keyturn.principal', 'keyturn.session', 'request.jwt.claims')
           AND c.source IN ('configuration file', 'command line', 'environment variable')
           AND coalesce(c.reset_val, '') <> ''
        UNION ALL
        -- A claim path into what the signed-in user may edit (Supabase's
        -- user_metadata) lets the caller choose its own identity.
        SELECT 'error', format('setting %s', p.name),
               format('points into %s, which the user may edit: a caller would choose this identity; use a claim only the issuer sets (app_metadata)',
                      current_setting(p.name, true))
          FROM (VALUES ('keyturn.claim_tenant'), ('keyturn.claim_principal'), ('keyturn.claim_session')) p (name)
         WHERE coalesce(current_setting(p.name, true), '') ~ '^user_metadata(\.|$)'
        UNION ALL
        SELECT 'warning', 'setting keyturn.allow_session_identity',
               'session-level identity is accepted: only safe while no connection is ever shared (no pooler, no reused connection)'
         WHERE coalesce(current_setting('keyturn.allow_session_identity', true), 'off') = 'on'
           OR EXISTS (SELECT 1 FROM pg_db_role_setting s, unnest(s.setconfig) cfg
                       WHERE cfg = 'keyturn.allow_session_identity=on')
        UNION ALL
        -- Statement logging that writes the bound parameters of keyturn's
        -- calls, which carry one-time tokens, link codes and card sessions
        -- (fifth red-team pass, docs/security.md row 86). The settings of
        -- this session: the server's, unless a role or database sets its own.
        SELECT 'warning', format('setting %s', l.name),
               format('%s = %s writes the bound parameters of keyturn''s calls (one-time tokens, link codes, card sessions) to the server log; set log_parameter_max_length = 0, server-wide or for the logins of keyturnd and the application',
                      l.name, l.setting)
          FROM pg_settings l
         WHERE ((l.name = 'log_statement' AND l.setting = 'all')
                OR (l.name = 'log_min_duration_statement' AND l.setting::int >= 0))
           AND (SELECT setting::int FROM pg_settings WHERE name = 'log_parameter_max_length') <> 0
        UNION ALL
        SELECT 'warning', 'setting log_parameter_max_length_on_error',
               'a failed statement''s bound parameters (one-time tokens, link codes, card sessions of keyturn''s calls) go to the server log; set it to 0'
         WHERE (SELECT setting::int FROM pg_settings WHERE name = 'log_parameter_max_length_on_error') <> 0
        UNION ALL
        -- Writes to keyturn's own tables, and reads of its secret.
        SELECT 'error', format('%I.%I', t.table_schema, t.table_name),
               format('role %s holds %s on it: only keyturn''s functions may change keyturn''s tables', t.grantee, t.privilege_type)
          FROM information_schema.role_table_grants t
         WHERE t.table_schema IN ('keyturn', 'keyturn_secret')
           AND t.privilege_type IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'TRIGGER', 'REFERENCES')
           AND NOT EXISTS (SELECT 1 FROM pg_roles o WHERE o.rolname = t.grantee AND o.rolsuper)
        UNION ALL
        SELECT 'error', r.rolname::text,
               'role is a member of pg_write_all_data: it may change keyturn''s tables directly, around every rule'
          FROM pg_roles r
         WHERE NOT r.rolsuper AND r.oid >= 16384
           AND pg_has_role(r.oid, 'pg_write_all_data', 'MEMBER')
        UNION ALL
        -- The predefined roles (oids below FirstNormalObjectId, 16384) are not
        -- reported themselves: their members are.
        SELECT 'error', 'keyturn_secret.approval_key',
               format('role %s may read the approval key: it could forge approvals', r.rolname)
          FROM pg_roles r
         WHERE NOT r.rolsuper AND r.oid >= 16384
           AND (has_table_privilege(r.oid, 'keyturn_secret.approval_key', 'SELECT')
                OR has_schema_privilege(r.oid, 'keyturn_secret', 'USAGE, CREATE'))
        UNION ALL
        SELECT 'error', format('%I.%I', t.table_schema, t.table_name),
               format('role %s (%s) may SELECT it: dispatchers, operators and admins reach keyturn only through its functions',
                      t.grantee, string_agg(DISTINCT k.rolname, ', '))
          FROM information_schema.role_table_grants t
          JOIN pg_roles g ON g.rolname = t.grantee
          JOIN pg_roles k ON k.rolname IN ('keyturn_dispatcher', 'keyturn_operator', 'keyturn_admin')
                         AND pg_has_role(g.oid, k.oid, 'MEMBER')
         WHERE t.table_schema = 'keyturn' AND t.privilege_type = 'SELECT' AND NOT g.rolsuper
           AND NOT pg_has_role(g.oid, 'keyturn_agent', 'MEMBER')
           AND NOT pg_has_role(g.oid, 'keyturn_approver', 'MEMBER')
         GROUP BY t.table_schema, t.table_name, t.grantee
        UNION ALL
        -- Gated tables that Citus distributes, and the workers (sql/071_citus.sql).
        SELECT c.severity, c.object, c.problem FROM keyturn._citus_problems() c
    )
    SELECT p.severity, p.object, p.problem FROM problems p
     ORDER BY CASE p.severity WHEN 'error' THEN 0 ELSE 1 END, p.object, p.problem;
END
$$;


-- ==== sql/071_citus.sql ====

-- keyturn on Citus (docs/scale-out.md): check_deployment's part for Citus,
-- the dispatcher's question whether to go tenant by tenant, and
-- citus_distribute, which lays keyturn's own tables out by tenant (layout
-- B). What Citus says about a table is sql/012_citus_catalog.sql.
--
-- The extension never depends on Citus: without it in this database every
-- function here answers nothing, and Citus's catalog and functions are only
-- reached through EXECUTE, once its presence is known.

-- Whether every backend of this node loads pg_keyturn when it starts
-- (shared_preload_libraries, or session_preload_libraries), so that its
-- planner hook runs before Citus plans any statement: the hook refuses a
-- tenant-explicit call whose tenant is NULL, which Citus would otherwise
-- hash as text and crash on (extension/src/route_guard.rs). A backend that
-- loads pg_keyturn later is protected only from then on.
CREATE OR REPLACE FUNCTION keyturn._preloaded()
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT concat_ws(',', current_setting('shared_preload_libraries', true),
                     current_setting('session_preload_libraries', true))
           ~ '(^|,)\s*(\$libdir/)?pg_keyturn(\.so)?\s*(,|$)'
$$;

-- What every node must agree on for identity to resolve alike everywhere:
-- pg_keyturn's version and the settings that read identity. Calling
-- current_tenant() first loads pg_keyturn in this backend, so its settings
-- are defined here even on a worker's fresh connection.
CREATE OR REPLACE FUNCTION keyturn._citus_node_settings()
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    PERFORM keyturn.current_tenant();
    RETURN format('%s|%s|%s|%s|%s|%s|%s', (SELECT extversion FROM pg_extension WHERE extname = 'pg_keyturn'),
                  current_setting('keyturn.claim_tenant', true), current_setting('keyturn.claim_principal', true),
                  current_setting('keyturn.claim_session', true), current_setting('keyturn.claim_numbers', true),
                  current_setting('keyturn.allow_session_identity', true), keyturn._preloaded());
END
$$;

-- check_deployment's part for Citus: the gated tables Citus distributes, and
-- what the workers must share with the coordinator. Severity as there.
-- VOLATILE: it asks the workers.
CREATE OR REPLACE FUNCTION keyturn._citus_problems()
RETURNS TABLE (severity text, object text, problem text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_coord text;
    w       record;
BEGIN
    IF NOT keyturn._citus_present() THEN
        RETURN;
    END IF;

    RETURN QUERY
    SELECT 'error', format('tool %s', v.tool), p
      FROM keyturn.tool t
      JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
     CROSS JOIN LATERAL keyturn._citus_table_problems(
               to_regclass(format('%I.%I', v.sql_schema, v.sql_table)), v.sql_key, v.sql_version,
               v.sql_set, v.sql_types) p
     WHERE v.executor = 'sql' AND to_regclass(format('%I.%I', v.sql_schema, v.sql_table)) IS NOT NULL;

    -- Routing: without the distribution column in the form, Citus cannot
    -- tell which shard the write touches and runs it on all of them, in a
    -- two-phase commit over every worker (docs/scale-out.md, "Throughput").
    RETURN QUERY
    SELECT 'warning', format('tool %s', v.tool),
           format('the form cannot name %s, the distribution column of %s: every approval runs on every shard, in a two-phase commit over all workers; add it to spec.sql.where and have the agent fill it in',
                  quote_ident(c.dist_column), format('%I.%I', v.sql_schema, v.sql_table))
      FROM keyturn.tool t
      JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version
     CROSS JOIN LATERAL keyturn._citus_table(to_regclass(format('%I.%I', v.sql_schema, v.sql_table))) c
     WHERE v.executor = 'sql' AND c.dist_column IS NOT NULL AND NOT c.dist_column = ANY (v.sql_where);

    -- Code on a distributed gated table runs on the workers, per shard, as
    -- the approver, inside the approved write.
    RETURN QUERY
    SELECT 'warning', g.relid::regclass::text,
           format('trigger %s runs on the workers, in each shard, inside the approved write (citus.enable_unsafe_triggers): it must touch only rows of the same shard (colocated tables, the same tenant); a statement without the tenant fans out to every node from inside the write',
                  tg.tgname)
      FROM keyturn._gated_tables() g
     CROSS JOIN LATERAL keyturn._citus_table(g.relid) c
      JOIN pg_trigger tg ON tg.tgrelid = g.relid AND NOT tg.tgisinternal
     WHERE g.kind = 'write' AND c.method = 'h' AND NOT c.reference;

    RETURN QUERY
    SELECT 'warning', g.relid::regclass::text,
           format('reference table gated by %s: every approval writes every node, in a two-phase commit', g.tools)
      FROM keyturn._gated_tables() g
     CROSS JOIN LATERAL keyturn._citus_table(g.relid) c
     WHERE g.kind = 'write' AND c.reference;

    -- The application's own statements on distributed tables (an agent's
    -- reads under RLS) reach the workers with its identity only as
    -- propagated SET LOCALs; keyturn re-asserts identity for its own.
    IF coalesce((SELECT s.reset_val FROM pg_settings s WHERE s.name = 'citus.propagate_set_commands'), 'none') <> 'local'
       AND EXISTS (SELECT 1 FROM keyturn._gated_tables() g CROSS JOIN LATERAL keyturn._citus_table(g.relid) c
                    WHERE NOT c.reference) THEN
        RETURN QUERY SELECT 'warning', 'setting citus.propagate_set_commands',
            'is not ''local'' for this login: the application''s own statements on distributed tables see no identity on the workers (row-level security there finds no tenant); set it to local and assert identity with SET LOCAL (docs/scale-out.md)';
    END IF;

    -- Distributed, every _for call is routed by Citus, which crashes on a NULL
    -- tenant unless pg_keyturn's planner hook refused it first.
    IF keyturn.dispatch_by_tenant() AND NOT keyturn._preloaded() THEN
        RETURN QUERY SELECT 'error', 'setting shared_preload_libraries',
            'does not load pg_keyturn: a tenant-explicit call with a NULL tenant, which any role that may make one can send, crashes the backend in Citus''s routing and restarts every connection of the node; set shared_preload_libraries = ''citus,pg_keyturn'' on every node and restart them (docs/scale-out.md)';
    END IF;

    -- Every worker resolves identity itself (RLS calls keyturn.current_tenant()
    -- there), from the settings keyturn propagates: it needs pg_keyturn at the
    -- coordinator's version and the same claim settings.
    v_coord := keyturn._citus_node_settings();
    BEGIN
        FOR w IN EXECUTE
            'SELECT nodename, nodeport, success, result
               FROM pg_catalog.run_command_on_workers(''SELECT keyturn._citus_node_settings()'')'
        LOOP
            IF NOT w.success THEN
                RETURN QUERY SELECT 'error', format('worker %s:%s', w.nodename, w.nodeport),
                    format('pg_keyturn is missing or differs there (keyturn._citus_node_settings() failed: %s): row-level security on that worker cannot resolve identity as here',
                           w.result);
            ELSIF w.result IS DISTINCT FROM v_coord THEN
                RETURN QUERY SELECT 'error', format('worker %s:%s', w.nodename, w.nodeport),
                    format('pg_keyturn version, identity settings or preloading (version|claim_tenant|claim_principal|claim_session|claim_numbers|allow_session_identity|preloaded) are %s there, %s here: row-level security on that worker would resolve another identity, or a call with a NULL tenant could crash a backend there; set them alike on every node',
                           w.result, v_coord);
            END IF;
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        RETURN QUERY SELECT 'warning', 'citus workers',
            format('could not compare keyturn''s version and identity settings with the workers: %s', SQLERRM);
    END;
END
$$;

-- Whether keyturn's own tables are distributed by tenant (layout B): the
-- dispatcher must then call the tenant-explicit forms, tenant by tenant
-- (sql/062_dispatch_for.sql). keyturnd asks this at start and whenever a
-- lease fails.
CREATE OR REPLACE FUNCTION keyturn.dispatch_by_tenant()
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM keyturn._citus_table('keyturn.action'::regclass) c WHERE c.dist_column = 'tenant');
END
$$;

-- The nodes besides this one whose notifications keyturnd must hear: in
-- layout B an approval's wake-up (NOTIFY keyturn_dispatch) is sent on the
-- worker that holds the tenant's shards, where the delegated call commits,
-- and a notification is heard only on the node that sent it. Empty
-- otherwise. The names are those this node reaches the workers by.
CREATE OR REPLACE FUNCTION keyturn.dispatch_nodes()
RETURNS TABLE (host text, port int)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT keyturn.dispatch_by_tenant() THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE
        'SELECT n.nodename::text, n.nodeport::int FROM pg_catalog.pg_dist_node n
          WHERE n.isactive AND n.noderole = ''primary''
            AND n.groupid <> (SELECT l.groupid FROM pg_catalog.pg_dist_local_group l)
          ORDER BY n.nodeid';
END
$$;

-- Whether the shard of p_rel (hash-distributed) that holds p_value has a
-- placement on this node. False without Citus or for a table Citus does not
-- hash-distribute. What keyturn runs at a worker's commit (the chain's
-- write, the recheck of the authorization epoch) asks it before it lets
-- Citus run those statements there (extension/src/citus.rs, begin_local):
-- only when, naming the tenant, they stay on this node.
CREATE OR REPLACE FUNCTION keyturn._citus_shard_here(p_rel regclass, p_value text)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_here boolean;
BEGIN
    IF NOT keyturn._citus_present()
       OR NOT EXISTS (SELECT 1 FROM keyturn._citus_table(p_rel) c WHERE c.method = 'h') THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_placement pl
                              JOIN pg_catalog.pg_dist_local_group g ON g.groupid = pl.groupid
                             WHERE pl.shardid = pg_catalog.get_shard_id_for_distribution_column($1, $2))'
        INTO v_here USING p_rel, p_value;
    RETURN v_here;
END
$$;

-- Layout B in one call (docs/scale-out.md): keyturn's tables that hold no
-- tenant become reference tables, its tenant tables are distributed by
-- tenant, colocated with colocate_with (a business table distributed by its
-- text tenant column), and every tenant-explicit call (propose_for, …,
-- lease_for, …) is registered so that Citus sends it whole to the tenant's
-- worker. For the coordinator's superuser, once, with keyturnd stopped;
-- what is done already is skipped, so it may run again. Returns what it did.
--
-- The foreign keys from keyturn's tables to its tables without a tenant go:
-- with them Citus converts every table they join and fails on the
-- extension's own objects, and they cannot be added back, since every
-- worker's copy of the extension still holds them. keyturn's functions,
-- the only writers of these tables, keep what they kept.
CREATE OR REPLACE FUNCTION keyturn.citus_distribute(colocate_with regclass)
RETURNS TABLE (object text, done text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c         record;
    r         record;
    delegated boolean;
BEGIN
    IF NOT keyturn._citus_present() THEN
        RAISE EXCEPTION 'keyturn: Citus is not installed in this database'
            USING ERRCODE = '55000',
                  HINT = 'CREATE EXTENSION citus on every node and add the workers first (docs/scale-out.md).';
    END IF;
    IF NOT keyturn._preloaded() THEN
        RAISE EXCEPTION 'keyturn: pg_keyturn is not in shared_preload_libraries'
            USING ERRCODE = '55000',
                  HINT = 'Distributed, every _for call is routed by Citus, which crashes a backend on a NULL tenant unless pg_keyturn refused it first (docs/scale-out.md): set shared_preload_libraries = ''citus,pg_keyturn'' on every node and restart them.';
    END IF;
    SELECT * INTO c FROM keyturn._citus_table(citus_distribute.colocate_with);
    IF NOT FOUND OR c.method <> 'h'
       OR (SELECT a.atttypid FROM pg_attribute a
            WHERE a.attrelid = citus_distribute.colocate_with AND a.attname = c.dist_column) <> 'text'::regtype THEN
        RAISE EXCEPTION 'keyturn: % is not a table Citus distributes by a text column', citus_distribute.colocate_with
            USING ERRCODE = '22023',
                  HINT = 'Name the business table distributed by its tenant: create_distributed_table(''…'', ''tenant'').';
    END IF;
    -- Distributing a table that has triggers (the lifecycle and the
    -- append-only guards) needs it; they run on every shard.
    PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
    -- Made on first use otherwise, by the first approval: on a worker, in a
    -- delegated call, which cannot write a reference table.
    PERFORM keyturn._ensure_approval_key();

    FOR r IN SELECT k.conrelid::regclass AS tbl, k.conname
               FROM pg_constraint k
              WHERE k.contype = 'f' AND k.connamespace = 'keyturn'::regnamespace
                AND NOT EXISTS (SELECT 1 FROM pg_attribute a
                                 WHERE a.attrelid = k.confrelid AND a.attname = 'tenant' AND NOT a.attisdropped)
              ORDER BY 1, 2 LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', r.tbl, r.conname);
        RETURN QUERY SELECT format('%s.%s', r.tbl, r.conname), 'foreign key dropped';
    END LOOP;

    FOR r IN SELECT k.oid::regclass AS tbl,
                    EXISTS (SELECT 1 FROM pg_attribute a
                             WHERE a.attrelid = k.oid AND a.attname = 'tenant' AND NOT a.attisdropped) AS tenant
               FROM pg_class k
              WHERE k.relnamespace IN ('keyturn'::regnamespace, 'keyturn_secret'::regnamespace) AND k.relkind = 'r'
                AND NOT EXISTS (SELECT 1 FROM keyturn._citus_table(k.oid))
              -- The tables without a tenant first, then action, which
              -- staged_payload's foreign key names.
              ORDER BY 2, k.relname <> 'action', 1 LOOP
        IF r.tenant THEN
            EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''tenant'', colocate_with => $2)'
                USING r.tbl, citus_distribute.colocate_with::text;
            RETURN QUERY SELECT r.tbl::text, format('distributed by tenant, colocated with %s', citus_distribute.colocate_with);
        ELSE
            EXECUTE 'SELECT pg_catalog.create_reference_table($1)' USING r.tbl;
            RETURN QUERY SELECT r.tbl::text, 'reference table';
        END IF;
    END LOOP;

    FOR r IN SELECT f.oid::regprocedure AS fn
               FROM pg_proc f
              WHERE f.pronamespace = 'keyturn'::regnamespace AND f.proname ~ '^[a-z].*_for$'
                AND f.proargtypes[0] = 'text'::regtype
              ORDER BY 1 LOOP
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_object o
                                  WHERE o.classid = ''pg_proc''::regclass AND o.objid = $1
                                    AND o.distribution_argument_index IS NOT NULL)'
            INTO delegated USING r.fn;
        CONTINUE WHEN delegated;
        EXECUTE 'SELECT pg_catalog.create_distributed_function($1, ''$1'', colocate_with => ''keyturn.action'',
                                                               force_delegation => true)'
            USING r.fn;
        RETURN QUERY SELECT r.fn::text, 'sent whole to the tenant''s worker (force_delegation)';
    END LOOP;
END
$$;


-- ==== sql/080_comments.sql ====

-- What a DBA sees in \d+ and \df+: every schema, table, type, public
-- function and role of keyturn says what it is for. The reference is
-- docs/sql-api.md; these are the one-line reminders.

COMMENT ON SCHEMA keyturn IS
    'keyturn: a human-approval gate for AI-agent writes. Agents propose, people approve exactly what was proposed, once; state changes only through these functions (docs/sql-api.md).';
COMMENT ON SCHEMA keyturn_secret IS
    'keyturn''s approval key. No role but the extension owner may read it; keyturn.check_deployment() reports any grant.';
COMMENT ON TYPE keyturn.status IS
    'The status of an action. Legal changes: keyturn.transition. Final: keyturn._is_final().';

COMMENT ON TABLE keyturn.transition IS 'Every legal status change of an action; the status guard refuses any other.';
COMMENT ON TABLE keyturn.tool IS 'Registered tools (global): the current version and whether it is enabled.';
COMMENT ON TABLE keyturn.tool_version IS 'Every registered version of every tool, immutable; proposals are bound to one.';
COMMENT ON TABLE keyturn.member IS 'Who belongs to which tenant, as member, approver or admin.';
COMMENT ON TABLE keyturn.tool_grant IS 'Which principal may propose (and approve) which tool, with an optional scope, end and number of uses.';
COMMENT ON TABLE keyturn.auth_epoch IS 'Per principal, bumped on every real membership or grant change; a changed epoch invalidates proposals.';
COMMENT ON TABLE keyturn.cancelled_origin IS 'Conversations that ended (cancelled or archived): they start no new actions.';
COMMENT ON TABLE keyturn.request IS 'Human messages recorded by the human side: the approval of task tools'' calls.';
COMMENT ON TABLE keyturn.action IS 'Immutable proposals and their lifecycle. Columns fixed at propose time never change.';
COMMENT ON TABLE keyturn.open_action IS 'The work list: one narrow row per action that is not final, kept by the lifecycle trigger.';
COMMENT ON TABLE keyturn.action_target IS 'sql tools: each target''s key and before-state version, fixed at propose time.';
COMMENT ON TABLE keyturn.staged_payload IS 'Digest-retained external actions: the approved params, from approve until a final status.';
COMMENT ON TABLE keyturn.vote IS 'Quorum votes, one per principal and action.';
COMMENT ON TABLE keyturn.delegation IS 'Standing approvals: what a person approves in advance, within a scope, uses and time.';
COMMENT ON TABLE keyturn.staged_file IS 'Private attachments: the bytes, bound to one action, deleted with its final status.';
COMMENT ON TABLE keyturn.grant_use IS 'The proposer''s side of a grant: the row propose locks to count its uses and rate window, and the uses of the grant made at granted_at.';
COMMENT ON TABLE keyturn.stager IS 'One row per principal that staged a file: the lock its stagings take to count the quota.';
COMMENT ON TABLE keyturn.card_link IS 'One-time codes of card links (digests only) and the card sessions they were redeemed for.';
COMMENT ON TABLE keyturn.audit_chain IS 'Each tenant''s audit chain head: its event count, last hash and last event id (sql/059_audit.sql).';
COMMENT ON TABLE keyturn.evidence IS 'Evidence recorded by the trusted side (a person, or keyturn.fence): kind, reference and SHA-256, which proposals cite.';
COMMENT ON TABLE keyturn.notify_channel IS 'Where each person is reached (set_notify): one target per channel, the role they set it as; a webhook''s own secret, never shown back.';
COMMENT ON TABLE keyturn.notification IS 'Notifications: one notice and one reminder per action, person and channel, and digests past the hourly cap; dispatched like external actions (sql/064_notify.sql).';
COMMENT ON TYPE keyturn.channel IS 'How a person is reached: email, webhook (Standard Webhooks, Slack-shaped), webpush (RFC 8030/8291/8292).';
COMMENT ON TYPE keyturn.notification_kind IS 'notice (an action waits for you), reminder (before it expires), digest (what the hourly cap held back).';
COMMENT ON TABLE keyturn.projection IS 'Read-side projections: the current version per provider.';
COMMENT ON TABLE keyturn.projection_version IS 'Every registered projection spec: which fields of a provider''s data may reach a prompt.';
COMMENT ON TABLE keyturn.attempt IS 'One row per provider attempt; kept after reconciliation.';
COMMENT ON TABLE keyturn.event IS 'The audit log: one row per status change (and per quorum vote), hash-chained per tenant; append-only, even for the owner.';
COMMENT ON TABLE keyturn.usage IS 'Metering: one row per action that reached succeeded; append-only.';
COMMENT ON TABLE keyturn_secret.approval_key IS 'The key of the approval binding (an HMAC proving an approval, not a table write, moved an action on).';

COMMENT ON FUNCTION keyturn.current_tenant() IS 'The calling tenant, from request.jwt.claims or keyturn.tenant (transaction-local only); NULL if missing.';
COMMENT ON FUNCTION keyturn.current_principal() IS 'The calling principal, from request.jwt.claims or keyturn.principal (transaction-local only); NULL if missing.';
COMMENT ON FUNCTION keyturn.current_session() IS 'The calling session, from request.jwt.claims or keyturn.session (transaction-local only); NULL if missing.';
COMMENT ON FUNCTION keyturn.canonical_json(jsonb) IS 'The RFC 8785 canonical text keyturn hashes; 22023 for numbers a double cannot hold exactly.';
COMMENT ON FUNCTION keyturn.params_hash(text, jsonb) IS 'Lowercase hex SHA-256 of the canonical form of {"params": params, "tool": tool}.';
COMMENT ON FUNCTION keyturn.classify(text) IS 'read, write or unsupported; never errors.';
COMMENT ON FUNCTION keyturn.issue_token(uuid) IS 'Human: a fresh token for a pending action the caller may decide (from the queue); the previous token stops working.';
COMMENT ON FUNCTION keyturn.link_code(uuid[], interval) IS 'Human and dispatcher: a one-time code for a card link to these actions, for a person who may decide them all; no credential in any URL.';
COMMENT ON FUNCTION keyturn.redeem_link_code(text, uuid[]) IS 'Dispatcher (keyturnd): redeems a link code once for a 15-minute card session with fresh tokens; no rows for a used, expired or unknown code.';
COMMENT ON FUNCTION keyturn.card_session(text) IS 'Dispatcher (keyturnd): the role, claims and actions of a live card session''s bearer; no rows otherwise.';
COMMENT ON FUNCTION keyturn.action_counts(text, text, timestamptz, timestamptz) IS 'Operator, admin: how many actions are in each status (every status, zeros included), by tenant, tool and creation time.';
COMMENT ON FUNCTION keyturn.find_actions(text, text, text, timestamptz, timestamptz, uuid, int) IS 'Operator, admin: the actions that match (status, tenant, tool, creation time, or one id), newest first; never a param value or a summary.';
COMMENT ON FUNCTION keyturn.tools() IS 'Operator, admin: every tool with its current version''s class and whether it is enabled.';
COMMENT ON FUNCTION keyturn.standing_approvals(text) IS 'Operator, admin: every standing approval (of one tenant), with why it ended.';
COMMENT ON FUNCTION keyturn.verify_audit(text) IS 'Operator, admin: recomputes a tenant''s hash chain; false and the first event that no longer verifies when any was changed, deleted, reordered or inserted, or whose action no longer is what it committed to (params, approval, result, receipt).';
COMMENT ON FUNCTION keyturn.audit_export(text, timestamptz) IS 'Operator, admin: a tenant''s events since a time, each one JSON object of all its columns, for keyturnd audit-verify.';
COMMENT ON FUNCTION keyturn.audit_head(text) IS 'Operator, admin: a tenant''s chain head (events, last hash), to anchor elsewhere.';
COMMENT ON FUNCTION keyturn.set_notify(text, text, jsonb) IS 'Human: where the caller is reached when an action waits for them (email, webhook, webpush), with remind_before, max_per_hour and a webhook''s secret.';
COMMENT ON FUNCTION keyturn.notify_channels() IS 'Human: the caller''s channels, with a URL''s scheme and host only and never a secret.';
COMMENT ON FUNCTION keyturn.remove_notify(text) IS 'Human: removes one of the caller''s channels; its notifications not yet sent are cancelled, and the links already sent to it end.';
COMMENT ON FUNCTION keyturn.revoke_links() IS 'Human: ends the caller''s link codes not yet opened and the card sessions they opened; how many.';
COMMENT ON FUNCTION keyturn.record_evidence(text, text, text) IS 'Human: records evidence the person saw (kind, reference, SHA-256) for proposals to cite; an agent never records evidence.';
COMMENT ON FUNCTION keyturn.revoke_evidence(uuid) IS 'The principal that recorded it: ends a piece of evidence and invalidates the pending proposals that cite it.';
COMMENT ON FUNCTION keyturn.register_tool(text, jsonb) IS 'Admin: creates or replaces a tool from its spec; returns the new version.';
COMMENT ON FUNCTION keyturn.set_tool_enabled(text, boolean) IS 'Admin: enables or disables a tool; returns whether it changed.';
COMMENT ON FUNCTION keyturn.add_member(text, text, text) IS 'Admin: adds or changes a member; returns whether it changed.';
COMMENT ON FUNCTION keyturn.remove_member(text, text) IS 'Admin: removes a member, its grants and its notification channels.';
COMMENT ON FUNCTION keyturn.grant_tool(text, text, text, jsonb, timestamptz, int) IS 'Admin: sets a grant to exactly this scope, end and number of uses; returns whether it changed.';
COMMENT ON FUNCTION keyturn.revoke_tool(text, text, text) IS 'Admin: revokes a grant; returns whether it changed.';
COMMENT ON FUNCTION keyturn.propose(text, jsonb, jsonb) IS 'Agent: stores an immutable proposal; returns its one-time token (and status, when a standing approval or task request approved it).';
COMMENT ON FUNCTION keyturn.approve(uuid, text, jsonb) IS 'Human: approves exactly what was proposed, once; a replay returns the stored outcome.';
COMMENT ON FUNCTION keyturn.propose_for(text, text, jsonb, jsonb) IS 'Agent: propose, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.reject_for(text, uuid, text, text) IS 'Human: reject, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.approve_for(text, uuid, text, jsonb) IS 'Human: approve, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.preview_for(text, uuid, text) IS 'Human: preview, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.preview_for(text, uuid, text, jsonb) IS 'Human: preview with params, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.approve_many(jsonb) IS 'Human: one card for several proposals; each element exactly approve.';
COMMENT ON FUNCTION keyturn.preview(uuid, text) IS 'Human: the approval card''s data (summary, tool, effect, params, targets with before and after, expiry, cited evidence).';
COMMENT ON FUNCTION keyturn.preview(uuid, text, jsonb) IS 'Human: the approval card''s data; with params (a digest action''s reviewed fields) also whether they are the proposed ones, ending the proposal rejected_tampered when they are not.';
COMMENT ON FUNCTION keyturn.reject(uuid, text, text) IS 'Human: declines a pending proposal (a veto for quorum tools).';
COMMENT ON FUNCTION keyturn.revise(uuid, text, jsonb) IS 'Human: edit before approve; the old proposal is superseded by a new one with its own hash and token.';
COMMENT ON FUNCTION keyturn.pending(int) IS 'Human: the caller''s queue of pending actions, soonest expiry first. Never a token.';
COMMENT ON FUNCTION keyturn.delegate(text, jsonb, int, interval) IS 'Human: a standing approval of the caller''s own proposals of a tool, within a scope, uses and time.';
COMMENT ON FUNCTION keyturn.revoke_delegation(uuid) IS 'Human: ends a standing approval.';
COMMENT ON FUNCTION keyturn.delegations() IS 'Human: the visible standing approvals, with their uses, the tool version each was given for, and why one no longer covers (ended).';
COMMENT ON FUNCTION keyturn.record_request(text, text, text, text) IS 'Human side: records the person''s message of a turn, the approval of the task tool calls it asks for.';
COMMENT ON FUNCTION keyturn.end_session(text) IS 'Logout: cancels the caller''s pending, queued and leased actions of a session.';
COMMENT ON FUNCTION keyturn.end_session_for(text, text) IS 'end_session, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.cancel_origin_for(text, text) IS 'cancel_origin, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.archive_conversation_for(text, text) IS 'archive_conversation, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.approve_many_for(text, jsonb) IS 'Human: approve_many, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.revise_for(text, uuid, text, jsonb) IS 'Human: revise, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.cancel_origin(text) IS 'Stops a conversation: cancels its actions and refuses later ones.';
COMMENT ON FUNCTION keyturn.archive_conversation(text) IS 'Ends a conversation normally: cancels its actions not yet executing and refuses later ones.';
COMMENT ON FUNCTION keyturn.action_status(uuid) IS 'An action''s status and result, if visible to the caller.';
COMMENT ON FUNCTION keyturn.audit(uuid) IS 'An action''s events in order (operators: every action; others: what their identity may see).';
COMMENT ON FUNCTION keyturn.stage_file(bytea, text, text) IS 'Stages an attachment''s bytes for the caller''s principal; returns its id, SHA-256 and size.';
COMMENT ON FUNCTION keyturn.attachments(uuid, uuid) IS 'Dispatcher: the files an action sends (from its approved params, in their order), while it is leased or executing under that lease.';
COMMENT ON FUNCTION keyturn.file_content(uuid, uuid, uuid) IS 'Dispatcher: an attachment''s bytes, only while its action is executing under that lease.';
COMMENT ON FUNCTION keyturn.register_projection(text, jsonb) IS 'Admin: which fields of a provider''s data may reach a prompt; returns the new version.';
COMMENT ON FUNCTION keyturn.fence(text, jsonb) IS 'A provider''s data as a fenced, projected reference block, with a fresh marker, the guard that names it, and the evidence id of what was fenced.';
COMMENT ON FUNCTION keyturn.lease(text, int, interval) IS 'Dispatcher: takes due notifications and queued actions (FOR UPDATE SKIP LOCKED) under a lease.';
COMMENT ON FUNCTION keyturn.lease(text, int, interval, text[]) IS 'Dispatcher: lease, of the named providers only.';
COMMENT ON FUNCTION keyturn.begin_dispatch(uuid, uuid) IS 'Dispatcher: rechecks everything and commits executing before any provider call; false: invalidated.';
COMMENT ON FUNCTION keyturn.begin_dispatch_many(uuid[], uuid[]) IS 'Dispatcher: begin_dispatch for a batch, one answer per element.';
COMMENT ON FUNCTION keyturn.complete(uuid, uuid, text, jsonb, interval) IS 'Dispatcher: records a provider call''s outcome (succeeded, failed, retry, unknown).';
COMMENT ON FUNCTION keyturn.complete_many(uuid[], uuid[], text[], jsonb[], interval[]) IS 'Dispatcher: complete for a batch, one answer per element.';
COMMENT ON FUNCTION keyturn.sweep() IS 'Expires pending actions, requeues lapsed leases, marks lapsed calls uncertain, deletes unbound files.';
COMMENT ON FUNCTION keyturn.reconcile(uuid, text, text) IS 'Operator: settles an uncertain action as succeeded or failed, with a note.';
COMMENT ON FUNCTION keyturn.uncertain_actions() IS 'Operator: the actions waiting for a person to decide what happened, when it is safe to decide, and whether keyturnd says it sent nothing.';
COMMENT ON FUNCTION keyturn.record_not_sent(uuid, uuid, jsonb) IS 'Dispatcher: keyturnd''s account that the attempt under this lease sent nothing, for an action the sweep made uncertain first; decides nothing.';
COMMENT ON FUNCTION keyturn.record_not_sent_for(text, uuid, uuid, jsonb) IS 'Dispatcher: record_not_sent for the tenant named.';
COMMENT ON FUNCTION keyturn.notification_message(uuid, uuid) IS 'Dispatcher: what an executing notification says, with a fresh one-time card link code; send = false when its action stopped waiting.';
COMMENT ON FUNCTION keyturn.notification_message_for(text, uuid, uuid) IS 'Dispatcher: notification_message in the tenant named.';
COMMENT ON FUNCTION keyturn.notifications(uuid) IS 'Operator: an action''s notifications and the digests that carried them: status, attempts, receipts; never a target.';
COMMENT ON FUNCTION keyturn.attempts(uuid) IS 'Operator: an action''s provider attempts, with their receipts.';
COMMENT ON FUNCTION keyturn.dispatch_by_tenant() IS 'Dispatcher: whether keyturn''s tables are distributed by tenant (Citus), so that the dispatcher must use the _for calls, tenant by tenant.';
COMMENT ON FUNCTION keyturn.dispatch_nodes() IS 'Dispatcher: the other nodes whose wake-ups keyturnd must LISTEN to when it dispatches by tenant; empty otherwise.';
COMMENT ON FUNCTION keyturn.tenants_due(text[], int) IS 'Dispatcher: the tenants with queued actions due (to_lease) or sweep work (to_sweep), oldest first; a hint, read without locks.';
COMMENT ON FUNCTION keyturn.lease_for(text, text, int, interval, text[]) IS 'Dispatcher: lease, limited to the tenant named, so that Citus can run it on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.begin_dispatch_for(text, uuid, uuid) IS 'Dispatcher: begin_dispatch in the tenant named.';
COMMENT ON FUNCTION keyturn.begin_dispatch_many_for(text, uuid[], uuid[]) IS 'Dispatcher: begin_dispatch_many in the tenant named; an element of another tenant is refused (55000).';
COMMENT ON FUNCTION keyturn.complete_for(text, uuid, uuid, text, jsonb, interval) IS 'Dispatcher: complete in the tenant named.';
COMMENT ON FUNCTION keyturn.complete_many_for(text, uuid[], uuid[], text[], jsonb[], interval[]) IS 'Dispatcher: complete_many in the tenant named; an element of another tenant is refused (55000).';
COMMENT ON FUNCTION keyturn.sweep_for(text) IS 'The sweep, of the tenant named only.';
COMMENT ON FUNCTION keyturn.attachments_for(text, uuid, uuid) IS 'Dispatcher: attachments in the tenant named.';
COMMENT ON FUNCTION keyturn.file_content_for(text, uuid, uuid, uuid) IS 'Dispatcher: file_content in the tenant named.';
COMMENT ON FUNCTION keyturn.reconcile_for(text, uuid, text, text) IS 'Operator: reconcile in the tenant named.';
COMMENT ON FUNCTION keyturn.citus_distribute(regclass) IS 'Superuser, on Citus: distributes keyturn''s tables by tenant, colocated with the business table named, and registers the _for calls for delegation (layout B).';
COMMENT ON FUNCTION keyturn.check_deployment() IS 'Superuser or admin: what a live database gets wrong for keyturn''s guarantees, one row per problem.';

-- Roles are cluster-wide; they may predate this install.
COMMENT ON ROLE keyturn_agent IS 'keyturn: the AI agent''s side. Proposes; never approves.';
COMMENT ON ROLE keyturn_approver IS 'keyturn: the person''s side. Approves, rejects, revises; a tenant''s admin administers it through this role.';
COMMENT ON ROLE keyturn_dispatcher IS 'keyturn: keyturnd. Dispatches approved external actions; reads nothing directly.';
COMMENT ON ROLE keyturn_operator IS 'keyturn: reconciles uncertain outcomes; reads nothing directly.';
COMMENT ON ROLE keyturn_admin IS 'keyturn: the platform administrator. Registers tools; manages every tenant.';

-- keyturn over MCP (sql/063_mcp.sql).
COMMENT ON FUNCTION keyturn.mcp_tools() IS 'Agent: the tools its principal may call over MCP (enabled, granted, runnable), each with its MCP description, inputSchema and annotations.';
COMMENT ON FUNCTION keyturn.read(text, jsonb) IS 'Agent: runs an sql read tool as the caller under its RLS (at most max_rows rows) and returns fence(projection, {"rows": [...]}); no approval.';
COMMENT ON FUNCTION keyturn.upstream_read(text, jsonb) IS 'Agent: whether the caller may call this upstream MCP read tool with these arguments, and the upstream, its tool name there and the projection that fences the answer.';
COMMENT ON FUNCTION keyturn.mcp_action_status(uuid) IS 'Agent: the status (and, once final, the result) of an action of the calling principal; no row for anything else.';
COMMENT ON FUNCTION keyturn.mcp_resume(uuid, text, jsonb) IS 'Agent: for an MCP client''s retry of a write call answered input_required: the status of the action that call proposed, only when the retry is the same tool and params by the same principal; no row otherwise.';
COMMENT ON FUNCTION keyturn.mcp_task(uuid) IS 'Agent: an action of the calling principal as an MCP task: its status, its result once final, its summary, expiry and times; no row for anything else.';
COMMENT ON FUNCTION keyturn.register_discovered_tool(text, jsonb, boolean) IS 'Dispatcher (keyturnd): registers a tool of an upstream MCP server as <upstream>.<tool>, disabled, read only when trusted and readOnlyHint is true; a changed definition is a new version.';
COMMENT ON FUNCTION keyturn.check_upstream_tool(uuid, uuid, jsonb) IS 'Dispatcher (keyturnd), right before an upstream MCP call: true when the live definition is the approved one; else the action becomes invalidated and nothing may be sent.';
COMMENT ON FUNCTION keyturn.check_upstream_tool_for(text, uuid, uuid, jsonb) IS 'Dispatcher: check_upstream_tool for the tenant named, so that Citus runs it on the tenant''s worker.';


-- ==== sql/090_privileges.sql ====

-- Who may call what (docs/sql-api.md, "Roles"). Runs last, and is the one
-- place where privileges are given.
--
-- PUBLIC: USAGE on the schema, EXECUTE on the three identity functions,
-- canonical_json and params_hash; nothing else. Each group role gets exactly
-- the calls of its part. Agents and approvers may also SELECT keyturn's
-- tables, where row-level security shows them their own tenant's rows; the
-- dispatcher, operator and admin roles read nothing directly: since identity
-- is only asserted, a role that could set any tenant and SELECT would read
-- every tenant's params. Nobody but a superuser writes a keyturn table.

-- Revoked from every keyturn role first, so that running this file again (an
-- upgrade does) leaves exactly the privileges below.
REVOKE ALL ON ALL TABLES IN SCHEMA keyturn
    FROM keyturn_agent, keyturn_approver, keyturn_dispatcher, keyturn_operator, keyturn_admin;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA keyturn
    FROM keyturn_agent, keyturn_approver, keyturn_dispatcher, keyturn_operator, keyturn_admin;
REVOKE ALL ON SCHEMA keyturn FROM PUBLIC;
GRANT USAGE ON SCHEMA keyturn TO PUBLIC;

REVOKE ALL ON ALL TABLES IN SCHEMA keyturn FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA keyturn FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA keyturn FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA keyturn_secret FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
    keyturn.current_tenant(), keyturn.current_principal(), keyturn.current_session(),
    keyturn.canonical_json(jsonb), keyturn.params_hash(text, jsonb)
TO PUBLIC;
-- Whether keyturn's tables are distributed decides which form of a call
-- keyturnd runs (/rpc, /mcp, the dispatcher), as whichever of keyturn's
-- roles it serves; PUBLIC gets nothing beyond the five above.
GRANT EXECUTE ON FUNCTION keyturn.dispatch_by_tenant()
TO keyturn_agent, keyturn_approver, keyturn_dispatcher, keyturn_operator, keyturn_admin;

GRANT SELECT ON ALL TABLES IN SCHEMA keyturn TO keyturn_agent, keyturn_approver;
-- Except the bytes of staged files and the params of digest actions: only
-- the dispatcher reads them, through a lease (keyturn.file_content, lease).
-- The other columns stay readable, under row-level security.
REVOKE SELECT ON keyturn.staged_file, keyturn.staged_payload FROM keyturn_agent, keyturn_approver;
GRANT SELECT (id, tenant, principal, filename, content_type, size, sha256, staged_at, action_id)
    ON keyturn.staged_file TO keyturn_agent, keyturn_approver;
GRANT SELECT (action_id, tenant, principal, staged_at) ON keyturn.staged_payload TO keyturn_agent, keyturn_approver;

GRANT EXECUTE ON FUNCTION keyturn.classify(text)
TO keyturn_agent, keyturn_approver, keyturn_dispatcher, keyturn_operator, keyturn_admin;

-- Agent.
GRANT EXECUTE ON FUNCTION keyturn.propose(text, jsonb, jsonb), keyturn.propose_for(text, text, jsonb, jsonb)
TO keyturn_agent;

-- Agent, over MCP (sql/063_mcp.sql).
GRANT EXECUTE ON FUNCTION
    keyturn.mcp_tools(), keyturn.read(text, jsonb), keyturn.upstream_read(text, jsonb),
    keyturn.mcp_action_status(uuid), keyturn.mcp_resume(uuid, text, jsonb),
    keyturn.mcp_task(uuid)
TO keyturn_agent;

-- Agent and human.
GRANT EXECUTE ON FUNCTION
    keyturn.action_status(uuid), keyturn.audit(uuid), keyturn.end_session(text),
    keyturn.cancel_origin(text), keyturn.archive_conversation(text),
    keyturn.end_session_for(text, text), keyturn.cancel_origin_for(text, text),
    keyturn.archive_conversation_for(text, text),
    keyturn.stage_file(bytea, text, text), keyturn.fence(text, jsonb), keyturn.revoke_evidence(uuid)
TO keyturn_agent, keyturn_approver;

-- Human. (Membership and grants are not here: keyturn_admin alone.)
GRANT EXECUTE ON FUNCTION
    keyturn.approve(uuid, text, jsonb), keyturn.approve_for(text, uuid, text, jsonb),
    keyturn.preview(uuid, text), keyturn.preview(uuid, text, jsonb),
    keyturn.preview_for(text, uuid, text), keyturn.preview_for(text, uuid, text, jsonb), keyturn.reject(uuid, text, text),
    keyturn.reject_for(text, uuid, text, text),
    keyturn.approve_many(jsonb), keyturn.approve_many_for(text, jsonb), keyturn.revise(uuid, text, jsonb),
    keyturn.revise_for(text, uuid, text, jsonb), keyturn.pending(int),
    keyturn.delegate(text, jsonb, int, interval), keyturn.revoke_delegation(uuid),
    keyturn.delegations(), keyturn.record_request(text, text, text, text),
    keyturn.issue_token(uuid), keyturn.record_evidence(text, text, text),
    keyturn.set_notify(text, text, jsonb), keyturn.notify_channels(), keyturn.remove_notify(text),
    keyturn.revoke_links()
TO keyturn_approver;

-- Human and dispatcher: a card link's one-time code (for notifications, the
-- dispatcher asserts the person it writes to).
GRANT EXECUTE ON FUNCTION keyturn.link_code(uuid[], interval) TO keyturn_approver, keyturn_dispatcher;

-- Dispatcher.
GRANT EXECUTE ON FUNCTION
    keyturn.lease(text, int, interval), keyturn.lease(text, int, interval, text[]), keyturn.begin_dispatch(uuid, uuid),
    keyturn.complete(uuid, uuid, text, jsonb, interval), keyturn.sweep(),
    keyturn.begin_dispatch_many(uuid[], uuid[]),
    keyturn.complete_many(uuid[], uuid[], text[], jsonb[], interval[]),
    keyturn.file_content(uuid, uuid, uuid),
    keyturn.attachments(uuid, uuid),
    keyturn.redeem_link_code(text, uuid[]), keyturn.card_session(text),
    keyturn.record_not_sent(uuid, uuid, jsonb), keyturn.notification_message(uuid, uuid)
TO keyturn_dispatcher;

-- Dispatcher, tenant by tenant (sql/062_dispatch_for.sql).
GRANT EXECUTE ON FUNCTION
    keyturn.dispatch_nodes(), keyturn.tenants_due(text[], int),
    keyturn.lease_for(text, text, int, interval, text[]), keyturn.begin_dispatch_for(text, uuid, uuid),
    keyturn.begin_dispatch_many_for(text, uuid[], uuid[]),
    keyturn.complete_for(text, uuid, uuid, text, jsonb, interval),
    keyturn.complete_many_for(text, uuid[], uuid[], text[], jsonb[], interval[]),
    keyturn.sweep_for(text), keyturn.attachments_for(text, uuid, uuid),
    keyturn.file_content_for(text, uuid, uuid, uuid), keyturn.record_not_sent_for(text, uuid, uuid, jsonb),
    keyturn.notification_message_for(text, uuid, uuid)
TO keyturn_dispatcher;

-- Dispatcher, for upstream MCP servers (sql/063_mcp.sql).
GRANT EXECUTE ON FUNCTION
    keyturn.register_discovered_tool(text, jsonb, boolean), keyturn.check_upstream_tool(uuid, uuid, jsonb),
    keyturn.check_upstream_tool_for(text, uuid, uuid, jsonb)
TO keyturn_dispatcher;

-- Operator.
GRANT EXECUTE ON FUNCTION
    keyturn.reconcile(uuid, text, text), keyturn.uncertain_actions(), keyturn.sweep(), keyturn.audit(uuid),
    keyturn.attempts(uuid), keyturn.reconcile_for(text, uuid, text, text), keyturn.sweep_for(text),
    keyturn.notifications(uuid)
TO keyturn_operator;

-- Platform administrator.
GRANT EXECUTE ON FUNCTION
    keyturn.register_tool(text, jsonb), keyturn.set_tool_enabled(text, boolean),
    keyturn.add_member(text, text, text), keyturn.remove_member(text, text),
    keyturn.grant_tool(text, text, text, jsonb, timestamptz, int), keyturn.revoke_tool(text, text, text),
    keyturn.check_deployment(), keyturn.register_projection(text, jsonb)
TO keyturn_admin;

-- Operator and platform administrator: the audit's chain, and what the
-- operator console reads (sql/068_console.sql).
GRANT EXECUTE ON FUNCTION
    keyturn.verify_audit(text), keyturn.audit_export(text, timestamptz), keyturn.audit_head(text),
    keyturn.action_counts(text, text, timestamptz, timestamptz),
    keyturn.find_actions(text, text, text, timestamptz, timestamptz, uuid, int),
    keyturn.tools(), keyturn.standing_approvals(text)
TO keyturn_operator, keyturn_admin;

-- The RLS helper runs inside policies as the querying role.
GRANT EXECUTE ON FUNCTION keyturn._sees(text, text)
TO keyturn_agent, keyturn_approver;


-- ==== sql/upgrade/0.2.0--0.3.0.post.sql ====

-- pg_keyturn 0.2.0 -> 0.3.0: after the code (hand-written; runs last).

-- Attachment metadata 0.2.0 accepted and 0.3.0 refuses at propose (a size
-- written 14.0, an uppercase sha256, a filename with a bidi control): such an
-- action could never be sent, since reading its attachments failed after
-- begin_dispatch and left it executing. Not yet started: invalidated, with
-- the reason; executing: failed (keyturnd reads the attachments before it
-- builds the request, so nothing was sent). Uncertain ones stay for an
-- operator, who may now reconcile them failed.
DO $$
DECLARE
    a keyturn.action;
    v keyturn.tool_version;
    v_reason text := 'its attachment metadata does not fit what 0.3.0 requires at propose (size an integer, '
                     || 'sha256 64 lowercase hex digits, a filename that reads as itself); nothing was sent';
BEGIN
    FOR a IN
        SELECT x.* FROM keyturn.action x JOIN keyturn.tool_version t ON t.tool = x.tool AND t.version = x.tool_version
         WHERE t.attachments_param IS NOT NULL AND x.status IN ('pending', 'queued', 'leased', 'executing')
    LOOP
        SELECT t.* INTO v FROM keyturn.tool_version t WHERE t.tool = a.tool AND t.version = a.tool_version;
        BEGIN
            PERFORM keyturn._attachments(v, coalesce(a.params, (SELECT s.params FROM keyturn.staged_payload s
                                                                  WHERE s.action_id = a.id AND s.tenant = a.tenant)));
        EXCEPTION WHEN invalid_parameter_value THEN
            PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'upgrade to 0.3.0: attachment metadata'));
            UPDATE keyturn.action x
               SET status = CASE WHEN a.status = 'executing' THEN 'failed' ELSE 'invalidated' END::keyturn.status,
                   result = jsonb_build_object('reason', v_reason), updated_at = clock_timestamp(),
                   lease_id = NULL, leased_by = NULL, lease_expires_at = NULL
             WHERE x.id = a.id AND x.tenant = a.tenant;
        END;
    END LOOP;
END
$$;

-- Evidence a 0.2.0 proposal cites was never recorded by anyone (0.2.0 took
-- any id strings; 0.3.0's propose admits only evidence the trusted side
-- recorded): a pending one citing any is invalidated, with the reason, so
-- that nobody approves it on evidence the card cannot show (fifth red-team
-- pass). What a person already approved stays.
DO $$
DECLARE
    a keyturn.action;
BEGIN
    FOR a IN
        SELECT x.* FROM keyturn.action x
         WHERE x.status = 'pending' AND jsonb_typeof(x.origin -> 'evidence') = 'array'
           AND jsonb_array_length(x.origin -> 'evidence') > 0
    LOOP
        PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'upgrade to 0.3.0: unrecorded evidence'));
        UPDATE keyturn.action x
           SET status = 'invalidated',
               result = jsonb_build_object('reason', 'it cites evidence nobody recorded (0.2.0 did not check it; '
                                          || '0.3.0 admits only evidence recorded with keyturn.record_evidence or fence); propose it again'),
               updated_at = clock_timestamp()
         WHERE x.id = a.id AND x.tenant = a.tenant;
    END LOOP;
END
$$;

-- Digest actions keep nothing that confirms a guess: their stored params
-- hash becomes the digest MAC of it (keyturn._digest_mac), as 0.3.0's
-- propose stores it. Their tokens stay bound to the plain hash, which
-- approve recomputes from the resubmitted params. An approval binds the
-- stored hash, so the approvals the old hash verifies are bound again to
-- the new one (those that do not verify stay unbound, and are never
-- dispatched, as before). The proposal columns are immutable to every
-- statement but this one.
ALTER TABLE keyturn.action DISABLE TRIGGER action_proposal_immutable;
DO $$
DECLARE
    a     keyturn.action;
    v_mac text;
    v_ok  boolean;
BEGIN
    FOR a IN SELECT x.* FROM keyturn.action x WHERE x.retain = 'digest' LOOP
        v_mac := keyturn._digest_mac(a.params_hash);
        v_ok := a.approved_at IS NOT NULL
                AND keyturn._approval_valid(a.id, a.params_hash, a.approved_by, a.approved_role, a.approved_at,
                                            a.approved_via, a.approval_mac);
        UPDATE keyturn.action x
           SET params_hash = v_mac,
               approval_mac = CASE WHEN v_ok THEN keyturn._approval_mac(a.id, v_mac, a.approved_by, a.approved_role,
                                                                        a.approved_at, a.approved_via)
                                   ELSE x.approval_mac END
         WHERE x.id = a.id AND x.tenant = a.tenant;
    END LOOP;
END
$$;
ALTER TABLE keyturn.action ENABLE TRIGGER action_proposal_immutable;

-- The existing events, chained tenant by tenant in id order, as 0.3.0
-- chains new ones (keyturn._chain_events); then the columns are required.
-- The event log is append-only even for its owner: its trigger is off for
-- this one statement's work.
ALTER TABLE keyturn.event DISABLE TRIGGER event_append_only;
-- What an event commits to of its action (sql/059_audit.sql) is 0.3.0's:
-- the events before this upgrade commit to nothing. This library under
-- 0.2.0's SQL (the upgrade window) wrote MACs of params hashes and
-- approvals that this upgrade binds again above (digest actions); they go.
UPDATE keyturn.event x
   SET detail = x.detail - ARRAY['params_mac', 'approval_mac', 'result_mac', 'receipt_mac']
 WHERE x.detail ?| ARRAY['params_mac', 'approval_mac', 'result_mac', 'receipt_mac'];
DO $$
DECLARE
    e       record;
    v_tenant text;
    v_prev  text;
    v_n     bigint;
    v_hash  text;
BEGIN
    PERFORM set_config('TimeZone', 'UTC', true);
    FOR v_tenant IN SELECT DISTINCT x.tenant FROM keyturn.event x ORDER BY 1 LOOP
        v_prev := keyturn._chain_start();
        v_n := 0;
        FOR e IN SELECT x.id, x.action_id, to_jsonb(x) AS j FROM keyturn.event x
                  WHERE x.tenant = v_tenant ORDER BY x.id LOOP
            v_hash := keyturn._event_hash(e.j - 'hash' || jsonb_build_object('prev_hash', v_prev));
            UPDATE keyturn.event x SET prev_hash = v_prev, hash = v_hash
             WHERE x.action_id = e.action_id AND x.tenant = v_tenant AND x.id = e.id;
            v_prev := v_hash;
            v_n := v_n + 1;
        END LOOP;
        INSERT INTO keyturn.audit_chain (tenant, events, head, last_id)
        VALUES (v_tenant, v_n, v_prev, (SELECT max(x.id) FROM keyturn.event x WHERE x.tenant = v_tenant));
    END LOOP;
END
$$;
ALTER TABLE keyturn.event ENABLE TRIGGER event_append_only;
ALTER TABLE keyturn.event ALTER COLUMN prev_hash SET NOT NULL, ALTER COLUMN hash SET NOT NULL;

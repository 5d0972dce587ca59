-- pg_keyturn 0.1.0 -> 0.2.0: the data model (hand-written; runs first).
--
-- tests/make-upgrade writes sql/pg_keyturn--0.1.0--0.2.0.sql from this file,
-- every function of 0.2.0 (the code sections of its install script: they
-- are recreated whole, after every 0.1.0 function is dropped), and
-- 0.1.0--0.2.0.post.sql. The upgrade layer checks that the result leaves a
-- database equal to a fresh 0.2.0 install and keeps its data.

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

-- One status type and the graph as a table (sql/005_status.sql).
CREATE TYPE keyturn.status AS ENUM (
    'pending', 'queued', 'leased', 'executing', 'succeeded', 'failed', 'uncertain', 'rejected',
    'rejected_tampered', 'expired', 'cancelled', 'conflict', 'invalidated', 'superseded');
CREATE TABLE keyturn.transition (
    from_status  keyturn.status NOT NULL,
    to_status    keyturn.status NOT NULL,
    PRIMARY KEY (from_status, to_status)
);
INSERT INTO keyturn.transition (from_status, to_status) VALUES
    ('pending', 'expired'), ('pending', 'invalidated'), ('pending', 'rejected_tampered'),
    ('pending', 'succeeded'), ('pending', 'conflict'), ('pending', 'failed'),
    ('pending', 'queued'), ('pending', 'rejected'), ('pending', 'cancelled'),
    ('pending', 'superseded'),
    ('queued', 'leased'), ('queued', 'cancelled'), ('queued', 'invalidated'),
    ('leased', 'executing'), ('leased', 'queued'), ('leased', 'cancelled'), ('leased', 'invalidated'),
    ('executing', 'succeeded'), ('executing', 'failed'), ('executing', 'uncertain'),
    ('executing', 'queued'),
    ('uncertain', 'succeeded'), ('uncertain', 'failed');

DROP INDEX keyturn.open_action_due_idx, keyturn.open_action_lease_idx,
           keyturn.open_action_expiry_idx, keyturn.open_action_uncertain_idx;
ALTER TABLE keyturn.action DROP CONSTRAINT action_status_check;
ALTER TABLE keyturn.action ALTER COLUMN status TYPE keyturn.status USING status::keyturn.status;
ALTER TABLE keyturn.open_action ALTER COLUMN status TYPE keyturn.status USING status::keyturn.status;
ALTER TABLE keyturn.event ALTER COLUMN from_status TYPE keyturn.status USING from_status::keyturn.status,
                          ALTER COLUMN to_status TYPE keyturn.status USING to_status::keyturn.status;
CREATE INDEX open_action_due_idx       ON keyturn.open_action (next_attempt_at, action_id) WHERE status = 'queued';
CREATE INDEX open_action_lease_idx     ON keyturn.open_action (lease_expires_at) WHERE status IN ('leased', 'executing');
CREATE INDEX open_action_expiry_idx    ON keyturn.open_action (expires_at) WHERE status = 'pending';
CREATE INDEX open_action_uncertain_idx ON keyturn.open_action (dispatched_at) WHERE status = 'uncertain';

-- Tools name their table (a restored database gives it another OID); the
-- version column's type joins the others; the v1 spec keys.
ALTER TABLE keyturn.tool_version
    ADD COLUMN sql_schema text,
    ADD COLUMN sql_table text,
    ADD COLUMN quorum int NOT NULL DEFAULT 1 CHECK (quorum BETWEEN 1 AND 5),
    ADD COLUMN delegable boolean NOT NULL DEFAULT false,
    ADD COLUMN attachments_param text,
    ADD COLUMN attachment_types text[],
    ADD COLUMN max_attachment_bytes bigint;
UPDATE keyturn.tool_version v
   SET sql_schema = n.nspname, sql_table = c.relname,
       sql_types = v.sql_types || CASE WHEN v.sql_version = 'xmin' THEN '{"xmin": "xid"}'::jsonb
                                       ELSE jsonb_build_object(v.sql_version,
                                                (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
                                                  WHERE a.attrelid = c.oid AND a.attname = v.sql_version)) END
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE v.sql_relid = c.oid;
ALTER TABLE keyturn.tool_version DROP COLUMN sql_relid;
ALTER TABLE keyturn.tool_version DROP CONSTRAINT tool_version_approval_check,
    ADD CONSTRAINT tool_version_approval_check CHECK (approval IN ('self', 'independent', 'task'));

-- Scoped grants, ended conversations, approvals bound by a MAC, revisions.
ALTER TABLE keyturn.tool_grant
    ADD COLUMN scope jsonb,
    ADD COLUMN valid_until timestamptz,
    ADD COLUMN max_uses int CHECK (max_uses > 0),
    ADD COLUMN uses int NOT NULL DEFAULT 0;
ALTER TABLE keyturn.cancelled_origin
    ADD COLUMN how text NOT NULL DEFAULT 'cancelled' CHECK (how IN ('cancelled', 'archived'));
ALTER TABLE keyturn.action
    ADD COLUMN revised_from uuid,
    ADD COLUMN revised_by text,
    ADD COLUMN approved_via text,
    ADD COLUMN approval_mac bytea;

-- The tenant in every key of 0.1.0's tables of one action's rows (why:
-- sql/010_tables.sql). Each key is rebuilt under its old name; the foreign key
-- that hangs on action's goes first and comes back with the tenant.
ALTER TABLE keyturn.staged_payload DROP CONSTRAINT staged_payload_action_id_fkey,
    DROP CONSTRAINT staged_payload_pkey, ADD PRIMARY KEY (action_id, tenant);
ALTER TABLE keyturn.action DROP CONSTRAINT action_pkey, ADD PRIMARY KEY (id, tenant);
ALTER TABLE keyturn.staged_payload ADD CONSTRAINT staged_payload_action_id_tenant_fkey
    FOREIGN KEY (action_id, tenant) REFERENCES keyturn.action (id, tenant);
ALTER TABLE keyturn.open_action DROP CONSTRAINT open_action_pkey, ADD PRIMARY KEY (action_id, tenant);
ALTER TABLE keyturn.action_target DROP CONSTRAINT action_target_pkey, ADD PRIMARY KEY (action_id, tenant, ord);
ALTER TABLE keyturn.attempt DROP CONSTRAINT attempt_pkey, ADD PRIMARY KEY (action_id, tenant, attempt);
ALTER TABLE keyturn.event DROP CONSTRAINT event_pkey, ADD PRIMARY KEY (action_id, tenant, id);
ALTER TABLE keyturn.usage DROP CONSTRAINT usage_action_id_key, ADD UNIQUE (action_id, tenant);

-- The tables v1 adds (sql/010_tables.sql).
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
CREATE TABLE keyturn.vote (
    action_id         uuid        NOT NULL,
    principal         text        NOT NULL,
    tenant            text        NOT NULL,
    action_principal  text        NOT NULL,
    epoch             bigint      NOT NULL,
    db_role           text        NOT NULL,
    voted_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (action_id, tenant, principal)
);
CREATE TABLE keyturn.delegation (
    id          uuid        NOT NULL,
    tenant      text        NOT NULL,
    principal   text        NOT NULL,
    tool        text        NOT NULL REFERENCES keyturn.tool (name),
    scope       jsonb       NOT NULL,
    max_uses    int         NOT NULL CHECK (max_uses BETWEEN 1 AND 1000),
    uses        int         NOT NULL DEFAULT 0 CHECK (uses <= max_uses),
    epoch       bigint      NOT NULL,
    db_role     text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at  timestamptz NOT NULL,
    revoked_at  timestamptz,
    PRIMARY KEY (id, tenant)
);
CREATE INDEX delegation_live_idx ON keyturn.delegation (tenant, principal, tool, expires_at)
    WHERE revoked_at IS NULL;
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
CREATE TABLE keyturn.projection (
    provider    text        PRIMARY KEY,
    version     int         NOT NULL CHECK (version > 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT projection_name_shape CHECK (provider ~ '^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$'
                                            AND length(provider) <= 63)
);
CREATE TABLE keyturn.projection_version (
    provider    text        NOT NULL REFERENCES keyturn.projection (provider),
    version     int         NOT NULL,
    spec        jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, version)
);

-- The approval key's table; the key is made on first use.
CREATE SCHEMA keyturn_secret;
REVOKE ALL ON SCHEMA keyturn_secret FROM PUBLIC;
CREATE TABLE keyturn_secret.approval_key (
    id   int   PRIMARY KEY CHECK (id = 1),
    key  bytea NOT NULL CHECK (length(key) = 32)
);

SELECT pg_catalog.pg_extension_config_dump('keyturn.request', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.vote', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.delegation', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.staged_file', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.projection', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.projection_version', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn.request_seq_seq', '');
SELECT pg_catalog.pg_extension_config_dump('keyturn_secret.approval_key', '');

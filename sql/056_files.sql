-- Private attachments (docs/sql-api.md, "Private attachments"): the bytes are
-- staged in keyturn.staged_file by the invoking principal, bound to the one
-- action whose params name them (their metadata is part of the params, so of
-- the hash), verified at propose and re-hashed at begin_dispatch, read by
-- the dispatcher only while that action is executing under its lease, and
-- deleted in the transaction that gives the action a final status (a
-- reconciled uncertain one included), or by the sweep a day after staging
-- when nothing ever bound them.

-- Most a tool may allow per attachment.
CREATE FUNCTION keyturn._max_file_bytes()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT 25 * 1024 * 1024::bigint
$$;

-- What one principal may have staged and waiting (bound to no final action):
-- 20 files, 100 MiB.
CREATE FUNCTION keyturn._max_staged_files()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 20 $$;

CREATE FUNCTION keyturn._max_staged_bytes()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 100::bigint * 1024 * 1024 $$;

-- The files and bytes a principal has staged and waiting, as committed (and
-- this transaction's own): files go with their action's final status, so
-- every row still there counts.
CREATE FUNCTION keyturn._staged_quota(p_tenant text, p_principal text)
RETURNS TABLE (files bigint, bytes bigint)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v text := keyturn._committed_staged(p_tenant, p_principal);
BEGIN
    RETURN QUERY SELECT split_part(v, ' ', 1)::bigint, split_part(v, ' ', 2)::bigint;
END
$$;

CREATE FUNCTION keyturn.stage_file(content bytea, filename text, content_type text)
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
CREATE FUNCTION keyturn._attachments(p_ver keyturn.tool_version, p_params jsonb)
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
CREATE FUNCTION keyturn._check_attachments(p_tenant text, p_principal text, p_ver keyturn.tool_version,
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
CREATE FUNCTION keyturn._bind_attachments(p_action uuid, p_tenant text, p_principal text,
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
CREATE FUNCTION keyturn._attachment_problem(a keyturn.action, p_ver keyturn.tool_version, p_params jsonb)
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
CREATE FUNCTION keyturn._attachments_unreadable(p_ver keyturn.tool_version, p_params jsonb)
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
CREATE FUNCTION keyturn._attachments_of(p_what text, p_tenant text, p_id uuid, p_lease uuid)
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

CREATE FUNCTION keyturn.attachments(action_id uuid, lease_id uuid)
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
CREATE FUNCTION keyturn._file_content_of(p_what text, p_tenant text, p_id uuid, p_lease uuid, p_file uuid)
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

CREATE FUNCTION keyturn.file_content(action_id uuid, lease_id uuid, file_id uuid)
RETURNS bytea
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT keyturn._file_content_of('file_content', NULL, file_content.action_id, file_content.lease_id,
                                    file_content.file_id)
$$;

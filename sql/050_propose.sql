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
CREATE FUNCTION keyturn._check_origin(p_origin jsonb)
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
CREATE FUNCTION keyturn._tool_table(p_ver keyturn.tool_version)
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
CREATE FUNCTION keyturn._form_value(p_ver keyturn.tool_version, p_part text, p_column text)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT keyturn._value_expr(p_ver.sql_types, p_part, p_column)
$$;

-- The WHERE clause of an sql tool's form, over the row alias t. Column names
-- come only from the tool's registered lists, so nothing the agent sends is
-- spliced in. Built in Rust (extension/src/form.rs); inlined where called.
CREATE FUNCTION keyturn._form_where(p_ver keyturn.tool_version, p_form jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT keyturn._where_clause(p_ver.sql_types, p_form)
$$;

CREATE FUNCTION keyturn._version_expr(p_ver keyturn.tool_version)
RETURNS text
LANGUAGE sql STABLE  -- as format(): STABLE, and no SET clause, so it is inlined
AS $$
    SELECT CASE WHEN p_ver.sql_version = 'xmin' THEN 't.xmin' ELSE format('t.%I', p_ver.sql_version) END
$$;

-- What is wrong with the form {"where": {col: value | [values]}, "set": {col: value}},
-- or NULL. Returned rather than raised, so approve's revalidation needs no
-- subtransaction to catch it. The check is Rust (extension/src/form.rs);
-- this wrapper is inlined where it is called.
CREATE FUNCTION keyturn._form_error(p_ver keyturn.tool_version, p_form jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT keyturn._form_problem(p_ver.tool, p_ver.sql_where, p_ver.sql_set, p_ver.sql_types, p_form)
$$;

-- Resolves the targets of an sql form as the caller (RLS applies). Returns
-- [{"k": key, "v": version}, ...], 1 to max_targets of them.
CREATE FUNCTION keyturn._resolve_targets(p_caller oid, p_ver keyturn.tool_version, p_form jsonb)
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
CREATE FUNCTION keyturn._undeclared_recipient(p_ver keyturn.tool_version, p_params jsonb)
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
CREATE FUNCTION keyturn._lock_grant(p_tenant text, p_principal text, p_tool text)
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
CREATE FUNCTION keyturn._propose_for(p_caller oid, p_tenant text, p_principal text, p_session text,
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

CREATE FUNCTION keyturn._propose(p_caller oid, p_tool text, p_params jsonb, p_origin jsonb)
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

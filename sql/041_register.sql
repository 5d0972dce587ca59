-- keyturn 0.1.0: tool registration (docs/sql-api.md).
--
-- A spec is validated whole before anything is written: unknown keys, wrong
-- types and out-of-range values are 22023 with the key named. sql tools are
-- resolved against the catalog here, once, so approve never has to.

CREATE FUNCTION keyturn._spec_choice(p_spec jsonb, p_key text, p_default text, p_allowed text[])
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

CREATE FUNCTION keyturn._spec_string(p_spec jsonb, p_key text)
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

CREATE FUNCTION keyturn._spec_positive_int(p_value jsonb, p_what text, p_max int)
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

CREATE FUNCTION keyturn._spec_interval(p_value jsonb, p_what text, p_max interval)
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
    IF v <= interval '0' OR v > p_max THEN
        RAISE EXCEPTION 'keyturn: % must be more than 0 and at most %, not %', p_what, p_max, v
            USING ERRCODE = '22023';
    END IF;
    RETURN v;
END
$$;

-- The column's type as format_type prints it, or 22023 when it is not a plain
-- column of the table (system columns, dropped columns and typos alike).
CREATE FUNCTION keyturn._spec_column(p_relid oid, p_column jsonb, p_what text)
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

-- IntervalStyle is pinned so the stored spec reads the same whatever the
-- caller's session settings.
CREATE FUNCTION keyturn.register_tool(name text, spec jsonb)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET IntervalStyle = 'postgres'
AS $$
DECLARE
    v_name      text := register_tool.name;
    k           text;
    c           jsonb;
    v_kind      text;
    v_exec      text;
    v_provider  text;
    v_schema    jsonb;
    v_summary   text;
    v_effect    text;
    v_expires   interval := interval '15 minutes';
    v_retain    text;
    v_approval  text;
    v_max       int := 100;
    v_tparam    text;
    v_sql       jsonb;
    v_relid     oid;
    v_key       text;
    v_verc      text := 'xmin';
    v_set       text[] := '{}';
    v_where     text[] := '{}';
    v_types     jsonb := '{}';
    v_rate_max  int;
    v_rate_per  interval;
    v_version   int;
    v_normal    jsonb;
BEGIN
    IF v_name IS NULL OR v_name !~ '^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$' OR length(v_name) > 63 THEN
        RAISE EXCEPTION 'keyturn: tool name % is not allowed', coalesce(quote_literal(v_name), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'Use lowercase ASCII letters, digits and underscores, dot-separated, at most 63 characters.';
    END IF;
    IF spec IS NULL OR jsonb_typeof(spec) <> 'object' THEN
        RAISE EXCEPTION 'keyturn: spec must be a JSON object' USING ERRCODE = '22023';
    END IF;
    FOR k IN SELECT jsonb_object_keys(spec) LOOP
        IF NOT k = ANY (ARRAY['kind', 'executor', 'provider', 'params_schema', 'summary', 'effect',
                              'expires_in', 'retain', 'approval', 'max_targets', 'targets_param',
                              'sql', 'rate_limit']) THEN
            RAISE EXCEPTION 'keyturn: unknown spec key %', quote_literal(k)
                USING ERRCODE = '22023',
                      HINT = 'Known keys: kind, executor, provider, params_schema, summary, effect, expires_in, retain, approval, max_targets, targets_param, sql, rate_limit.';
        END IF;
    END LOOP;

    v_kind     := keyturn._spec_choice(spec, 'kind', 'write', ARRAY['read', 'write']);
    v_exec     := keyturn._spec_choice(spec, 'executor', NULL, ARRAY['sql', 'external']);
    v_effect   := keyturn._spec_choice(spec, 'effect', 'irreversible',
                                       ARRAY['reversible', 'compensatable', 'irreversible']);
    v_retain   := keyturn._spec_choice(spec, 'retain', 'full', ARRAY['full', 'digest']);
    v_approval := keyturn._spec_choice(spec, 'approval', 'self', ARRAY['self', 'independent']);
    v_provider := keyturn._spec_string(spec, 'provider');
    v_tparam   := keyturn._spec_string(spec, 'targets_param');
    v_summary  := coalesce(keyturn._spec_string(spec, 'summary'), v_name);
    PERFORM keyturn._check_template(v_summary);
    IF spec ? 'expires_in' THEN
        v_expires := keyturn._spec_interval(spec -> 'expires_in', 'spec.expires_in', interval '7 days');
    END IF;
    IF spec ? 'max_targets' THEN
        v_max := keyturn._spec_positive_int(spec -> 'max_targets', 'spec.max_targets', 10000);
    END IF;
    IF spec ? 'rate_limit' THEN
        IF jsonb_typeof(spec -> 'rate_limit') <> 'object'
           OR EXISTS (SELECT 1 FROM jsonb_object_keys(spec -> 'rate_limit') j WHERE j NOT IN ('max', 'per'))
           OR NOT (spec -> 'rate_limit' ?& ARRAY['max', 'per']) THEN
            RAISE EXCEPTION 'keyturn: spec.rate_limit must be {"max": N, "per": "<interval>"}'
                USING ERRCODE = '22023';
        END IF;
        v_rate_max := keyturn._spec_positive_int(spec #> '{rate_limit,max}', 'spec.rate_limit.max', 1000000);
        v_rate_per := keyturn._spec_interval(spec #> '{rate_limit,per}', 'spec.rate_limit.per', interval '366 days');
    END IF;

    IF v_kind = 'write' AND v_exec IS NULL THEN
        RAISE EXCEPTION 'keyturn: write tool % needs spec.executor (sql or external)', v_name
            USING ERRCODE = '22023';
    END IF;
    IF v_exec IS DISTINCT FROM 'external' THEN
        FOREACH k IN ARRAY ARRAY['provider', 'params_schema', 'targets_param'] LOOP
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
        IF v_provider IS NULL OR v_provider !~ '^[a-z][a-z0-9_]*$' THEN
            RAISE EXCEPTION 'keyturn: external tool % needs spec.provider, a lowercase adapter name such as webhook or smtp', v_name
                USING ERRCODE = '22023';
        END IF;
        v_schema := keyturn._check_params_schema(coalesce(spec -> 'params_schema', '{}'));
        IF v_tparam IS NOT NULL AND NOT (v_schema -> 'properties') ? v_tparam THEN
            RAISE EXCEPTION 'keyturn: spec.targets_param % is not a property of params_schema', quote_literal(v_tparam)
                USING ERRCODE = '22023';
        END IF;
    ELSIF v_exec = 'sql' THEN
        v_sql := spec -> 'sql';
        IF v_sql IS NULL OR jsonb_typeof(v_sql) <> 'object' THEN
            RAISE EXCEPTION 'keyturn: sql tool % needs spec.sql = {"table", "key", "version", "set", "where"}', v_name
                USING ERRCODE = '22023';
        END IF;
        FOR k IN SELECT jsonb_object_keys(v_sql) LOOP
            IF k NOT IN ('table', 'key', 'version', 'set', 'where') THEN
                RAISE EXCEPTION 'keyturn: unknown spec.sql key %', quote_literal(k) USING ERRCODE = '22023';
            END IF;
        END LOOP;
        IF jsonb_typeof(v_sql -> 'table') IS DISTINCT FROM 'string' THEN
            RAISE EXCEPTION 'keyturn: spec.sql.table must name a table, e.g. "crm.deal"' USING ERRCODE = '22023';
        END IF;
        v_relid := to_regclass(v_sql ->> 'table');
        IF v_relid IS NULL OR NOT EXISTS (SELECT 1 FROM pg_class r WHERE r.oid = v_relid AND r.relkind IN ('r', 'p')) THEN
            RAISE EXCEPTION 'keyturn: spec.sql.table % is not an existing table', v_sql -> 'table'
                USING ERRCODE = '22023';
        END IF;
        v_key := v_sql ->> 'key';
        v_types := jsonb_build_object(v_key, keyturn._spec_column(v_relid, v_sql -> 'key', 'spec.sql.key'));
        IF v_sql ? 'version' AND v_sql -> 'version' IS DISTINCT FROM '"xmin"' THEN
            PERFORM keyturn._spec_column(v_relid, v_sql -> 'version', 'spec.sql.version');
            v_verc := v_sql ->> 'version';
        END IF;
        IF jsonb_typeof(v_sql -> 'set') IS DISTINCT FROM 'array' OR jsonb_array_length(v_sql -> 'set') = 0 THEN
            RAISE EXCEPTION 'keyturn: spec.sql.set must be a non-empty array of column names' USING ERRCODE = '22023';
        END IF;
        FOR c IN SELECT jsonb_array_elements(v_sql -> 'set') LOOP
            v_types := v_types || jsonb_build_object(c #>> '{}', keyturn._spec_column(v_relid, c, 'spec.sql.set'));
            IF c #>> '{}' IN (v_key, v_verc) THEN
                RAISE EXCEPTION 'keyturn: spec.sql.set may not include the key or version column %', c
                    USING ERRCODE = '22023';
            END IF;
            v_set := v_set || (c #>> '{}');
        END LOOP;
        IF v_sql ? 'where' THEN
            IF jsonb_typeof(v_sql -> 'where') <> 'array' THEN
                RAISE EXCEPTION 'keyturn: spec.sql.where must be an array of column names' USING ERRCODE = '22023';
            END IF;
            FOR c IN SELECT jsonb_array_elements(v_sql -> 'where') LOOP
                v_types := v_types || jsonb_build_object(c #>> '{}', keyturn._spec_column(v_relid, c, 'spec.sql.where'));
                v_where := v_where || (c #>> '{}');
            END LOOP;
        END IF;
        IF cardinality(v_where) = 0 THEN
            RAISE EXCEPTION 'keyturn: spec.sql.where must name at least one column the form may filter on'
                USING ERRCODE = '22023',
                      HINT = 'A form without filters would address the whole table.';
        END IF;
    END IF;

    v_normal := jsonb_strip_nulls(jsonb_build_object(
        'kind', v_kind, 'executor', v_exec, 'provider', v_provider, 'params_schema', v_schema,
        'summary', v_summary, 'effect', v_effect, 'expires_in', v_expires::text,
        'retain', v_retain, 'approval', v_approval, 'max_targets', v_max,
        'targets_param', v_tparam,
        'sql', CASE WHEN v_exec = 'sql' THEN jsonb_build_object(
                    'table', v_relid::regclass::text, 'key', v_key, 'version', v_verc,
                    'set', to_jsonb(v_set), 'where', to_jsonb(v_where)) END,
        'rate_limit', CASE WHEN v_rate_max IS NOT NULL THEN jsonb_build_object(
                    'max', v_rate_max, 'per', v_rate_per::text) END));

    SELECT t.version + 1 INTO v_version FROM keyturn.tool t WHERE t.name = v_name FOR UPDATE;
    IF v_version IS NULL THEN
        v_version := 1;
        INSERT INTO keyturn.tool (name, version) VALUES (v_name, v_version);
    ELSE
        UPDATE keyturn.tool t SET version = v_version, updated_at = now() WHERE t.name = v_name;
    END IF;

    INSERT INTO keyturn.tool_version (tool, version, spec, kind, executor, provider, params_schema,
                                      summary, effect, expires_in, retain, approval, max_targets,
                                      targets_param, sql_relid, sql_key, sql_version, sql_set,
                                      sql_where, sql_types, rate_max, rate_per)
    VALUES (v_name, v_version, v_normal, v_kind, v_exec, v_provider, v_schema,
            v_summary, v_effect, v_expires, v_retain, v_approval, v_max,
            v_tparam, v_relid, v_key, CASE WHEN v_exec = 'sql' THEN v_verc END,
            CASE WHEN v_exec = 'sql' THEN v_set END, CASE WHEN v_exec = 'sql' THEN v_where END,
            CASE WHEN v_exec = 'sql' THEN v_types END, v_rate_max, v_rate_per);
    RETURN v_version;
END
$$;

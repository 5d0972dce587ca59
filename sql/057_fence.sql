-- Read-side fencing (docs/fencing.md): data from a connected app reaches a
-- prompt only as a fenced, projected block. An admin registers, per
-- provider, the fields its data may contribute (keyturn.register_projection,
-- versioned like tools); keyturn.fence keeps only those, cuts each string to
-- its bound, redacts credential-shaped values, neutralizes control, bidi and
-- marker characters, and wraps the result between fresh random markers that
-- the guard text names. An unreviewed integration contributes nothing.

CREATE FUNCTION keyturn.register_projection(provider text, spec jsonb)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_spec    jsonb;
    v_version int;
BEGIN
    PERFORM keyturn._refuse_nested('register_projection');
    IF register_projection.provider IS NULL
       OR register_projection.provider !~ '^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$'
       OR length(register_projection.provider) > 63 THEN
        RAISE EXCEPTION 'keyturn: provider name % is not allowed', coalesce(quote_literal(register_projection.provider), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'Use lowercase ASCII letters, digits and underscores, dot-separated, at most 63 characters.';
    END IF;
    v_spec := keyturn._check_projection(register_projection.spec);
    SELECT p.version + 1 INTO v_version FROM keyturn.projection p
     WHERE p.provider = register_projection.provider FOR UPDATE;
    IF v_version IS NULL THEN
        v_version := 1;
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

CREATE FUNCTION keyturn.fence(provider text, data jsonb)
RETURNS TABLE (guard text, reference text, marker text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_spec jsonb;
BEGIN
    PERFORM keyturn._refuse_nested('fence');
    SELECT v.spec INTO v_spec FROM keyturn.projection p
      JOIN keyturn.projection_version v ON v.provider = p.provider AND v.version = p.version
     WHERE p.provider = fence.provider;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'keyturn: no projection is registered for provider %', coalesce(quote_literal(fence.provider), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'An unreviewed integration contributes nothing: an admin registers the fields it may contribute with keyturn.register_projection(provider, spec).';
    END IF;
    IF fence.data IS NULL THEN
        RAISE EXCEPTION 'keyturn: data must be a JSON value' USING ERRCODE = '22023';
    END IF;
    RETURN QUERY SELECT * FROM keyturn._fence(fence.provider, v_spec, fence.data);
END
$$;

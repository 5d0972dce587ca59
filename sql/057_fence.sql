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
CREATE FUNCTION keyturn._record_evidence(p_caller oid, p_tenant text, p_principal text, p_kind text, p_ref text,
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
CREATE FUNCTION keyturn._record_evidence_for_caller(p_caller oid, p_kind text, p_ref text, p_sha256 text)
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
CREATE FUNCTION keyturn.revoke_evidence(id uuid)
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
CREATE FUNCTION keyturn._check_evidence(p_tenant text, p_principal text, p_origin jsonb)
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
CREATE FUNCTION keyturn._cited_evidence(p_tenant text, p_origin jsonb)
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

CREATE FUNCTION keyturn.fence(provider text, data jsonb)
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

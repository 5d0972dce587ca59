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
CREATE FUNCTION keyturn._chain_start()
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
CREATE FUNCTION keyturn._commitments_kept(a keyturn.action, d jsonb, p_to keyturn.status)
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
CREATE FUNCTION keyturn._commitment_missing(a keyturn.action)
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
CREATE FUNCTION keyturn.verify_audit(tenant text)
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
CREATE FUNCTION keyturn.audit_export(tenant text, since timestamptz DEFAULT '-infinity')
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
CREATE FUNCTION keyturn.audit_head(tenant text)
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

-- Identity checks, membership lookups and row-level security.
--
-- The identity functions themselves (current_tenant, current_principal,
-- current_session) are written in Rust (extension/src/identity.rs): they parse
-- request.jwt.claims without a subtransaction, which keeps them cheap enough to
-- sit inside RLS policies.

-- The role a SECURITY DEFINER function was called from: the SET ROLE role, else
-- the login role (current_user inside such a function is its owner).
CREATE FUNCTION keyturn._calling_role()
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
CREATE FUNCTION keyturn._membership(p_tenant text, p_principal text, p_session text,
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
CREATE FUNCTION keyturn._membership_missing(p_tenant text, p_principal text, p_session text)
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
CREATE FUNCTION keyturn._require_member(p_tenant text, p_principal text, p_session text)
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
CREATE FUNCTION keyturn._grant_live(p_valid_until timestamptz)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT p_valid_until IS NULL OR p_valid_until > pg_catalog.clock_timestamp()
$$;

-- plpgsql, not sql: a sql function with a subquery is never inlined, and is
-- parsed and planned again on every call; plpgsql keeps the plan.
CREATE FUNCTION keyturn._has_grant(p_tenant text, p_principal text, p_tool text)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM keyturn.tool_grant g
                    WHERE g.tenant = p_tenant AND g.principal = p_principal AND g.tool = p_tool
                      AND keyturn._grant_live(g.valid_until));
END
$$;

CREATE FUNCTION keyturn._epoch(p_tenant text, p_principal text)
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
CREATE FUNCTION keyturn._bump_epoch(p_tenant text, p_principal text)
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
CREATE FUNCTION keyturn._sees(p_tenant text, p_principal text)
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

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

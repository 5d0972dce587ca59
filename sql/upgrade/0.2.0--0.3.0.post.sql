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

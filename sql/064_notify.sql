-- Reaching people (docs/notifications.md): a person's channels
-- (keyturn.set_notify), the notifications keyturn records when an action
-- starts to wait for them, and how the dispatcher carries them.
--
-- A notification is one of keyturn's own effects: a message leaves keyturn
-- for a person as an external action's call leaves it for a provider, and it
-- must be as honest: never sent twice, never lost without anyone knowing. So
-- notifications travel through the dispatcher's own calls (lease,
-- begin_dispatch, complete, their batch and tenant-explicit forms, sweep,
-- uncertain_actions, reconcile, record_not_sent, attempts), and the rules
-- those calls apply are written once and shared (sql/060_dispatch.sql):
-- keyturn._lease_problem_of, _complete_problem_of, _complete_args_error,
-- _outcome_status, _outcome_delay, _outcome_result, _max_attempts,
-- _retry_backoff, _attempt_not_sent. keyturnd leases them with the providers
-- it has for them (notify.email, notify.webhook, notify.webpush), and needs
-- nothing else of its own but those adapters: the same loop, journal and
-- recovery carry them. An uncertain notification waits in the operator's
-- queue like an uncertain action.
--
-- Why a table of their own, not actions of internal tools. An action is a
-- proposal a person approves: its row's token and binding, params hash,
-- epoch, the grant its proposer holds, the approval MAC that lease and
-- begin_dispatch verify, the usage row of its success, all serve that, and a
-- trigger lets it past 'pending' only with a person's approval. A
-- notification has none of it. As an action it would be a queued row no
-- person approved, which is exactly what lease refuses as forged; keyturn
-- would need a way to mint approvals without a person, and metering, the
-- queue and the audit's status chain would each need an exception. The
-- protocol is what the two share, so the protocol is what is shared: the
-- rules above, the attempt rows (keyed by the notification's id), and an id
-- the calls route by without a lookup (keyturn._is_notification), so a batch
-- of actions pays nothing for them.
--
-- Who is notified, when, and what the message says are decided here: the
-- people an action waits for (keyturn._waits_for), checked again at lease,
-- at begin and when the message is made, so nothing is sent for an action
-- that was decided, expired or cancelled first; the one reminder; the hourly
-- cap, past which notices wait for one digest; the message's text, with a
-- fresh one-time link code and never params, a token or a JWT.

-- Whether an id is a notification's: a UUID of version 8 (a v7 whose version
-- nibble keyturn._notification_id changed); every action id is a v7 (or, from
-- before 0.2.0, a v4).
CREATE FUNCTION keyturn._is_notification(p_id uuid)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT substr(p_id::text, 15, 1) = '8'
$$;

-- The provider a notification of this channel is leased for: keyturnd
-- passes these names to lease for the channels it can send.
CREATE FUNCTION keyturn._notify_provider(p_channel keyturn.channel)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE  -- as an enum's text is: inlined
AS $$
    SELECT 'notify.' || p_channel::text
$$;

-- ---- The person's channels ----

-- The links a person's channel was sent, ended: the unopened codes its
-- notifications carried and the card sessions they opened. Whoever read the
-- channel (a chat webhook that leaked, an inbox handed on) could otherwise
-- decide the person's pending actions with them after the person removed
-- the channel or pointed it elsewhere (docs/security.md, row 138). Returns
-- how many ended.
CREATE FUNCTION keyturn._end_channel_links(p_tenant text, p_principal text, p_channel keyturn.channel)
RETURNS int
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_n int;
BEGIN
    -- Every attempt's code (each carried one), opened or not.
    DELETE FROM keyturn.card_link l
     USING keyturn.notification n
     WHERE n.tenant = p_tenant AND n.principal = p_principal AND n.channel = p_channel
       AND l.tenant = p_tenant AND l.notification = n.id;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

-- set_notify: one target per channel for the caller's principal, replacing
-- the one before (and ending the links sent to it, when the target
-- changes). Settings: remind_before (an interval, more than 0 and at
-- most 7 days; 5 minutes by default), max_per_hour (1 to 1000; 100 by
-- default: a bound on a runaway agent, not on a busy person, who sets it
-- lower for a quieter phone), and for a webhook its own secret (whsec_…; without one keyturnd
-- signs with KEYTURN_NOTIFY_WEBHOOK_SECRET). Anything else, or a target
-- outside its channel's rule (keyturn-core's notify module): 22023. The
-- caller's role is kept: the card its notifications open runs as it.
CREATE FUNCTION keyturn._set_notify(p_caller oid, p_channel text, p_target text, p_settings jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_settings  jsonb := coalesce(p_settings, '{}');
    v_channels  text[] := enum_range(NULL::keyturn.channel)::text[];
    v_key       text;
    v_target    text;
    v_remind    interval := interval '5 minutes';
    v_max       int := 100;
    v_secret    text;
    v_role      text := p_caller::regrole::text;
    v_now       timestamptz := clock_timestamp();
    v_old       text;
BEGIN
    PERFORM keyturn._set_actor(v_role, v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    IF p_channel IS NULL OR NOT p_channel = ANY (v_channels) THEN
        RAISE EXCEPTION 'keyturn: channel must be one of %, not %', array_to_string(v_channels, ', '),
                coalesce(keyturn._quoted(p_channel), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_target IS NULL THEN
        RAISE EXCEPTION 'keyturn: a % channel needs its target', p_channel USING ERRCODE = '22023';
    END IF;
    v_target := keyturn._notify_target(p_channel, p_target);
    IF jsonb_typeof(v_settings) <> 'object' THEN
        RAISE EXCEPTION 'keyturn: settings must be a JSON object' USING ERRCODE = '22023';
    END IF;
    FOR v_key IN SELECT k FROM jsonb_object_keys(v_settings) k ORDER BY 1 LOOP
        IF NOT (v_key IN ('remind_before', 'max_per_hour') OR (v_key = 'secret' AND p_channel = 'webhook')) THEN
            RAISE EXCEPTION 'keyturn: unknown setting % for a % channel', keyturn._quoted(v_key), p_channel
                USING ERRCODE = '22023',
                      HINT = 'Settings: remind_before (an interval), max_per_hour (a number), and for a webhook secret (whsec_…).';
        END IF;
    END LOOP;
    IF v_settings ? 'remind_before' THEN
        IF jsonb_typeof(v_settings -> 'remind_before') <> 'string' THEN
            RAISE EXCEPTION 'keyturn: remind_before must be an interval, as text' USING ERRCODE = '22023';
        END IF;
        BEGIN
            v_remind := (v_settings ->> 'remind_before')::interval;
        EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
            RAISE EXCEPTION 'keyturn: remind_before is not an interval: %', keyturn._quoted(v_settings ->> 'remind_before')
                USING ERRCODE = '22023';
        END;
        IF NOT keyturn._interval_within(v_remind, interval '7 days') THEN
            RAISE EXCEPTION 'keyturn: remind_before must be more than 0 and at most 7 days, without months or years, not %', v_remind
                USING ERRCODE = '22023';
        END IF;
    END IF;
    IF v_settings ? 'max_per_hour' THEN
        IF jsonb_typeof(v_settings -> 'max_per_hour') <> 'number'
           OR (v_settings ->> 'max_per_hour') !~ '^[0-9]{1,4}$'
           OR (v_settings ->> 'max_per_hour')::int NOT BETWEEN 1 AND 1000 THEN
            RAISE EXCEPTION 'keyturn: max_per_hour must be a whole number from 1 to 1000' USING ERRCODE = '22023';
        END IF;
        v_max := (v_settings ->> 'max_per_hour')::int;
    END IF;
    IF v_settings ? 'secret' THEN
        IF jsonb_typeof(v_settings -> 'secret') <> 'string' THEN
            RAISE EXCEPTION 'keyturn: secret must be a string (whsec_…)' USING ERRCODE = '22023';
        END IF;
        v_secret := v_settings ->> 'secret';
        PERFORM keyturn._check_webhook_secret(v_secret);
    END IF;
    SELECT c.target INTO v_old FROM keyturn.notify_channel c
     WHERE c.tenant = v_tenant AND c.principal = v_principal AND c.channel = p_channel::keyturn.channel
       FOR UPDATE;
    IF v_old IS DISTINCT FROM v_target THEN
        PERFORM keyturn._end_channel_links(v_tenant, v_principal, p_channel::keyturn.channel);
    END IF;
    INSERT INTO keyturn.notify_channel AS c (tenant, principal, channel, target, remind_before, max_per_hour, secret,
                                              db_role, created_at, updated_at)
    VALUES (v_tenant, v_principal, p_channel::keyturn.channel, v_target, v_remind, v_max, v_secret, v_role, v_now,
            v_now)
    ON CONFLICT (tenant, principal, channel)
    DO UPDATE SET target = EXCLUDED.target, remind_before = EXCLUDED.remind_before,
                  max_per_hour = EXCLUDED.max_per_hour, secret = EXCLUDED.secret, db_role = EXCLUDED.db_role,
                  updated_at = EXCLUDED.updated_at;
END
$$;

-- The caller's channels, as the caller may see them: a URL's scheme and host
-- only (a Slack or Teams workflow URL's path is its secret; a push endpoint's
-- names the device), whether a webhook signs with a secret of its own, never
-- the secret.
CREATE FUNCTION keyturn._notify_channels(p_caller oid)
RETURNS TABLE (o_channel text, o_target text, o_remind_before interval, o_max_per_hour int, o_own_secret boolean,
               o_db_role text, o_updated_at timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
BEGIN
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    RETURN QUERY
    SELECT c.channel::text, keyturn._notify_target_hint(c.channel::text, c.target), c.remind_before,
           c.max_per_hour, c.secret IS NOT NULL, c.db_role, c.updated_at
      FROM keyturn.notify_channel c
     WHERE c.tenant = v_tenant AND c.principal = v_principal
     ORDER BY c.channel;
END
$$;

-- Removes one of the caller's channels: true if there was one. Its
-- notifications not yet sent are cancelled when they come due, and the
-- links already sent to it end.
CREATE FUNCTION keyturn._remove_notify(p_caller oid, p_channel text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    -- The name is made a channel first, and the column compared as it is:
    -- Citus refuses a DELETE on a distributed table (layout B) whose WHERE
    -- calls a STABLE function on a column (c.channel::text is enum_out). A
    -- name that is no channel matches no row, as the text comparison did.
    IF p_channel IS NULL OR NOT p_channel = ANY (enum_range(NULL::keyturn.channel)::text[]) THEN
        RETURN false;
    END IF;
    DELETE FROM keyturn.notify_channel c
     WHERE c.tenant = v_tenant AND c.principal = v_principal AND c.channel = p_channel::keyturn.channel;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM keyturn._end_channel_links(v_tenant, v_principal, p_channel::keyturn.channel);
    RETURN true;
END
$$;

-- revoke_links: every link code of the caller's principal not yet opened,
-- and every card session one opened, ended (a person who fears a link
-- reached someone else); how many.
CREATE FUNCTION keyturn._revoke_links(p_caller oid)
RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant    text := keyturn.current_tenant();
    v_principal text := keyturn.current_principal();
    v_n         int;
BEGIN
    PERFORM keyturn._set_actor(p_caller::regrole::text, v_principal);
    PERFORM keyturn._require_member(v_tenant, v_principal, keyturn.current_session());
    DELETE FROM keyturn.card_link l WHERE l.tenant = v_tenant AND l.principal = v_principal;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

-- ---- Who is waited for ----

-- Why action a does not (or no longer) wait for p_principal, or NULL: the
-- one rule for whom a notification reaches, applied when it is recorded,
-- leased, begun and when its message is made. The action is pending and not
-- expired; the person is a member who may decide it by approve's rule
-- (keyturn._decide_problem: the proposer in its session for self, an
-- approver or admin who wrote none of it and holds the tool's grant for
-- independent and quorum tools) and has not voted on it yet. a.id NULL: the
-- action is not there.
CREATE FUNCTION keyturn._waits_for(a keyturn.action, p_principal text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_role text;
BEGIN
    IF a.id IS NULL THEN
        RETURN 'the action is not there';
    END IF;
    IF a.status <> 'pending' THEN
        RETURN format('the action is %s', a.status);
    END IF;
    IF a.expires_at <= clock_timestamp() THEN
        RETURN 'the action expired';
    END IF;
    SELECT m.role INTO v_role FROM keyturn.member m WHERE m.tenant = a.tenant AND m.principal = p_principal;
    IF v_role IS NULL THEN
        RETURN format('%s is not a member of %s', p_principal, a.tenant);
    END IF;
    IF EXISTS (SELECT 1 FROM keyturn.vote x
                WHERE x.action_id = a.id AND x.tenant = a.tenant AND x.principal = p_principal) THEN
        RETURN format('%s has voted on it', p_principal);
    END IF;
    -- The action's own session: a self action is decided in it, and no
    -- other rule reads the session.
    RETURN keyturn._decide_problem(a, p_principal, a.session, v_role, 'approve');
END
$$;

-- Records the notifications of an action that has started to wait (propose
-- calls it for a pending proposal, in a tenant where someone set a channel):
-- for each person it waits for and each of their channels, a notice due now
-- and the reminder, due remind_before its expiry if that is still ahead.
-- Then wakes the dispatcher. Returns how many it recorded. One row each
-- (notification_once_idx): a second call records nothing.
CREATE FUNCTION keyturn._record_notifications(p_id uuid, p_tenant text)
RETURNS int
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    a        keyturn.action;
    c        record;
    v_now    timestamptz := clock_timestamp();
    v_due    timestamptz;
    v_id     uuid;
    v_last   text;
    v_waits  boolean := false;
    v_n      int := 0;
BEGIN
    SELECT x.* INTO a FROM keyturn.action x WHERE x.id = p_id AND x.tenant = p_tenant;
    -- A self action waits for its proposer alone; the others for the
    -- tenant's approvers and admins, each checked by keyturn._waits_for.
    FOR c IN
        SELECT n.principal, n.channel, n.remind_before FROM keyturn.notify_channel n
         WHERE n.tenant = p_tenant
           AND (n.principal = a.principal
                OR (a.approval <> 'self'
                    AND n.principal IN (SELECT m.principal FROM keyturn.member m
                                         WHERE m.tenant = p_tenant AND m.role IN ('approver', 'admin'))))
         ORDER BY n.principal, n.channel
    LOOP
        IF c.principal IS DISTINCT FROM v_last THEN
            v_last := c.principal;
            v_waits := keyturn._waits_for(a, c.principal) IS NULL;
        END IF;
        CONTINUE WHEN NOT v_waits;
        v_id := keyturn._notification_id();
        INSERT INTO keyturn.notification (id, tenant, principal, channel, kind, action_id, status, next_attempt_at,
                                          created_at, updated_at)
        VALUES (v_id, p_tenant, c.principal, c.channel, 'notice', p_id, 'queued', v_now, v_now, v_now)
        ON CONFLICT DO NOTHING;
        v_n := v_n + 1;
        v_due := a.expires_at - c.remind_before;
        IF v_due > v_now THEN
            v_id := keyturn._notification_id();
            INSERT INTO keyturn.notification (id, tenant, principal, channel, kind, action_id, status,
                                              next_attempt_at, created_at, updated_at)
            VALUES (v_id, p_tenant, c.principal, c.channel, 'reminder', p_id, 'queued', v_due, v_now, v_now)
            ON CONFLICT DO NOTHING;
            v_n := v_n + 1;
        END IF;
    END LOOP;
    IF v_n > 0 AND current_setting('keyturn.notify')::boolean THEN
        PERFORM pg_notify('keyturn_dispatch', '');
    END IF;
    RETURN v_n;
END
$$;

-- Why notification n must not be sent now, or NULL: its person removed the
-- channel, or its action no longer waits for them (for a digest: none of the
-- actions it carries still does).
CREATE FUNCTION keyturn._notification_problem(n keyturn.notification)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    a         keyturn.action;
    v_id      uuid;
BEGIN
    PERFORM 1 FROM keyturn.notify_channel c
      WHERE c.tenant = n.tenant AND c.principal = n.principal AND c.channel = n.channel;
    IF NOT FOUND THEN
        RETURN format('%s removed the %s channel', n.principal, n.channel);
    END IF;
    IF n.kind <> 'digest' THEN
        SELECT x.* INTO a FROM keyturn.action x WHERE x.id = n.action_id AND x.tenant = n.tenant;
        RETURN keyturn._waits_for(a, n.principal);
    END IF;
    FOR v_id IN SELECT b.action_id FROM keyturn.notification b
                 WHERE b.batched_into = n.id AND b.tenant = n.tenant ORDER BY b.action_id LOOP
        SELECT x.* INTO a FROM keyturn.action x WHERE x.id = v_id AND x.tenant = n.tenant;
        IF keyturn._waits_for(a, n.principal) IS NULL THEN
            RETURN NULL;
        END IF;
    END LOOP;
    RETURN 'none of the actions it carries waits for the person any more';
END
$$;

-- ---- The dispatcher's calls, for notifications ----

-- How many of one tenant's notifications may be leased or executing at
-- once (keyturn._lease_notifications).
CREATE FUNCTION keyturn._notify_in_flight()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 2 $$;

-- lease's part (keyturn._lease calls it first): the due notifications of the
-- channels p_providers names (NULL: every channel), at most p_max, locked
-- FOR UPDATE SKIP LOCKED in (next_attempt_at, id) order. Each is checked
-- first: one whose action no longer waits for its person is cancelled; a
-- notice or reminder past its person's hourly cap on that channel is
-- batched into the channel's digest (made if there is none, due when the
-- hour's first one leaves the window); the rest are leased and returned as
-- lease returns jobs: tool keyturn.notify, provider notify.<channel>,
-- params naming the notification, idempotency key keyturn-notify-<id>. The
-- channel row is locked while the cap is counted, so two dispatchers count
-- one person's notifications one at a time. p_tenant as in keyturn._lease.
-- A share of the dispatcher, not all of it: a person's endpoint that never
-- answers holds a slot for a whole call timeout, and notifications come
-- first, so one tenant's person (and their agent's burst of proposals) had
-- every slot all tenants share (docs/security.md, row 136). A lease gives
-- notifications at most half its jobs (at least one); a person with one
-- notification leased or executing gets no other until it ends (one
-- member's stalled endpoint had held the tenant's whole share, and their
-- colleagues' notifications waited behind it), and a tenant with
-- keyturn._notify_in_flight() gets no more: their others wait in the
-- queue, and everyone else's are leased past them.
CREATE FUNCTION keyturn._lease_notifications(p_tenant text, p_worker text, p_max int, p_lease_for interval,
                                             p_providers text[], p_now timestamptz)
RETURNS TABLE (action_id uuid, lease_id uuid, tenant text, tool text, provider text, params jsonb,
               idempotency_key text, attempt int)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_channels keyturn.channel[];
    n          keyturn.notification;
    v_max      int;
    v_problem  text;
    v_lease    uuid;
    v_digest   uuid;
    v_recent   bigint;
    v_full     text[];
    v_busy     jsonb;
    v_left     int := greatest(1, p_max / 2);
BEGIN
    v_channels := ARRAY(SELECT c FROM unnest(enum_range(NULL::keyturn.channel)) c
                         WHERE p_providers IS NULL OR keyturn._notify_provider(c) = ANY (p_providers));
    IF p_max < 1 OR cardinality(v_channels) = 0 THEN
        RETURN;
    END IF;
    -- The tenants with their share in flight already, and the people with
    -- one in flight: [[tenant, principal], …].
    v_full := ARRAY(SELECT x.tenant FROM keyturn.notification x
                     WHERE x.status IN ('leased', 'executing') AND (p_tenant IS NULL OR x.tenant = p_tenant)
                     GROUP BY x.tenant HAVING count(*) >= keyturn._notify_in_flight());
    v_busy := coalesce((SELECT jsonb_agg(DISTINCT jsonb_build_array(x.tenant, x.principal))
                          FROM keyturn.notification x
                         WHERE x.status IN ('leased', 'executing') AND (p_tenant IS NULL OR x.tenant = p_tenant)),
                       '[]');
    FOR n IN
        SELECT x.* FROM keyturn.notification x
         WHERE x.status = 'queued' AND x.next_attempt_at <= p_now AND x.channel = ANY (v_channels)
           AND (p_tenant IS NULL OR x.tenant = p_tenant) AND x.tenant <> ALL (v_full)
           AND NOT v_busy @> jsonb_build_array(jsonb_build_array(x.tenant, x.principal))
         ORDER BY x.next_attempt_at, x.id
         LIMIT p_max
           FOR UPDATE SKIP LOCKED
    LOOP
        SELECT c.max_per_hour INTO v_max FROM keyturn.notify_channel c
         WHERE c.tenant = n.tenant AND c.principal = n.principal AND c.channel = n.channel
           FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND AND EXISTS (SELECT 1 FROM keyturn.notify_channel c
                                  WHERE c.tenant = n.tenant AND c.principal = n.principal AND c.channel = n.channel) THEN
            -- Its person is changing the channel, in a transaction still
            -- open: left queued for a later lease, never waited for, and
            -- due a little later, so that a burst of them does not fill
            -- every lease's first rows. A person's open transaction had
            -- held every tenant's lease (docs/security.md, row 140).
            UPDATE keyturn.notification x SET next_attempt_at = p_now + interval '5 seconds', updated_at = p_now
             WHERE x.id = n.id AND x.tenant = n.tenant;
            CONTINUE;
        END IF;
        v_problem := keyturn._notification_problem(n);
        IF v_problem IS NOT NULL THEN
            UPDATE keyturn.notification x
               SET status = 'cancelled', result = jsonb_build_object('reason', v_problem), updated_at = p_now
             WHERE x.id = n.id AND x.tenant = n.tenant;
            CONTINUE;
        END IF;
        IF n.kind <> 'digest' THEN
            -- Sent in the last hour, and leased (in this call or another
            -- not yet begun).
            SELECT count(*) INTO v_recent FROM keyturn.notification x
             WHERE x.tenant = n.tenant AND x.principal = n.principal AND x.channel = n.channel
               AND (x.dispatched_at > p_now - interval '1 hour' OR x.status = 'leased');
            IF v_recent >= v_max THEN
                v_digest := keyturn._digest_for(n, p_now);
                UPDATE keyturn.notification x
                   SET status = 'superseded', batched_into = v_digest,
                       result = jsonb_build_object('batched_into', v_digest), updated_at = p_now
                 WHERE x.id = n.id AND x.tenant = n.tenant;
                CONTINUE;
            END IF;
        END IF;
        -- Past the lease's share, or of a person or tenant that took theirs
        -- in it: checked above (cancelled, held for the digest), not leased.
        IF v_left < 1 OR n.tenant = ANY (v_full)
           OR v_busy @> jsonb_build_array(jsonb_build_array(n.tenant, n.principal)) THEN
            CONTINUE;
        END IF;
        v_lease := gen_random_uuid();
        UPDATE keyturn.notification x
           SET status = 'leased', lease_id = v_lease, leased_by = p_worker, lease_expires_at = p_now + p_lease_for,
               updated_at = p_now
         WHERE x.id = n.id AND x.tenant = n.tenant;
        v_left := v_left - 1;
        v_busy := v_busy || jsonb_build_array(jsonb_build_array(n.tenant, n.principal));
        IF (SELECT count(*) FROM keyturn.notification x
             WHERE x.tenant = n.tenant AND x.status IN ('leased', 'executing')) >= keyturn._notify_in_flight() THEN
            v_full := v_full || n.tenant;
        END IF;
        action_id := n.id;
        lease_id := v_lease;
        tenant := n.tenant;
        tool := 'keyturn.notify';
        provider := keyturn._notify_provider(n.channel);
        params := jsonb_strip_nulls(jsonb_build_object('notification', n.id, 'kind', n.kind, 'channel', n.channel,
                                                       'action_id', n.action_id));
        idempotency_key := 'keyturn-notify-' || n.id::text;
        attempt := n.attempts + 1;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The queued digest of n's person and channel, made if there is none: due
-- an hour after the first notification the cap counted was sent (or, not
-- yet begun, now), when the cap has room again. The caller holds the
-- channel row's lock.
CREATE FUNCTION keyturn._digest_for(n keyturn.notification, p_now timestamptz)
RETURNS uuid
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_id  uuid;
    v_due timestamptz;
BEGIN
    SELECT x.id INTO v_id FROM keyturn.notification x
     WHERE x.tenant = n.tenant AND x.principal = n.principal AND x.channel = n.channel
       AND x.kind = 'digest' AND x.status = 'queued';
    IF FOUND THEN
        RETURN v_id;
    END IF;
    SELECT coalesce(min(coalesce(x.dispatched_at, p_now)), p_now) + interval '1 hour' INTO v_due
      FROM keyturn.notification x
     WHERE x.tenant = n.tenant AND x.principal = n.principal AND x.channel = n.channel
       AND (x.dispatched_at > p_now - interval '1 hour' OR x.status = 'leased');
    v_id := keyturn._notification_id();
    INSERT INTO keyturn.notification (id, tenant, principal, channel, kind, status, next_attempt_at, created_at,
                                      updated_at)
    VALUES (v_id, n.tenant, n.principal, n.channel, 'digest', 'queued', v_due, p_now, p_now);
    RETURN v_id;
END
$$;

-- keyturn._begin_set and _complete_set hand a batch that holds notifications
-- here: its actions go back to them (a batch of actions alone), its
-- notifications to keyturn._notify_begin_set and _notify_complete_set, and
-- the answers keep each element's place (ord).
CREATE FUNCTION keyturn._begin_mixed(p_tenant text, p_ords int[], p_ids uuid[], p_leases uuid[])
RETURNS TABLE (ord int, dispatch boolean, problem text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_ords   int[];
    v_ids    uuid[];
    v_leases uuid[];
    v_nords  int[];
    v_nids   uuid[];
    v_nlease uuid[];
BEGIN
    SELECT array_agg(e.o) FILTER (WHERE NOT e.n), array_agg(e.i) FILTER (WHERE NOT e.n),
           array_agg(e.l) FILTER (WHERE NOT e.n),
           array_agg(e.o) FILTER (WHERE e.n), array_agg(e.i) FILTER (WHERE e.n), array_agg(e.l) FILTER (WHERE e.n)
      INTO v_ords, v_ids, v_leases, v_nords, v_nids, v_nlease
      FROM (SELECT u.o, u.i, u.l, coalesce(keyturn._is_notification(u.i), false) AS n
              FROM unnest(p_ords, p_ids, p_leases) AS u (o, i, l)) e;
    IF v_ids IS NOT NULL THEN
        RETURN QUERY SELECT * FROM keyturn._begin_set(p_tenant, v_ords, v_ids, v_leases);
    END IF;
    RETURN QUERY SELECT * FROM keyturn._notify_begin_set(p_tenant, v_nords, v_nids, v_nlease);
END
$$;

CREATE FUNCTION keyturn._complete_mixed(p_tenant text, p_ords int[], p_ids uuid[], p_leases uuid[],
                                        p_outcomes text[], p_receipts jsonb[], p_retry_after interval[])
RETURNS TABLE (ord int, status text, problem text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_a record;
    v_n record;
BEGIN
    SELECT array_agg(e.o) AS ords, array_agg(e.i) AS ids, array_agg(e.l) AS leases, array_agg(e.oc) AS outcomes,
           array_agg(e.r) AS receipts, array_agg(e.d) AS delays
      INTO v_a
      FROM unnest(p_ords, p_ids, p_leases, p_outcomes, p_receipts, p_retry_after) AS e (o, i, l, oc, r, d)
     WHERE NOT coalesce(keyturn._is_notification(e.i), false);
    SELECT array_agg(e.o) AS ords, array_agg(e.i) AS ids, array_agg(e.l) AS leases, array_agg(e.oc) AS outcomes,
           array_agg(e.r) AS receipts, array_agg(e.d) AS delays
      INTO v_n
      FROM unnest(p_ords, p_ids, p_leases, p_outcomes, p_receipts, p_retry_after) AS e (o, i, l, oc, r, d)
     WHERE coalesce(keyturn._is_notification(e.i), false);
    IF v_a.ids IS NOT NULL THEN
        RETURN QUERY SELECT * FROM keyturn._complete_set(p_tenant, v_a.ords, v_a.ids, v_a.leases, v_a.outcomes,
                                                          v_a.receipts, v_a.delays);
    END IF;
    RETURN QUERY SELECT * FROM keyturn._notify_complete_set(p_tenant, v_n.ords, v_n.ids, v_n.leases, v_n.outcomes,
                                                             v_n.receipts, v_n.delays);
END
$$;

-- begin_dispatch for notifications, element by element in the batch's
-- order (as calls one after another would, so a notification named twice
-- sees its first begin): the lease rule (keyturn._lease_problem_of) answered
-- as a problem; then, checked on the locked row, a notification whose action
-- no longer waits for its person (keyturn._notification_problem) is
-- cancelled and answered dispatch = false, as an invalidated action is; the
-- rest become executing, with an attempt row, and dispatch = true. p_tenant
-- as in keyturn._begin_set.
CREATE FUNCTION keyturn._notify_begin_set(p_tenant text, p_ords int[], p_ids uuid[], p_leases uuid[])
RETURNS TABLE (ord int, dispatch boolean, problem text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n         keyturn.notification;
    v_problem text;
    v_reason  text;
    v_now     timestamptz;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_ids), 0) LOOP
        ord := p_ords[i];
        SELECT x.* INTO n FROM keyturn.notification x
         WHERE x.id = p_ids[i] AND (p_tenant IS NULL OR x.tenant = p_tenant) FOR UPDATE;
        v_problem := keyturn._lease_problem_of('notification', p_ids[i], FOUND, n.status, n.lease_id,
                                               n.lease_expires_at, p_leases[i], '{leased}', true);
        IF v_problem IS NOT NULL THEN
            dispatch := false;
            problem := v_problem;
            RETURN NEXT;
            CONTINUE;
        END IF;
        v_reason := keyturn._notification_problem(n);
        v_now := clock_timestamp();
        problem := NULL;
        IF v_reason IS NOT NULL THEN
            UPDATE keyturn.notification x
               SET status = 'cancelled', result = jsonb_build_object('reason', v_reason), lease_id = NULL,
                   leased_by = NULL, lease_expires_at = NULL, updated_at = v_now
             WHERE x.id = n.id AND x.tenant = n.tenant;
            dispatch := false;
        ELSE
            UPDATE keyturn.notification x
               SET status = 'executing', attempts = n.attempts + 1, dispatched_at = v_now, updated_at = v_now
             WHERE x.id = n.id AND x.tenant = n.tenant;
            INSERT INTO keyturn.attempt (action_id, attempt, tenant, principal, lease_id, worker, started_at)
            VALUES (n.id, n.attempts + 1, n.tenant, n.principal, n.lease_id, n.leased_by, v_now);
            dispatch := true;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

-- complete for notifications, element by element: the arguments
-- (keyturn._complete_args_error, 22023) and the lease
-- (keyturn._complete_problem_of, 55000) answered as problems; otherwise the
-- outcome becomes the status, delay and result complete gives an action
-- (keyturn._outcome_status, _outcome_delay, _outcome_result), the attempt is
-- closed (not for a hand-back), and a notification that was sent, failed
-- or is now uncertain is an event on its action's timeline.
CREATE FUNCTION keyturn._notify_complete_set(p_tenant text, p_ords int[], p_ids uuid[], p_leases uuid[],
                                             p_outcomes text[], p_receipts jsonb[], p_retry_after interval[])
RETURNS TABLE (ord int, status text, problem text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n         keyturn.notification;
    v_problem text;
    v_back    boolean;
    v_status  keyturn.status;
    v_delay   interval;
    v_receipt jsonb;
    v_result  jsonb;
    v_next    timestamptz;
    v_now     timestamptz;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_ids), 0) LOOP
        ord := p_ords[i];
        status := NULL;
        v_problem := keyturn._complete_args_error(p_outcomes[i], p_retry_after[i], p_receipts[i]);
        IF v_problem IS NOT NULL THEN
            problem := '22023 ' || v_problem;
            RETURN NEXT;
            CONTINUE;
        END IF;
        SELECT x.* INTO n FROM keyturn.notification x
         WHERE x.id = p_ids[i] AND (p_tenant IS NULL OR x.tenant = p_tenant) FOR UPDATE;
        v_problem := keyturn._complete_problem_of('notification', p_ids[i], FOUND, n.status, n.lease_id,
                                                  n.lease_expires_at, p_leases[i], p_outcomes[i]);
        IF v_problem IS NOT NULL THEN
            problem := '55000 ' || v_problem;
            RETURN NEXT;
            CONTINUE;
        END IF;
        v_back := n.status = 'leased';
        v_status := keyturn._outcome_status(n.status, p_outcomes[i], n.attempts);
        v_delay := keyturn._outcome_delay(n.status, p_retry_after[i], n.attempts);
        v_receipt := keyturn._redact(coalesce(p_receipts[i], '{}'));
        v_result := keyturn._outcome_result(v_status, p_outcomes[i]);
        v_now := clock_timestamp();
        IF v_back THEN
            v_receipt := n.receipt;
        ELSE
            UPDATE keyturn.attempt t
               SET finished_at = v_now, outcome = p_outcomes[i]::keyturn.attempt_outcome, receipt = v_receipt
             WHERE t.action_id = n.id AND t.tenant = n.tenant AND t.attempt = n.attempts;
        END IF;
        IF v_status = 'queued' THEN
            v_next := v_now + v_delay;
            v_result := n.result;
            UPDATE keyturn.notification x
               SET status = v_status, receipt = v_receipt, next_attempt_at = v_next, lease_id = NULL,
                   leased_by = NULL, lease_expires_at = NULL, updated_at = v_now
             WHERE x.id = n.id AND x.tenant = n.tenant;
        ELSE
            UPDATE keyturn.notification x
               SET status = v_status, receipt = v_receipt, result = v_result, updated_at = v_now
             WHERE x.id = n.id AND x.tenant = n.tenant;
            PERFORM keyturn._notification_event(n, v_status::text,
                                                jsonb_build_object('outcome', p_outcomes[i], 'attempt', n.attempts));
        END IF;
        status := v_status::text;
        problem := NULL;
        RETURN NEXT;
    END LOOP;
END
$$;

-- A notification that was sent (or may have been, or failed, or was
-- reconciled), as an event in the tenant's chain (keyturn._append_event),
-- one for each action it is about: keyed by the notification's own id, not
-- the action's, so an action's audit stays its status changes and votes
-- (a notice is not a status change, and a pending-to-pending row is a vote:
-- docs/audit.md); the action's status as both ends, the action and the
-- notification in its detail. keyturn.notifications(action_id) lists them.
CREATE FUNCTION keyturn._notification_event(n keyturn.notification, p_status text, p_detail jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_id        uuid;
    v_principal text;
    v_status    text;
BEGIN
    FOREACH v_id IN ARRAY (CASE WHEN n.kind = 'digest' THEN coalesce(n.covers, '{}') ELSE ARRAY[n.action_id] END) LOOP
        SELECT x.principal, x.status::text INTO v_principal, v_status FROM keyturn.action x
         WHERE x.id = v_id AND x.tenant = n.tenant;
        CONTINUE WHEN NOT FOUND;
        PERFORM keyturn._append_event(n.id, n.tenant, v_principal, keyturn._calling_role(), NULL, v_status, v_status,
                                      jsonb_build_object('notification', jsonb_build_object(
                                          'id', n.id, 'action_id', v_id, 'kind', n.kind, 'channel', n.channel,
                                          'to', n.principal, 'status', p_status) || coalesce(p_detail, '{}')));
    END LOOP;
END
$$;

-- The sweep's part (keyturn._sweep calls it): a lapsed lease of a
-- notification never begun goes back to queued; one begun is uncertain, its
-- attempt lapsed, never sent again automatically; and a queued notification
-- whose action is no longer pending is cancelled (lease would find it so).
-- p_tenant as in keyturn._lease.
CREATE FUNCTION keyturn._sweep_notifications(p_tenant text, p_now timestamptz)
RETURNS TABLE (requeued int, uncertain int)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n keyturn.notification;
BEGIN
    UPDATE keyturn.notification x
       SET status = 'queued', lease_id = NULL, leased_by = NULL, lease_expires_at = NULL, updated_at = p_now
     WHERE (x.id, x.tenant) IN (SELECT y.id, y.tenant FROM keyturn.notification y
                                WHERE y.status = 'leased' AND y.lease_expires_at < p_now
                                  AND (p_tenant IS NULL OR y.tenant = p_tenant)
                                FOR UPDATE SKIP LOCKED)
       AND (p_tenant IS NULL OR x.tenant = p_tenant);
    GET DIAGNOSTICS requeued = ROW_COUNT;

    uncertain := 0;
    FOR n IN SELECT y.* FROM keyturn.notification y
              WHERE y.status = 'executing' AND y.lease_expires_at < p_now
                AND (p_tenant IS NULL OR y.tenant = p_tenant)
                FOR UPDATE SKIP LOCKED LOOP
        UPDATE keyturn.notification x
           SET status = 'uncertain', updated_at = p_now,
               result = jsonb_build_object('reason', 'the dispatcher''s lease lapsed while it was sending; whether the person got it is unknown, and it is never sent again automatically')
         WHERE x.id = n.id AND x.tenant = n.tenant;
        UPDATE keyturn.attempt t SET finished_at = p_now, outcome = 'lapsed'
         WHERE t.action_id = n.id AND t.tenant = n.tenant AND t.attempt = n.attempts AND t.outcome IS NULL;
        PERFORM keyturn._notification_event(n, 'uncertain', jsonb_build_object('attempt', n.attempts,
                                                                               'reason', 'lease lapsed while sending'));
        uncertain := uncertain + 1;
    END LOOP;

    UPDATE keyturn.notification x
       SET status = 'cancelled', result = jsonb_build_object('reason', 'the action no longer waits'), updated_at = p_now
     WHERE (x.id, x.tenant) IN (SELECT y.id, y.tenant FROM keyturn.notification y
                                JOIN keyturn.action a ON a.id = y.action_id AND a.tenant = y.tenant
                                WHERE y.status = 'queued' AND (a.status <> 'pending' OR a.expires_at < p_now)
                                  AND (p_tenant IS NULL OR (y.tenant = p_tenant AND a.tenant = p_tenant))
                                FOR UPDATE OF y SKIP LOCKED)
       AND (p_tenant IS NULL OR x.tenant = p_tenant);
    RETURN NEXT;
END
$$;

-- The uncertain notifications, as keyturn.uncertain_actions lists them.
CREATE FUNCTION keyturn._uncertain_notifications()
RETURNS TABLE (action_id uuid, tenant text, tool text, attempts int, dispatched_at timestamptz, receipt jsonb,
               safe_to_decide_after timestamptz, not_sent_by_dispatcher boolean)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT n.id, n.tenant, 'keyturn.notify.' || n.channel::text, n.attempts, n.dispatched_at, n.receipt,
           n.lease_expires_at, coalesce(t.dispatcher_account = 'not_sent', false)
      FROM keyturn.notification n
      LEFT JOIN keyturn.attempt t ON t.action_id = n.id AND t.tenant = n.tenant AND t.attempt = n.attempts
     WHERE n.status = 'uncertain';
END
$$;

-- reconcile of an uncertain notification (keyturn._reconcile routes it
-- here, the outcome checked): as for an action, the tenant is read first
-- when the plain call names none, then the row is locked in it.
CREATE FUNCTION keyturn._reconcile_notification(p_tenant text, p_id uuid, p_outcome text, p_note text)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n        keyturn.notification;
    v_tenant text := p_tenant;
    v_now    timestamptz := clock_timestamp();
    v_status keyturn.status := p_outcome::keyturn.status;
    v_added  jsonb;
BEGIN
    IF v_tenant IS NULL THEN
        SELECT x.tenant INTO v_tenant FROM keyturn.notification x
         WHERE x.id = p_id;  -- by id alone: the plain call names no tenant
    END IF;
    SELECT x.* INTO n FROM keyturn.notification x WHERE x.id = p_id AND x.tenant = v_tenant FOR UPDATE;
    IF NOT FOUND OR n.status <> 'uncertain' THEN
        RAISE EXCEPTION 'keyturn: only an uncertain notification can be reconciled; % is %',
                p_id, coalesce(n.status::text, 'unknown')
            USING ERRCODE = '55000';
    END IF;
    v_added := jsonb_strip_nulls(jsonb_build_object('reconciled', p_outcome, 'note', p_note,
                                                    'by', keyturn._calling_role()));
    UPDATE keyturn.notification x
       SET status = v_status, result = coalesce(n.result, '{}') || v_added, updated_at = v_now
     WHERE x.id = n.id AND x.tenant = n.tenant;
    PERFORM keyturn._notification_event(n, p_outcome, jsonb_strip_nulls(jsonb_build_object(
        'reconciled', p_outcome, 'note', p_note)));
    RETURN p_outcome;
END
$$;

-- record_not_sent of a notification (keyturn._record_not_sent routes it
-- here): the same account, kept on its last attempt
-- (keyturn._attempt_not_sent), an event on its action's timeline.
CREATE FUNCTION keyturn._record_notification_not_sent(p_tenant text, p_id uuid, p_lease uuid, p_receipt jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n       keyturn.notification;
    v_taken text;
BEGIN
    SELECT x.* INTO n FROM keyturn.notification x
     WHERE x.id = p_id AND (p_tenant IS NULL OR x.tenant = p_tenant)  -- the plain call: by id alone
       FOR UPDATE;
    IF NOT FOUND OR n.status <> 'uncertain' THEN
        RETURN false;
    END IF;
    v_taken := keyturn._attempt_not_sent(n.id, n.tenant, n.attempts, p_lease, p_receipt);
    IF v_taken = 'written' THEN
        PERFORM keyturn._notification_event(n, 'uncertain', jsonb_build_object(
            'dispatcher_account', 'not_sent', 'attempt', n.attempts, 'lease_id', p_lease));
    END IF;
    RETURN v_taken <> 'refused';
END
$$;

-- ---- The message ----

-- What a notification says of an action: the server-written summary (for a
-- digest-retained action, which keeps none, the tool's name: pending() shows
-- the same), whole in a notice or a reminder (the renderer already shared
-- the summary's length among its values, so a cut here could hide the one
-- that decides, an amount at the end); a digest's lines at most p_max
-- characters, each pointing to the card.
CREATE FUNCTION keyturn._notify_summary(p_summary text, p_tool text, p_max int)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_max IS NOT NULL AND length(coalesce(p_summary, p_tool)) > p_max
                THEN left(coalesce(p_summary, p_tool), p_max - 1) || '…'
                ELSE coalesce(p_summary, p_tool) END
$$;

-- notification_message and notification_message_for (p_what names the
-- call; p_tenant as in keyturn._lease): what the notification under this
-- lease says, for the dispatcher to send now, once begin_dispatch has made
-- it executing and while its lease is live (else 55000, as file_content).
--
-- send = false (reason says why) when nothing is to be sent after all: the
-- person removed the channel, or the action stopped waiting for them since
-- the begin. Otherwise: the channel, its target and a webhook's own secret;
-- the kind; title and body, plain text, and actions (a JSON array of
-- {action_id, summary, tool, effect, expires_at}) for renderers; and a card
-- link: a fresh one-time code (keyturn._mint_link) for link_action_ids, for
-- this person, whose card runs as the role they set the channel as, valid
-- until the first of those actions expires (at most a day). One message per
-- attempt (a second call is 55000), and its code replaces the unredeemed
-- code of the attempt before: the dispatcher's login, which carries the
-- message, cannot keep a spare code while it delivers another. Only the
-- code's digest is kept. Never params, a token or a JWT.
--
-- A digest lists every action still waiting among those it carries
-- (waiting counts them) and links those one card can hold: at most 100,
-- and self actions of one session only (a card works in one session; the
-- others are counted and wait in the person's queue).
CREATE FUNCTION keyturn._notification_message(p_what text, p_tenant text, p_id uuid, p_lease uuid)
RETURNS TABLE (send boolean, reason text, channel text, target text, secret text, kind text, title text,
               body text, actions jsonb, link_action_ids uuid[], code text, code_expires_at timestamptz,
               waiting int)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n          keyturn.notification;
    c          keyturn.notify_channel;
    a          keyturn.action;
    v_ids      uuid[];
    v_id       uuid;
    v_reason   text;
    v_session  text;
    v_link     uuid[] := '{}';
    v_items    jsonb := '[]';
    v_lines    text[] := '{}';
    v_waiting  int := 0;
    v_effect   text;
    v_summary  text;
    v_now      timestamptz := clock_timestamp();
    v_expires  timestamptz := clock_timestamp() + interval '1 day';
    v_title    text;
    v_code     text;
BEGIN
    PERFORM keyturn._refuse_nested(p_what);
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    SELECT x.* INTO n FROM keyturn.notification x
     WHERE x.id = p_id AND (p_tenant IS NULL OR x.tenant = p_tenant)  -- the plain call: by id alone
       FOR NO KEY UPDATE;
    PERFORM keyturn._raise_lease_problem(keyturn._lease_problem_of('notification', p_id, FOUND, n.status, n.lease_id,
                                                                   n.lease_expires_at, p_lease, '{executing}', true));
    IF n.link_attempt IS NOT DISTINCT FROM n.attempts THEN
        RAISE EXCEPTION 'keyturn: the message of notification % attempt % was written already', n.id, n.attempts
            USING ERRCODE = '55000',
                  HINT = 'One message, and one link, per attempt: send the one read, or record the attempt''s outcome (retry if nothing was sent).';
    END IF;
    -- Shared, until this transaction ends: a set_notify or remove_notify
    -- of the channel waits for the code made here, and ends it (docs/
    -- security.md, row 138). One under way is never waited for (row 140):
    -- the message is not read now, keyturnd records a retry, and the next
    -- attempt reads the new target or the removal.
    BEGIN
        SELECT x.* INTO c FROM keyturn.notify_channel x
         WHERE x.tenant = n.tenant AND x.principal = n.principal AND x.channel = n.channel
           FOR SHARE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'keyturn: % is changing their % channel; its message is not read now', n.principal, n.channel
            USING ERRCODE = '55P03',
                  HINT = 'Record the attempt as retry: nothing was sent. The next attempt reads the channel as its person left it.';
    END;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, format('%s removed the %s channel', n.principal, n.channel), n.channel::text,
                            NULL::text, NULL::text, n.kind::text, NULL::text, NULL::text, NULL::jsonb, NULL::uuid[],
                            NULL::text, NULL::timestamptz, 0;
        RETURN;
    END IF;
    IF n.kind = 'digest' THEN
        v_ids := ARRAY(SELECT b.action_id FROM keyturn.notification b
                        WHERE b.batched_into = n.id AND b.tenant = n.tenant ORDER BY b.created_at, b.action_id);
    ELSE
        v_ids := ARRAY[n.action_id];
    END IF;
    FOREACH v_id IN ARRAY v_ids LOOP
        CONTINUE WHEN v_id = ANY (v_link);
        SELECT x.* INTO a FROM keyturn.action x WHERE x.id = v_id AND x.tenant = n.tenant;
        v_reason := keyturn._waits_for(a, n.principal);
        CONTINUE WHEN v_reason IS NOT NULL;
        v_waiting := v_waiting + 1;
        IF a.approval = 'self' THEN
            CONTINUE WHEN v_session IS NOT NULL AND v_session <> a.session;
            v_session := a.session;
        END IF;
        CONTINUE WHEN cardinality(v_link) >= 100;
        SELECT v.effect::text INTO v_effect FROM keyturn.tool_version v
         WHERE v.tool = a.tool AND v.version = a.tool_version;
        v_summary := keyturn._notify_summary(a.summary, a.tool, CASE WHEN n.kind = 'digest' THEN 300 END);
        v_link := v_link || a.id;
        v_expires := least(v_expires, a.expires_at);
        v_items := v_items || jsonb_build_array(jsonb_build_object(
            'action_id', a.id, 'summary', v_summary, 'tool', a.tool, 'effect', v_effect,
            'expires_at', keyturn._utc(a.expires_at)));
        v_lines := v_lines || format(E'%s\nTool: %s · Effect: %s · Expires: %s UTC', v_summary, a.tool, v_effect,
                                     to_char(a.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'));
    END LOOP;
    IF cardinality(v_link) = 0 THEN
        RETURN QUERY SELECT false, coalesce(v_reason, 'no action it is about waits for the person'),
                            n.channel::text, NULL::text, NULL::text, n.kind::text, NULL::text, NULL::text,
                            NULL::jsonb, NULL::uuid[], NULL::text, NULL::timestamptz, 0;
        RETURN;
    END IF;
    -- A card of no self action works in a session of its own.
    v_session := coalesce(v_session, 'notification:' || n.id::text);
    IF n.kind = 'digest' THEN
        UPDATE keyturn.notification x SET covers = v_link, updated_at = v_now
         WHERE x.id = n.id AND x.tenant = n.tenant;
        v_title := CASE WHEN v_waiting = 1 THEN '1 action waits for you'
                        ELSE format('%s actions wait for you', v_waiting) END;
    ELSIF n.kind = 'reminder' THEN
        v_title := 'Reminder, expires soon: ' || (v_items -> 0 ->> 'summary');
    ELSE
        v_title := 'Approval needed: ' || (v_items -> 0 ->> 'summary');
    END IF;
    -- The attempt before's code, unless the person opened it, ends here.
    DELETE FROM keyturn.card_link l
     WHERE l.code_digest = n.link_digest AND l.tenant = n.tenant AND l.redeemed_at IS NULL;
    v_code := keyturn._mint_link(n.tenant, n.principal, v_session, c.db_role, v_link, v_now, v_expires,
                                 p_notification => n.id);
    UPDATE keyturn.notification x SET link_digest = keyturn._token_digest(v_code), link_attempt = n.attempts
     WHERE x.id = n.id AND x.tenant = n.tenant;
    RETURN QUERY SELECT true, NULL::text, n.channel::text, c.target, c.secret, n.kind::text, v_title,
                        array_to_string(v_lines, E'\n\n'), v_items, v_link, v_code, v_expires, v_waiting;
END
$$;

CREATE FUNCTION keyturn.notification_message(notification_id uuid, lease_id uuid)
RETURNS TABLE (send boolean, reason text, channel text, target text, secret text, kind text, title text,
               body text, actions jsonb, link_action_ids uuid[], code text, code_expires_at timestamptz,
               waiting int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM keyturn._notification_message('notification_message', NULL,
                                                             notification_message.notification_id,
                                                             notification_message.lease_id);
END
$$;

CREATE FUNCTION keyturn.notification_message_for(tenant text, notification_id uuid, lease_id uuid)
RETURNS TABLE (send boolean, reason text, channel text, target text, secret text, kind text, title text,
               body text, actions jsonb, link_action_ids uuid[], code text, code_expires_at timestamptz,
               waiting int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(notification_message_for.tenant, 'notification_message_for');
    RETURN QUERY SELECT * FROM keyturn._notification_message('notification_message_for',
                                                             notification_message_for.tenant,
                                                             notification_message_for.notification_id,
                                                             notification_message_for.lease_id);
END
$$;

-- The operator's view of an action's notifications (the console's
-- timeline): the notices and reminders about it and the digests that
-- carried them, with their status, attempts and receipts (stored redacted),
-- never a target or secret.
CREATE FUNCTION keyturn.notifications(action_id uuid)
RETURNS TABLE (notification_id uuid, tenant text, principal text, channel text, kind text, status text,
               attempts int, created_at timestamptz, due_at timestamptz, dispatched_at timestamptz,
               receipt jsonb, result jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('notifications');
    RETURN QUERY
    SELECT n.id, n.tenant, n.principal, n.channel::text, n.kind::text, n.status::text, n.attempts, n.created_at,
           n.next_attempt_at, n.dispatched_at, n.receipt, n.result
      FROM keyturn.notification n
     WHERE n.action_id = notifications.action_id  -- by id alone: operators act across tenants
        OR n.id IN (SELECT b.batched_into FROM keyturn.notification b
                     WHERE b.action_id = notifications.action_id AND b.batched_into IS NOT NULL)
     ORDER BY n.created_at, n.id;
END
$$;

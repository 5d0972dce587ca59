-- The dispatcher and operator protocol (docs/sql-api.md, "Dispatcher").
--
-- keyturnd only moves rows the database has released (queued), and only calls a
-- provider after begin_dispatch has committed 'executing'. Authorized by role
-- alone (keyturn_dispatcher, keyturn_operator); no tenant identity, all tenants.

-- How many provider attempts an action gets: a retry reported for the last
-- one fails the action. Said once, here.
CREATE FUNCTION keyturn._max_attempts()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 3 $$;

CREATE FUNCTION keyturn._retry_backoff(p_attempts int)
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    -- After attempt n (counted at begin_dispatch): 2 s, 4 s, 8 s, ... capped at
    -- 5 minutes; at least 1 s, growing with attempts.
    SELECT make_interval(secs => least(300, power(2, greatest(p_attempts, 1))))
$$;

-- The due actions lease takes, locked FOR UPDATE (SKIP LOCKED) until the
-- caller's transaction ends: the first p_max in (next_attempt_at, id) order
-- whose tool has one of p_providers (NULL = any).
--
-- The plan must be an ordered scan of open_action_due_idx that stops after
-- p_max rows. A queue's statistics are always stale (20,000 rows arrive and
-- leave between two autovacuum naps), and with a stale small estimate the
-- planner prefers reading every due row and sorting them, which makes each
-- lease cost O(queue length). Without sort and bitmap paths the ordered index
-- scan is the only plan left. The settings live on this one function, so the
-- statements lease runs afterwards (its UPDATE and the triggers it fires) are
-- planned as usual.
--
-- That plan does not depend on the parameters, so it is planned once per
-- backend (force_generic_plan). Planned per call with the actual p_now, the
-- planner probed the end of open_action_due_idx for the column's true
-- maximum, walking the index entries every drained row leaves dead: about a
-- fifth of a lease call's time in the drain's profile (tests/bench/BENCHMARKS.md).
CREATE FUNCTION keyturn._due(p_now timestamptz, p_max int, p_providers text[])
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE
ROWS 16
SET enable_sort = off
SET enable_bitmapscan = off
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    SELECT a.id FROM keyturn.open_action o
      JOIN keyturn.action a ON a.id = o.action_id AND a.tenant = o.tenant
     WHERE o.status = 'queued' AND o.next_attempt_at <= p_now
       -- The work list finds the rows; the status on the locked action row
       -- (rechecked after a wait) is what decides.
       AND a.status = 'queued' AND a.next_attempt_at <= p_now
       AND (p_providers IS NULL OR EXISTS (
                SELECT 1 FROM keyturn.tool_version v
                 WHERE v.tool = a.tool AND v.version = a.tool_version
                   AND v.provider = ANY (p_providers)))
     ORDER BY o.next_attempt_at, o.action_id
     LIMIT p_max
       FOR UPDATE OF a SKIP LOCKED;
END
$$;

-- keyturn._due for one tenant: its due actions, locked FOR UPDATE SKIP
-- LOCKED, in lease's order. The ordered scan of open_action_due_idx reads
-- past other tenants' due rows; on Citus those are only the few tenants
-- that share the shard. The tool versions of the providers asked for are
-- read first, by a statement of their own: Citus refuses a statement of a
-- delegated call that joins a reference table (tool_version) to the
-- tenant's shards.
CREATE FUNCTION keyturn._due_for(p_tenant text, p_now timestamptz, p_max int, p_providers text[])
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE
ROWS 16
SET enable_sort = off
SET enable_bitmapscan = off
AS $$
DECLARE
    v_versions text[];
BEGIN
    IF p_providers IS NOT NULL THEN
        v_versions := ARRAY(SELECT v.tool || ':' || v.version FROM keyturn.tool_version v
                             WHERE v.provider = ANY (p_providers));
    END IF;
    RETURN QUERY
    SELECT a.id FROM keyturn.open_action o
      JOIN keyturn.action a ON a.id = o.action_id AND a.tenant = o.tenant
     WHERE o.tenant = p_tenant AND a.tenant = p_tenant
       AND o.status = 'queued' AND o.next_attempt_at <= p_now
       AND a.status = 'queued' AND a.next_attempt_at <= p_now
       AND (v_versions IS NULL OR a.tool || ':' || a.tool_version = ANY (v_versions))
     ORDER BY o.next_attempt_at, o.action_id
     LIMIT p_max
       FOR UPDATE OF a SKIP LOCKED;
END
$$;

-- lease and lease_for (p_what names the call): the due actions of every
-- tenant (keyturn._due) or of p_tenant (keyturn._due_for), locked, leased,
-- and returned as lease returns them.
--
-- p_tenant: NULL for lease, whose batch spans tenants, so each statement
-- finds its rows by id alone; the tenant for lease_for
-- (sql/062_dispatch_for.sql). Written "p_tenant IS NULL OR x.tenant =
-- p_tenant" so that one statement serves both: planned for a tenant, the
-- condition folds to "x.tenant = <the tenant>", which is what Citus needs
-- to pin the statement to that tenant's shard. So no caller on the
-- tenant's path may force a generic plan, in which it would not fold.
CREATE FUNCTION keyturn._lease(p_what text, p_tenant text, p_worker text, p_max_jobs int, p_lease_for interval,
                               p_providers text[])
RETURNS TABLE (action_id uuid, lease_id uuid, tenant text, tool text, provider text, params jsonb,
               idempotency_key text, attempt int)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now       timestamptz := clock_timestamp();
    v_ids       uuid[];
    v_forged    uuid[];
    v_tenants   text[];
    v_leases    uuid[];
    v_tools     text[];
    v_versions  int[];
    v_providers text[];
    v_max       int;
BEGIN
    PERFORM keyturn._check_lease_args(p_worker, p_max_jobs, p_lease_for);
    PERFORM keyturn._refuse_nested(p_what);
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    -- Notifications first (sql/064_notify.sql): they are few, and a person
    -- waits for each. Actions take the slots left.
    RETURN QUERY SELECT * FROM keyturn._lease_notifications(p_tenant, p_worker, p_max_jobs, p_lease_for,
                                                            p_providers, v_now);
    GET DIAGNOSTICS v_max = ROW_COUNT;
    v_max := p_max_jobs - v_max;
    IF v_max < 1 THEN
        RETURN;
    END IF;
    IF p_tenant IS NULL THEN
        v_ids := ARRAY(SELECT keyturn._due(v_now, v_max, p_providers));
    ELSE
        v_ids := ARRAY(SELECT keyturn._due_for(p_tenant, v_now, v_max, p_providers));
    END IF;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;
    -- A queued row that no approval produced (a table write, a tampered
    -- restore) is never leased: it is invalidated, visibly, instead. The rows
    -- are locked, so what is read here is what is updated: the check, and the
    -- new lease ids, are read first because the UPDATEs, like every UPDATE of
    -- keyturn's tables, call no volatile function (docs/scale-out.md, layout
    -- B, step 5).
    SELECT coalesce(array_agg(a.id) FILTER (WHERE NOT c.valid), '{}'),
           coalesce(array_agg(a.id) FILTER (WHERE c.valid), '{}'),
           coalesce(array_agg(a.tenant) FILTER (WHERE c.valid), '{}'),
           coalesce(array_agg(gen_random_uuid()) FILTER (WHERE c.valid), '{}'),
           coalesce(array_agg(DISTINCT a.tool) FILTER (WHERE c.valid), '{}')
      INTO v_forged, v_ids, v_tenants, v_leases, v_tools
      FROM keyturn.action a
     CROSS JOIN LATERAL (SELECT keyturn._approval_valid(a.id, a.params_hash, a.approved_by, a.approved_role,
                                                        a.approved_at, a.approved_via, a.approval_mac) AS valid) c
     WHERE a.id = ANY (v_ids) AND (p_tenant IS NULL OR a.tenant = p_tenant);
    -- Each job's provider, read by a statement of its own: Citus refuses a
    -- statement of a delegated call that joins a reference table
    -- (tool_version) to the tenant's shards.
    SELECT array_agg(v.tool), array_agg(v.version), array_agg(v.provider)
      INTO v_tools, v_versions, v_providers
      FROM keyturn.tool_version v WHERE v.tool = ANY (v_tools);
    IF cardinality(v_forged) > 0 THEN
        PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'no valid approval', 'worker', p_worker));
        UPDATE keyturn.action a
           SET updated_at = v_now, status = 'invalidated',
               result = jsonb_build_object('reason', 'no approval produced this queued action; it is never dispatched')
         WHERE a.id = ANY (v_forged) AND (p_tenant IS NULL OR a.tenant = p_tenant);
    END IF;
    PERFORM keyturn._set_event_detail(jsonb_build_object('worker', p_worker));
    RETURN QUERY
    WITH leased AS (
        UPDATE keyturn.action a
           SET updated_at = v_now, status = 'leased', lease_id = u.lease,
               leased_by = p_worker, lease_expires_at = v_now + p_lease_for
          FROM unnest(v_ids, v_tenants, v_leases) AS u (id, tenant, lease)
         WHERE a.id = u.id AND a.tenant = u.tenant AND (p_tenant IS NULL OR a.tenant = p_tenant)
        RETURNING a.*
    )
    SELECT l.id, l.lease_id, l.tenant, l.tool, v.provider, coalesce(l.params, s.params),
           l.idempotency_key, l.attempts + 1
      FROM leased l
      JOIN unnest(v_tools, v_versions, v_providers) AS v (tool, version, provider)
        ON v.tool = l.tool AND v.version = l.tool_version
      LEFT JOIN keyturn.staged_payload s ON s.action_id = l.id AND s.tenant = l.tenant
                                        AND (p_tenant IS NULL OR s.tenant = p_tenant)
     ORDER BY l.next_attempt_at, l.id;
END
$$;

-- providers (keyturn's addition to the dispatcher protocol): only actions whose tool's provider is
-- in the list, so a worker never leases what it has no adapter for; NULL = all.
-- lease(worker, max_jobs, lease_for) is the documented signature; the
-- overload with providers (keyturnd's, with NULL for every provider) has
-- no defaults, so that each call names one of the two unambiguously.
-- Planned once per backend (the note before keyturn.begin_dispatch).
CREATE FUNCTION keyturn.lease(worker text, max_jobs int DEFAULT 16, lease_for interval DEFAULT '30 seconds')
RETURNS TABLE (action_id uuid, lease_id uuid, tenant text, tool text, provider text, params jsonb,
               idempotency_key text, attempt int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY SELECT * FROM keyturn._lease('lease', NULL, lease.worker, lease.max_jobs, lease.lease_for, NULL);
END
$$;

CREATE FUNCTION keyturn.lease(worker text, max_jobs int, lease_for interval, providers text[])
RETURNS TABLE (action_id uuid, lease_id uuid, tenant text, tool text, provider text, params jsonb,
               idempotency_key text, attempt int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY SELECT * FROM keyturn._lease('lease', NULL, lease.worker, lease.max_jobs, lease.lease_for,
                                              lease.providers);
END
$$;

-- Why a dispatcher call may not act on this job under this lease, or NULL:
-- the one place for these rules, shared by the single calls (which raise it
-- as 55000), the batch calls (which answer it per element) and the
-- notifications the same calls carry (sql/064_notify.sql; p_what names the
-- kind of job). The job's row is locked FOR UPDATE; p_found: there is one,
-- p_status, p_lease_id and p_lease_expires_at are its columns; p_live: the
-- lease must not have lapsed.
CREATE FUNCTION keyturn._lease_problem_of(p_what text, p_id uuid, p_found boolean, p_status keyturn.status,
                                          p_lease_id uuid, p_lease_expires_at timestamptz, p_lease uuid,
                                          p_statuses keyturn.status[], p_live boolean)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF NOT p_found OR p_lease_id IS DISTINCT FROM p_lease OR NOT p_status = ANY (p_statuses) THEN
        RETURN format('keyturn: %s %s is not %s under lease %s (its status is %s)',
                      p_what, coalesce(p_id::text, 'NULL'), array_to_string(p_statuses, ' or '),
                      coalesce(p_lease::text, 'NULL'), coalesce(p_status::text, 'unknown'));
    END IF;
    IF p_live AND p_lease_expires_at <= clock_timestamp() THEN
        RETURN format('keyturn: the lease on %s %s lapsed at %s; do not call the provider, the sweep requeues it',
                      p_what, p_id, keyturn._utc(p_lease_expires_at));
    END IF;
    RETURN NULL;
END
$$;

-- keyturn._lease_problem_of for an action: a is its row, locked FOR UPDATE
-- (all NULL when there is none).
CREATE FUNCTION keyturn._lease_problem(a keyturn.action, p_id uuid, p_lease uuid,
                                       p_statuses keyturn.status[], p_live boolean)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN keyturn._lease_problem_of('action', p_id, a.id IS NOT NULL, a.status, a.lease_id, a.lease_expires_at,
                                     p_lease, p_statuses, p_live);
END
$$;

-- complete's version: also only 'retry' may hand back a job never begun.
CREATE FUNCTION keyturn._complete_problem_of(p_what text, p_id uuid, p_found boolean, p_status keyturn.status,
                                             p_lease_id uuid, p_lease_expires_at timestamptz, p_lease uuid,
                                             p_outcome text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    -- 'executing' under this lease is accepted even past the lease's expiry:
    -- a known outcome beats an unknown one.
    RETURN coalesce(
        keyturn._lease_problem_of(p_what, p_id, p_found, p_status, p_lease_id, p_lease_expires_at, p_lease,
                                  '{leased,executing}', p_status = 'leased'),
        CASE WHEN p_status = 'leased' AND p_outcome <> 'retry' THEN
            format('keyturn: %s %s was never dispatched; only ''retry'' can hand it back (call begin_dispatch before the provider)',
                   p_what, p_id)
        END);
END
$$;

CREATE FUNCTION keyturn._complete_problem(a keyturn.action, p_id uuid, p_lease uuid, p_outcome text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN keyturn._complete_problem_of('action', p_id, a.id IS NOT NULL, a.status, a.lease_id, a.lease_expires_at,
                                        p_lease, p_outcome);
END
$$;

-- What complete makes of an outcome, for an action and a notification
-- alike: the new status of a job that was p_current after p_attempts
-- attempts, the delay before a requeued one is due again (a job handed back
-- from leased: retry_after, else at once; after an attempt: retry_after,
-- else the backoff; capped at a day either way: a provider cannot park a
-- job for a year), and the result it is given. Inlined.
CREATE FUNCTION keyturn._outcome_status(p_current keyturn.status, p_outcome text, p_attempts int)
RETURNS keyturn.status
LANGUAGE sql STABLE PARALLEL SAFE  -- as a cast to an enum is: inlined
AS $$
    SELECT CASE WHEN p_current = 'leased' THEN 'queued'
                WHEN p_outcome = 'succeeded' THEN 'succeeded'
                WHEN p_outcome = 'failed' THEN 'failed'
                WHEN p_outcome = 'unknown' THEN 'uncertain'
                WHEN p_attempts < keyturn._max_attempts() THEN 'queued'
                ELSE 'failed'
           END::keyturn.status
$$;

CREATE FUNCTION keyturn._outcome_delay(p_current keyturn.status, p_delay interval, p_attempts int)
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT least(CASE WHEN p_current = 'leased' THEN coalesce(p_delay, interval '0')
                      ELSE coalesce(p_delay, keyturn._retry_backoff(p_attempts)) END,
                 interval '1 day')
$$;

CREATE FUNCTION keyturn._outcome_result(p_status keyturn.status, p_outcome text)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE  -- as jsonb_build_object is
AS $$
    SELECT CASE
               WHEN p_status = 'failed' AND p_outcome = 'retry'
                   THEN jsonb_build_object('reason', 'the provider asked to retry after the third attempt')
               WHEN p_status = 'uncertain'
                   THEN jsonb_build_object('reason', 'the provider call''s outcome is unknown; an operator must reconcile it')
               ELSE jsonb_build_object('outcome', p_outcome)
           END
$$;

-- Raises 55000 with a dispatcher call's problem, if there is one.
CREATE FUNCTION keyturn._raise_lease_problem(p_problem text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_problem IS NOT NULL THEN
        RAISE EXCEPTION '%', p_problem
            USING ERRCODE = '55000',
                  HINT = 'Lease it again; never call the provider without a successful begin_dispatch.';
    END IF;
END
$$;

-- Why an action leased to the caller must not be dispatched (reason NULL:
-- it may be), and whether that ends it failed rather than invalidated.
-- Invalidated: no approval produced it, or something approve checked no
-- longer holds (keyturn._invalid_reason), or its attachments are gone or
-- changed in storage, or (a task action, approved by a request rather than
-- by a person looking at it) its params no longer pass the tool's schema,
-- checked right before they leave. Failed, when nothing else is wrong: a
-- deterministic failure after the approval (its approved attachments'
-- metadata cannot be read), which no attempt could ever get past, so
-- begin_dispatch ends it with the reason and sends nothing, instead of a
-- lease that lapses into the same problem again and again.
-- One function for both, so an action's tool version and params are read
-- once (BENCHMARKS.md, section 23).
CREATE FUNCTION keyturn._begin_check(a keyturn.action)
RETURNS keyturn._begun
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_reason     text;
    v_unreadable text;
    v_ver        keyturn.tool_version;
    v_params     jsonb;
BEGIN
    IF NOT keyturn._approval_valid(a.id, a.params_hash, a.approved_by, a.approved_role,
                                   a.approved_at, a.approved_via, a.approval_mac) THEN
        RETURN ROW('no approval produced this action; it is never dispatched', false);
    END IF;
    v_reason := keyturn._invalid_reason(a);
    IF v_reason IS NOT NULL THEN
        RETURN ROW(v_reason, false);
    END IF;
    SELECT v.* INTO v_ver FROM keyturn.tool_version v WHERE v.tool = a.tool AND v.version = a.tool_version;
    v_params := coalesce(a.params, (SELECT s.params FROM keyturn.staged_payload s
                                     WHERE s.action_id = a.id AND s.tenant = a.tenant));
    IF v_ver.attachments_param IS NOT NULL THEN
        v_unreadable := keyturn._attachments_unreadable(v_ver, v_params);
        IF v_unreadable IS NULL THEN
            v_reason := keyturn._attachment_problem(a, v_ver, v_params);
        END IF;
    END IF;
    IF v_reason IS NULL AND a.approval = 'task'
       AND coalesce(keyturn._params_errors(v_ver.params_schema, v_params),
                    keyturn._undeclared_recipient(v_ver, v_params)) IS NOT NULL THEN
        v_reason := 'params no longer pass the tool''s schema';
    END IF;
    IF v_reason IS NOT NULL THEN
        RETURN ROW(v_reason, false);
    END IF;
    RETURN ROW(v_unreadable, v_unreadable IS NOT NULL);
END
$$;

-- begin_dispatch of distinct actions, each under its lease, as one statement
-- of each kind for all of them: the row locks, the checks, the status
-- UPDATE (executing; invalidated with the reason it may no longer run; failed
-- with the reason it never can) and the attempt INSERT.
-- The one implementation of begin_dispatch: the single call is a set of
-- one, keyturn.begin_dispatch_many runs sets (sql/061_dispatch_batch.sql).
-- Answers each element (p_ords: its place in the caller's batch) with
-- dispatch, or with the lease problem that left it unchanged.
--
-- p_tenant: NULL for begin_dispatch and begin_dispatch_many (by id alone,
-- the dispatcher's calls name no tenant); the tenant for their _for forms,
-- as keyturn._lease explains. The plain calls plan it once per backend
-- (their force_generic_plan): with the arrays known, a custom plan's
-- estimate is always lower than the generic one's, so plpgsql planned every
-- statement again on every call, which cost a one-job step more than
-- running them (tests/bench/BENCHMARKS.md). Every plan is index lookups by
-- id, whatever the arrays hold.
CREATE FUNCTION keyturn._begin_set(p_tenant text, p_ords int[], p_ids uuid[], p_leases uuid[])
RETURNS TABLE (ord int, dispatch boolean, problem text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_ords     int[];
    v_ids      uuid[];
    v_tenants  text[];
    v_problems text[];
    v_reasons  text[];
    v_details  text[];
    v_statuses keyturn.status[];
    v_results  jsonb[];
    v_now      timestamptz;
BEGIN
    -- Notifications, told by their id (sql/064_notify.sql), are begun by
    -- keyturn._notify_begin_set; a batch of actions alone never gets there.
    IF EXISTS (SELECT 1 FROM unnest(p_ids) x WHERE keyturn._is_notification(x)) THEN
        RETURN QUERY SELECT * FROM keyturn._begin_mixed(p_tenant, p_ords, p_ids, p_leases);
        RETURN;
    END IF;
    -- What the UPDATE writes is computed here too: Citus refuses a function
    -- that is not immutable (a cast to keyturn.status, jsonb_build_object)
    -- inside a CASE of an UPDATE.
    SELECT array_agg(v.ord), array_agg(v.id), array_agg(v.tenant), array_agg(v.problem), array_agg(v.reason),
           array_agg(CASE WHEN v.problem IS NOT NULL THEN NULL
                          WHEN v.reason IS NULL
                          THEN jsonb_build_object('attempt', v.attempts + 1, 'worker', v.leased_by)::text
                          ELSE jsonb_build_object('reason', v.reason)::text END),
           array_agg(CASE WHEN v.reason IS NULL THEN 'executing'
                          WHEN v.failed THEN 'failed'
                          ELSE 'invalidated' END::keyturn.status),
           array_agg(CASE WHEN v.reason IS NOT NULL THEN jsonb_build_object('reason', v.reason) END)
      INTO v_ords, v_ids, v_tenants, v_problems, v_reasons, v_details, v_statuses, v_results
      FROM (SELECT c.*, (c.checked).reason, coalesce((c.checked).failed, false) AS failed
              FROM (SELECT e.ord, e.id, (l.a).tenant, p.problem, (l.a).attempts, (l.a).leased_by,
                   CASE WHEN p.problem IS NULL THEN keyturn._begin_check(l.a) END AS checked
              FROM unnest(p_ords, p_ids, p_leases) AS e (ord, id, lease)
              -- Each row locked as it is read (in the batch's order, as the
              -- single calls one after another would), so the checks see it
              -- as it is locked.
              -- The row found names the tenant for every statement after
              -- this one. ROW(x.*): on a Citus shard x is of the shard's
              -- row type, which keyturn's functions do not take.
              LEFT JOIN LATERAL (SELECT ROW(x.*)::keyturn.action AS a FROM keyturn.action x
                                  WHERE x.id = e.id AND (p_tenant IS NULL OR x.tenant = p_tenant) FOR UPDATE) l ON true
             CROSS JOIN LATERAL (SELECT keyturn._lease_problem(l.a, e.id, e.lease, '{leased}', true) AS problem) p
             -- OFFSET 0: c stays a subquery, so its check runs once an
             -- action, not once for each of its fields v reads (as in
             -- keyturn._complete_set).
            OFFSET 0) c) v;
    PERFORM keyturn._set_event_details(v_ids, v_details);
    v_now := clock_timestamp();
    WITH done AS (
        UPDATE keyturn.action x
           SET updated_at = v_now,
               status = u.status,
               attempts = x.attempts + CASE WHEN u.reason IS NULL THEN 1 ELSE 0 END,
               dispatched_at = CASE WHEN u.reason IS NULL THEN v_now ELSE x.dispatched_at END,
               result = CASE WHEN u.reason IS NULL THEN x.result ELSE u.result END,
               lease_id = CASE WHEN u.reason IS NULL THEN x.lease_id END,
               leased_by = CASE WHEN u.reason IS NULL THEN x.leased_by END,
               lease_expires_at = CASE WHEN u.reason IS NULL THEN x.lease_expires_at END
          FROM unnest(v_ids, v_tenants, v_problems, v_reasons, v_statuses, v_results)
               AS u (id, tenant, problem, reason, status, result)
         WHERE x.id = u.id AND x.tenant = u.tenant AND u.problem IS NULL AND (p_tenant IS NULL OR x.tenant = p_tenant)
           AND x.id = ANY (v_ids)
     RETURNING x.id, x.attempts, x.tenant, x.principal, x.lease_id, x.leased_by, x.status)
    INSERT INTO keyturn.attempt (action_id, attempt, tenant, principal, lease_id, worker, started_at)
    SELECT d.id, d.attempts, d.tenant, d.principal, d.lease_id, d.leased_by, v_now
      FROM done d WHERE d.status = 'executing';
    RETURN QUERY
    SELECT v.ord, v.problem IS NULL AND v.reason IS NULL, v.problem
      FROM unnest(v_ords, v_problems, v_reasons) AS v (ord, problem, reason)
     ORDER BY v.ord;
END
$$;

-- The dispatcher's plain calls (lease, begin and complete, single and
-- batched, and keyturn._due) are planned once per backend
-- (force_generic_plan): a keyturnd connection runs them thousands of times
-- with the same shape, and with a batch's arrays known plpgsql's custom plan
-- always looked cheaper, so it planned again on every call (for a one-job
-- lease, a third of the call's time: tests/bench/BENCHMARKS.md, section
-- 19). Their _for forms are not: on Citus their plans must fold the tenant
-- to a constant (keyturn._lease). A generic plan is made from the
-- statistics of the moment and kept: made while a table was empty (a new
-- installation's keyturn.attempt), it read that table whole in every later
-- call, and the first drain of 20,000 actions ran at a third of the speed
-- of the next (tests/bench/BENCHMARKS.md).
-- Every statement they run finds its rows by key, so sequential scans are
-- off for them, and each UPDATE joined to the batch's arrays also names the
-- ids as an index condition (x.id = ANY (v_ids)), so that the plan kept
-- reads only the batch's rows in either join order.
CREATE FUNCTION keyturn.begin_dispatch(action_id uuid, lease_id uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    r record;
BEGIN
    PERFORM keyturn._refuse_nested('begin_dispatch');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    SELECT * INTO r FROM keyturn._begin_set(NULL, '{1}', ARRAY[begin_dispatch.action_id],
                                            ARRAY[begin_dispatch.lease_id]);
    PERFORM keyturn._raise_lease_problem(r.problem);
    RETURN r.dispatch;
END
$$;

-- What is wrong with complete's arguments (a 22023 message), or NULL: the
-- outcome word, a negative delay, a receipt keyturn cannot store. Checked
-- before anything is read or locked; complete raises it, complete_many
-- answers it for its element.
CREATE FUNCTION keyturn._complete_args_error(p_outcome text, p_retry_after interval, p_receipt jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    -- complete's outcomes: every attempt outcome but lapsed, which only the
    -- sweep records.
    IF p_outcome IS NULL OR p_outcome = 'lapsed'
       OR NOT p_outcome = ANY (enum_range(NULL::keyturn.attempt_outcome)::text[]) THEN
        RETURN format('keyturn: outcome must be succeeded, failed, retry or unknown, not %s',
                      coalesce(keyturn._quoted(p_outcome), 'NULL'));
    END IF;
    IF p_retry_after IS NOT NULL AND p_retry_after < interval '0' THEN
        RETURN 'keyturn: retry_after must not be negative';
    END IF;
    RETURN keyturn._receipt_problem(p_receipt);
END
$$;

-- complete of distinct actions, as one statement of each kind for all of
-- them: the row locks, the checks, the attempt UPDATE and the status UPDATE.
-- The one implementation of complete: the single call is a set of one,
-- keyturn.complete_many runs sets (sql/061_dispatch_batch.sql). Answers each
-- element (p_ords: its place in the caller's batch) with its new status, or
-- with the problem that left it unchanged: '22023 ...' for its arguments
-- (keyturn._complete_args_error: the outcome word, the delay, a receipt
-- keyturn cannot store), '55000 ...' for its lease or status.
--
-- A job handed back before any provider call ('retry' while 'leased') is
-- queued again without counting an attempt, due after retry_after (else at
-- once); any other outcome closes the attempt. retry_after is capped at a
-- day on both paths: a provider cannot park an approved action for a year.
--
-- p_tenant, and the plans, as in keyturn._begin_set.
CREATE FUNCTION keyturn._complete_set(p_tenant text, p_ords int[], p_ids uuid[], p_leases uuid[], p_outcomes text[],
                                      p_receipts jsonb[], p_retry_after interval[])
RETURNS TABLE (ord int, status text, problem text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_ords     int[];
    v_ids      uuid[];
    v_tenants  text[];
    v_problems text[];
    v_statuses keyturn.status[];
    v_back     boolean[];
    v_outcomes keyturn.attempt_outcome[];
    v_receipts jsonb[];
    v_delays   interval[];
    v_attempts int[];
    v_details  text[];
    v_results  jsonb[];
    v_next     timestamptz[];
    v_now      timestamptz;
BEGIN
    -- Notifications, as in keyturn._begin_set.
    IF EXISTS (SELECT 1 FROM unnest(p_ids) x WHERE keyturn._is_notification(x)) THEN
        RETURN QUERY SELECT * FROM keyturn._complete_mixed(p_tenant, p_ords, p_ids, p_leases, p_outcomes, p_receipts,
                                                           p_retry_after);
        RETURN;
    END IF;
    -- What the UPDATEs write is computed before them, as in
    -- keyturn._begin_set: Citus refuses a function that is not immutable
    -- inside a CASE of an UPDATE.
    SELECT array_agg(v.ord), array_agg(v.id), array_agg(v.tenant), array_agg(v.problem), array_agg(v.status),
           array_agg(v.back),
           -- Typed here, not in the UPDATE: Citus refuses a stable function
           -- (enum_in) with column references in an UPDATE's SET. An
           -- element with a problem changes nothing, and its outcome may be
           -- no attempt outcome at all.
           array_agg(CASE WHEN v.problem IS NULL THEN v.outcome::keyturn.attempt_outcome END),
           array_agg(v.receipt), array_agg(v.delay),
           array_agg(v.attempts),
           array_agg(CASE WHEN v.problem IS NOT NULL THEN NULL
                          WHEN v.back THEN jsonb_build_object('handed_back', true)::text
                          ELSE jsonb_strip_nulls(jsonb_build_object(
                                   'outcome', v.outcome, 'attempt', v.attempts,
                                   'retry_in', CASE WHEN v.status = 'queued' THEN v.delay::text END))::text END),
           array_agg(keyturn._outcome_result(v.status, v.outcome))
      INTO v_ords, v_ids, v_tenants, v_problems, v_statuses, v_back, v_outcomes, v_receipts, v_delays,
           v_attempts, v_details, v_results
      FROM (SELECT e.ord, e.id, (l.a).tenant, p.problem, e.outcome, (l.a).attempts,
                   (l.a).status = 'leased' AS back,
                   CASE WHEN p.problem IS NULL THEN keyturn._redact(coalesce(e.receipt, '{}')) END AS receipt,
                   keyturn._outcome_delay((l.a).status, e.delay, (l.a).attempts) AS delay,
                   keyturn._outcome_status((l.a).status, e.outcome, (l.a).attempts) AS status
              FROM unnest(p_ords, p_ids, p_leases, p_outcomes, p_receipts, p_retry_after)
                   AS e (ord, id, lease, outcome, receipt, delay)
             -- OFFSET 0 here, in p and in v: a subquery the planner pulls up
             -- has its columns' expressions copied into every place that
             -- names them, and each copy runs: _complete_args_error ran five
             -- times an element, _complete_problem four and _outcome_status
             -- three (the drain's profile). Kept as subqueries, each runs once.
             CROSS JOIN LATERAL (SELECT keyturn._complete_args_error(e.outcome, e.delay, e.receipt) AS arg_error
                                 OFFSET 0) g
              -- Each row locked as it is read, in the batch's order, and only
              -- for an element whose arguments are right: the others change
              -- nothing. ROW(x.*), as in keyturn._begin_set.
              LEFT JOIN LATERAL (SELECT ROW(x.*)::keyturn.action AS a FROM keyturn.action x
                                  WHERE x.id = e.id AND (p_tenant IS NULL OR x.tenant = p_tenant)
                                    AND g.arg_error IS NULL FOR UPDATE) l ON true
             CROSS JOIN LATERAL (
                   SELECT coalesce('22023 ' || g.arg_error,
                                   '55000 ' || keyturn._complete_problem(l.a, e.id, e.lease, e.outcome)) AS problem
                   OFFSET 0) p
            OFFSET 0) v;
    v_now := clock_timestamp();
    v_next := ARRAY(SELECT v_now + u.delay FROM unnest(v_delays) WITH ORDINALITY AS u (delay, o) ORDER BY u.o);
    UPDATE keyturn.attempt t
       SET finished_at = v_now, outcome = u.outcome, receipt = u.receipt
      FROM unnest(v_ids, v_tenants, v_problems, v_back, v_attempts, v_outcomes, v_receipts)
           AS u (id, tenant, problem, back, attempt, outcome, receipt)
     WHERE t.action_id = u.id AND t.tenant = u.tenant AND t.attempt = u.attempt
       AND u.problem IS NULL AND NOT u.back AND (p_tenant IS NULL OR t.tenant = p_tenant)
       AND t.action_id = ANY (v_ids);  -- see the note before keyturn.begin_dispatch
    PERFORM keyturn._set_event_details(v_ids, v_details);
    UPDATE keyturn.action x
       SET updated_at = v_now, status = u.status,
           receipt = CASE WHEN u.back THEN x.receipt ELSE u.receipt END,
           result = CASE WHEN u.status = 'queued' THEN x.result ELSE u.result END,
           next_attempt_at = CASE WHEN u.status = 'queued' THEN u.next END,
           lease_id = CASE WHEN u.status = 'queued' THEN NULL ELSE x.lease_id END,
           leased_by = CASE WHEN u.status = 'queued' THEN NULL ELSE x.leased_by END,
           lease_expires_at = CASE WHEN u.status = 'queued' THEN NULL ELSE x.lease_expires_at END
      FROM unnest(v_ids, v_tenants, v_problems, v_statuses, v_back, v_outcomes, v_receipts, v_next, v_results)
           AS u (id, tenant, problem, status, back, outcome, receipt, next, result)
     WHERE x.id = u.id AND x.tenant = u.tenant AND u.problem IS NULL AND (p_tenant IS NULL OR x.tenant = p_tenant)
       AND x.id = ANY (v_ids);
    RETURN QUERY
    SELECT v.ord, CASE WHEN v.problem IS NULL THEN v.status::text END, v.problem
      FROM unnest(v_ords, v_problems, v_statuses) AS v (ord, problem, status)
     ORDER BY v.ord;
END
$$;

CREATE FUNCTION keyturn.complete(action_id uuid, lease_id uuid, outcome text, receipt jsonb DEFAULT '{}',
                                 retry_after interval DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    v_error text := keyturn._complete_args_error(complete.outcome, complete.retry_after, complete.receipt);
    r       record;
BEGIN
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._refuse_nested('complete');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    SELECT * INTO r FROM keyturn._complete_set(NULL, '{1}', ARRAY[complete.action_id], ARRAY[complete.lease_id],
                                               ARRAY[complete.outcome], ARRAY[complete.receipt],
                                               ARRAY[complete.retry_after]);
    -- Only a lease problem is left: the arguments were checked above.
    PERFORM keyturn._raise_lease_problem(substr(r.problem, 7));
    RETURN r.status;
END
$$;

-- The sweep: pending past expiry -> expired, leased with a lapsed lease ->
-- queued, executing with a lapsed lease -> uncertain, and staged files no
-- proposal bound a day after staging deleted. p_tenant: NULL for sweep
-- (every tenant), the tenant for sweep_for, as keyturn._lease explains.
CREATE FUNCTION keyturn._sweep(p_tenant text)
RETURNS TABLE (expired int, requeued int, uncertain int, files int)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_expired   int;
    v_requeued  int;
    v_uncertain int;
    v_files     int;
    v_notes     record;
    v_now       timestamptz := clock_timestamp();  -- an index condition, unlike clock_timestamp()
BEGIN
    PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'expired before approval'));
    UPDATE keyturn.action a
       SET updated_at = v_now, status = 'expired', result = jsonb_build_object('reason', 'the proposal expired before approval')
     WHERE (a.id, a.tenant) IN (SELECT x.id, x.tenant FROM keyturn.open_action o
                                JOIN keyturn.action x ON x.id = o.action_id AND x.tenant = o.tenant
                                WHERE o.status = 'pending' AND o.expires_at < v_now
                                  AND x.status = 'pending'
                                  AND (p_tenant IS NULL OR (o.tenant = p_tenant AND x.tenant = p_tenant))
                                FOR UPDATE OF x SKIP LOCKED)
       AND (p_tenant IS NULL OR a.tenant = p_tenant);
    GET DIAGNOSTICS v_expired = ROW_COUNT;

    PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'lease lapsed before dispatch'));
    UPDATE keyturn.action a
       SET updated_at = v_now, status = 'queued', next_attempt_at = v_now,
           lease_id = NULL, leased_by = NULL, lease_expires_at = NULL
     WHERE (a.id, a.tenant) IN (SELECT x.id, x.tenant FROM keyturn.open_action o
                                JOIN keyturn.action x ON x.id = o.action_id AND x.tenant = o.tenant
                                WHERE o.status IN ('leased', 'executing') AND o.lease_expires_at < v_now
                                  AND x.status = 'leased' AND x.lease_expires_at < v_now
                                  AND (p_tenant IS NULL OR (o.tenant = p_tenant AND x.tenant = p_tenant))
                                FOR UPDATE OF x SKIP LOCKED)
       AND (p_tenant IS NULL OR a.tenant = p_tenant);
    GET DIAGNOSTICS v_requeued = ROW_COUNT;

    PERFORM keyturn._set_event_detail(jsonb_build_object('reason', 'lease lapsed while executing'));
    WITH lapsed AS (
        UPDATE keyturn.action a
           SET updated_at = v_now, status = 'uncertain',
               result = jsonb_build_object('reason', 'the dispatcher''s lease lapsed during the provider call; the outcome is unknown and is never retried automatically')
         WHERE (a.id, a.tenant) IN (SELECT x.id, x.tenant FROM keyturn.open_action o
                                    JOIN keyturn.action x ON x.id = o.action_id AND x.tenant = o.tenant
                                    WHERE o.status IN ('leased', 'executing') AND o.lease_expires_at < v_now
                                      AND x.status = 'executing' AND x.lease_expires_at < v_now
                                      AND (p_tenant IS NULL OR (o.tenant = p_tenant AND x.tenant = p_tenant))
                                    FOR UPDATE OF x SKIP LOCKED)
           AND (p_tenant IS NULL OR a.tenant = p_tenant)
        RETURNING a.id, a.tenant, a.attempts
    ), closed AS (
        UPDATE keyturn.attempt t SET finished_at = v_now, outcome = 'lapsed'
          FROM lapsed
         WHERE t.action_id = lapsed.id AND t.tenant = lapsed.tenant AND t.attempt = lapsed.attempts
           AND t.outcome IS NULL AND (p_tenant IS NULL OR t.tenant = p_tenant)
        RETURNING 1
    )
    SELECT count(*) INTO v_uncertain FROM lapsed;

    DELETE FROM keyturn.staged_file s
     WHERE (s.id, s.tenant) IN (SELECT f.id, f.tenant FROM keyturn.staged_file f
                                WHERE f.action_id IS NULL AND f.staged_at < v_now - interval '24 hours'
                                  AND (p_tenant IS NULL OR f.tenant = p_tenant)
                                FOR UPDATE SKIP LOCKED)
       AND (p_tenant IS NULL OR s.tenant = p_tenant);
    GET DIAGNOSTICS v_files = ROW_COUNT;

    -- Notifications: their lapsed leases by the same rules, counted with the
    -- actions' (sql/064_notify.sql).
    SELECT * INTO v_notes FROM keyturn._sweep_notifications(p_tenant, v_now);
    RETURN QUERY SELECT v_expired, v_requeued + v_notes.requeued, v_uncertain + v_notes.uncertain, v_files;
END
$$;

CREATE FUNCTION keyturn.sweep()
RETURNS TABLE (expired int, requeued int, uncertain int, files int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('sweep');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    RETURN QUERY SELECT * FROM keyturn._sweep(NULL);
END
$$;

-- reconcile, and reconcile_for (p_what names the call): p_tenant as in
-- keyturn._lease.
CREATE FUNCTION keyturn._reconcile(p_what text, p_tenant text, p_id uuid, p_outcome text, p_note text)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    a        keyturn.action;
    v_now    timestamptz := clock_timestamp();
    v_status keyturn.status;
    v_added  jsonb;
    v_tenant text := p_tenant;
BEGIN
    IF p_outcome IS NULL OR p_outcome NOT IN ('succeeded', 'failed') THEN
        RAISE EXCEPTION 'keyturn: reconcile outcome must be succeeded or failed, not %',
                coalesce(keyturn._quoted(p_outcome), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._refuse_nested(p_what);
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    IF keyturn._is_notification(p_id) THEN
        RETURN keyturn._reconcile_notification(p_tenant, p_id, p_outcome, p_note);
    END IF;
    -- Operators reconcile across tenants: the plain call names none, so it
    -- reads the tenant first, without a lock, then locks the row in its
    -- tenant. On Citus a lock by id alone would reach every shard, which
    -- Citus refuses (0A000): this way the plain call answers an action that
    -- is not uncertain as on one node (55000), and an uncertain one is
    -- refused by the lifecycle trigger, naming reconcile_for. Planned only
    -- when run: never in reconcile_for, which names its tenant.
    IF v_tenant IS NULL THEN
        SELECT x.tenant INTO v_tenant FROM keyturn.action x
         WHERE x.id = p_id;  -- by id alone: the plain call names no tenant
    END IF;
    SELECT x.* INTO a FROM keyturn.action x
     WHERE x.id = p_id AND x.tenant = v_tenant FOR UPDATE;
    IF NOT FOUND OR a.status <> 'uncertain' THEN
        RAISE EXCEPTION 'keyturn: only an uncertain action can be reconciled; % is %',
                p_id, coalesce(a.status::text, 'unknown')
            USING ERRCODE = '55000';
    END IF;
    PERFORM keyturn._set_event_detail(jsonb_strip_nulls(jsonb_build_object(
        'reconciled', p_outcome, 'note', p_note)));
    -- Computed first: Citus refuses a function that is not immutable in an
    -- UPDATE's expression that holds a COALESCE.
    v_status := p_outcome::keyturn.status;
    v_added := jsonb_strip_nulls(jsonb_build_object('reconciled', p_outcome, 'note', p_note,
                                                    'by', keyturn._calling_role()));
    UPDATE keyturn.action x
       SET updated_at = v_now, status = v_status, result = coalesce(x.result, '{}') || v_added
     WHERE x.id = a.id AND x.tenant = a.tenant;
    RETURN p_outcome;
END
$$;

CREATE FUNCTION keyturn.reconcile(action_id uuid, outcome text, note text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN keyturn._reconcile('reconcile', NULL, reconcile.action_id, reconcile.outcome, reconcile.note);
END
$$;

-- The operator's queue of what keyturn cannot decide. safe_to_decide_after:
-- the end of the last attempt's lease, after which no keyturnd starts or
-- continues that provider call (it starts none past its lease's deadline
-- and bounds each by it), so an operator who asks the provider then sees
-- all there will be; not_sent_by_dispatcher: keyturnd's own account that
-- the last attempt sent nothing (keyturn.record_not_sent), which makes
-- failed the likely answer.
CREATE FUNCTION keyturn.uncertain_actions()
RETURNS TABLE (action_id uuid, tenant text, tool text, attempts int, dispatched_at timestamptz, receipt jsonb,
               safe_to_decide_after timestamptz, not_sent_by_dispatcher boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('uncertain_actions');
    -- With the uncertain notifications (sql/064_notify.sql), whose tool is
    -- keyturn.notify.<channel>.
    RETURN QUERY
    SELECT u.* FROM (
        SELECT a.id, a.tenant, a.tool, a.attempts, a.dispatched_at, a.receipt, a.lease_expires_at,
               coalesce(t.dispatcher_account = 'not_sent', false)
          FROM keyturn.open_action o
          JOIN keyturn.action a ON a.id = o.action_id AND a.tenant = o.tenant
          LEFT JOIN keyturn.attempt t ON t.action_id = a.id AND t.tenant = a.tenant AND t.attempt = a.attempts
         WHERE o.status = 'uncertain' AND a.status = 'uncertain'
        UNION ALL
        SELECT * FROM keyturn._uncertain_notifications()) u
     ORDER BY 5, 1;
END
$$;

-- record_not_sent, and record_not_sent_for (p_what names the call): p_tenant
-- as in keyturn._lease. keyturnd's account that the attempt under p_lease
-- sent nothing (its provider call never started), for an action the sweep
-- made uncertain before keyturnd's complete(…, 'retry') arrived. It decides
-- nothing: the action stays uncertain, for an operator. Taken (true) only
-- for the uncertain action's last attempt under that lease, once: the same
-- account again is true and writes nothing; anything else is false and
-- changes nothing.
CREATE FUNCTION keyturn._record_not_sent(p_what text, p_tenant text, p_id uuid, p_lease uuid, p_receipt jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    a         keyturn.action;
    v_taken   text;
BEGIN
    PERFORM keyturn._refuse_nested(p_what);
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    IF p_receipt IS NULL OR jsonb_typeof(p_receipt) <> 'object' THEN
        RAISE EXCEPTION 'keyturn: receipt must be a JSON object' USING ERRCODE = '22023';
    END IF;
    IF keyturn._is_notification(p_id) THEN
        RETURN keyturn._record_notification_not_sent(p_tenant, p_id, p_lease, p_receipt);
    END IF;
    SELECT x.* INTO a FROM keyturn.action x
     WHERE x.id = p_id AND (p_tenant IS NULL OR x.tenant = p_tenant)  -- the plain call: by id alone
       FOR UPDATE;
    IF NOT FOUND OR a.status <> 'uncertain' THEN
        RETURN false;
    END IF;
    v_taken := keyturn._attempt_not_sent(a.id, a.tenant, a.attempts, p_lease, p_receipt);
    IF v_taken = 'written' THEN
        PERFORM keyturn._append_event(a.id, a.tenant, a.principal, keyturn._calling_role(), NULL, 'uncertain',
                                      'uncertain', jsonb_build_object('dispatcher_account', 'not_sent',
                                                                      'attempt', a.attempts, 'lease_id', p_lease));
    END IF;
    RETURN v_taken <> 'refused';
END
$$;

-- The dispatcher's account that attempt p_attempt of the job p_id (an
-- action's or a notification's) sent nothing, kept on the attempt once:
-- 'written' now, 'kept' already (the same account again), 'refused' when
-- that attempt is not under p_lease. The caller has checked that the job is
-- uncertain, and writes the event.
CREATE FUNCTION keyturn._attempt_not_sent(p_id uuid, p_tenant text, p_attempt int, p_lease uuid, p_receipt jsonb)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    t         keyturn.attempt;
    v_receipt jsonb;
BEGIN
    SELECT x.* INTO t FROM keyturn.attempt x
     WHERE x.action_id = p_id AND x.tenant = p_tenant AND x.attempt = p_attempt FOR UPDATE;
    IF NOT FOUND OR t.lease_id IS DISTINCT FROM p_lease THEN
        RETURN 'refused';
    END IF;
    IF t.dispatcher_account IS NOT NULL THEN
        RETURN 'kept';
    END IF;
    v_receipt := keyturn._redact(p_receipt);
    UPDATE keyturn.attempt x SET dispatcher_account = 'not_sent', dispatcher_receipt = v_receipt
     WHERE x.action_id = t.action_id AND x.tenant = t.tenant AND x.attempt = t.attempt;
    RETURN 'written';
END
$$;

CREATE FUNCTION keyturn.record_not_sent(action_id uuid, lease_id uuid, receipt jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN keyturn._record_not_sent('record_not_sent', NULL, record_not_sent.action_id, record_not_sent.lease_id,
                                    record_not_sent.receipt);
END
$$;

-- An action's attempts, for the operator deciding an uncertain outcome:
-- who tried when, what came back (receipts are stored redacted). plpgsql,
-- not sql: Citus cannot plan a parameter of an SQL function's statement on
-- distributed tables.
CREATE FUNCTION keyturn.attempts(action_id uuid)
RETURNS TABLE (attempt int, worker text, started_at timestamptz, finished_at timestamptz, outcome text,
               receipt jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('attempts');
    RETURN QUERY
    SELECT t.attempt, t.worker, t.started_at, t.finished_at, t.outcome::text, t.receipt
      FROM keyturn.attempt t
     WHERE t.action_id = attempts.action_id  -- by id alone: operators reconcile across tenants
     ORDER BY t.attempt;
END
$$;

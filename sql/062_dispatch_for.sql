-- The dispatcher's and the operator's calls with the tenant named (an
-- addition to the dispatcher protocol, docs/sql-api.md, "Dispatching tenant
-- by tenant").
--
-- Once keyturn's own tables are distributed by tenant (Citus, layout B,
-- docs/scale-out.md), every call that changes an action must run whole on
-- the worker that holds its tenant's shards: the lifecycle trigger fires
-- there, and it writes the event only in the backend that ran keyturn's
-- call. keyturn.citus_distribute() registers each call below with Citus so
-- that it is sent there (force_delegation), and Citus then pins every
-- statement of the call to that tenant. So each takes the tenant first, and
-- keyturnd, which asks keyturn.dispatch_by_tenant() at start, finds the
-- tenants with work due (tenants_due) and calls them tenant by tenant.
--
-- Each is its plain form with every statement limited to the tenant named:
-- the plain and the tenant-explicit forms run the same code
-- (keyturn._lease, _begin_many, _complete_many, _sweep, _reconcile,
-- _attachments_of, _file_content_of), whose statements say "p_tenant IS
-- NULL OR x.tenant = p_tenant". Only the due scan is a query of its own
-- (keyturn._due_for, sql/060_dispatch.sql). An element of another tenant is answered as an
-- unknown action (55000); nothing of another tenant is read or changed.
--
-- Authorized by role alone, as the plain calls: the dispatcher's and the
-- operator's calls act for every tenant, and the tenant only routes. A call
-- without its tenant is refused (22023, keyturn._require_tenant, in Rust:
-- extension/src/route_guard.rs, one rule for every _for call): a NULL would
-- mean every tenant to the statements it shares with the plain call.

-- The tenants with dispatcher work due, oldest work first: to_lease counts
-- the queued actions due now whose tool's provider is in providers (NULL =
-- any) and the notifications due on those providers, to_sweep what the
-- sweep would move on or delete (pending past expiry, a lease lapsed, an
-- unbound file a day old). A plain read of every
-- shard without locks: a hint of where to call lease_for and sweep_for,
-- which decide on the locked rows.
CREATE FUNCTION keyturn.tenants_due(providers text[] DEFAULT NULL, max_tenants int DEFAULT 100)
RETURNS TABLE (tenant text, to_lease bigint, to_sweep bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    IF tenants_due.max_tenants IS NULL OR tenants_due.max_tenants NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'keyturn: max_tenants must be from 1 to 10000, not %', tenants_due.max_tenants
            USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._refuse_nested('tenants_due');
    RETURN QUERY
    SELECT d.tenant, sum(d.lease)::bigint, sum(d.sweep)::bigint
      FROM (SELECT o.tenant, 1 AS lease, 0 AS sweep, o.next_attempt_at AS due
              FROM keyturn.open_action o
              JOIN keyturn.action a ON a.id = o.action_id AND a.tenant = o.tenant
             WHERE o.status = 'queued' AND o.next_attempt_at <= v_now AND a.status = 'queued'
               AND (tenants_due.providers IS NULL OR EXISTS (
                        SELECT 1 FROM keyturn.tool_version v
                         WHERE v.tool = a.tool AND v.version = a.tool_version
                           AND v.provider = ANY (tenants_due.providers)))
            UNION ALL
            SELECT o.tenant, 0, 1, o.expires_at FROM keyturn.open_action o
             WHERE o.status = 'pending' AND o.expires_at < v_now
            UNION ALL
            SELECT o.tenant, 0, 1, o.lease_expires_at FROM keyturn.open_action o
             WHERE o.status IN ('leased', 'executing') AND o.lease_expires_at < v_now
            UNION ALL
            SELECT f.tenant, 0, 1, f.staged_at FROM keyturn.staged_file f
             WHERE f.action_id IS NULL AND f.staged_at < v_now - interval '24 hours'
            -- Notifications (sql/064_notify.sql): due, and lapsed leases.
            UNION ALL
            SELECT n.tenant, 1, 0, n.next_attempt_at FROM keyturn.notification n
             WHERE n.status = 'queued' AND n.next_attempt_at <= v_now
               AND (tenants_due.providers IS NULL OR keyturn._notify_provider(n.channel) = ANY (tenants_due.providers))
            UNION ALL
            SELECT n.tenant, 0, 1, n.lease_expires_at FROM keyturn.notification n
             WHERE n.status IN ('leased', 'executing') AND n.lease_expires_at < v_now) d
     GROUP BY d.tenant
     ORDER BY min(d.due), d.tenant
     LIMIT tenants_due.max_tenants;
END
$$;

-- in_tenant, since "tenant" names a column it returns.
CREATE FUNCTION keyturn.lease_for(in_tenant text, worker text, max_jobs int DEFAULT 16,
                                  lease_for interval DEFAULT '30 seconds', providers text[] DEFAULT NULL)
RETURNS TABLE (action_id uuid, lease_id uuid, tenant text, tool text, provider text, params jsonb,
               idempotency_key text, attempt int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(lease_for.in_tenant, 'lease_for');
    RETURN QUERY SELECT * FROM keyturn._lease('lease_for', lease_for.in_tenant, lease_for.worker, lease_for.max_jobs,
                                              lease_for.lease_for, lease_for.providers);
END
$$;

CREATE FUNCTION keyturn.begin_dispatch_for(tenant text, action_id uuid, lease_id uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r record;
BEGIN
    PERFORM keyturn._require_tenant(begin_dispatch_for.tenant, 'begin_dispatch_for');
    PERFORM keyturn._refuse_nested('begin_dispatch_for');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    SELECT * INTO r FROM keyturn._begin_set(begin_dispatch_for.tenant, '{1}', ARRAY[begin_dispatch_for.action_id],
                                            ARRAY[begin_dispatch_for.lease_id]);
    PERFORM keyturn._raise_lease_problem(r.problem);
    RETURN r.dispatch;
END
$$;

CREATE FUNCTION keyturn.begin_dispatch_many_for(tenant text, action_ids uuid[], lease_ids uuid[])
RETURNS TABLE (action_id uuid, dispatch boolean, error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(begin_dispatch_many_for.tenant, 'begin_dispatch_many_for');
    PERFORM keyturn._refuse_nested('begin_dispatch_many_for');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    RETURN QUERY SELECT * FROM keyturn._begin_many(begin_dispatch_many_for.tenant, begin_dispatch_many_for.action_ids,
                                                   begin_dispatch_many_for.lease_ids);
END
$$;

CREATE FUNCTION keyturn.complete_for(tenant text, action_id uuid, lease_id uuid, outcome text,
                                     receipt jsonb DEFAULT '{}', retry_after interval DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_error text := keyturn._complete_args_error(complete_for.outcome, complete_for.retry_after, complete_for.receipt);
    r       record;
BEGIN
    PERFORM keyturn._require_tenant(complete_for.tenant, 'complete_for');
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;
    PERFORM keyturn._refuse_nested('complete_for');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    SELECT * INTO r FROM keyturn._complete_set(complete_for.tenant, '{1}', ARRAY[complete_for.action_id],
                                               ARRAY[complete_for.lease_id], ARRAY[complete_for.outcome],
                                               ARRAY[complete_for.receipt], ARRAY[complete_for.retry_after]);
    -- Only a lease problem is left: the arguments were checked above.
    PERFORM keyturn._raise_lease_problem(substr(r.problem, 7));
    RETURN r.status;
END
$$;

CREATE FUNCTION keyturn.complete_many_for(tenant text, action_ids uuid[], lease_ids uuid[], outcomes text[],
                                          receipts jsonb[], retry_after interval[])
RETURNS TABLE (action_id uuid, status text, error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(complete_many_for.tenant, 'complete_many_for');
    PERFORM keyturn._refuse_nested('complete_many_for');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    RETURN QUERY SELECT * FROM keyturn._complete_many(complete_many_for.tenant, complete_many_for.action_ids,
                                                      complete_many_for.lease_ids, complete_many_for.outcomes,
                                                      complete_many_for.receipts, complete_many_for.retry_after);
END
$$;

CREATE FUNCTION keyturn.sweep_for(tenant text)
RETURNS TABLE (expired int, requeued int, uncertain int, files int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(sweep_for.tenant, 'sweep_for');
    PERFORM keyturn._refuse_nested('sweep_for');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    RETURN QUERY SELECT * FROM keyturn._sweep(sweep_for.tenant);
END
$$;

CREATE FUNCTION keyturn.attachments_for(tenant text, action_id uuid, lease_id uuid)
RETURNS TABLE (param text, ord int, file_id uuid, sha256 text, filename text, content_type text, size bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(attachments_for.tenant, 'attachments_for');
    RETURN QUERY SELECT * FROM keyturn._attachments_of('attachments_for', attachments_for.tenant,
                                                       attachments_for.action_id, attachments_for.lease_id);
END
$$;

CREATE FUNCTION keyturn.file_content_for(tenant text, action_id uuid, lease_id uuid, file_id uuid)
RETURNS bytea
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(file_content_for.tenant, 'file_content_for');
    RETURN keyturn._file_content_of('file_content_for', file_content_for.tenant, file_content_for.action_id,
                                    file_content_for.lease_id, file_content_for.file_id);
END
$$;

CREATE FUNCTION keyturn.reconcile_for(tenant text, action_id uuid, outcome text, note text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(reconcile_for.tenant, 'reconcile_for');
    RETURN keyturn._reconcile('reconcile_for', reconcile_for.tenant, reconcile_for.action_id,
                              reconcile_for.outcome, reconcile_for.note);
END
$$;

CREATE FUNCTION keyturn.record_not_sent_for(tenant text, action_id uuid, lease_id uuid, receipt jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM keyturn._require_tenant(record_not_sent_for.tenant, 'record_not_sent_for');
    RETURN keyturn._record_not_sent('record_not_sent_for', record_not_sent_for.tenant, record_not_sent_for.action_id,
                                    record_not_sent_for.lease_id, record_not_sent_for.receipt);
END
$$;

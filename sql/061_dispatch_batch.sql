-- Batched dispatcher calls (an addition to the dispatcher calls,
-- docs/sql-api.md, "Dispatcher").
--
-- keyturn.begin_dispatch_many and keyturn.complete_many do, per element,
-- exactly what keyturn.begin_dispatch and keyturn.complete do, because they
-- run the same code: keyturn._begin_set and keyturn._complete_set
-- (sql/060_dispatch.sql), which the single calls run on a set of one. A
-- batch is one statement of each kind (the row locks, the checks, the
-- UPDATEs, the INSERT) instead of one per element, and one durable commit
-- covers it instead of one commit per action. begin_dispatch_many is still
-- committed before any provider call: keyturnd calls a provider only for the
-- elements it answered dispatch = true, after the COMMIT.
--
-- One bad element never fails the batch: every condition under which the
-- single call raises for one action (22023: unknown outcome word, negative
-- retry_after, a receipt keyturn cannot store, checked before any lock;
-- 55000: unknown action, wrong or lapsed lease, wrong status, checked on the
-- row locked FOR UPDATE) is answered in the element's `error` column as
-- '<SQLSTATE> <message>', with nothing changed for it.
--
-- Errors about the batch as a whole (NULL or unequal arrays, more than 1000
-- elements) raise 22023, changing nothing. Anything unexpected (a statement
-- timeout, a serialization failure, a deadlock) raises as usual and rolls the
-- whole batch back; the caller may retry the same batch.
--
-- Rows are answered in input order, one per element. A batch that names an
-- action more than once runs in rounds (keyturn._batch_rounds, in
-- extension/src/args.rs with the checks of the arrays), every
-- action's first occurrence in the first, its second in the next, so the
-- second occurrence sees the first one's effect, as calls one after another
-- would.

-- The elements of p_arr at the positions p_idx, in that order: a round's
-- share of a batch.
CREATE FUNCTION keyturn._batch_pick(p_arr anyarray, p_idx int[])
RETURNS anyarray
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RETURN ARRAY(SELECT p_arr[u.i] FROM unnest(p_idx) WITH ORDINALITY AS u (i, o) ORDER BY u.o);
END
$$;

-- A batch of begin_dispatch, in rounds when it names an action twice:
-- begin_dispatch_many's answers. p_tenant as in keyturn._begin_set.
CREATE FUNCTION keyturn._begin_many(p_tenant text, p_ids uuid[], p_leases uuid[])
RETURNS TABLE (action_id uuid, dispatch boolean, error text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n        int;
    v_rounds int[];
    v_idx    int[];
    v_ords   int[] := '{}';
    v_disp   boolean[] := '{}';
    v_errors text[] := '{}';
BEGIN
    n := keyturn._batch_check_arrays(cardinality(p_ids), cardinality(p_leases), 'action_ids and lease_ids');
    v_rounds := keyturn._batch_rounds(p_ids);
    IF v_rounds IS NULL THEN
        RETURN QUERY
        SELECT p_ids[b.ord], b.dispatch, '55000 ' || b.problem
          FROM keyturn._begin_set(p_tenant, ARRAY(SELECT generate_series(1, n)), p_ids, p_leases) b
         ORDER BY b.ord;
        RETURN;
    END IF;
    FOR r IN 1 .. (SELECT max(x) FROM unnest(v_rounds) x) LOOP
        v_idx := ARRAY(SELECT i FROM generate_subscripts(v_rounds, 1) i WHERE v_rounds[i] = r ORDER BY i);
        SELECT v_ords || array_agg(b.ord), v_disp || array_agg(b.dispatch),
               v_errors || array_agg('55000 ' || b.problem)
          INTO v_ords, v_disp, v_errors
          FROM keyturn._begin_set(p_tenant, v_idx, keyturn._batch_pick(p_ids, v_idx),
                                  keyturn._batch_pick(p_leases, v_idx)) b;
    END LOOP;
    RETURN QUERY
    SELECT p_ids[b.ord], b.dispatch, b.error
      FROM unnest(v_ords, v_disp, v_errors) AS b (ord, dispatch, error)
     ORDER BY b.ord;
END
$$;

-- keyturn.begin_dispatch_many(action_ids, lease_ids): per pair, exactly
-- keyturn.begin_dispatch. dispatch = true: now 'executing', call the provider.
-- dispatch = false, error NULL: invalidated (never call the provider).
-- dispatch = false, error '55000 ...': refused, nothing changed (never call
-- the provider; the lease lapses or has lapsed and the sweep requeues it).
-- Planned once per backend, as begin_dispatch.
CREATE FUNCTION keyturn.begin_dispatch_many(action_ids uuid[], lease_ids uuid[])
RETURNS TABLE (action_id uuid, dispatch boolean, error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('begin_dispatch_many');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    RETURN QUERY SELECT * FROM keyturn._begin_many(NULL, begin_dispatch_many.action_ids,
                                                   begin_dispatch_many.lease_ids);
END
$$;

-- A batch of complete, in rounds when it names an action twice:
-- complete_many's answers. p_tenant as in keyturn._begin_set.
CREATE FUNCTION keyturn._complete_many(p_tenant text, p_ids uuid[], p_leases uuid[], p_outcomes text[],
                                       p_receipts jsonb[], p_retry_after interval[])
RETURNS TABLE (action_id uuid, status text, error text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n          int;
    v_rounds   int[];
    v_idx      int[];
    v_ords     int[] := '{}';
    v_statuses text[] := '{}';
    v_errors   text[] := '{}';
BEGIN
    n := keyturn._batch_check_arrays(cardinality(p_ids), cardinality(p_leases), 'action_ids and lease_ids');
    PERFORM keyturn._batch_check_arrays(n, cardinality(p_outcomes), 'action_ids and outcomes');
    PERFORM keyturn._batch_check_arrays(n, cardinality(p_receipts), 'action_ids and receipts');
    PERFORM keyturn._batch_check_arrays(n, cardinality(p_retry_after), 'action_ids and retry_after');
    v_rounds := keyturn._batch_rounds(p_ids);
    IF v_rounds IS NULL THEN
        RETURN QUERY
        SELECT p_ids[c.ord], c.status, c.problem
          FROM keyturn._complete_set(p_tenant, ARRAY(SELECT generate_series(1, n)), p_ids, p_leases,
                                     p_outcomes, p_receipts, p_retry_after) c
         ORDER BY c.ord;
        RETURN;
    END IF;
    FOR r IN 1 .. (SELECT max(x) FROM unnest(v_rounds) x) LOOP
        v_idx := ARRAY(SELECT i FROM generate_subscripts(v_rounds, 1) i WHERE v_rounds[i] = r ORDER BY i);
        SELECT v_ords || array_agg(c.ord), v_statuses || array_agg(c.status), v_errors || array_agg(c.problem)
          INTO v_ords, v_statuses, v_errors
          FROM keyturn._complete_set(p_tenant, v_idx, keyturn._batch_pick(p_ids, v_idx),
                                     keyturn._batch_pick(p_leases, v_idx),
                                     keyturn._batch_pick(p_outcomes, v_idx),
                                     keyturn._batch_pick(p_receipts, v_idx),
                                     keyturn._batch_pick(p_retry_after, v_idx)) c;
    END LOOP;
    RETURN QUERY
    SELECT p_ids[c.ord], c.status, c.error
      FROM unnest(v_ords, v_statuses, v_errors) AS c (ord, status, error)
     ORDER BY c.ord;
END
$$;

-- keyturn.complete_many(action_ids, lease_ids, outcomes, receipts, retry_after):
-- per element, exactly keyturn.complete (a NULL receipt is '{}', a NULL
-- retry_after the database's backoff, as there). status = the new status and
-- error NULL; or status NULL and error '<SQLSTATE> ...' (55000 wrong/lapsed
-- lease or status, e.g. already swept to uncertain; 22023 bad outcome word,
-- negative retry_after, or a receipt keyturn cannot store) with nothing
-- changed for that element. Planned once per backend, as complete.
CREATE FUNCTION keyturn.complete_many(action_ids uuid[], lease_ids uuid[], outcomes text[],
                                      receipts jsonb[], retry_after interval[])
RETURNS TABLE (action_id uuid, status text, error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    PERFORM keyturn._refuse_nested('complete_many');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    RETURN QUERY SELECT * FROM keyturn._complete_many(NULL, complete_many.action_ids, complete_many.lease_ids,
                                                      complete_many.outcomes, complete_many.receipts,
                                                      complete_many.retry_after);
END
$$;

-- Batched dispatcher calls (an addition to the dispatcher calls,
-- docs/sql-api.md, "Dispatcher").
--
-- keyturn.begin_dispatch_many and keyturn.complete_many do, per element,
-- exactly what keyturn.begin_dispatch and keyturn.complete do -- the same
-- checks (keyturn._lease_problem, keyturn._complete_problem,
-- keyturn._complete_args_error) and the same
-- shared code on the locked row (keyturn._begin_locked,
-- keyturn._complete_locked) -- but for a whole batch in one statement, so one
-- durable commit covers the batch instead of one commit per action.
-- begin_dispatch_many is still committed before any provider call: keyturnd
-- calls a provider only for the elements it answered dispatch = true, after
-- the COMMIT.
--
-- One bad element never fails the batch: every condition under which the
-- single call raises for one action (55000: unknown action, wrong or lapsed
-- lease, wrong status; 22023: unknown outcome word, negative retry_after) is
-- checked first, on the row locked FOR UPDATE, and answered in the element's
-- `error` column as '<SQLSTATE> <message>', with nothing changed for it.
--
-- Errors about the batch as a whole (NULL or unequal arrays, more than 1000
-- elements) raise 22023, changing nothing. Anything unexpected (a statement
-- timeout, a serialization failure, a deadlock) raises as usual and rolls the
-- whole batch back; the caller may retry the same batch.
--
-- Rows are answered in input order, one per element (duplicates included: the
-- second occurrence of an action sees the first one's effect).

CREATE FUNCTION keyturn._batch_check_arrays(p_n1 int, p_n2 int, p_what text)
RETURNS int
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_n1 IS NULL OR p_n2 IS NULL OR p_n1 <> p_n2 THEN
        RAISE EXCEPTION 'keyturn: % must be arrays of equal length', p_what
            USING ERRCODE = '22023';
    END IF;
    IF p_n1 > 1000 THEN
        RAISE EXCEPTION 'keyturn: at most 1000 elements per batch, not %', p_n1
            USING ERRCODE = '22023';
    END IF;
    RETURN p_n1;
END
$$;

-- keyturn.begin_dispatch_many(action_ids, lease_ids): per pair, exactly
-- keyturn.begin_dispatch. dispatch = true: now 'executing', call the provider.
-- dispatch = false, error NULL: invalidated (never call the provider).
-- dispatch = false, error '55000 ...': refused, nothing changed (never call
-- the provider; the lease lapses or has lapsed and the sweep requeues it).
CREATE FUNCTION keyturn.begin_dispatch_many(action_ids uuid[], lease_ids uuid[])
RETURNS TABLE (action_id uuid, dispatch boolean, error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n       int;
    v_id    uuid;
    v_lease uuid;
    a       keyturn.action;
    v_err   text;
BEGIN
    PERFORM keyturn._refuse_nested('begin_dispatch_many');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    n := keyturn._batch_check_arrays(cardinality(begin_dispatch_many.action_ids),
                                     cardinality(begin_dispatch_many.lease_ids),
                                     'action_ids and lease_ids');
    FOR i IN 1 .. n LOOP
        v_id := begin_dispatch_many.action_ids[i];
        v_lease := begin_dispatch_many.lease_ids[i];
        a := NULL;
        SELECT x.* INTO a FROM keyturn.action x WHERE x.id = v_id FOR UPDATE;
        v_err := keyturn._lease_problem(a, v_id, v_lease, '{leased}', true);
        IF v_err IS NOT NULL THEN
            RETURN QUERY SELECT v_id, false, '55000 ' || v_err;
        ELSE
            RETURN QUERY SELECT v_id, keyturn._begin_locked(a), NULL::text;
        END IF;
    END LOOP;
END
$$;

-- keyturn.complete_many(action_ids, lease_ids, outcomes, receipts, retry_after):
-- per element, exactly keyturn.complete (a NULL receipt is '{}', a NULL
-- retry_after the database's backoff, as there). status = the new status and
-- error NULL; or status NULL and error '<SQLSTATE> ...' (55000 wrong/lapsed
-- lease or status, e.g. already swept to uncertain; 22023 bad outcome word or
-- negative retry_after) with nothing changed for that element.
CREATE FUNCTION keyturn.complete_many(action_ids uuid[], lease_ids uuid[], outcomes text[],
                                      receipts jsonb[], retry_after interval[])
RETURNS TABLE (action_id uuid, status text, error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n         int;
    v_id      uuid;
    v_lease   uuid;
    v_outcome text;
    v_delay   interval;
    a         keyturn.action;
    v_err     text;
BEGIN
    PERFORM keyturn._refuse_nested('complete_many');
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    n := keyturn._batch_check_arrays(cardinality(complete_many.action_ids),
                                     cardinality(complete_many.lease_ids),
                                     'action_ids and lease_ids');
    PERFORM keyturn._batch_check_arrays(n, cardinality(complete_many.outcomes), 'action_ids and outcomes');
    PERFORM keyturn._batch_check_arrays(n, cardinality(complete_many.receipts), 'action_ids and receipts');
    PERFORM keyturn._batch_check_arrays(n, cardinality(complete_many.retry_after), 'action_ids and retry_after');
    FOR i IN 1 .. n LOOP
        v_id := complete_many.action_ids[i];
        v_lease := complete_many.lease_ids[i];
        v_outcome := complete_many.outcomes[i];
        v_delay := complete_many.retry_after[i];
        v_err := keyturn._complete_args_error(v_outcome, v_delay);
        IF v_err IS NOT NULL THEN
            RETURN QUERY SELECT v_id, NULL::text, '22023 ' || v_err;
            CONTINUE;
        END IF;
        a := NULL;
        SELECT x.* INTO a FROM keyturn.action x WHERE x.id = v_id FOR UPDATE;
        v_err := keyturn._complete_problem(a, v_id, v_lease, v_outcome);
        IF v_err IS NOT NULL THEN
            RETURN QUERY SELECT v_id, NULL::text, '55000 ' || v_err;
        ELSE
            RETURN QUERY SELECT v_id, keyturn._complete_locked(a, v_outcome, complete_many.receipts[i], v_delay), NULL::text;
        END IF;
    END LOOP;
END
$$;

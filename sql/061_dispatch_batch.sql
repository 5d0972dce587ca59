-- keyturn 0.1.0: batched dispatcher calls (an addition to the dispatcher
-- calls, docs/sql-api.md).
--
-- keyturn.begin_dispatch_many and keyturn.complete_many do, per element, exactly
-- what keyturn.begin_dispatch and keyturn.complete do -- both run the same
-- keyturn._begin_locked / keyturn._complete_locked on the locked row -- but
-- for a whole batch in one statement, so one durable commit covers the batch
-- instead of one commit per action. begin_dispatch_many is still committed
-- before any provider call: keyturnd calls it in autocommit and calls a
-- provider only for the elements it answered dispatch = true.
--
-- One bad element never fails the batch. Every condition under which the
-- single call raises for one action (55000: unknown action, wrong or lapsed
-- lease, wrong status; 22023: unknown outcome word, negative retry_after) is
-- checked first, on the row locked FOR UPDATE, and reported in the element's
-- `error` column as '<SQLSTATE> <message>' with nothing changed for it. Only
-- elements that passed those checks reach the shared code, so the common
-- path needs no subtransaction per element. The one check that depends on the
-- clock (has the lease lapsed?) could flip between the pre-check and the
-- shared code's own check; an element whose lease ends within
-- keyturn._batch_lease_slack() of now is therefore run inside its own
-- BEGIN ... EXCEPTION block instead, so that whichever way the clock falls the
-- answer is the single call's own and the batch survives.
--
-- Errors about the batch as a whole (NULL or unequal arrays, more than 1000
-- elements) raise 22023, changing nothing. Anything unexpected (a statement
-- timeout, a serialization failure, a deadlock) raises as usual and rolls the
-- whole batch back; the caller may retry the same batch.
--
-- Rows are answered in input order, one per element (duplicates included: the
-- second occurrence of an action sees the first one's effect).

-- How close to its expiry a lease must be for its element to be run in a
-- subtransaction (see above). Generous: the pre-check and the call are
-- microseconds apart; a second costs a subtransaction only for jobs that
-- keyturnd would have handed back anyway.
CREATE FUNCTION keyturn._batch_lease_slack()
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT interval '1 second'
$$;

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
    v_found boolean;
    v_go    boolean;
    v_state text;
    v_msg   text;
BEGIN
    PERFORM keyturn._set_actor(keyturn._calling_role(), NULL);
    n := keyturn._batch_check_arrays(cardinality(begin_dispatch_many.action_ids),
                                     cardinality(begin_dispatch_many.lease_ids),
                                     'action_ids and lease_ids');
    FOR i IN 1 .. n LOOP
        v_id := begin_dispatch_many.action_ids[i];
        v_lease := begin_dispatch_many.lease_ids[i];
        SELECT x.* INTO a FROM keyturn.action x WHERE x.id = v_id FOR UPDATE;
        v_found := FOUND;
        IF NOT v_found OR a.lease_id IS DISTINCT FROM v_lease OR a.status <> 'leased' THEN
            RETURN QUERY SELECT v_id, false,
                format('55000 keyturn: action %s is not leased under lease %s (its status is %s)',
                       coalesce(v_id::text, 'NULL'), coalesce(v_lease::text, 'NULL'),
                       CASE WHEN v_found THEN a.status ELSE 'unknown' END);
            CONTINUE;
        END IF;
        IF a.lease_expires_at <= clock_timestamp() THEN
            RETURN QUERY SELECT v_id, false,
                format('55000 keyturn: the lease on action %s lapsed at %s', v_id, a.lease_expires_at);
            CONTINUE;
        END IF;
        IF a.lease_expires_at <= clock_timestamp() + keyturn._batch_lease_slack() THEN
            BEGIN
                v_go := keyturn._begin_locked(a);
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;
                IF v_state <> '55000' THEN
                    RAISE;
                END IF;
                RETURN QUERY SELECT v_id, false, v_state || ' ' || v_msg;
                CONTINUE;
            END;
        ELSE
            v_go := keyturn._begin_locked(a);
        END IF;
        RETURN QUERY SELECT v_id, v_go, NULL::text;
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
    v_found   boolean;
    v_status  text;
    v_state   text;
    v_msg     text;
BEGIN
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
        v_msg := keyturn._complete_args_error(v_outcome, v_delay);
        IF v_msg IS NOT NULL THEN
            RETURN QUERY SELECT v_id, NULL::text, '22023 ' || v_msg;
            CONTINUE;
        END IF;
        SELECT x.* INTO a FROM keyturn.action x WHERE x.id = v_id FOR UPDATE;
        v_found := FOUND;
        IF NOT v_found OR a.lease_id IS DISTINCT FROM v_lease OR a.status NOT IN ('leased', 'executing') THEN
            RETURN QUERY SELECT v_id, NULL::text,
                format('55000 keyturn: action %s is not leased or executing under lease %s (its status is %s)',
                       coalesce(v_id::text, 'NULL'), coalesce(v_lease::text, 'NULL'),
                       CASE WHEN v_found THEN a.status ELSE 'unknown' END);
            CONTINUE;
        END IF;
        IF a.status = 'leased' THEN
            IF a.lease_expires_at <= clock_timestamp() THEN
                RETURN QUERY SELECT v_id, NULL::text,
                    format('55000 keyturn: the lease on action %s lapsed at %s', v_id, a.lease_expires_at);
                CONTINUE;
            END IF;
            IF v_outcome <> 'retry' THEN
                RETURN QUERY SELECT v_id, NULL::text,
                    format('55000 keyturn: action %s was never dispatched; only ''retry'' can hand it back', v_id);
                CONTINUE;
            END IF;
            IF a.lease_expires_at <= clock_timestamp() + keyturn._batch_lease_slack() THEN
                BEGIN
                    v_status := keyturn._complete_locked(a, v_outcome, complete_many.receipts[i], v_delay);
                EXCEPTION WHEN OTHERS THEN
                    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;
                    IF v_state <> '55000' THEN
                        RAISE;
                    END IF;
                    RETURN QUERY SELECT v_id, NULL::text, v_state || ' ' || v_msg;
                    CONTINUE;
                END;
                RETURN QUERY SELECT v_id, v_status, NULL::text;
                CONTINUE;
            END IF;
        END IF;
        -- 'executing' under this lease: accepted even past the lease's expiry.
        v_status := keyturn._complete_locked(a, v_outcome, complete_many.receipts[i], v_delay);
        RETURN QUERY SELECT v_id, v_status, NULL::text;
    END LOOP;
END
$$;

GRANT EXECUTE ON FUNCTION keyturn.begin_dispatch_many(uuid[], uuid[]),
                          keyturn.complete_many(uuid[], uuid[], text[], jsonb[], interval[])
   TO keyturn_dispatcher;

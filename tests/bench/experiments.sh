# shellcheck shell=bash
# What-if experiments for the profile findings, measured like the pairs:
# A = the extension as installed, B = the same cluster with one change applied
# in place (as superuser, in this private cluster only; sql/ is untouched),
# alternating, the change reverted after each B run. Sourced by tests/bench/run.
# (E1, helpers without their own SET search_path, is how the extension is built
# now; see BENCHMARKS.md.)

# Replaces text $3 by $4 in the definition of function $1 and recreates it;
# $2 names the experiment in the error raised when $3 is not there.
swap_in_function() {
  local fn=$1 name=$2 from=$3 to=$4
  kt_psql -q <<SQL
DO \$\$
DECLARE src text;
BEGIN
    SELECT pg_get_functiondef('$fn'::regprocedure) INTO src;
    IF strpos(src, \$q\$$from\$q\$) = 0 THEN
        RAISE EXCEPTION '$name: the text to swap is not in $fn; update experiments.sh';
    END IF;
    EXECUTE replace(src, \$q\$$from\$q\$, \$q\$$to\$q\$);
END
\$\$;
SQL
}

# E2: _invalid_reason without its FOR SHARE row locks on keyturn.tool and
# keyturn.auth_epoch: the upper bound of what a lock that writes nothing
# (a shared advisory lock, proposed in BENCHMARKS.md) would save.
E2_FN='keyturn._invalid_reason(keyturn.action)'
e2_apply()  { swap_in_function "$E2_FN" E2 "FOR SHARE;" "/*FOR SHARE*/;"; }
e2_revert() { swap_in_function "$E2_FN" E2 "/*FOR SHARE*/;" "FOR SHARE;"; }

# E3: coalesced NOTIFY (BENCHMARKS.md, item 7). The lifecycle trigger sends
# NOTIFY keyturn_dispatch only when no other due action is queued: the empty →
# non-empty edge. keyturnd leases again whenever a job ends, so a non-empty
# queue keeps draining without being told; the approval that finds the queue
# empty is the one that must wake it.
E3_FROM="    IF NEW.status = 'queued' AND NEW.next_attempt_at <= clock_timestamp()"
E3_TO="    IF NEW.status = 'queued' AND NEW.next_attempt_at <= clock_timestamp()
       AND NOT EXISTS (SELECT 1 FROM keyturn.open_action o
                        WHERE o.status = 'queued' AND o.next_attempt_at <= clock_timestamp()
                          AND o.action_id <> NEW.id)"
e3_apply()  { swap_in_function 'keyturn._action_lifecycle()' E3 "$E3_FROM" "$E3_TO"; }
e3_revert() { swap_in_function 'keyturn._action_lifecycle()' E3 "$E3_TO" "$E3_FROM"; }

# E3 as a pair: the external approve flow with the NOTIFY as installed (A)
# against the coalesced one (B). No keyturnd runs, so the queue only grows and
# B sends no NOTIFY once one action is queued: the upper bound of the saving.
# Its cost, wake-up latency, is measured by item_wakeup's "coalesced" mode.
experiment_e3() {
  local clients r
  for clients in 4 16; do
    for r in $(seq 1 "$ROUNDS"); do
      pgbench_run exp-e3 A "$clients" "$r" ext_flow.sql
      e3_apply
      pgbench_run exp-e3 B "$clients" "$r" ext_flow.sql
      e3_revert
    done
  done
}

experiment() {
  local name=$1 clients=$2 r
  for r in $(seq 1 "$ROUNDS"); do
    pgbench_run "exp-$name" A "$clients" "$r" gate_flow.sql
    "${name}_apply"
    pgbench_run "exp-$name" B "$clients" "$r" gate_flow.sql
    "${name}_revert"
  done
}

item_experiments() {
  log "experiments: E2 (no FOR SHARE in _invalid_reason), E3 (coalesced NOTIFY)"
  experiment e2 4
  experiment_e3
}

# shellcheck shell=bash
# What-if experiments for the profile findings, measured like the pairs:
# A = the extension as installed, B = the same cluster with one change applied
# in place (as superuser, in this private cluster only; sql/ is untouched),
# alternating, the change reverted after each B run. Sourced by tests/bench/run.

# E1: helpers and triggers without their own `SET search_path` (the entry
# points _propose/_approve/_preview/_reject and every SECURITY DEFINER
# function keep theirs, so the helpers still run under a pinned path).
E1_LIST="SELECT p.oid::regprocedure FROM pg_proc p
          WHERE p.pronamespace = 'keyturn'::regnamespace AND NOT p.prosecdef AND p.proconfig IS NOT NULL
            AND p.proname NOT IN ('_propose', '_approve', '_preview', '_reject')"
e1_apply()  { kt_psql -Atc "$E1_LIST" | while read -r f; do echo "ALTER FUNCTION $f RESET search_path;"; done | kt_psql -q; }
e1_revert() { kt_psql -Atc "SELECT p.oid::regprocedure FROM pg_proc p WHERE p.pronamespace = 'keyturn'::regnamespace AND NOT p.prosecdef AND p.proconfig IS NULL AND p.prolang <> 13 AND p.proname LIKE '\_%' AND p.proname NOT IN ('_exec_as') AND p.prolang IN (SELECT oid FROM pg_language WHERE lanname IN ('sql', 'plpgsql'))" \
                | while read -r f; do echo "ALTER FUNCTION $f SET search_path = pg_catalog, pg_temp;"; done | kt_psql -q; }

# E2: _invalid_reason without its FOR SHARE row locks on keyturn.tool and
# keyturn.auth_epoch: the upper bound of what a lock that writes nothing
# (a shared advisory lock, proposed in BENCHMARKS.md) would save.
e2_toggle() {
  local from=$1 to=$2
  kt_psql -q <<SQL
DO \$\$
DECLARE src text;
BEGIN
    SELECT pg_get_functiondef('keyturn._invalid_reason(keyturn.action)'::regprocedure) INTO src;
    EXECUTE replace(src, '$from', '$to');
END
\$\$;
SQL
}
e2_apply()  { e2_toggle "FOR SHARE;" "/*FOR SHARE*/;"; }
e2_revert() { e2_toggle "/*FOR SHARE*/;" "FOR SHARE;"; }

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
  log "experiments: E1 (no per-helper SET search_path), E2 (no FOR SHARE in _invalid_reason)"
  experiment e1 4
  experiment e2 4
}

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

# E2: _invalid_reason with the row locks it took until docs/security.md row
# 97 (FOR KEY SHARE on keyturn.tool and keyturn.auth_epoch) put back: what
# those locks cost (B) against the extension as built (A). It ran the other
# way round (the locks taken out) until they were.
E2_FN='keyturn._invalid_reason(keyturn.action)'
E2_TOOL=' WHERE t.name = a.tool;'
E2_EPOCH='e.principal = a.principal),'
e2_apply() {
  swap_in_function "$E2_FN" E2 "$E2_TOOL" " WHERE t.name = a.tool FOR KEY SHARE;"
  swap_in_function "$E2_FN" E2 "$E2_EPOCH" "e.principal = a.principal FOR KEY SHARE),"
}
e2_revert() {
  swap_in_function "$E2_FN" E2 " WHERE t.name = a.tool FOR KEY SHARE;" "$E2_TOOL"
  swap_in_function "$E2_FN" E2 "e.principal = a.principal FOR KEY SHARE)," "$E2_EPOCH"
}

# E3 (a coalesced NOTIFY, BENCHMARKS.md item 7) swapped one condition in the
# plpgsql lifecycle trigger of 0.1.0; the trigger is Rust since 0.2.0, so it is
# no longer applied here (its 0.1.0 figures stay in BENCHMARKS.md).

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
  log "experiments: E2 (the FOR KEY SHARE of _invalid_reason put back), 4 and 16 clients"
  experiment e2 4
  experiment e2 16
}

# L: two builds of the extension's library in one cluster: A the library this
# run built from the tree, B another build (KT_BENCH_LIBRARY_B: a copy of
# $libdir/pg_keyturn.so made after `cargo pgrx install --release` at another
# commit). What a change to the extension's Rust alone is worth, where two
# runs' noise would hide a few per cent. Every function's probin names the
# side's copy while it runs; each pgbench run connects anew, and a backend
# loads the library when it first calls into it. Alternating, A B then B A.
# Pairs: the gate flow at 4 clients; a dispatch step of 32 jobs and of 1
# (pgbench/dispatch_step.sql, rolled back, one client).
item_library() {
  local b=${KT_BENCH_LIBRARY_B:-}
  if [ -z "$b" ] || [ ! -f "$b" ]; then
    log "library: skipped: KT_BENCH_LIBRARY_B names no library file (${b:-unset})"
    return 0
  fi
  local lib_a lib_b
  lib_a="$(kt_scratch)/pg_keyturn.so"
  lib_b="$(kt_scratch)/pg_keyturn-b.so"
  cp "$b" "$lib_b"
  log "library: A = this tree's build, B = $b ($(sha256sum "$b" | cut -c1-12))"
  clear_queue
  queue_actions 2000 approve
  local r side item clients script args
  for r in $(seq 1 "$ROUNDS"); do
    for item in flow step32 step1; do
      case $item in
        flow) clients=4; script=gate_flow.sql; args=() ;;
        step32) clients=1; script=dispatch_step.sql; args=(-U app_dispatcher -D n=32) ;;
        step1) clients=1; script=dispatch_step.sql; args=(-U app_dispatcher -D n=1) ;;
      esac
      for side in $( (( r % 2 )) && echo A B || echo B A); do
        library_use "$( [ "$side" = A ] && echo "$lib_a" || echo "$lib_b")" "$lib_a" "$lib_b"
        pgbench_run "lib-$item" "$side" "$clients" "$r" "$script" "${args[@]}"
      done
    done
  done
  library_use "$lib_a" "$lib_a" "$lib_b"
  clear_queue
}

# Points every function of pg_keyturn at library $1 (one of $2, $3).
library_use() {
  kt_psql -qc "UPDATE pg_proc SET probin = '$1' WHERE probin IN ('$2', '$3')" >/dev/null
}

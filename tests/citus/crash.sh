# shellcheck shell=bash
# The coordinator crash tests of the citus layer (sourced by tests/citus/run,
# which defines cpsql, wpsql, C, W1, W2): what a crash of the coordinator
# between a worker's commit and its own leaves behind, for a pending action
# approved in layout A (docs/scale-out.md, "A coordinator crash").
#
# The crash is placed, not timed: a deferred constraint trigger on the shard,
# on the worker, waits for an advisory lock that a session of the test holds,
# so the worker stops inside its COMMIT (one phase) or its PREPARE
# TRANSACTION (two phases) until the test has crashed the coordinator. Every
# wait is for a state, bounded so that a state that never comes fails the
# test instead of hanging it.

GATE_LOCK=4242

# until_state <what> <command…>: runs the command every 0.1 s until it
# succeeds; gives up (and fails the test) after two minutes.
until_state() {
  local what=$1 deadline=$((SECONDS + 120))
  shift
  until "$@"; do
    if [ $SECONDS -ge $deadline ]; then
      echo "gave up waiting for: $what" >&2
      return 1
    fi
    sleep 0.1
  done
}

# The port of the worker holding tenant $1's shard of crm.deal, and the shard.
shard_of() {
  cpsql -Atc "SELECT s.nodeport || ' crm.deal_' || s.shardid FROM citus_shards s
               WHERE s.table_name = 'crm.deal'::regclass
                 AND s.shardid = get_shard_id_for_distribution_column('crm.deal', '$1')"
}

# gate_install <port> <shard>: the waiting trigger on that shard only (DDL
# made on a worker, for that worker alone: Citus would refuse to propagate it).
gate_install() {
  wpsql "$1" -q -c "SET citus.enable_ddl_propagation = off" -c "CREATE OR REPLACE FUNCTION public.crash_gate() RETURNS trigger LANGUAGE plpgsql AS
                      \$\$ BEGIN PERFORM pg_advisory_xact_lock($GATE_LOCK); RETURN NULL; END \$\$" \
            -c "CREATE CONSTRAINT TRIGGER crash_gate AFTER UPDATE ON $2 DEFERRABLE INITIALLY DEFERRED
                  FOR EACH ROW EXECUTE FUNCTION public.crash_gate()"
}
gate_remove() {
  wpsql "$1" -q -c "SET citus.enable_ddl_propagation = off" -c "SET lock_timeout = '60s'" \
    -c "DROP TRIGGER IF EXISTS crash_gate ON $2"
}

# Holds the gate's lock on worker $1 in a session of its own until gate_open
# (or until the worker stops). Started as a plain command, not a function, so
# that no subshell keeps the caller's output open.
gate_close() {
  env PGAPPNAME=kt_crash_gate "$PG_BIN/psql" -X -h 127.0.0.1 -p "$1" -U postgres -d keyturn \
    -qAtc "SELECT pg_advisory_lock($GATE_LOCK), pg_sleep(600)" >/dev/null 2>&1 &
  until_state "the gate's lock is held" gate_held "$1"
}
gate_held() {
  [ "$(wpsql "$1" -Atc "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $GATE_LOCK AND granted")" = 1 ]
}
gate_waiting() {
  [ "$(wpsql "$1" -Atc "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $GATE_LOCK AND NOT granted")" = 1 ]
}
gate_open() {
  wpsql "$1" -qAtc "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'kt_crash_gate'" >/dev/null
}
gate_idle() {
  [ "$(wpsql "$1" -Atc "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $GATE_LOCK")" = 0 ]
}
# A prepared transaction (no backend: pid is NULL) holds the gate's lock.
gate_prepared() {
  [ "$(wpsql "$1" -Atc "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $GATE_LOCK AND granted AND pid IS NULL")" = 1 ]
}

# propose <tool> <form>: prints "<action_id> <token>", proposed by alice (acme).
propose() {
  cpsql -qAt -F ' ' -c "\\connect - app_agent" -c "BEGIN" \
    -c "SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1'" \
    -c "SELECT action_id, token FROM keyturn.propose('$1', '$2')" -c "COMMIT"
}
# approve_cmd <id> <token>: alice's approval; prints its status.
approve_args() {
  printf '%s\n' -X -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$C" -U app_human -d keyturn -qAt -c "BEGIN" \
    -c "SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1'" \
    -c "SELECT status FROM keyturn.approve('$1', '$2')" -c "COMMIT"
}
approve_cmd() {
  local args
  mapfile -t args < <(approve_args "$1" "$2")
  "$PG_BIN/psql" "${args[@]}"
}
# The same in the background, as a plain command; sets bg to its pid.
approve_bg() {
  local args
  mapfile -t args < <(approve_args "$1" "$2")
  "$PG_BIN/psql" "${args[@]}" >/dev/null 2>&1 &
  bg=$!
}
status_of() { cpsql -Atc "SELECT status FROM keyturn.action WHERE id = '$1'"; }
# row <port> <shard> <id>: stage and revision of acme's deal, read on its worker.
row() { wpsql "$1" -Atc "SELECT stage || ' ' || revision FROM $2 WHERE tenant = 'acme' AND id = $3"; }
# expect <what> <got> <want>: a failed check is noted in crash_failed (these
# functions run where errexit is off) and the test goes on to clean up.
expect() {
  if [ "$2" = "$3" ]; then echo "NOTICE:  ok - $1"; else echo "FAILED: $1: got '$2', want '$3'"; crash_failed=1; fi
}

# Runs one crash scenario, then takes the gate away whatever happened.
crash_test() {
  local port shard
  read -r port shard <<<"$(shard_of acme)"
  crash_failed=
  "$1" "$port" "$shard" || crash_failed=1
  gate_open "$port"
  # A prepared part left behind would hold the shard's locks.
  cpsql -qAtc 'SELECT recover_prepared_transactions()' >/dev/null || crash_failed=1
  gate_remove "$port" "$shard" || crash_failed=1
  [ -z "$crash_failed" ]
}

# One phase: the routed write. Citus commits the worker first; the crash
# comes before the coordinator's commit: the write is done, the proposal is
# still pending. Approving it again finds the row at another version: a
# conflict, and nothing is written twice.
crash_single_shard() { crash_test single_shard; }
single_shard() {
  local port=$1 shard=$2 id token bg
  read -r id token <<<"$(propose deal_stage_routed '{"where": {"tenant": "acme", "id": 102}, "set": {"stage": "lost"}}')"
  local before
  before=$(row "$port" "$shard" 102)
  gate_install "$port" "$shard" || return 1
  gate_close "$port" || return 1
  approve_bg "$id" "$token"
  until_state "the worker's COMMIT waits at the gate" gate_waiting "$port" || return 1
  kt_citus_coordinator_crash_restart || return 1
  if wait "$bg"; then echo "FAILED: the approval's connection survived the crash"; return 1; fi
  gate_open "$port"
  until_state "the worker's COMMIT went through" gate_idle "$port" || return 1
  expect "one phase: the proposal is still pending" "$(status_of "$id")" pending
  expect "one phase: the write is done on the worker" "$(row "$port" "$shard" 102)" "lost $(( ${before#* } + 1 ))"
  expect "one phase: nothing in doubt" "$(cpsql -Atc 'SELECT recover_prepared_transactions()')" 0
  expect "one phase: approving it again is a conflict" "$(approve_cmd "$id" "$token")" conflict
  expect "one phase: and writes nothing" "$(row "$port" "$shard" 102)" "lost $(( ${before#* } + 1 ))"
}

# Two phases: the fanned-out write. The crash comes while a worker prepares:
# the coordinator never recorded its commit, so recovery rolls every prepared
# part back; the proposal is pending and the row untouched, and approving it
# again succeeds, once.
crash_two_phase() { crash_test two_phase; }
two_phase() {
  local port=$1 shard=$2 id token bg
  read -r id token <<<"$(propose deal_stage '{"where": {"id": 106}, "set": {"stage": "negotiation"}}')"
  local before
  before=$(row "$port" "$shard" 106)
  gate_install "$port" "$shard" || return 1
  gate_close "$port" || return 1
  approve_bg "$id" "$token"
  until_state "the worker's PREPARE waits at the gate" gate_waiting "$port" || return 1
  kt_citus_coordinator_crash_restart || return 1
  if wait "$bg"; then echo "FAILED: the approval's connection survived the crash"; return 1; fi
  gate_open "$port"
  until_state "the worker's PREPARE went through" gate_prepared "$port" || return 1
  expect "two phases: the proposal is still pending" "$(status_of "$id")" pending
  expect "two phases: a prepared part waits on the worker" \
    "$(wpsql "$port" -Atc "SELECT count(*) > 0 FROM pg_prepared_xacts WHERE gid LIKE 'citus\_%'")" t
  expect "two phases: the row is untouched" "$(row "$port" "$shard" 106)" "$before"
  local recovered
  recovered=$(cpsql -Atc 'SELECT recover_prepared_transactions()')
  expect "two phases: recovery resolved the prepared parts" "$(( recovered > 0 ))" 1
  expect "two phases: none is left" \
    "$(wpsql "$port" -Atc "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE 'citus\_%'")" 0
  expect "two phases: rolled back, the row is untouched" "$(row "$port" "$shard" 106)" "$before"
  expect "two phases: approving it again succeeds" "$(approve_cmd "$id" "$token")" succeeded
  expect "two phases: written once" "$(row "$port" "$shard" 106)" "negotiation $(( ${before#* } + 1 ))"
}

# shellcheck shell=bash
# Concurrent approvals on layout B (sourced by tests/citus/run, which defines
# cpsql, C, OUT, HERE and check): four pgbench clients propose and approve,
# delegated, acme's and globex's deals at random, on both workers at once. Every
# transaction must commit: a delegated call that took a lock on another node
# (a row lock on a reference table does, unless keyturn takes it on the local
# placement, keyturn._local_placement) deadlocks against another such call,
# and pgbench counts each as a failed transaction. Each proposal ends
# succeeded, or conflict when a concurrent approval changed its deal first.

concurrent_approvals() {
  local log="$OUT/b_concurrent.pgbench.log" failed flows
  cpsql -q -c "CREATE ROLE citus_app LOGIN NOINHERIT IN ROLE app_agent, app_human" || return 1
  "$PG_BIN/pgbench" -h 127.0.0.1 -p "$C" -U citus_app -n -M simple -c 4 -j 2 -t 25 --failures-detailed \
    -f "$HERE/b_concurrent.pgbench" keyturn >"$log" 2>&1 || { cat "$log"; return 1; }
  failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$log")
  flows=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$log")
  local status=0
  check "100 flows, four clients at once, on both workers" "${flows:-none}" 100
  check "no transaction failed (no deadlock across nodes)" "${failed:-none}" 0
  check "every proposal approved: succeeded, or conflict where a concurrent approval changed its deal" \
    "$(cpsql -Atc "SELECT string_agg(DISTINCT status::text || ': ' || coalesce(result ->> 'reason', ''), '; ')
                     FROM keyturn.action WHERE session ~ '^c[0-9]+$' AND status NOT IN ('succeeded', 'conflict')")" ""
  check "as many proposals as flows" \
    "$(cpsql -Atc "SELECT count(*) FROM keyturn.action WHERE session ~ '^c[0-9]+$'")" 100
  [ $status -eq 0 ] || cat "$log"
  return $status
}

# No approval in flight delays a tool change, on layout B as on one node
# (keyturn._invalid_reason reads the tool row FOR KEY SHARE, on this worker's
# placement of the reference table, and the commit reads it again). Placed,
# not timed: the approval's transaction stays open after approve_for,
# waiting for an advisory lock the test holds on the coordinator, while
# set_tool_enabled runs and returns; then the approval's COMMIT fails to
# serialize (the worker's commit check finds the tool disabled) and the
# proposal stays pending.
TOOL_LOCK=4343
tool_change_does_not_wait() {
  local id token approval holder status=0
  read -r id token <<<"$(cpsql -qAt -F ' ' -c "\\connect - app_agent" -c "BEGIN" \
    -c "SET LOCAL citus.propagate_set_commands = 'local'; SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1'" \
    -c "SELECT action_id, token FROM keyturn.propose_for('acme', 'notify', '{\"channel\": \"ops\", \"text\": \"held\"}')" \
    -c "COMMIT")"
  env PGAPPNAME=kt_tool_gate "$PG_BIN/psql" -X -h 127.0.0.1 -p "$C" -U postgres -d keyturn \
    -qAtc "SELECT pg_advisory_lock($TOOL_LOCK), pg_sleep(600)" >/dev/null 2>&1 &
  holder=$!
  coord_lock() { [ "$(cpsql -Atc "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $TOOL_LOCK AND $1")" = 1 ]; }
  until_state "the test holds the gate" coord_lock granted || return 1
  "$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$C" -U app_human -d keyturn -qAt -c "BEGIN" \
    -c "SET LOCAL citus.propagate_set_commands = 'local'; SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1'" \
    -c "SELECT status FROM keyturn.approve_for('acme', '$id', '$token')" \
    -c "SELECT pg_advisory_lock($TOOL_LOCK)" -c "COMMIT" >"$OUT/tool_approval.log" 2>&1 &
  approval=$!
  until_state "the approval waits at the gate, its transaction open" coord_lock "NOT granted" || return 1
  "$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$C" -U app_admin -d keyturn -qAt \
    -c "SELECT keyturn.set_tool_enabled('notify', false)" >"$OUT/tool_change.log" 2>&1 || status=1
  check "set_tool_enabled returned while the approval is open" "$(kill -0 "$approval" 2>/dev/null && echo open)" open
  check "the tool is disabled" "$(cpsql -Atc "SELECT enabled FROM keyturn.tool WHERE name = 'notify'")" f
  kill "$holder" 2>/dev/null
  cpsql -qAtc "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'kt_tool_gate'" >/dev/null
  wait "$approval" && status=1
  check "the approval's COMMIT failed to serialize: the tool went off while it was open" \
    "$(grep -c 'was disabled while this transaction was open' "$OUT/tool_approval.log")" 1
  check "the proposal is still pending" "$(cpsql -Atc "SELECT status FROM keyturn.action WHERE id = '$id'")" pending
  cpsql -qAt -c "\\connect - app_admin" -c "SELECT keyturn.set_tool_enabled('notify', true)" >/dev/null || status=1
  return $status
}

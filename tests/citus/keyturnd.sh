# shellcheck shell=bash
# keyturnd on layout B (sourced by tests/citus/run, which defines cpsql, C,
# W1, W2, OUT, until_state, check, keyturnd_build and keyturnd_ready):
# keyturnd against the coordinator, with a webhook receiver, once keyturn's
# tables are distributed by tenant (b_distribute). The SQL half is b_keyturnd.sql; this half starts and
# stops the processes and checks what only they can tell: that keyturnd
# chose to dispatch by tenant, listened on both workers and was woken by a
# worker's notification, that the receiver got each delivery once, and that
# `keyturnd reconcile` settles an uncertain action on its tenant's worker.

KT_CITUS_WEBHOOK_SECRET=citus-layer-webhook-secret

keyturnd_by_tenant() {
  local dir="$OUT/keyturnd" target receiver_port keyturnd_port receiver_pid keyturnd_pid status=0
  mkdir -p "$dir"
  target=$(keyturnd_build receiver) || return 1
  receiver_port=$(kt_free_port)
  "$target/debug/examples/receiver" --listen "127.0.0.1:$receiver_port" --secret "$KT_CITUS_WEBHOOK_SECRET" \
    --status 200 >"$dir/receiver.log" 2>&1 &
  receiver_pid=$!
  keyturnd_port=$(kt_free_port)
  # Debug, for the wake-ups it logs. A second's poll: a notification missed
  # would still be delivered, and the log tells which way it came.
  RUST_LOG=keyturnd=debug \
  DATABASE_URL="postgres://app_dispatcher@127.0.0.1:$C/keyturn" \
  KEYTURN_LISTEN="127.0.0.1:$keyturnd_port" \
  KEYTURN_WEBHOOK_URL="http://127.0.0.1:$receiver_port/hook" KEYTURN_WEBHOOK_SECRET=$KT_CITUS_WEBHOOK_SECRET \
  KEYTURN_LEASE_SECONDS=10 KEYTURN_HTTP_TIMEOUT_SECONDS=3 KEYTURN_SWEEP_SECONDS=1 \
  KEYTURN_JOURNAL_DIR="$dir/journal" \
    "$target/debug/keyturnd" >"$dir/keyturnd.log" 2>&1 &
  keyturnd_pid=$!
  # shellcheck disable=SC2064 # the pids are known now
  trap "kill $keyturnd_pid $receiver_pid 2>/dev/null || true" RETURN
  keyturnd_ready "$keyturnd_port" "$dir/keyturnd.log" || return 1

  # Ready means the coordinator's LISTEN works; the workers' follow. Wait for
  # both, or a slow machine's poll could deliver before any worker listened
  # and the wake-up check below would test nothing.
  log_has() { grep -c -- "$1" "$dir/keyturnd.log" || true; }
  listening_on_both() { [ "$(log_has 'listening on a worker')" -ge 2 ]; }
  until_state "keyturnd listening on both workers" listening_on_both || {
    tail -n 20 "$dir/keyturnd.log"
    return 1
  }

  cpsql -f "$HERE/b_keyturnd.sql" | tee "$dir/sql.log" || return 1
  local uncertain
  uncertain=$(sed -n 's/^UNCERTAIN //p' "$dir/sql.log")

  check "keyturnd chose to dispatch tenant by tenant" "$(log_has 'dispatching tenant by tenant')" 1
  check "keyturnd listens on both workers" "$(log_has 'listening on a worker')" 2
  check "and was woken by a worker's notification" "$([ "$(log_has "woken by a worker's notification")" -ge 1 ] && echo yes)" yes
  check "the receiver got each delivery once" \
    "$(curl -fs "http://127.0.0.1:$receiver_port/stats" \
         | python3 -c 'import json, sys; s = json.load(sys.stdin); print(s["total"], len(s["per_key"]), s["duplicates"], s["bad_signatures"])')" \
    "2 2 0 0"
  check "nothing logged at ERROR" "$(grep -c ' ERROR ' "$dir/keyturnd.log" || true)" 0

  # The operator command finds the tenant among the uncertain actions and
  # reconciles there.
  local said
  said=$(DATABASE_URL="postgres://app_operator@127.0.0.1:$C/keyturn" "$target/debug/keyturnd" reconcile "$uncertain" \
           --outcome failed --note "the pager has no record of it" 2>&1) || { echo "$said"; status=1; }
  check "keyturnd reconcile on layout B" "$said" "$uncertain failed"
  check "its event, the operator's, on the tenant's worker" \
    "$(cpsql -Atc "SELECT string_agg(to_status::text || ':' || db_role, ' ' ORDER BY id) FROM keyturn.event
                    WHERE tenant = 'acme' AND action_id = '$uncertain'")" \
    "pending:app_agent queued:app_human leased:app_dispatcher executing:app_dispatcher uncertain:app_dispatcher failed:app_operator"
  return $status
}

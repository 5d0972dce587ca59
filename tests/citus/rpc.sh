# shellcheck shell=bash
# keyturnd's /rpc on layout B (sourced by tests/citus/run, which defines
# cpsql, C, OUT, until_state, check, keyturnd_build and keyturnd_ready): a
# person's JWT, the card's calls over HTTP. keyturnd asks the database
# whether keyturn's tables are distributed, and runs preview, approve,
# reject, revise and approve_many in their tenant-explicit forms, which Citus
# delegates to the tenant's worker, with the claims asserted by a propagated
# SET LOCAL, and the operator's reconcile in the uncertain action's tenant; a
# call without such a form (pending, uncertain_actions) runs as it is. A JWT
# of another tenant is refused there, and changes nothing.

KT_CITUS_JWT_SECRET=citus-layer-jwt-secret-of-32-bytes-or-more

rpc_by_tenant() {
  local dir="$OUT/rpc" target port pid status=0
  mkdir -p "$dir"
  target=$(keyturnd_build jwt) || return 1
  # The /rpc login: NOINHERIT, the person's role per request (Citus creates
  # it on the workers too).
  cpsql -q -c "CREATE ROLE citus_rpc LOGIN NOINHERIT IN ROLE app_human, app_operator" || return 1

  # Three of alice's proposals, made as the agent, delegated; statement by
  # statement, as a pooled application sends them.
  # propose <tool> <params>: the action id and token, a space between.
  propose() {
    cpsql -qAt -F ' ' <<SQL
\\connect - app_agent
BEGIN;
SET LOCAL citus.propagate_set_commands = 'local';
SET LOCAL keyturn.tenant = 'acme';
SET LOCAL keyturn.principal = 'alice';
SET LOCAL keyturn.session = 's-rpc';
SELECT action_id, token FROM keyturn.propose_for('acme', '$1', '$2');
COMMIT;
SQL
  }
  deal() { propose deal_stage_routed "{\"where\": {\"tenant\": \"acme\", \"id\": $1}, \"set\": {\"stage\": \"$2\"}}"; }
  local p1 t1 p2 t2 p3 t3
  read -r p1 t1 < <(deal 103 negotiation) && read -r p2 t2 < <(deal 104 negotiation) \
    && read -r p3 t3 < <(deal 101 lost) || return 1
  [ -n "$t3" ] || { echo "could not propose"; return 1; }

  port=$(kt_free_port)
  DATABASE_URL="postgres://app_dispatcher@127.0.0.1:$C/keyturn" \
  KEYTURN_LISTEN="127.0.0.1:$port" KEYTURN_JOURNAL=false \
  KEYTURN_JWT_SECRET=$KT_CITUS_JWT_SECRET KEYTURN_JWT_ROLES=app_human,app_operator \
  KEYTURN_RPC_DATABASE_URL="postgres://citus_rpc@127.0.0.1:$C/keyturn" \
    "$target/debug/keyturnd" >"$dir/keyturnd.log" 2>&1 &
  pid=$!
  # shellcheck disable=SC2064 # the pid is known now
  trap "kill $pid 2>/dev/null || true" RETURN
  keyturnd_ready "$port" "$dir/keyturnd.log" || return 1

  jwt() {
    "$target/debug/examples/jwt" --secret "$KT_CITUS_JWT_SECRET" \
      "{\"role\": \"${3:-app_human}\", \"tenant_id\": \"$1\", \"sub\": \"$2\", \"session_id\": \"s-rpc\"}"
  }
  local alice gina
  alice=$(jwt acme alice) && gina=$(jwt globex gina) || return 1
  # rpc <jwt> <function> <body>: the HTTP status, a space, the answer.
  rpc() {
    curl -s -o "$dir/answer" -w '%{http_code}' -X POST "http://127.0.0.1:$port/rpc/$2" \
      -H "Authorization: Bearer $1" -H 'Content-Type: application/json' -d "$3"
    printf ' '
    cat "$dir/answer"
  }
  field() { python3 -c 'import json, sys; v = json.loads(sys.stdin.read().split(" ", 1)[1]); print(eval(sys.argv[1]))' "$1"; }
  local said
  said=$(rpc "$alice" preview "{\"action_id\": \"$p1\", \"token\": \"$t1\"}")
  check "preview over /rpc, on acme's worker" "${said%% *} $(field 'v["tool"] + " " + str(v["params"]["set"])' <<<"$said")" \
    "200 deal_stage_routed {'stage': 'negotiation'}"
  said=$(rpc "$alice" approve "{\"action_id\": \"$p1\", \"token\": \"$t1\"}")
  check "approve over /rpc, delegated" "${said%% *} $(field 'v[0]["status"]' <<<"$said")" "200 succeeded"
  said=$(rpc "$alice" reject "{\"action_id\": \"$p2\", \"token\": \"$t2\"}")
  check "reject over /rpc, delegated" "$said" '200 "rejected"'
  said=$(rpc "$alice" pending '{}')
  check "pending over /rpc, as it is: of the three, the one left" \
    "${said%% *} $(field '" ".join(a["action_id"] for a in v if a["action_id"] in "'"$p1 $p2 $p3"'".split())' <<<"$said")" \
    "200 $p3"
  said=$(rpc "$gina" approve "{\"action_id\": \"$p3\", \"token\": \"$t3\"}")
  check "another tenant's JWT is refused on its own worker" "${said%% *} $(field 'v["code"]' <<<"$said")" "409 55000"
  said=$(rpc "$(jwt "" alice)" approve "{\"action_id\": \"$p3\", \"token\": \"$t3\"}")
  check "a JWT that names no tenant is refused" "${said%% *} $(field 'v["code"]' <<<"$said")" "403 42501"
  check "and changes nothing: the third is still pending" \
    "$(cpsql -Atc "SELECT status FROM keyturn.action WHERE tenant = 'acme' AND id = '$p3'")" pending

  # The third edited on the card, then approved as a batch of one.
  local p3b t3b
  said=$(rpc "$alice" revise "{\"action_id\": \"$p3\", \"token\": \"$t3\",
                               \"params\": {\"where\": {\"tenant\": \"acme\", \"id\": 101}, \"set\": {\"stage\": \"won\"}}}")
  read -r p3b t3b < <(field 'v[0]["action_id"] + " " + v[0]["token"]' <<<"$said")
  check "revise over /rpc, delegated: a new proposal" "${said%% *} $([ -n "$t3b" ] && echo "a token")" "200 a token"
  said=$(rpc "$alice" approve_many "{\"items\": [{\"action_id\": \"$p3b\", \"token\": \"$t3b\"}]}")
  check "approve_many over /rpc, delegated" "${said%% *} $(field 'v[0]["status"]' <<<"$said")" "200 succeeded"

  check "what the database holds: the approvals written, the rejection, the edit superseding" \
    "$(cpsql -Atc "SELECT string_agg(a.status::text, ' ' ORDER BY a.id) || ' ' ||
                          (SELECT string_agg(stage, ' ' ORDER BY id) FROM crm.deal WHERE tenant = 'acme' AND id IN (101, 103))
                     FROM keyturn.action a WHERE a.tenant = 'acme' AND a.id IN ('$p1', '$p2', '$p3', '$p3b')")" \
    "succeeded rejected superseded succeeded won negotiation"
  check "its events, each by its role" \
    "$(cpsql -Atc "SELECT string_agg(to_status::text || ':' || db_role, ' ' ORDER BY id) FROM keyturn.event
                    WHERE tenant = 'acme' AND action_id IN ('$p1', '$p2')")" \
    "pending:app_agent pending:app_agent succeeded:app_human rejected:app_human"
  # The operator's console: a pager job (b_keyturnd's tool, whose provider
  # this keyturnd lacks), approved, leased by hand and left uncertain, then
  # reconciled over /rpc, on acme's worker.
  local pj pj_token pj_lease
  read -r pj pj_token < <(propose page_oncall '{"text": "rpc"}')
  said=$(rpc "$alice" approve "{\"action_id\": \"$pj\", \"token\": \"$pj_token\"}")
  check "the pager job approved over /rpc: queued" "${said%% *} $(field 'v[0]["status"]' <<<"$said")" "200 queued"
  pj_lease=$(cpsql -qAt -F ' ' <<SQL
\\connect - app_dispatcher
BEGIN;
SELECT lease_id FROM keyturn.lease_for('acme', 'by-hand', 1, '30 seconds', '{pager}');
COMMIT;
SQL
)
  check "and leased by hand" "$([ -n "$pj_lease" ] && echo leased)" leased
  cpsql -qAt -c '\connect - app_dispatcher' \
    -c "SELECT keyturn.begin_dispatch_for('acme', '$pj', '$pj_lease')" \
    -c "SELECT keyturn.complete_for('acme', '$pj', '$pj_lease', 'unknown')" >/dev/null || return 1
  local ops
  ops=$(jwt "" ops app_operator)
  said=$(rpc "$ops" uncertain_actions '{}')
  check "uncertain_actions over /rpc lists it, with its tenant" \
    "${said%% *} $(field '" ".join(a["tenant"] for a in v if a["action_id"] == "'"$pj"'")' <<<"$said")" "200 acme"
  said=$(rpc "$ops" reconcile "{\"action_id\": \"$pj\", \"outcome\": \"failed\", \"note\": \"the pager has no record\"}")
  check "reconcile over /rpc, delegated to its tenant's worker" "$said" '200 "failed"'
  said=$(rpc "$ops" reconcile "{\"action_id\": \"$pj\", \"outcome\": \"failed\", \"note\": \"again\"}")
  check "once more: no longer uncertain" "${said%% *} $(field 'v["code"]' <<<"$said")" "409 55000"
  check "its events, the operator's last" \
    "$(cpsql -Atc "SELECT string_agg(to_status::text || ':' || db_role, ' ' ORDER BY id) FROM keyturn.event
                    WHERE tenant = 'acme' AND action_id = '$pj'")" \
    "pending:app_agent queued:app_human leased:app_dispatcher executing:app_dispatcher uncertain:app_dispatcher failed:app_operator"

  check "nothing logged at ERROR" "$(grep -c ' ERROR ' "$dir/keyturnd.log" || true)" 0
  [ $status -eq 0 ] || tail -n 30 "$dir/keyturnd.log"
  return $status
}

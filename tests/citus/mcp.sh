# shellcheck shell=bash
# keyturnd's /mcp on layout B (sourced by tests/citus/run, which defines
# cpsql, C, OUT, check, keyturnd_build and keyturnd_ready): an agent's JWT,
# the official MCP Python SDK client. keyturnd asks the database whether
# keyturn's tables are distributed and proposes with propose_for in the
# tenant the claims name, which Citus delegates to the tenant's worker with
# the claims asserted by a propagated SET LOCAL, as /rpc does. Alice's
# standing approval covers the first proposal, so it is approved there, in
# the same call; the second waits for her.

KT_CITUS_MCP_JWT_SECRET=citus-layer-mcp-jwt-secret-of-32-bytes-or-more

mcp_by_tenant() {
  local dir="$OUT/mcp" target port pid status=0
  mkdir -p "$dir"
  KT_SCRATCH=$dir kt_mcp_python
  if [ -n "${KT_MCP_UNAVAILABLE:-}" ]; then
    echo "SKIPPED b_mcp: $KT_MCP_UNAVAILABLE"
    [ -n "${KT_SKIPS:-}" ] && echo "b_mcp: $KT_MCP_UNAVAILABLE" >>"$KT_SKIPS"
    return 0
  fi
  target=$(keyturnd_build jwt) || return 1
  # The MCP login: NOINHERIT, the agent's role per request (app_agent, which
  # Citus may log in as on the workers); /rpc's login, which /mcp needs beside it.
  cpsql -q -c "CREATE ROLE citus_mcp LOGIN NOINHERIT IN ROLE app_agent" || return 1
  cpsql -q -c "DO \$\$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'citus_rpc') THEN
                 CREATE ROLE citus_rpc LOGIN NOINHERIT IN ROLE app_human, app_operator; END IF; END \$\$" || return 1
  local standing
  standing=$(cpsql -qAt <<'SQL'
\connect - app_human
BEGIN;
SET LOCAL citus.propagate_set_commands = 'local';
SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's-mcp';
-- Every path the proposals carry named (an empty scope covers nothing).
SELECT keyturn.delegate('deal_stage_routed',
  '{"params": {"where.tenant": {"eq": "acme"}, "where.id": {"any": true}, "set.stage": {"any": true}}}', 1, '1 hour');
COMMIT;
SQL
)
  check "alice's standing approval" "$([ -n "$standing" ] && echo made)" made

  port=$(kt_free_port)
  DATABASE_URL="postgres://app_dispatcher@127.0.0.1:$C/keyturn" \
  KEYTURN_LISTEN="127.0.0.1:$port" KEYTURN_JOURNAL=false \
  KEYTURN_JWT_SECRET=$KT_CITUS_MCP_JWT_SECRET KEYTURN_JWT_ROLES=app_human \
  KEYTURN_RPC_DATABASE_URL="postgres://citus_rpc@127.0.0.1:$C/keyturn" \
  KEYTURN_MCP_ROLES=app_agent KEYTURN_MCP_DATABASE_URL="postgres://citus_mcp@127.0.0.1:$C/keyturn" \
    "$target/debug/keyturnd" >"$dir/keyturnd.log" 2>&1 &
  pid=$!
  # shellcheck disable=SC2064 # the pid is known now
  trap "kill $pid 2>/dev/null || true" RETURN
  keyturnd_ready "$port" "$dir/keyturnd.log" || return 1

  local jwt said
  jwt=$("$target/debug/examples/jwt" --secret "$KT_CITUS_MCP_JWT_SECRET" \
    '{"role": "app_agent", "tenant_id": "acme", "sub": "alice", "session_id": "s-mcp"}') || return 1
  said=$(KT_JWT=$jwt KT_URL="http://127.0.0.1:$port/mcp" "$KT_MCP_PYTHON" - <<'PY'
import asyncio, os
import httpx2
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

async def main():
    http = httpx2.AsyncClient(headers={"Authorization": "Bearer " + os.environ["KT_JWT"]})
    async with Client(streamable_http_client(os.environ["KT_URL"], http_client=http)) as c:
        out = []
        for deal, stage in [(104, "won"), (102, "lost")]:
            r = await c.call_tool("deal_stage_routed", {"where": {"tenant": "acme", "id": deal}, "set": {"stage": stage}},
                                  meta={"conversation_id": "c-mcp"})
            s = r.structured_content or {}
            out.append(f"{s.get('status')}:{s.get('action_id')}:{r.is_error}")
        print(" ".join(out))

asyncio.run(main())
PY
)
  local first second
  read -r first second <<<"$said"
  check "a proposal over /mcp covered by the standing approval, on acme's worker" "${first%%:*} ${first##*:}" "succeeded False"
  check "the next one waits for alice" "${second%%:*} ${second##*:}" "pending False"
  local id1 id2
  id1=$(cut -d: -f2 <<<"$first"); id2=$(cut -d: -f2 <<<"$second")
  check "what the database holds" \
    "$(cpsql -Atc "SELECT string_agg(a.status::text || ':' || (a.origin ->> 'conversation_id'), ' ' ORDER BY a.created_at)
                     FROM keyturn.action a WHERE a.tenant = 'acme' AND a.id IN ('$id1', '$id2')") $(cpsql -Atc "SELECT stage FROM crm.deal WHERE tenant = 'acme' AND id = 104")" \
    "succeeded:c-mcp pending:c-mcp won"
  check "nothing logged at ERROR" "$(grep -c ' ERROR ' "$dir/keyturnd.log" || true)" 0
  [ $status -eq 0 ] || tail -n 30 "$dir/keyturnd.log"
  return $status
}

# shellcheck shell=bash
# Item 9 of tests/bench/run (`--only mcp`): keyturnd's MCP and notification
# surfaces, each against a baseline measured in the same run.
#   9a  an MCP write call (tools/call through /mcp, the official Python SDK)
#       ÷ the same propose in SQL (pgbench, propose.sql), latency p50 and p99
#   9b  keyturnd's VmRSS idle and with 100 MCP sessions open
#   9c  propose over MCP -> its notification at a webhook receiver
#       ÷ propose over MCP -> the webhook of an action a standing approval
#       approved at once
# The clients are tests/bench/mcp_bench.py. Sourced by tests/bench/run, after
# dispatch.sh (build_service, stop_pid, WEBHOOK_SECRET).

MCP_JWT_SECRET=bench-mcp-jwt-secret-0123456789abcdef
MCP_NOTIFY_SECRET=whsec_$(printf 'keyturn-bench-notify-secret-0032' | base64)
MCP_NOTIFY_TENANT=mcpn
MCP_NOTIFY_TOOL=email.send_delegable

# The word key=value of a line of mcp_bench.py's.
kv() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$2"; }

# keyturnd with /rpc, /mcp and the notification webhook on (the webhook
# adapter's requests go to the same receiver as the notifications, 9c's);
# waits until it answers /readyz. Sets MCP_KTD_PID and MCP_URL.
start_mcp_keyturnd() {
  local port i
  port=$(kt_free_port)
  env DATABASE_URL="postgres://app_dispatcher@127.0.0.1:$KT_PGPORT/keyturn" \
      KEYTURN_LISTEN="127.0.0.1:$port" KEYTURN_JOURNAL_DIR="$(kt_scratch)/keyturnd-mcp-journal" \
      KEYTURN_WEBHOOK_URL="http://127.0.0.1:$MCP_RECV_PORT/hook" KEYTURN_WEBHOOK_SECRET="$WEBHOOK_SECRET" \
      KEYTURN_JWT_SECRET="$MCP_JWT_SECRET" KEYTURN_JWT_ROLES=app_human \
      KEYTURN_RPC_DATABASE_URL="postgres://bench_rpc@127.0.0.1:$KT_PGPORT/keyturn" \
      KEYTURN_MCP_ROLES=app_agent KEYTURN_MCP_DATABASE_URL="postgres://bench_mcp@127.0.0.1:$KT_PGPORT/keyturn" \
      KEYTURN_PUBLIC_URL="http://127.0.0.1:$port" KEYTURN_NOTIFY_WEBHOOK_SECRET="$MCP_NOTIFY_SECRET" \
      KEYTURN_NOTIFY_ALLOW_NETWORKS=127.0.0.0/8 RUST_LOG=warn \
      "$BENCH_BIN/keyturnd" >> "$OUT/keyturnd-mcp.log" 2>&1 &
  MCP_KTD_PID=$!
  KT_PIDS="${KT_PIDS:-} $MCP_KTD_PID"
  MCP_URL="http://127.0.0.1:$port/mcp"
  for i in $(seq 100); do
    curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && return 0
    kill -0 "$MCP_KTD_PID" 2>/dev/null || break
    sleep 0.1
  done
  log "keyturnd (MCP) did not become ready; see keyturnd-mcp.log"
  return 1
}

# The logins keyturnd's /rpc and /mcp run on (the MCP role is app_agent, the
# role propose.sql sets, so both sides of 9a propose as the same role), and
# 9c's tenant: per round one person waited for, with a webhook channel, and
# one whose standing approval covers the proposals.
mcp_setup() {
  local rounds=$1 uses=$2 r
  kt_psql -q <<SQL >/dev/null
CREATE ROLE bench_rpc LOGIN NOINHERIT IN ROLE app_human;
CREATE ROLE bench_mcp LOGIN NOINHERIT IN ROLE app_agent;
-- email.send as setup.sql registers it, and delegable: it is irreversible,
-- which a standing approval covers only when the tool says so.
SELECT keyturn.register_tool('$MCP_NOTIFY_TOOL', '{
    "executor": "external", "provider": "webhook", "delegable": true,
    "summary": "Send email to {to} about \\"{subject}\\"",
    "params_schema": {"type": "object", "required": ["to", "subject"],
        "properties": {"to": {"type": "string", "format": "email"}, "subject": {"type": "string", "maxLength": 200},
                       "body": {"type": "string", "maxLength": 10000}}}}');
SELECT count(*) FROM (SELECT keyturn.add_member('$MCP_NOTIFY_TENANT', w || r, 'member'),
                             keyturn.grant_tool('$MCP_NOTIFY_TENANT', w || r, '$MCP_NOTIFY_TOOL')
                        FROM unnest(ARRAY['n', 'd']) w, generate_series(1, $rounds) r) s;
SQL
  {
    echo "SET SESSION AUTHORIZATION app_human;"
    for r in $(seq 1 "$rounds"); do
      cat <<SQL
BEGIN;
SELECT set_config('keyturn.tenant', '$MCP_NOTIFY_TENANT', true), set_config('keyturn.principal', 'n$r', true), set_config('keyturn.session', 'web', true);
SELECT keyturn.set_notify('webhook', 'http://127.0.0.1:$MCP_RECV_PORT/notify/n$r', '{"max_per_hour": 1000}');
COMMIT;
BEGIN;
SELECT set_config('keyturn.tenant', '$MCP_NOTIFY_TENANT', true), set_config('keyturn.principal', 'd$r', true), set_config('keyturn.session', 'web', true);
SELECT keyturn.delegate('$MCP_NOTIFY_TOOL', '{"params": {"to": {"any": true}, "subject": {"any": true}, "body": {"any": true}}}', $uses, '1 hour');
COMMIT;
SQL
    done
  } | kt_psql -q >/dev/null
}

# What 9c leaves waiting is cancelled with its channels (nothing is sent for
# a removed channel), so no later item's dispatcher sees it.
mcp_teardown() {
  local rounds=$1 r
  {
    echo "SET SESSION AUTHORIZATION app_human;"
    for r in $(seq 1 "$rounds"); do
      echo "BEGIN; SELECT set_config('keyturn.tenant', '$MCP_NOTIFY_TENANT', true), set_config('keyturn.principal', 'n$r', true), set_config('keyturn.session', 'web', true);"
      echo "SELECT keyturn.remove_notify('webhook'); COMMIT;"
    done
  } | kt_psql -q >/dev/null
}

# 9a, one round at $1 clients: the MCP side, then the SQL side.
mcp_call_round() {
  local c=$1 r=$2 dir="$OUT/mcp" said threads tps
  said=$("$KT_MCP_PYTHON" "$BENCH/mcp_bench.py" call --url "$MCP_URL" --keyturnd "$BENCH_BIN/keyturnd" \
           --secret "$MCP_JWT_SECRET" --tenant acme --clients "$c" --seconds "$DUR" --pid "$MCP_KTD_PID" \
           --out "$dir/call-mcp-c$c-r$r.ms" 2>>"$dir/mcp_bench.log") || { log "mcp call c=$c r=$r failed; see mcp/mcp_bench.log"; return 1; }
  printf 'mcp-call\tmcp\t%s\t%s\t%s\t%s\t0\t0\t%s\n' "$c" "$r" "$(kv per_s "$said")" "$(kv n "$said")" "$said" >> "$RESULTS"
  echo "c=$c round $r MCP: $said" | tee -a "$OUT/mcp.txt"

  threads=$(( c < 2 ? 1 : 2 ))
  "$PGBENCH" -h 127.0.0.1 -p "$KT_PGPORT" -U bench_mcp -n -M prepared -c "$c" -j "$threads" -T "$DUR" \
    -f "$BENCH/pgbench/propose.sql" -l --log-prefix "$dir/sql-c$c-r$r" keyturn > "$dir/sql-c$c-r$r.out" 2>&1 || {
      cat "$dir/sql-c$c-r$r.out" >&2; return 1; }
  tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$dir/sql-c$c-r$r.out")
  said="$(python3 "$BENCH/mcp_bench.py" latency "$dir/sql-c$c-r$r".*[0-9]) per_s=$(printf '%.1f' "$tps")"
  printf 'mcp-call\tsql\t%s\t%s\t%s\t%s\t0\t0\t%s\n' "$c" "$r" "$tps" "$(kv n "$said")" "$said" >> "$RESULTS"
  echo "c=$c round $r SQL: $said" | tee -a "$OUT/mcp.txt"
}

item_mcp() {
  mkdir -p "$OUT/mcp"
  : > "$OUT/mcp.txt"
  kt_mcp_python
  if [ -n "${KT_MCP_UNAVAILABLE:-}" ]; then
    echo "skipped: the MCP Python SDK cannot be had: $KT_MCP_UNAVAILABLE" | tee "$OUT/mcp.txt"
    return 0
  fi
  clear_queue  # earlier items' approved actions would reach 9c's receiver
  build_service || { echo "skipped: keyturnd does not build; see service-build.log" | tee "$OUT/mcp.txt"; return 0; }
  local c r said n=${MCP_NOTIFY_N:-$([ "$MODE" = quick ] && echo 200 || echo 500)} warm=5
  MCP_RECV_PORT=$(kt_free_port)
  "$KT_MCP_PYTHON" -c 'import importlib.metadata as m, sys; print("client: PyPI mcp", m.version("mcp"), "on Python", sys.version.split()[0])' |
    tee -a "$OUT/mcp.txt"
  mcp_setup "$ROUNDS" "$(( n + warm ))"
  start_mcp_keyturnd || { echo "skipped: keyturnd with /mcp did not start; see keyturnd-mcp.log" | tee -a "$OUT/mcp.txt"; return 0; }

  for c in ${MCP_CLIENTS:-1 16}; do
    for r in $(seq 1 "$ROUNDS"); do
      log "mcp: tools/call vs SQL propose, c=$c round $r"
      mcp_call_round "$c" "$r"
    done
  done

  log "mcp: propose -> notification vs propose -> approved action's webhook, $n each a round"
  "$KT_MCP_PYTHON" "$BENCH/mcp_bench.py" notify --url "$MCP_URL" --keyturnd "$BENCH_BIN/keyturnd" \
      --secret "$MCP_JWT_SECRET" --tenant "$MCP_NOTIFY_TENANT" --tool "$MCP_NOTIFY_TOOL" \
      --port "$MCP_RECV_PORT" --rounds "$ROUNDS" --n "$n" --warmup "$warm" 2>>"$OUT/mcp/mcp_bench.log" |
    while read -r said; do
      printf 'mcp-notify\t%s\t1\t%s\t\t%s\t0\t0\t%s\n' "$(kv variant "$said")" "$(kv round "$said")" "$(kv n "$said")" "$said" >> "$RESULTS"
      echo "notify: $said" | tee -a "$OUT/mcp.txt"
    done
  mcp_teardown "$ROUNDS"
  stop_pid "$MCP_KTD_PID"

  # A keyturnd of its own each round: "idle" is one that has served nothing.
  for r in $(seq 1 "$ROUNDS"); do
    start_mcp_keyturnd
    said=$("$KT_MCP_PYTHON" "$BENCH/mcp_bench.py" sessions --url "$MCP_URL" --keyturnd "$BENCH_BIN/keyturnd" \
             --secret "$MCP_JWT_SECRET" --tenant acme --pid "$MCP_KTD_PID" --n "${MCP_SESSIONS:-100}" 2>>"$OUT/mcp/mcp_bench.log") ||
      log "mcp sessions round $r failed; see mcp/mcp_bench.log"
    stop_pid "$MCP_KTD_PID"
    printf 'mcp-rss\tsessions\t%s\t%s\t\t\t0\t0\t%s\n' "${MCP_SESSIONS:-100}" "$r" "$said" >> "$RESULTS"
    echo "rss round $r: $said" | tee -a "$OUT/mcp.txt"
  done
}

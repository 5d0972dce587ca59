# shellcheck shell=bash
# Item `latency` of tests/bench/run (issue 33): measurement only.
#
#   1. p50 and p99 of propose alone and of approve alone, keyturn ÷ the lean
#      flow's corresponding transaction, at LATENCY_CLIENTS (default 1 16),
#      per-transaction latencies from pgbench -l (mcp_bench.py latency; each
#      client's first transaction is left out). Every round runs, in turn:
#      propose A (gate_propose.sql), propose B (lean_propose.sql), then makes
#      keyturn's pending supply and runs approve A (gate_approve.sql), then
#      makes the lean supply and runs approve B (lean_approve.sql).
#   2. The gate flow ÷ the hand-written flow at FLOW_WIDE_CLIENTS (default 64),
#      as item `flow` at 1/4/16: the same pair, the same results rows.
#   3. Statements executed per gate flow: pg_stat_statements with track = all
#      (bench_app's role setting) over one short 4-client gate flow run; the
#      sum of calls, top level and nested, ÷ the flows pgbench completed
#      (-M extended, so that each BEGIN, SET LOCAL ROLE and COMMIT counts).
# Sourced by tests/bench/run.

# One pgbench run with -l; appends a results row whose extra holds
# n= p50_ms= p99_ms= per_s=. Args: item variant clients round script login [pgbench args…]
latency_run() {
  local item=$1 variant=$2 clients=$3 round=$4 script=$5 login=$6
  shift 6
  local threads=$(( clients < 2 ? 1 : 2 )) dir="$OUT/latency" w0 c0 w1 c1 tps n failed said
  local prefix="$dir/$item-$variant-c$clients-r$round"
  mkdir -p "$dir"
  rm -f "$prefix".*
  read -r w0 c0 < <(kt_psql -Atc "SELECT wal_bytes, (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter) FROM pg_stat_wal" | tr '|' ' ')
  "$PGBENCH" -h 127.0.0.1 -p "$KT_PGPORT" -U "$login" -n -M prepared -c "$clients" -j "$threads" \
    -f "$BENCH/pgbench/$script" -l --log-prefix "$prefix" "$@" keyturn > "$prefix.out" 2>&1 || {
      cat "$prefix.out" >&2; return 1; }
  read -r w1 c1 < <(kt_psql -Atc "SELECT wal_bytes, (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter) FROM pg_stat_wal" | tr '|' ' ')
  tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$prefix.out")
  n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$prefix.out")
  failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$prefix.out")
  if [ -n "$failed" ] && [ "$failed" != 0 ]; then log "WARNING: $failed failed transactions in $prefix.out"; fi
  said="$(python3 "$BENCH/mcp_bench.py" latency "$prefix".[0-9]*) per_s=$(printf '%.1f' "$tps")"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$item" "$variant" "$clients" "$round" \
    "$tps" "$n" "$(( w1 - w0 ))" "$(( c1 - c0 ))" "$said" >> "$RESULTS"
  echo "$item $variant c=$clients r=$round: $said, $(( c1 - c0 )) checkpoints" | tee -a "$OUT/latency.txt" >&2
}

# keyturn's supply: $2 pending proposals of deal.set_stage for each of $1
# clients, client c proposing as p<c> in session s<c> (as gate_flow.sql does),
# each of a deal of its own (c * n + k), so that no write between propose and
# approve changes its before-state (a changed row would settle as 'conflict').
supply_gate() {
  local clients=$1 n=$2 c
  {
    echo "TRUNCATE bare.pending;"
    for c in $(seq 0 $(( clients - 1 ))); do
      cat <<SQL
BEGIN;
SET LOCAL ROLE app_agent;
SELECT set_config('keyturn.tenant', 'acme', true), set_config('keyturn.principal', 'p$c', true), set_config('keyturn.session', 's$c', true) \\gset
INSERT INTO bare.pending (side, client, k, action_id, token)
SELECT 'gate', $c, g, p.action_id, p.token
  FROM generate_series(1, $n) g,
       LATERAL keyturn.propose('deal.set_stage', jsonb_build_object('where', jsonb_build_object('id', $c * $n + g),
               'set', jsonb_build_object('stage', (ARRAY['lead', 'qualified', 'negotiation', 'won'])[1 + g % 4]))) p;
COMMIT;
SQL
    done
    echo "ANALYZE bare.pending;"
  } | kt_psql -q >/dev/null
}

# The lean supply: the same deals and stages, as bare.proposal rows.
supply_lean() {
  local clients=$1 n=$2
  kt_psql -q >/dev/null <<SQL
TRUNCATE bare.pending;
WITH s AS (SELECT c, g, gen_random_uuid() AS id,
                  jsonb_build_object('where', jsonb_build_object('id', c * $n + g),
                    'set', jsonb_build_object('stage', (ARRAY['lead', 'qualified', 'negotiation', 'won'])[1 + g % 4])) AS params
             FROM generate_series(0, $clients - 1) c, generate_series(1, $n) g),
     ins AS (INSERT INTO bare.proposal (id, tenant, principal, tool, params, params_hash)
             SELECT id, 'acme', 'p' || c, 'deal.set_stage', params, encode(sha256(convert_to(params::text, 'UTF8')), 'hex') FROM s)
INSERT INTO bare.pending (side, client, k, action_id) SELECT 'lean', c, g, id FROM s;
ANALYZE bare.pending;
SQL
}

item_latency() {
  local c r n per
  : > "$OUT/latency.txt"
  for c in ${LATENCY_CLIENTS:-1 16}; do
    for r in $(seq 1 "$ROUNDS"); do
      log "latency: propose and approve alone, keyturn vs lean, c=$c round $r"
      latency_run lat-propose gate "$c" "$r" gate_propose.sql bench_app -T "$DUR"
      latency_run lat-propose lean "$c" "$r" lean_propose.sql bench_lean -T "$DUR"
      # Approves per client: as many as keyturn's propose ran in this round
      # (the timed approve runs then last about as long), at most one deal each.
      n=$(awk -F'\t' -v c="$c" -v r="$r" '$1 == "lat-propose" && $2 == "gate" && $3 == c && $4 == r { print $6 }' "$RESULTS")
      per=$(( ${n:-0} / c ))
      [ "$per" -gt $(( 100000 / c )) ] && per=$(( 100000 / c ))
      [ "$per" -lt 50 ] && per=50
      supply_gate "$c" "$per"
      latency_run lat-approve gate "$c" "$r" gate_approve.sql bench_app -D k=0 -t "$per"
      kt_psql -Atc "SELECT 'gate approve outcomes c=$c r=$r: ' || string_agg(status || '=' || n, ', ') FROM (SELECT a.status, count(*) n FROM bare.pending t JOIN keyturn.action a ON a.id = t.action_id GROUP BY 1 ORDER BY 1) s" | tee -a "$OUT/latency.txt" >&2
      supply_lean "$c" "$per"
      latency_run lat-approve lean "$c" "$r" lean_approve.sql bench_lean -D k=0 -t "$per"
      kt_psql -Atc "SELECT 'lean approve outcomes c=$c r=$r: ' || string_agg(status || '=' || n, ', ') FROM (SELECT p.status, count(*) n FROM bare.pending t JOIN bare.proposal p ON p.id = t.action_id GROUP BY 1 ORDER BY 1) s" | tee -a "$OUT/latency.txt" >&2
    done
  done
  kt_psql -qc "TRUNCATE bare.pending" >/dev/null

  for c in ${FLOW_WIDE_CLIENTS:-64}; do pair flow "$c" gate_flow.sql bare_flow.sql; done

  log "latency: statements per gate flow (pg_stat_statements, track = all, 4 clients)"
  kt_psql -qc "ALTER ROLE bench_app SET pg_stat_statements.track = 'all'" >/dev/null
  kt_psql -qc "SELECT pg_stat_statements_reset()" >/dev/null
  # -M extended: under -M prepared, pg_stat_statements (PostgreSQL 15) counts
  # a prepared utility statement (BEGIN, SET LOCAL ROLE, COMMIT) once, not at
  # each execution; nested statements count the same either way. (-M simple
  # would paste :action_id into approve's text unquoted.)
  "$PGBENCH" -h 127.0.0.1 -p "$KT_PGPORT" -U bench_app -n -M extended -c 4 -j 2 -T "${STMT_SECONDS:-8}" \
    -f "$BENCH/pgbench/gate_flow.sql" keyturn > "$OUT/statements-pgbench.log" 2>&1 || true
  kt_psql -qc "ALTER ROLE bench_app RESET pg_stat_statements.track" >/dev/null
  n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$OUT/statements-pgbench.log")
  if [ "${n:-0}" = 0 ] || grep -q 'aborted' "$OUT/statements-pgbench.log"; then
    log "latency: the statement count run failed; see statements-pgbench.log"
    return 0
  fi
  kt_psql -At -c "
    SELECT 'flows=$n calls=' || sum(calls) || ' top=' || sum(calls) FILTER (WHERE toplevel)
           || ' nested=' || coalesce(sum(calls) FILTER (WHERE NOT toplevel), 0)
           || ' per_flow=' || round(sum(calls)::numeric / $n, 2)
           || ' top_per_flow=' || round((sum(calls) FILTER (WHERE toplevel))::numeric / $n, 2)
           || ' nested_per_flow=' || round(coalesce(sum(calls) FILTER (WHERE NOT toplevel), 0)::numeric / $n, 2)
           || ' deallocated=' || (SELECT dealloc FROM pg_stat_statements_info)
      FROM pg_stat_statements" > "$OUT/statements.txt"
  kt_psql -P pager=off -c "
    SELECT round(calls::numeric / $n, 2) AS per_flow, toplevel AS top,
           regexp_replace(left(query, 140), '\s+', ' ', 'g') AS query
      FROM pg_stat_statements WHERE calls >= $n / 10
     ORDER BY toplevel DESC, calls DESC, query" > "$OUT/statements-per-flow.txt"
  log "latency: $(cat "$OUT/statements.txt")"
}

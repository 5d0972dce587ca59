# shellcheck shell=bash
# Items 3, 4 and 6 of tests/bench/run: keyturnd's drain rate against a bare
# worker, wake-up latency with LISTEN/NOTIFY and with polling only, and
# keyturnd's peak RSS during the drain. Sourced by tests/bench/run.

BENCH_BIN="$CARGO_TARGET_DIR/release"
WEBHOOK_SECRET=bench-secret

build_service() {
  log "building keyturnd and the benchmark examples (release)"
  (cd "$KT_ROOT" && cargo build -q --release -p keyturnd --bin keyturnd \
     --example receiver --example bench_worker --example bench_wakeup) > "$OUT/service-build.log" 2>&1 || {
    tail -30 "$OUT/service-build.log" >&2; return 1; }
}

# Proposes $1 external actions as p0/s0 and records their tokens in bare.token
# (approved too when $2 = approve, with the NOTIFY switched off: no listener yet).
queue_actions() {
  local n=$1 approve=${2:-}
  kt_psql -q -v n="$n" <<'SQL'
SET session_replication_role = replica;
TRUNCATE bare.token, bare.job;
RESET session_replication_role;
BEGIN;
SET LOCAL ROLE app_agent;
SELECT set_config('keyturn.tenant', 'acme', true), set_config('keyturn.principal', 'p0', true), set_config('keyturn.session', 's0', true) \gset
INSERT INTO bare.token (n, action_id, token)
SELECT g, p.action_id, p.token
  FROM generate_series(1, :n) g,
       LATERAL keyturn.propose('email.send', jsonb_build_object('to', 'ann' || g || '@example.com',
               'subject', 'Q3 numbers', 'body', 'Hi Ann, the Q3 numbers are attached. Best, Bob')) p;
COMMIT;
SQL
  if [ "$approve" = approve ]; then
    # The person approves from a session of their own: keyturn refuses a
    # session whose login (this superuser) could act as an agent.
    # keyturn.notify is the superuser's to set, so it is set first.
    kt_psql -q <<'SQL'
SET keyturn.notify = off;
SET SESSION AUTHORIZATION app_human;
BEGIN;
SELECT set_config('keyturn.tenant', 'acme', true), set_config('keyturn.principal', 'p0', true), set_config('keyturn.session', 's0', true) \gset
SELECT count(*) AS queued FROM bare.token t, LATERAL keyturn.approve(t.action_id, t.token) a WHERE a.status = 'queued' \gset
COMMIT;
RESET SESSION AUTHORIZATION;
-- The same jobs, as the bare worker's plain queue.
INSERT INTO bare.job (id, tenant, tool, params, idempotency_key)
SELECT a.id, a.tenant, a.tool, a.params, a.idempotency_key
  FROM keyturn.action a JOIN bare.token t ON t.action_id = a.id;
VACUUM ANALYZE keyturn.action;
VACUUM ANALYZE bare.job;
CHECKPOINT;
SQL
  fi
}

start_receiver() {
  RECV_PORT=$(kt_free_port)
  "$BENCH_BIN/examples/receiver" --listen "127.0.0.1:$RECV_PORT" --secret "$WEBHOOK_SECRET" \
    > "$OUT/receiver.log" 2>&1 &
  RECV_PID=$!
  KT_PIDS="${KT_PIDS:-} $RECV_PID"
  sleep 0.5
}

# keyturnd in the background; extra VAR=value arguments go to its environment.
start_keyturnd() {
  local url=$1
  shift
  KTD_PORT=$(kt_free_port)
  env DATABASE_URL="postgres://app_dispatcher@127.0.0.1:$KT_PGPORT/keyturn" \
      KEYTURN_LISTEN="127.0.0.1:$KTD_PORT" KEYTURN_WEBHOOK_URL="$url" \
      KEYTURN_WEBHOOK_SECRET="$WEBHOOK_SECRET" KEYTURN_JOURNAL_DIR="$(kt_scratch)/keyturnd-journal" \
      RUST_LOG=warn "$@" \
      "$BENCH_BIN/keyturnd" >> "$OUT/keyturnd.log" 2>&1 &
  KTD_PID=$!
  KT_PIDS="${KT_PIDS:-} $KTD_PID"
}

# CPU time of process $1 so far, in clock ticks (utime + stime; 0 when gone).
pid_ticks() {
  awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0
}

# Busy clock ticks of the whole machine so far, and apart the ticks the
# hypervisor took ("steal": our virtual CPUs wanted to run and the host ran
# something else), as "busy steal" (/proc/stat's cpu line: user, nice,
# system, irq, softirq; steal). Steal used to be counted as busy, so a side
# that a noisy neighbour slowed read as one that used more CPU an action.
busy_ticks() {
  awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $9}' /proc/stat
}

# "$1 ticks over $2 items" as milliseconds per item.
ms_per() {
  python3 -c "import os; print(round($1 * 1000 / os.sysconf('SC_CLK_TCK') / max($2, 1), 3))"
}

stop_pid() {
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# Seconds (and peak RSS of $2, if given) until the query $1 answers 0.
# One connection asks, every 100 ms: a psql started for each question cost
# the machine a few per cent of its CPU, which only keyturnd's side paid
# (the bare worker exits when its queue is empty). VmHWM is the peak, so
# it is read once, at the end.
wait_drained() {
  local q=$1 pid=${2:-} t0 left hwm=0
  t0=$(date +%s.%N)
  coproc POLL { kt_psql -qAt 2>&1; }
  while :; do
    echo "$q;" >&"${POLL[1]}"
    IFS= read -r -t 60 left <&"${POLL[0]}" || { log "the drain's poll got no answer"; break; }
    [ "$left" = 0 ] && break
    sleep 0.1
    if (( $(date +%s) - ${t0%.*} > 600 )); then log "drain did not finish in 600 s ($left left)"; break; fi
  done
  local secs
  secs=$(python3 -c "import time; print(round(time.time() - $t0, 3))")
  if [ -n "$pid" ] && [ -r "/proc/$pid/status" ]; then
    hwm=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
  fi
  exec {POLL[1]}>&-
  wait "$POLL_PID" 2>/dev/null || true
  echo "$secs ${hwm:-0}"
}

# Earlier items (7) leave approved external actions queued with no consumer:
# settle them out of band so a drain only sees its own batch.
clear_queue() {
  kt_psql -q <<'SQL'
SET session_replication_role = replica;
UPDATE keyturn.action SET status = 'cancelled', updated_at = now() WHERE status IN ('pending', 'queued', 'leased', 'executing');
DELETE FROM keyturn.open_action WHERE status IN ('pending', 'queued', 'leased', 'executing');
RESET session_replication_role;
-- What autovacuum would do within a minute: without it every lease of the next
-- item skips the dead entries of the rows just removed.
VACUUM ANALYZE keyturn.open_action;
SQL
}

# What autovacuum has finished so far, as "table=runs …" (vacuums and
# analyzes of every table that had one): a drain's side that a vacuum of a
# big table ran beside pays that CPU in its machine figure, and the tables'
# statistics it leaves change the plans of the sides after it.
maintenance_runs() {
  kt_psql -Atc "SELECT coalesce(string_agg(relid::regclass::text || '=' || (autovacuum_count + autoanalyze_count), ' ' ORDER BY relid::regclass::text), '')
                  FROM pg_stat_all_tables WHERE autovacuum_count + autoanalyze_count > 0"
}

# "autovacuum meanwhile: <table runs, …> (<n> running at the end)" between
# two maintenance_runs answers.
maintenance_between() {
  local running
  running=$(kt_psql -Atc "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'")
  python3 - "$1" "$2" "$running" <<'PY'
import sys
def runs(s):
    return {k: int(v) for k, v in (kv.split("=") for kv in s.split())}
before, after = runs(sys.argv[1]), runs(sys.argv[2])
done = {t: n - before.get(t, 0) for t, n in after.items() if n > before.get(t, 0)}
print("autovacuum meanwhile: %s (%s running at the end)"
      % (", ".join("%s %d" % kv for kv in sorted(done.items())) or "none", sys.argv[3]))
PY
}

# Queues $DRAIN_N approved actions and drains them with keyturnd at $2 slots,
# round $3, results variant $4 (A: as configured by default; A1: the other
# side, one lease step at a time unless DRAIN_A1_ENV says otherwise), extra
# VAR=value arguments to keyturnd's environment (kept in the results row).
drain_keyturnd() {
  local url=$1 w=$2 r=$3 variant=$4 n=$DRAIN_N secs hwm w0 w1 b0 b1 s0 s1 r0 r1 k1 ok m0 m1
  shift 4
  log "drain round $r, $w slots, keyturnd ($variant): queueing $n approved actions"
  queue_actions "$n" approve
  # The rate counts this side's set; anything else queued would be drained
  # in its time too.
  local queued
  queued=$(kt_psql -Atc "SELECT count(*) FROM keyturn.open_action WHERE status IN ('queued', 'leased', 'executing')")
  [ "$queued" = "$n" ] || log "WARNING: $queued actions to drain, not $n: this side's rate is wrong"
  w0=$(kt_psql -Atc "SELECT wal_bytes FROM pg_stat_wal"); m0=$(maintenance_runs)
  read -r b0 s0 < <(busy_ticks); r0=$(pid_ticks "$RECV_PID")
  start_keyturnd "$url" KEYTURN_WORKERS="$w" "$@"
  read -r secs hwm < <(wait_drained "SELECT count(*) FROM keyturn.open_action WHERE status IN ('queued', 'leased', 'executing')" "$KTD_PID")
  read -r b1 s1 < <(busy_ticks); r1=$(pid_ticks "$RECV_PID"); k1=$(pid_ticks "$KTD_PID")
  w1=$(kt_psql -Atc "SELECT wal_bytes FROM pg_stat_wal"); m1=$(maintenance_runs)
  stop_pid "$KTD_PID"
  ok=$(kt_psql -Atc "SELECT count(*) FROM keyturn.action a JOIN bare.token t ON t.action_id = a.id WHERE a.status = 'succeeded'")
  printf 'drain\t%s\t%s\t%s\t%s\t%s\t%s\t0\trss_kib=%s env=%s\n' "$variant" "$w" "$r" "$(python3 -c "print(round($ok / $secs, 1))")" "$ok" "$(( w1 - w0 ))" "$hwm" "$(IFS=,; echo "$*")" >> "$RESULTS"
  echo "round $r, $w slots, keyturnd ($variant): $ok/$n succeeded in ${secs}s = $(python3 -c "print(round($ok / $secs))") actions/s, WAL $(( (w1 - w0) / (ok > 0 ? ok : 1) )) B/action, peak RSS $(( hwm / 1024 )) MiB, CPU ms/action: machine $(ms_per $(( b1 - b0 )) "$ok") (stolen by the host $(ms_per $(( s1 - s0 )) "$ok")), keyturnd $(ms_per "$k1" "$ok"), receiver $(ms_per $(( r1 - r0 )) "$ok"); $(maintenance_between "$m0" "$m1")" | tee -a "$OUT/drain.txt"
}

# Each round, for each $w of DRAIN_WORKERS (8, keyturnd's default, and 64,
# for a provider that takes that many requests at once), queues approved actions and drains them
# with keyturnd (A) and then with the bare worker (B), each with $w provider
# calls in flight (the results' clients column is the slots). At the slots of
# DRAIN_ONE_STEP (default 64) keyturnd also drains with one lease step at a
# time (A1, KEYTURN_LEASE_STEPS=1, 0.2.0's loop; DRAIN_A1_ENV="VAR=value …"
# sets another environment for that side), before A in odd rounds and after
# it in even ones.
item_drain() {
  clear_queue
  build_service || { echo "PENDING: keyturnd or the examples do not build; see service-build.log" > "$OUT/drain.txt"; return 0; }
  start_receiver
  local url="http://127.0.0.1:$RECV_PORT/hook" r w secs n=$DRAIN_N rounds=${DRAIN_ROUNDS:-$(( ROUNDS < 3 ? ROUNDS : 3 ))}
  : > "$OUT/drain.txt"
  for r in $(seq 1 "$rounds"); do
    for w in ${DRAIN_WORKERS:-8 64}; do
      local one_step=""
      [[ " ${DRAIN_ONE_STEP-64} " == *" $w "* ]] && one_step=1
      [ -n "$one_step" ] && (( r % 2 == 1 )) && drain_keyturnd "$url" "$w" "$r" A1 ${DRAIN_A1_ENV:-KEYTURN_LEASE_STEPS=1}
      drain_keyturnd "$url" "$w" "$r" A
      [ -n "$one_step" ] && (( r % 2 == 0 )) && drain_keyturnd "$url" "$w" "$r" A1 ${DRAIN_A1_ENV:-KEYTURN_LEASE_STEPS=1}

      # The bare worker drains bare.job, which holds a copy of the set the
      # last keyturnd side drained (queue_actions); queueing a set for it
      # would leave the set's actions queued for the next keyturnd side.
      log "drain round $r, $w slots, bare worker: the same $n actions"
      local w0 w1 b0 b1 s0 s1 r0 r1 t0 out ok m0 m1
      w0=$(kt_psql -Atc "SELECT wal_bytes FROM pg_stat_wal"); m0=$(maintenance_runs)
      t0=$(date +%s.%N)
      read -r b0 s0 < <(busy_ticks); r0=$(pid_ticks "$RECV_PID")
      out=$("$BENCH_BIN/examples/bench_worker" --database-url "postgres://app_dispatcher@127.0.0.1:$KT_PGPORT/keyturn" \
              --webhook-url "$url" --secret "$WEBHOOK_SECRET" --workers "$w" --exit-when-empty 2>>"$OUT/bench_worker.log")
      secs=$(python3 -c "import time; print(round(time.time() - $t0, 3))")
      read -r b1 s1 < <(busy_ticks); r1=$(pid_ticks "$RECV_PID")
      w1=$(kt_psql -Atc "SELECT wal_bytes FROM pg_stat_wal"); m1=$(maintenance_runs)
      ok=$(kt_psql -Atc "SELECT count(*) FROM bare.job WHERE status = 'succeeded'")
      printf 'drain\tB\t%s\t%s\t%s\t%s\t%s\t0\t%s\n' "$w" "$r" "$(python3 -c "print(round($ok / $secs, 1))")" "$ok" "$(( w1 - w0 ))" "$out" >> "$RESULTS"
      echo "round $r, $w slots, bare worker: $ok/$n succeeded in ${secs}s = $(python3 -c "print(round($ok / $secs))") jobs/s, WAL $(( (w1 - w0) / (ok > 0 ? ok : 1) )) B/job, CPU ms/job: machine $(ms_per $(( b1 - b0 )) "$ok") (stolen by the host $(ms_per $(( s1 - s0 )) "$ok")), receiver $(ms_per $(( r1 - r0 )) "$ok"); $(maintenance_between "$m0" "$m1") ($out)" | tee -a "$OUT/drain.txt"
    done
  done
  drain_profile "$url" "$(( n / 4 ))"
  curl -s "http://127.0.0.1:$RECV_PORT/stats" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("receiver: total", d["total"], "bad signatures", d["bad_signatures"], "duplicates", d["duplicates"])' | tee -a "$OUT/drain.txt" || true
  stop_pid "$RECV_PID"
}

# Where a drained action's database time goes (profile-drain.txt; not a
# measured round: the tracking has a price of its own): keyturnd's statements
# and, apart, the statements keyturn's functions and triggers run under them
# (pg_stat_statements, track = all: a nested statement's time is also in its
# caller's; it is counted under the role it ran as, the extension owner, and
# nothing else runs nested statements while the profile drains), and keyturn's functions (track_functions, total and self time,
# the difference of two snapshots) over one more drain of $2 actions, each
# divided by the actions drained.
drain_profile() {
  local url=$1 n=$2 secs hwm
  log "drain profile: $n actions, the dispatcher's statements and functions tracked"
  queue_actions "$n" approve
  kt_psql -q <<'SQL' >/dev/null
ALTER ROLE app_dispatcher SET pg_stat_statements.track = 'all';
ALTER ROLE app_dispatcher SET track_functions = 'all';
SELECT pg_stat_statements_reset();
DROP TABLE IF EXISTS bare.functions_before;
CREATE TABLE bare.functions_before AS SELECT funcid, calls, total_time, self_time FROM pg_stat_user_functions;
SQL
  start_keyturnd "$url"
  read -r secs hwm < <(wait_drained "SELECT count(*) FROM keyturn.open_action WHERE status IN ('queued', 'leased', 'executing')" "$KTD_PID")
  stop_pid "$KTD_PID"
  sleep 1  # the exiting backends report their function counters
  {
    echo "$n actions drained in ${secs} s with the tracking on; times in ms per drained action"
    kt_psql -q -P pager=off -v n="$n" <<'SQL'
ALTER ROLE app_dispatcher RESET pg_stat_statements.track;
ALTER ROLE app_dispatcher RESET track_functions;
SELECT calls, round((calls::numeric / :n), 3) AS calls_per_action,
       round((total_exec_time / calls)::numeric, 3) AS ms_per_call,
       round((total_exec_time / :n)::numeric, 4) AS ms_per_action,
       regexp_replace(left(query, 90), '\s+', ' ', 'g') AS statement
  FROM pg_stat_statements
 WHERE userid = 'app_dispatcher'::regrole AND calls > 0 AND toplevel
 ORDER BY total_exec_time DESC LIMIT 10;
SELECT round(sum(total_exec_time)::numeric / :n, 4) AS database_ms_per_action
  FROM pg_stat_statements WHERE userid = 'app_dispatcher'::regrole AND toplevel;
\echo 'The statements run under them (nested), by time:'
SELECT calls, round((calls::numeric / :n), 3) AS calls_per_action,
       round((total_exec_time / calls)::numeric, 4) AS ms_per_call,
       round((total_exec_time / :n)::numeric, 4) AS ms_per_action,
       regexp_replace(left(query, 110), '\s+', ' ', 'g') AS statement
  FROM pg_stat_statements
 WHERE calls > 0 AND NOT toplevel
 ORDER BY total_exec_time DESC LIMIT 25;
SELECT f.funcname AS function, f.calls - coalesce(b.calls, 0) AS calls,
       round(((f.total_time - coalesce(b.total_time, 0)) / :n)::numeric, 4) AS total_ms_per_action,
       round(((f.self_time - coalesce(b.self_time, 0)) / :n)::numeric, 4) AS self_ms_per_action
  FROM pg_stat_user_functions f LEFT JOIN bare.functions_before b USING (funcid)
 WHERE f.calls > coalesce(b.calls, 0)
 ORDER BY f.total_time - coalesce(b.total_time, 0) DESC LIMIT 20;
SQL
  } > "$OUT/profile-drain.txt" 2>&1
}

# Item 3b, the price of a dispatch step by its size: one lease, begin and
# complete of n jobs in one transaction, rolled back (so every run sees the
# same queue), by the dispatcher's role, one client. The baseline is the step
# of eight (keyturnd's default workers) in the same run.
item_step() {
  clear_queue
  queue_actions 2000 approve
  local n lat script rounds=${STEP_ROUNDS:-$(( ROUNDS < 3 ? ROUNDS : 3 ))} r queued raw
  queued=$(kt_psql -Atc "SELECT count(*) FROM keyturn.open_action WHERE status = 'queued'")
  if [ "$queued" -lt 64 ]; then
    echo "only $queued actions queued: the steps would lease fewer jobs than they say" | tee "$OUT/step.txt"
    return 1
  fi
  raw="$(kt_scratch)/step.raw"
  : > "$raw"
  for r in $(seq 1 "$rounds"); do
    for n in 1 4 8 16 32 64; do
      script="$(kt_scratch)/step-$n.sql"
      cat > "$script" <<SQL
BEGIN;
SELECT array_agg(action_id) AS ids, array_agg(lease_id) AS ls FROM keyturn.lease('bench-step', $n, '30 s', '{webhook}') \\gset
SELECT count(*) FROM keyturn.begin_dispatch_many(':ids'::uuid[], ':ls'::uuid[]);
SELECT count(*) FROM keyturn.complete_many(':ids'::uuid[], ':ls'::uuid[], array_fill('succeeded'::text, ARRAY[$n]),
                                           array_fill('{}'::jsonb, ARRAY[$n]), array_fill(NULL::interval, ARRAY[$n]));
ROLLBACK;
SQL
      lat=$("$PGBENCH" -h 127.0.0.1 -p "$KT_PGPORT" -U app_dispatcher -n -c 1 -T "$(( DUR < 10 ? DUR : 10 ))" -f "$script" keyturn 2>&1 |
              sed -n 's/^latency average = \([0-9.]*\) ms/\1/p')
      [ -n "$lat" ] || { echo "round $r, $n jobs: pgbench failed" | tee "$OUT/step.txt"; return 1; }
      echo "$r $n $lat" >> "$raw"
    done
  done
  # Rounds, then the medians against the step of eight.
  python3 - "$raw" <<'PY' | tee "$OUT/step.txt"
import statistics, sys
per = {}
for r, n, lat in (line.split() for line in open(sys.argv[1])):
    n, lat = int(n), float(lat)
    print(f"round {r}, {n:2d} jobs a step: {lat:7.3f} ms a step, {lat / n:6.3f} ms a job")
    per.setdefault(n, []).append(lat / n)
base = statistics.median(per[8])
for n in sorted(per):
    print(f"median, {n:2d} jobs a step: {statistics.median(per[n]):.3f} ms a job = {statistics.median(per[n]) / base:.2f} x a step of 8")
PY
  clear_queue
}

# Item 4: approve commit → the webhook's request, 100 approvals a second, for
# each of WAKE_MODES: keyturnd woken by NOTIFY (as configured; and with one
# lease step at a time), and polling only, every second and every 20 ms.
item_wakeup() {
  [ -x "$BENCH_BIN/examples/bench_wakeup" ] || build_service || {
    echo "PENDING: keyturnd or the examples do not build; see service-build.log" > "$OUT/wakeup.txt"; return 0; }
  local n=$(( 100 * WAKE_SECONDS )) mode port out
  : > "$OUT/wakeup.txt"
  for mode in ${WAKE_MODES:-notify notify-one-step poll-1000ms poll-20ms}; do
    clear_queue
    queue_actions "$n"
    kt_psql -qc "VACUUM ANALYZE keyturn.action" >/dev/null
    port=$(kt_free_port)
    case $mode in
      notify)      start_keyturnd "http://127.0.0.1:$port/hook" ;;
      notify-one-step) start_keyturnd "http://127.0.0.1:$port/hook" KEYTURN_LEASE_STEPS=1 ;;
      poll-1000ms) start_keyturnd "http://127.0.0.1:$port/hook" KEYTURN_LISTEN_NOTIFY=false KEYTURN_POLL_MS=1000 ;;
      poll-20ms)   start_keyturnd "http://127.0.0.1:$port/hook" KEYTURN_LISTEN_NOTIFY=false KEYTURN_POLL_MS=20 ;;
    esac
    sleep 1.5
    log "wake-up ($mode): $n approvals at 100/s"
    out=$("$BENCH_BIN/examples/bench_wakeup" --database-url "postgres://app_human@127.0.0.1:$KT_PGPORT/keyturn" \
            --listen "127.0.0.1:$port" --rate 100 --principal p0 --session s0 2>>"$OUT/bench_wakeup.log") || out="failed"
    stop_pid "$KTD_PID"
    echo "$mode: $out" | tee -a "$OUT/wakeup.txt"
    printf 'wakeup\t%s\t1\t1\t0\t%s\t0\t0\t%s\n' "$mode" "$n" "$out" >> "$RESULTS"
  done
}

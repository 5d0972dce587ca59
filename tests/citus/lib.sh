# shellcheck shell=bash
# A private Citus cluster for the citus layer and its benchmark: one
# coordinator and two workers on loopback, each a cluster of its own in the
# run's scratch directory (own data directory, socket directory and free
# port, run as postgres when we are root), stopped by kt_citus_stop, which
# callers put in their EXIT trap. Sourced after tests/harness.sh.

# Where the control file of Citus would be for the PostgreSQL the tests use.
kt_citus_control() {
  printf '%s/extension/citus.control\n' "$("$PG_CONFIG" --sharedir)"
}

# Empty when Citus is installed for $PG_CONFIG; otherwise why not, in one line.
kt_citus_missing() {
  local control
  control=$(kt_citus_control)
  if [ ! -f "$control" ]; then
    printf 'Citus is not installed for %s (no %s); tests/citus-setup builds it from source (needs network)\n' \
      "$PG_CONFIG" "$control"
    return 0
  fi
  if [ ! -f "$("$PG_CONFIG" --pkglibdir)/citus.so" ]; then
    printf 'citus.control is there but citus.so is not in %s; run tests/citus-setup again\n' \
      "$("$PG_CONFIG" --pkglibdir)"
  fi
}

# kt_citus_node_start <name> [setting=value …]: initdb and start one node with
# Citus preloaded; prints its port, and notes port and data directory in
# <dir>/node for kt_citus_stop.
kt_citus_node_start() {
  local name=$1
  shift
  local dir port
  dir="$(kt_scratch)/citus/$name"
  port=$(kt_free_port)
  kt_as_pg mkdir -p "$dir"
  kt_as_pg "$PG_BIN/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 --no-sync \
    >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; return 1; }
  # pg_keyturn after citus: its planner hook refuses a tenant-explicit call
  # with a NULL tenant before Citus routes it (b_null_tenant).
  # max_prepared_transactions: Citus's two-phase commits. wal_level=logical is
  # what Citus wants for shard moves; the layer never moves shards.
  local opts="-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200"
  opts="$opts -c shared_preload_libraries=citus,pg_keyturn -c max_prepared_transactions=200"
  # synchronous_commit stays on: the crash tests stop the coordinator at once,
  # and a commit must not be lost from its WAL buffers with it.
  opts="$opts -c fsync=off -c citus.recover_2pc_interval=-1"
  local extra
  for extra in "$@"; do opts="$opts -c $extra"; done
  kt_as_pg env RUST_BACKTRACE=0 RUST_LIB_BACKTRACE=0 \
    "$PG_BIN/pg_ctl" -D "$dir/data" -o "$opts" -l "$dir/postgres.log" -w -t 60 start >/dev/null \
    || { cat "$dir/postgres.log" >&2; return 1; }
  printf '%s %s\n' "$port" "$dir/data" >"$dir/node"
  printf '%s\n' "$port"
}

# psql as the superuser on node port $1, database keyturn unless -d is given.
kt_citus_psql() {
  local port=$1
  shift
  "$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d keyturn "$@"
}

# Stops every node this scratch directory holds (and only those).
kt_citus_stop() {
  local node port data
  for node in "$(kt_scratch)"/citus/*/node; do
    [ -f "$node" ] || continue
    read -r port data <"$node" || continue
    kt_as_pg "$PG_BIN/pg_ctl" -D "$data" -m immediate -w stop >/dev/null 2>&1 || true
  done
}

# Starts the coordinator and two workers, creates database keyturn with
# Citus on each, adds the workers, and creates pg_keyturn on the coordinator
# (Citus propagates it). Exports KT_CITUS_COORD, KT_CITUS_W1, KT_CITUS_W2
# (ports) and KT_CITUS_COORD_DATA. Extra settings apply to every node. The
# caller's EXIT trap must run kt_citus_stop.
kt_citus_start() {
  local c w1 w2 p
  c=$(kt_citus_node_start coordinator "$@")
  w1=$(kt_citus_node_start worker1 "$@")
  w2=$(kt_citus_node_start worker2 "$@")
  for p in "$c" "$w1" "$w2"; do
    kt_citus_psql "$p" -d postgres -qAtc 'CREATE DATABASE keyturn' >/dev/null
    kt_citus_psql "$p" -qc 'CREATE EXTENSION citus' >/dev/null
  done
  kt_citus_psql "$c" -qAt \
    -c "SELECT citus_set_coordinator_host('127.0.0.1', $c)" \
    -c "SELECT citus_add_node('127.0.0.1', $w1)" \
    -c "SELECT citus_add_node('127.0.0.1', $w2)" >/dev/null
  kt_citus_psql "$c" -qc 'CREATE EXTENSION pg_keyturn' >/dev/null
  export KT_CITUS_COORD=$c KT_CITUS_W1=$w1 KT_CITUS_W2=$w2
  export KT_CITUS_COORD_DATA="$(kt_scratch)/citus/coordinator/data"
  kt_log "citus cluster up: coordinator 127.0.0.1:$c, workers :$w1 :$w2 (data in $(kt_scratch)/citus)"
}

# Stops the coordinator at once (immediate shutdown: no checkpoint, crash
# recovery at the next start, as after a crash) and starts it again with the
# options it had (pg_ctl restart reuses postmaster.opts).
kt_citus_coordinator_crash_restart() {
  local dir
  dir=$(dirname "$KT_CITUS_COORD_DATA")
  kt_as_pg env RUST_BACKTRACE=0 RUST_LIB_BACKTRACE=0 \
    "$PG_BIN/pg_ctl" -D "$KT_CITUS_COORD_DATA" -m immediate -l "$dir/postgres.log" -w -t 60 restart >/dev/null \
    || { cat "$dir/postgres.log" >&2; return 1; }
}

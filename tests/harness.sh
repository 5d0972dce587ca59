# shellcheck shell=bash
# The private test cluster harness, sourced by tests/run-all, tests/demo and the
# benchmarks. Every run gets its own data directory, socket directory and free
# port (never 5432), runs PostgreSQL as the `postgres` OS user when we are root
# (PostgreSQL refuses to run as root), and is torn down by an EXIT trap, also
# when a test fails. Two runs at once do not collide. PgBouncer, for the
# pgbouncer layer, runs in front of the cluster the same way.

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
PG_CONFIG=${PG_CONFIG:-$PG_BIN/pg_config}
KT_ROOT=${KT_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}

kt_log() { printf '\033[1m[keyturn]\033[0m %s\n' "$*" >&2; }

# A TCP port nobody listens on right now.
kt_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Runs a command as the OS user that owns the clusters.
kt_as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# Creates this run's scratch directory (removed at exit). Call once, in the
# top-level shell, before anything else: $(...) subshells cannot export it.
kt_init() {
  if [ -z "${KT_SCRATCH:-}" ]; then
    KT_SCRATCH=$(mktemp -d /tmp/keyturn-run.XXXXXX)
    chmod 755 "$KT_SCRATCH"
    if [ "$(id -u)" -eq 0 ]; then chown postgres:postgres "$KT_SCRATCH"; fi
    export KT_SCRATCH
  fi
}

kt_scratch() {
  : "${KT_SCRATCH:?kt_init was not called}"
  printf '%s\n' "$KT_SCRATCH"
}

# A PGRX_HOME of this run's own, with its own base ports, so `cargo pgrx test`
# and `cargo pgrx regress` of two concurrent runs never share a port or a data
# directory.
kt_pgrx_home() {
  local home
  home="$(kt_scratch)/pgrx"
  if [ ! -f "$home/config.toml" ]; then
    mkdir -p "$home"
    local base=$(( 20000 + RANDOM % 20000 ))
    printf 'base_port = %d\nbase_testing_port = %d\n\n[configs]\npg15 = "%s"\n' \
      "$base" "$(( base + 100 ))" "$PG_CONFIG" > "$home/config.toml"
    if [ "$(id -u)" -eq 0 ]; then chown -R postgres:postgres "$home"; fi
  fi
  printf '%s\n' "$home"
}

# Builds and installs the extension into the system PostgreSQL 15.
kt_install_extension() {
  local profile=${1:-debug}
  local args=(install -p pg_keyturn --pg-config "$PG_CONFIG")
  [ "$profile" = release ] && args+=(--release)
  [ "$(id -u)" -ne 0 ] && args+=(--sudo)
  kt_log "building and installing pg_keyturn ($profile)"
  (cd "$KT_ROOT" && cargo pgrx "${args[@]}" >"$(kt_scratch)/install.log" 2>&1) || {
    cat "$(kt_scratch)/install.log" >&2
    return 1
  }
}

# Starts a private cluster; exports KT_PGPORT, KT_PGHOST, KT_PGDATA and
# KT_ADMIN_URL (superuser, database keyturn). Extra postgres -c settings may be
# passed as arguments.
kt_cluster_start() {
  local dir port
  dir="$(kt_scratch)/cluster"
  port=$(kt_free_port)
  kt_as_pg mkdir -p "$dir"
  kt_as_pg "$PG_BIN/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 --no-sync >"$(kt_scratch)/initdb.log" 2>&1 || {
    cat "$(kt_scratch)/initdb.log" >&2
    return 1
  }
  local opts="-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off -c synchronous_commit=off"
  local extra
  for extra in "$@"; do opts="$opts -c $extra"; done
  # RUST_BACKTRACE=1, as on many developer machines and some images: pgrx
  # would attach a Rust backtrace, with source paths, to the DETAIL of every
  # error a keyturn function raises, and pg_keyturn must keep them out
  # whatever the server's environment (security_tests' backtrace test).
  kt_as_pg env RUST_BACKTRACE=1 \
    "$PG_BIN/pg_ctl" -D "$dir/data" -o "$opts" -l "$dir/postgres.log" -w -t 60 start >/dev/null || {
    cat "$dir/postgres.log" >&2
    return 1
  }
  export KT_PGDATA="$dir/data" KT_PGPORT=$port KT_PGHOST=127.0.0.1 KT_PGSOCK=$dir KT_PGLOG=$dir/postgres.log
  export KT_ADMIN_URL="postgres://postgres@127.0.0.1:$port/keyturn"
  kt_as_pg "$PG_BIN/psql" -h "$dir" -p "$port" -U postgres -d postgres -qAtc 'CREATE DATABASE keyturn' >/dev/null
  kt_psql -qc 'CREATE EXTENSION pg_keyturn' >/dev/null
  kt_log "private cluster up on 127.0.0.1:$port (data in $dir)"
}

# A venv in the run's scratch directory with PyPI packages for a test:
# kt_pypi_venv <dir name> <python import check> <pip spec…>. Prints the venv's
# Python; when it cannot be had (no python3-venv, PyPI unreachable), prints
# the reason (with pip's last line) and fails. Never fails the run.
kt_pypi_venv() {
  local name=$1 check=$2 venv log
  shift 2
  venv="$(kt_scratch)/$name"
  log="$(kt_scratch)/$name.log"
  if ! "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
    if ! python3 -m venv "$venv" >"$log" 2>&1; then
      echo "python3 -m venv failed (is python3-venv installed?): $(tail -n 1 "$log")"
      return 1
    fi
    if ! "$venv/bin/pip" install --quiet --disable-pip-version-check --timeout 20 --retries 1 \
        "$@" >>"$log" 2>&1; then
      echo "pip install $* failed (is PyPI reachable?): $(tail -n 1 "$log")"
      return 1
    fi
  fi
  printf '%s\n' "$venv/bin/python"
}

# The Standard Webhooks library (PyPI standardwebhooks), for keyturnd's
# e2e_standard_webhooks test: exports KT_STANDARDWEBHOOKS_PYTHON, or
# KT_STANDARDWEBHOOKS_UNAVAILABLE with the reason.
kt_standard_webhooks() {
  unset KT_STANDARDWEBHOOKS_PYTHON KT_STANDARDWEBHOOKS_UNAVAILABLE
  local said
  if said=$(kt_pypi_venv standardwebhooks-venv 'import standardwebhooks' standardwebhooks); then
    export KT_STANDARDWEBHOOKS_PYTHON=$said
  else
    export KT_STANDARDWEBHOOKS_UNAVAILABLE=$said
  fi
}

# The official MCP Python SDK (PyPI mcp 2.x), for the mcp layer and the demo:
# exports KT_MCP_PYTHON, or KT_MCP_UNAVAILABLE with the reason.
kt_mcp_python() {
  unset KT_MCP_PYTHON KT_MCP_UNAVAILABLE
  local said
  if said=$(kt_pypi_venv mcp-venv 'import mcp.server.mcpserver, httpx2, uvicorn' 'mcp>=2,<3'); then
    export KT_MCP_PYTHON=$said
  else
    export KT_MCP_UNAVAILABLE=$said
  fi
}

# The official MCP TypeScript SDK client (npm @modelcontextprotocol/sdk,
# pinned in tests/mcp/ts/package.json), for the mcp layer's second client:
# exports KT_MCP_TS_DIR (the install, with tests/mcp/ts's script beside it),
# or KT_MCP_TS_UNAVAILABLE with the reason. Never fails the run.
kt_mcp_typescript() {
  unset KT_MCP_TS_DIR KT_MCP_TS_UNAVAILABLE
  local dir log
  dir="$(kt_scratch)/mcp-ts"
  log="$(kt_scratch)/mcp-ts.log"
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    export KT_MCP_TS_UNAVAILABLE="node or npm is not installed"
    return 0
  fi
  mkdir -p "$dir"
  cp "$KT_ROOT/tests/mcp/ts/package.json" "$KT_ROOT/tests/mcp/ts/"*.mjs "$dir/"
  if { [ ! -d "$dir/node_modules/@modelcontextprotocol/sdk" ] ||
       [ ! -d "$dir/node_modules/@modelcontextprotocol/ext-tasks" ] ||
       [ ! -d "$dir/node_modules/@modelcontextprotocol/inspector" ]; } &&
     ! (cd "$dir" && timeout 300 npm install --no-audit --no-fund --silent) >"$log" 2>&1; then
    export KT_MCP_TS_UNAVAILABLE="npm install of the MCP TypeScript SDK failed (is the npm registry reachable?): $(tail -n 1 "$log")"
    return 0
  fi
  export KT_MCP_TS_DIR=$dir
}

# The Web Push checks' libraries (http_ece decrypts, py_vapid verifies what
# keyturnd sends; the Standard Webhooks library too, for the receivers they
# share): exports KT_WEBPUSH_PYTHON, or KT_WEBPUSH_UNAVAILABLE with the reason.
kt_webpush_python() {
  unset KT_WEBPUSH_PYTHON KT_WEBPUSH_UNAVAILABLE
  local said
  if said=$(kt_pypi_venv webpush-venv 'import http_ece, py_vapid, standardwebhooks' standardwebhooks http_ece py_vapid); then
    export KT_WEBPUSH_PYTHON=$said
  else
    export KT_WEBPUSH_UNAVAILABLE=$said
  fi
}

# chromedriver on a free loopback port, for the browser layer: exports
# KT_WEBDRIVER_URL (and KT_CHROMIUM, the browser binary), or, when Debian's
# chromium or chromium-driver is missing, KT_BROWSER_UNAVAILABLE with the
# reason, which every browser test prints as its reason for skipping. Never
# fails the run; stopped by kt_cleanup.
kt_chromedriver() {
  unset KT_WEBDRIVER_URL KT_BROWSER_UNAVAILABLE
  local driver browser port log
  driver=$(command -v chromedriver || true)
  browser=$(command -v chromium || true)
  if [ -z "$browser" ] || [ -z "$driver" ]; then
    export KT_BROWSER_UNAVAILABLE="chromium or chromedriver is not installed (Debian's chromium and chromium-driver; .ci/bootstrap installs them)"
    return 0
  fi
  port=$(kt_free_port)
  log="$(kt_scratch)/chromedriver.log"
  # A process group of its own, so that kt_cleanup also stops a browser a
  # test left open (chromedriver's children outlive it otherwise).
  setsid "$driver" --port="$port" --allowed-ips=127.0.0.1 --log-path="$log" >/dev/null 2>&1 &
  KT_PIDS="${KT_PIDS:-} $!"
  KT_GROUPS="${KT_GROUPS:-} $!"
  export KT_PIDS KT_GROUPS
  local _
  for _ in $(seq 100); do
    if curl -fs "http://127.0.0.1:$port/status" >/dev/null 2>&1; then
      export KT_WEBDRIVER_URL="http://127.0.0.1:$port" KT_CHROMIUM="$browser"
      kt_log "chromedriver on 127.0.0.1:$port ($("$browser" --version 2>/dev/null || echo chromium))"
      return 0
    fi
    sleep 0.1
  done
  export KT_BROWSER_UNAVAILABLE="chromedriver did not answer on 127.0.0.1:$port (see $log)"
}

# psql as the superuser against the private cluster's keyturn database.
kt_psql() {
  "$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$KT_PGPORT" -U postgres -d keyturn "$@"
}

# Drops the roles the integration tests made (keyturn_tests::unique names,
# <prefix>_<pid>_<n>), with whatever they own in every database, so a later
# layer's check_deployment() sees the cluster as the fixture left it. Roles
# are cluster-wide and outlive the databases the tests used.
kt_drop_test_roles() {
  local roles db
  roles=$(kt_psql -d postgres -Atc "SELECT string_agg(quote_ident(rolname), ', ') FROM pg_roles WHERE rolname ~ '^[a-z][a-z_]*_[0-9]+_[0-9]+$'")
  [ -n "$roles" ] || return 0
  for db in $(kt_psql -d postgres -Atc "SELECT datname FROM pg_database WHERE datallowconn"); do
    kt_psql -d "$db" -qc "DROP OWNED BY $roles CASCADE" >/dev/null
  done
  kt_psql -d postgres -qc "DROP ROLE $roles" >/dev/null
}

# Starts PgBouncer in transaction mode in front of the private cluster, on a
# port of its own; exports KT_PGBOUNCER_PORT and KT_PGBOUNCER_DIR (its config
# and log). Any login role of the cluster connects through it as itself:
# trust, as the cluster itself does, the role looked up by auth_query. No
# server_reset_query runs between clients (PgBouncer's default in transaction
# mode), so session state does travel from one client to the next: the case
# keyturn's identity rules must survive. Database keyturn_one is keyturn with
# one server connection per role, for tests that need two clients to share
# one; any other name reaches the database of that name.
kt_pgbouncer_start() {
  : "${KT_PGPORT:?start the cluster first (kt_cluster_start)}"
  local dir port
  dir="$(kt_scratch)/pgbouncer"
  port=$(kt_free_port)
  kt_as_pg mkdir -p "$dir"
  echo '"postgres" ""' | kt_as_pg tee "$dir/userlist.txt" >/dev/null
  kt_as_pg tee "$dir/pgbouncer.ini" >/dev/null <<INI
[databases]
keyturn_one = host=127.0.0.1 port=$KT_PGPORT dbname=keyturn pool_size=1
* = host=127.0.0.1 port=$KT_PGPORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
pool_mode = transaction
default_pool_size = 8
max_client_conn = 500
auth_type = trust
auth_file = $dir/userlist.txt
auth_user = postgres
auth_query = SELECT rolname::text, NULL::text FROM pg_catalog.pg_roles WHERE rolname = \$1 AND rolcanlogin
ignore_startup_parameters = extra_float_digits
admin_users = postgres
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
  # PgBouncer refuses to run as root, as PostgreSQL does.
  kt_as_pg pgbouncer -d -q "$dir/pgbouncer.ini" || {
    cat "$dir/pgbouncer.log" >&2 2>/dev/null
    return 1
  }
  local i
  for i in $(seq 1 100); do
    if "$PG_BIN/psql" -X -h 127.0.0.1 -p "$port" -U postgres -d keyturn -qAtc 'SELECT 1' >/dev/null 2>&1; then
      export KT_PGBOUNCER_PORT=$port KT_PGBOUNCER_DIR=$dir
      KT_PIDS="${KT_PIDS:-} $(cat "$dir/pgbouncer.pid")"
      kt_log "PgBouncer (transaction mode) up on 127.0.0.1:$port in front of :$KT_PGPORT (config and log in $dir)"
      return 0
    fi
    sleep 0.1
  done
  kt_log "PgBouncer did not accept connections on :$port after 10 s; its log:"
  cat "$dir/pgbouncer.log" >&2 2>/dev/null
  return 1
}

kt_pgbouncer_stop() {
  if [ -n "${KT_PGBOUNCER_DIR:-}" ] && [ -f "$KT_PGBOUNCER_DIR/pgbouncer.pid" ]; then
    local pid
    pid=$(cat "$KT_PGBOUNCER_DIR/pgbouncer.pid")
    kill "$pid" 2>/dev/null || true
    KT_PIDS=$(sed "s/\b$pid\b//" <<<"${KT_PIDS:-}")
  fi
  unset KT_PGBOUNCER_PORT KT_PGBOUNCER_DIR
}

kt_cluster_stop() {
  if [ -n "${KT_PGDATA:-}" ] && [ -d "$KT_PGDATA" ]; then
    kt_as_pg "$PG_BIN/pg_ctl" -D "$KT_PGDATA" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  unset KT_PGDATA
}

kt_cleanup() {
  local status=$?
  kt_cluster_stop
  # Stop anything else this run left listening (keyturnd, receivers).
  if [ -n "${KT_PIDS:-}" ]; then kill $KT_PIDS 2>/dev/null || true; fi
  local group
  for group in ${KT_GROUPS:-}; do kill -- "-$group" 2>/dev/null || true; done
  if [ -n "${KT_SCRATCH:-}" ] && [ -z "${KT_KEEP:-}" ]; then rm -rf "$KT_SCRATCH"; fi
  return $status
}

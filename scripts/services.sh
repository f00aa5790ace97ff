#!/usr/bin/env bash
# Local PostgreSQL, Redis and Apache Kafka (KRaft) without Docker; with TRACING=1, a Zipkin
# server for the traces too.
#
#   scripts/services.sh up|down|status
#   scripts/services.sh zipkin-up | zipkin-down     Zipkin alone (zipkin-up needs no TRACING)
#   scripts/services.sh kafka-up | kafka-down       Kafka alone (a broker of its own for a test)
#   Fault tests act on one part at a time:
#   scripts/services.sh kafka-stop N | kafka-kill N | kafka-start N | kafka-pause N | kafka-resume N
#   scripts/services.sh postgres-crash | postgres-start | redis-stop | redis-start
#   A failover, on a standby (PG_STANDBY_PORT) the first command makes:
#   scripts/services.sh postgres-standby [sync|async] | postgres-kill | postgres-promote |
#                       postgres-rejoin [sync|async] | postgres-switchback
#
# For each service: if something already answers at the configured address it is used
# as it is; otherwise the service is installed (Debian packages, or Kafka's jars and Zipkin's
# exec jar from Maven Central) and started on loopback with its data under .local/, which git
# ignores.
# Running `up` twice changes nothing.
#
# Environment (the same variables the Django settings read):
#   DATABASE_URL             postgres://outbox:outbox@127.0.0.1:5432/outbox
#   CELERY_BROKER_URL        redis://127.0.0.1:6379/0
#   KAFKA_BROKERS            1 (one node) or 3 (three nodes, replication factor 3,
#                            min.insync.replicas=2, unclean leader election off); when
#                            unset, the size this project's cluster was last started with
#                            (1 on a new machine), so a running 3-node cluster is used
#   KAFKA_BOOTSTRAP_SERVERS  derived from KAFKA_BROKERS when unset
#   KAFKA_PORT_BASE          9091: broker N listens on KAFKA_PORT_BASE+N
#   KAFKA_CONTROLLER_PORT_BASE 29091: its controller on KAFKA_CONTROLLER_PORT_BASE+N
#   KAFKA_SECURE_PORT_BASE   9191: its SASL_SSL listener (TLS, SCRAM users, ACLs) on
#                            KAFKA_SECURE_PORT_BASE+N; the CA to trust is .local/kafka/tls/ca.pem
#   TRACING                  1, true or yes: `up` starts Zipkin as well (`down` and `status`
#                            cover it whatever TRACING says)
#   ZIPKIN_PORT              9411: Zipkin's API, UI (/zipkin/) and span collector
#                            (/api/v2/spans) on 127.0.0.1
#   ZIPKIN_HEAP              -Xms64m -Xmx512m: its JVM's heap options
#   ZIPKIN_MAX_SPANS         100000: spans kept in memory (the oldest traces go first)
#   PGBOUNCER_PORT           6432: PgBouncer in session mode (a client keeps its server
#                            connection until it disconnects; DISCARD ALL after), in front of
#                            the PostgreSQL of DATABASE_URL, every database name
#   PGBOUNCER_TRANSACTION_PORT 6433: PgBouncer in transaction mode (a server connection per
#                            transaction), the same
#   PG_STANDBY_PORT          the port of DATABASE_URL + 3: the standby `postgres-standby` makes
#   LOCAL_DIR                .local: data and logs; a second set of services (other ports,
#                            another LOCAL_DIR) can run beside the first, e.g. for fault tests
set -euo pipefail

PROJECT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL_DIR="${LOCAL_DIR:-$PROJECT_DIR/.local}"
PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
KAFKA_DIR="$LOCAL_DIR/kafka"
KAFKA_LIBS="$KAFKA_DIR/libs"
# Unset: keep the size of the cluster this project last formatted, so that `up`, `status`
# and the default bootstrap address follow a running 3-node cluster.
KAFKA_BROKERS="${KAFKA_BROKERS:-$(cat "$KAFKA_DIR/brokers" 2>/dev/null || echo 1)}"
# Broker N (1-based) listens on 9091+N for clients and 29091+N for the controller quorum.
KAFKA_CLIENT_PORT_BASE="${KAFKA_PORT_BASE:-9091}"
KAFKA_CONTROLLER_PORT_BASE="${KAFKA_CONTROLLER_PORT_BASE:-29091}"
# Its SASL_SSL listener (Kafka's secured listener, below) on KAFKA_SECURE_PORT_BASE+N.
KAFKA_SECURE_PORT_BASE="${KAFKA_SECURE_PORT_BASE:-9191}"
KAFKA_HEAP="${KAFKA_HEAP:--Xms256m -Xmx768m}"
WAIT_SECONDS="${SERVICES_WAIT_SECONDS:-90}"

DATABASE_URL="${DATABASE_URL:-postgres://outbox:outbox@127.0.0.1:5432/outbox}"
PG_STANDBY_PORT_SETTING="${PG_STANDBY_PORT:-}"
CELERY_BROKER_URL="${CELERY_BROKER_URL:-redis://127.0.0.1:6379/0}"

log() { printf '%-10s %s\n' "$1" "$2"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# --- address parsing ---------------------------------------------------------------------

parse_database_url() {
  local re='^postgres(ql)?://([^:@/]+)(:([^@/]*))?@([^:/]+)(:([0-9]+))?/([^?]+)'
  [[ "$DATABASE_URL" =~ $re ]] || die "DATABASE_URL must look like postgres://user:password@host:port/name, got '$DATABASE_URL'"
  PG_USER="${BASH_REMATCH[2]}"
  PG_PASSWORD="${BASH_REMATCH[4]}"
  PG_HOST="${BASH_REMATCH[5]}"
  PG_PORT="${BASH_REMATCH[7]:-5432}"
  PG_DB="${BASH_REMATCH[8]}"
  PG_STANDBY_PORT="${PG_STANDBY_PORT_SETTING:-$((PG_PORT + 3))}"
}

parse_redis_url() {
  local re='^rediss?://([^@/]*@)?([^:/]+)(:([0-9]+))?'
  [[ "$CELERY_BROKER_URL" =~ $re ]] || die "CELERY_BROKER_URL must look like redis://host:port/db, got '$CELERY_BROKER_URL'"
  REDIS_HOST="${BASH_REMATCH[2]}"
  REDIS_PORT="${BASH_REMATCH[4]:-6379}"
}

kafka_default_bootstrap() {
  local servers="" n
  for ((n = 1; n <= KAFKA_BROKERS; n++)); do
    servers+="${servers:+,}127.0.0.1:$((KAFKA_CLIENT_PORT_BASE + n))"
  done
  echo "$servers"
}

is_loopback() { [[ "$1" == "127.0.0.1" || "$1" == "localhost" ]]; }

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

wait_for() {
  local what="$1"; shift
  local deadline=$((SECONDS + WAIT_SECONDS))
  until "$@"; do
    ((SECONDS < deadline)) || die "$what did not become healthy within ${WAIT_SECONDS}s (see logs under $LOCAL_DIR)"
    sleep 0.5
  done
}

apt_install() {
  local packages=("$@")
  local sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  command -v apt-get >/dev/null || die "apt-get not found: install ${packages[*]} by hand"
  log install "${packages[*]} (Debian packages)"
  # RUNLEVEL=1: the packages' own services are not started; this script starts what it needs.
  if ! $sudo env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq "${packages[@]}" >/dev/null 2>&1; then
    $sudo apt-get update -qq >/dev/null
    $sudo env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq "${packages[@]}" >/dev/null
  fi
}

# --- PostgreSQL --------------------------------------------------------------------------

PG_DATA="$LOCAL_DIR/postgres/data"
PG_LOG="$LOCAL_DIR/postgres/postgres.log"

as_postgres() { runuser -u postgres -- "$@"; }

# The outbox is a queue table: every event is written three times (insert, claim, mark), so
# its working set must fit in shared buffers or the relay's scans read from disk.
# A server's options; with a port, those of the standby on it (PostgreSQL standby below).
pg_server_options() {
  echo "-h $PG_HOST -p ${1:-$PG_PORT} -k /tmp -c max_connections=200 -c shared_buffers=${POSTGRES_SHARED_BUFFERS:-1GB}"
}

pg_ready() { "$PG_BIN/pg_isready" -q -h "$PG_HOST" -p "$PG_PORT" 2>/dev/null || pg_isready -q -h "$PG_HOST" -p "$PG_PORT" 2>/dev/null; }

postgres_up() {
  parse_database_url
  if pg_ready; then
    if [[ -f "$PG_DATA/postmaster.pid" ]]; then
      log postgres "running at $PG_HOST:$PG_PORT (data $PG_DATA)"
    else
      log postgres "already answering at $PG_HOST:$PG_PORT; using it"
    fi
    return
  fi
  is_loopback "$PG_HOST" || die "nothing answers at $PG_HOST:$PG_PORT and only a loopback PostgreSQL can be started here"
  if [[ ! -x "$PG_BIN/postgres" ]]; then
    apt_install postgresql-15
    # The package may start its own cluster on 5432; this project runs its own.
    pg_ctlcluster 15 main stop >/dev/null 2>&1 || true
  fi
  id postgres >/dev/null 2>&1 || die "the 'postgres' system user is missing; reinstall postgresql-15"
  mkdir -p "$LOCAL_DIR/postgres"
  chown postgres: "$LOCAL_DIR/postgres"
  # PostgreSQL refuses to run as root, so the server runs as its own system user, who must
  # be able to reach the data folder: let it traverse (not list) the folders above it.
  local dir="$LOCAL_DIR/postgres"
  while ! as_postgres test -x "$LOCAL_DIR/postgres" && [[ "$dir" != "/" ]]; do
    dir="$(dirname "$dir")"
    chmod o+x "$dir"
    log postgres "allowed the postgres user to traverse $dir"
  done
  if [[ ! -f "$PG_DATA/PG_VERSION" ]]; then
    log postgres "initialising $PG_DATA"
    as_postgres "$PG_BIN/initdb" -D "$PG_DATA" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >/dev/null
  fi
  as_postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t "$WAIT_SECONDS" \
    -o "$(pg_server_options)" start >/dev/null
  wait_for postgres pg_ready
  # The application role: CREATEDB so the test runner can create its test database.
  as_postgres psql -h /tmp -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -q <<SQL
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN
    CREATE ROLE "$PG_USER" LOGIN CREATEDB PASSWORD '$PG_PASSWORD';
  END IF;
END \$\$;
SELECT 'CREATE DATABASE "$PG_DB" OWNER "$PG_USER"'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$PG_DB')\gexec
SQL
  log postgres "started at $PG_HOST:$PG_PORT (data $PG_DATA)"
}

postgres_down() {
  if [[ -f "$PG_DATA/postmaster.pid" ]]; then
    pg_dir_stop "$PG_DATA" && log postgres stopped
  else
    log postgres "not started by this project"
  fi
}

postgres_status() {
  parse_database_url
  if pg_ready; then log postgres "healthy at $PG_HOST:$PG_PORT"; else log postgres "down at $PG_HOST:$PG_PORT"; return 1; fi
}

# --- PostgreSQL standby (failover) ---------------------------------------------------------
# A streaming replica of the server above on PG_STANDBY_PORT, for the failover scenario. The
# two data folders trade roles (the standby is promoted, the old primary comes back as its
# standby, then the roles switch back) and end as they began: one primary on PG_PORT.

PG_STANDBY_DATA="$LOCAL_DIR/postgres/standby"
PG_STANDBY_LOG="$LOCAL_DIR/postgres/standby.log"
# The standby's application_name: what the primary's synchronous_standby_names waits for.
PG_STANDBY_NAME=standby

psql_on() {
  local port="$1"; shift
  local statement
  for statement in "$@"; do
    as_postgres psql -h /tmp -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -qAtX -c "$statement"
  done
}

postmaster_pid_of() { head -n 1 "$1/postmaster.pid" 2>/dev/null || true; }

pg_dir_running() {
  local pid
  pid="$(postmaster_pid_of "$1")"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null
}

pg_dir_stop() {
  if pg_dir_running "$1"; then
    # A fault may have left one of the server's processes stopped (the failover scenarios
    # SIGSTOP the WAL sender and count on the primary's SIGKILL to end it): the shutdown
    # would wait for it until WAIT_SECONDS ran out.
    pkill -CONT -P "$(postmaster_pid_of "$1")" 2>/dev/null || true
    as_postgres "$PG_BIN/pg_ctl" -D "$1" -m fast -w -t "$WAIT_SECONDS" stop >/dev/null
  fi
}

# replica DIR PORT LOG SOURCE_PORT: DIR made afresh from the server on SOURCE_PORT
# (pg_basebackup) and started on PORT as its streaming standby.
pg_replica_start() {
  local dir="$1" port="$2" logfile="$3" source_port="$4"
  pg_dir_stop "$dir"
  rm -rf "$dir"
  mkdir -p "$dir"
  chown postgres: "$dir"
  chmod 700 "$dir"
  as_postgres "$PG_BIN/pg_basebackup" -h /tmp -p "$source_port" -U postgres -D "$dir" \
    -X stream -c fast
  as_postgres touch "$dir/standby.signal"
  # Later settings win: the copy's synchronous_standby_names (the source's) must not make it
  # wait for a standby of its own once promoted.
  as_postgres tee -a "$dir/postgresql.auto.conf" >/dev/null <<CONF
primary_conninfo = 'host=/tmp port=$source_port user=postgres application_name=$PG_STANDBY_NAME'
synchronous_standby_names = ''
CONF
  as_postgres "$PG_BIN/pg_ctl" -D "$dir" -l "$logfile" -w -t "$WAIT_SECONDS" \
    -o "$(pg_server_options "$port")" start >/dev/null
}

# replication PORT sync|async: whether the primary on PORT waits for its standby at commit
# (synchronous_commit stays on: a commit returns once the standby has flushed it).
pg_replication_set() {
  local names=""
  [[ "$2" == sync ]] && names="$PG_STANDBY_NAME"
  psql_on "$1" "ALTER SYSTEM SET synchronous_standby_names = '$names'" \
    "ALTER SYSTEM SET wal_keep_size = '1GB'" "SELECT pg_reload_conf()" >/dev/null
}

pg_replica_streaming() {
  [[ "$(psql_on "$1" "SELECT sync_state FROM pg_stat_replication WHERE application_name = '$PG_STANDBY_NAME' AND state = 'streaming'")" == "$2" ]]
}

pg_replication_mode() {
  case "${1:-sync}" in
    sync | async) echo "${1:-sync}" ;;
    *) die "replication must be sync or async, got '$1'" ;;
  esac
}

pg_promote() {
  as_postgres "$PG_BIN/pg_ctl" -D "$1" -w -t "$WAIT_SECONDS" promote >/dev/null
  accepts_writes() { [[ "$(psql_on "$2" "SELECT pg_is_in_recovery()")" == f ]]; }
  wait_for "the promotion on port $2" accepts_writes "$1" "$2"
}

# A standby, or a primary demoted by an interrupted failover scenario, left from an earlier
# run: `up` starts from one primary on PG_PORT.
# (postgres_standby_forget, once the primary runs, stops it waiting for that standby.)
PG_STANDBY_CLEARED=0

postgres_standby_clear() {
  if [[ -d "$PG_STANDBY_DATA" ]]; then
    pg_dir_stop "$PG_STANDBY_DATA"
    rm -rf "$PG_STANDBY_DATA"
    PG_STANDBY_CLEARED=1
    log postgres "removed the standby left in $PG_STANDBY_DATA"
  fi
  if [[ -f "$PG_DATA/standby.signal" ]]; then
    rm -f "$PG_DATA/standby.signal"
    PG_STANDBY_CLEARED=1
    log postgres "$PG_DATA was left a standby: it starts as the primary"
  fi
}

postgres_standby_forget() {
  ((PG_STANDBY_CLEARED)) || return 0
  psql_on "$PG_PORT" "ALTER SYSTEM RESET synchronous_standby_names" "SELECT pg_reload_conf()" >/dev/null
  log postgres "the primary waits for no standby"
}

# --- PgBouncer ---------------------------------------------------------------------------
# Two poolers in front of PostgreSQL, one per pool mode, as production runs them: the tests
# and the scenarios publish, consume and relay through them (docs/integration.md).

PGBOUNCER_DIR="$LOCAL_DIR/pgbouncer"
PGBOUNCER_PORT="${PGBOUNCER_PORT:-6432}"
PGBOUNCER_TRANSACTION_PORT="${PGBOUNCER_TRANSACTION_PORT:-6433}"

pgbouncer_port() { if [[ "$1" == session ]]; then echo "$PGBOUNCER_PORT"; else echo "$PGBOUNCER_TRANSACTION_PORT"; fi; }
pgbouncer_pidfile() { echo "$PGBOUNCER_DIR/$1.pid"; }
pgbouncer_ready() { port_open 127.0.0.1 "$(pgbouncer_port "$1")"; }

pgbouncer_up() {
  parse_database_url
  [[ -x /usr/sbin/pgbouncer ]] || apt_install pgbouncer
  local mode
  mkdir -p "$PGBOUNCER_DIR"
  chown postgres: "$PGBOUNCER_DIR"
  # The application role's password, as the poolers ask clients for it (SCRAM); PostgreSQL
  # behind them trusts loopback connections.
  printf '"%s" "%s"\n' "$PG_USER" "$PG_PASSWORD" >"$PGBOUNCER_DIR/userlist.txt"
  for mode in session transaction; do
    if pgbouncer_ready "$mode"; then
      log pgbouncer "$mode mode running at 127.0.0.1:$(pgbouncer_port "$mode")"
      continue
    fi
    # Every database name goes to the same server, so the tests' databases are reachable too.
    # `options` (DATABASE_OPTIONS' jit=off) is a startup parameter PgBouncer cannot pass on.
    cat >"$PGBOUNCER_DIR/$mode.ini" <<INI
[databases]
* = host=$PG_HOST port=$PG_PORT
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $(pgbouncer_port "$mode")
unix_socket_dir =
pool_mode = $mode
auth_type = scram-sha-256
auth_file = $PGBOUNCER_DIR/userlist.txt
# The application role may KILL a database's server connections (the tests, before they drop
# their database).
admin_users = $PG_USER
max_client_conn = 400
default_pool_size = 40
ignore_startup_parameters = extra_float_digits, options
logfile = $PGBOUNCER_DIR/$mode.log
pidfile = $(pgbouncer_pidfile "$mode")
INI
    chown postgres: "$PGBOUNCER_DIR/$mode.ini" "$PGBOUNCER_DIR/userlist.txt"
    # PgBouncer refuses to run as root: it runs as PostgreSQL's system user.
    as_postgres /usr/sbin/pgbouncer -d -q "$PGBOUNCER_DIR/$mode.ini"
    wait_for "pgbouncer ($mode)" pgbouncer_ready "$mode"
    log pgbouncer "$mode mode started at 127.0.0.1:$(pgbouncer_port "$mode")"
  done
}

pgbouncer_down() {
  local mode pid
  for mode in session transaction; do
    pid="$(cat "$(pgbouncer_pidfile "$mode")" 2>/dev/null || true)"
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
      log pgbouncer "$mode mode stopped"
    fi
  done
}

pgbouncer_status() {
  local mode status=0
  for mode in session transaction; do
    if pgbouncer_ready "$mode"; then
      log pgbouncer "$mode mode healthy at 127.0.0.1:$(pgbouncer_port "$mode")"
    else
      log pgbouncer "$mode mode down at 127.0.0.1:$(pgbouncer_port "$mode")"
      status=1
    fi
  done
  return "$status"
}

# --- Redis -------------------------------------------------------------------------------

REDIS_PIDFILE="$LOCAL_DIR/redis/redis.pid"

redis_ready() { [[ "$(redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null)" == "PONG" ]]; }

redis_up() {
  parse_redis_url
  command -v redis-server >/dev/null || apt_install redis-server
  if redis_ready; then
    if [[ -f "$REDIS_PIDFILE" ]]; then
      log redis "running at $REDIS_HOST:$REDIS_PORT"
    else
      log redis "already answering at $REDIS_HOST:$REDIS_PORT; using it"
    fi
    return
  fi
  is_loopback "$REDIS_HOST" || die "nothing answers at $REDIS_HOST:$REDIS_PORT and only a loopback Redis can be started here"
  mkdir -p "$LOCAL_DIR/redis"
  redis-server --bind "$REDIS_HOST" --port "$REDIS_PORT" --daemonize yes \
    --dir "$LOCAL_DIR/redis" --pidfile "$REDIS_PIDFILE" --logfile "$LOCAL_DIR/redis/redis.log" \
    --save "" --appendonly no >/dev/null
  wait_for redis redis_ready
  log redis "started at $REDIS_HOST:$REDIS_PORT"
}

redis_down() {
  if [[ -f "$REDIS_PIDFILE" ]] && kill -0 "$(cat "$REDIS_PIDFILE")" 2>/dev/null; then
    kill "$(cat "$REDIS_PIDFILE")"
    while kill -0 "$(cat "$REDIS_PIDFILE" 2>/dev/null)" 2>/dev/null; do sleep 0.2; done
    log redis stopped
  else
    log redis "not started by this project"
  fi
}

redis_status() {
  parse_redis_url
  if redis_ready; then log redis "healthy at $REDIS_HOST:$REDIS_PORT"; else log redis "down at $REDIS_HOST:$REDIS_PORT"; return 1; fi
}

# --- Apache Kafka (KRaft) ----------------------------------------------------------------

require_java() {
  command -v java >/dev/null || die "java not found: Apache Kafka and Zipkin need Java 17 (Debian: apt-get install openjdk-17-jre-headless)"
  local major
  major="$(java -version 2>&1 | sed -n 's/.* version "\([0-9]*\).*/\1/p' | head -n 1)"
  ((${major:-0} >= 17)) || die "Apache Kafka 4 and Zipkin 3 need Java 17 or newer; 'java -version' says: $(java -version 2>&1 | head -n 1)"
}

kafka_version() { sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$PROJECT_DIR/scripts/kafka/pom.xml"; }

kafka_fetch() {
  local version; version="$(kafka_version)"
  if [[ -f "$KAFKA_LIBS/kafka_2.13-$version.jar" ]]; then return; fi
  require_java
  command -v mvn >/dev/null || die "mvn not found: Kafka's jars are fetched from Maven Central with Maven (Debian: apt-get install maven)"
  log kafka "fetching Apache Kafka $version from Maven Central"
  rm -rf "$KAFKA_LIBS.tmp"
  mvn -q -B -f "$PROJECT_DIR/scripts/kafka/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$KAFKA_LIBS.tmp" >/dev/null \
    || die "mvn could not fetch Apache Kafka $version (see 'mvn -f scripts/kafka/pom.xml dependency:copy-dependencies')"
  rm -rf "$KAFKA_LIBS"
  mv "$KAFKA_LIBS.tmp" "$KAFKA_LIBS"
}

kafka_java() {
  require_java
  java -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" -cp "$KAFKA_LIBS/*" "$@"
}

kafka_node_dir() { echo "$KAFKA_DIR/node-$1"; }

# --- Kafka's secured listener ---
# Every broker listens twice for clients: PLAINTEXT on KAFKA_PORT_BASE+N, for development and
# the tests, whose clients are User:ANONYMOUS, a super user (so are the brokers and the
# controllers among themselves); and SASL_SSL on KAFKA_SECURE_PORT_BASE+N: TLS with a
# certificate of this project's own CA (made here with openssl, for 127.0.0.1 and localhost),
# SCRAM-SHA-512 users, and KRaft's StandardAuthorizer, which lets a user do only what its ACLs
# allow. Users and ACLs are made through the PLAINTEXT listener by whoever needs them
# (tests/kafka_events/conftest.py; docs/integration.md shows Kafka's own commands).
KAFKA_TLS_DIR="$KAFKA_DIR/tls"
# The keystore's password: it guards a certificate for 127.0.0.1, made for this machine only.
KAFKA_KEYSTORE_PASSWORD=outbox-local

kafka_tls_make() {
  [[ -f "$KAFKA_TLS_DIR/ca.pem" && -f "$KAFKA_TLS_DIR/broker.p12" ]] && return
  command -v openssl >/dev/null || apt_install openssl
  log kafka "making a CA and the brokers' TLS certificate in $KAFKA_TLS_DIR"
  rm -rf "$KAFKA_TLS_DIR"
  mkdir -p "$KAFKA_TLS_DIR"
  (
    cd "$KAFKA_TLS_DIR"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=outbox local CA" \
      -keyout ca.key -out ca.pem 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout broker.key \
      -out broker.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >broker.ext
    openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile broker.ext -out broker.pem 2>/dev/null
    openssl pkcs12 -export -in broker.pem -inkey broker.key -CAfile ca.pem -chain \
      -name broker -passout "pass:$KAFKA_KEYSTORE_PASSWORD" -out broker.p12
    rm -f broker.csr broker.ext ca.srl
  ) || die "openssl could not make the brokers' TLS certificate in $KAFKA_TLS_DIR"
}

kafka_write_config() {
  local node="$1" brokers="$2" dir voters="" n
  dir="$(kafka_node_dir "$node")"
  for ((n = 1; n <= brokers; n++)); do
    voters+="${voters:+,}$n@127.0.0.1:$((KAFKA_CONTROLLER_PORT_BASE + n))"
  done
  local replication=1 min_isr=1
  if ((brokers >= 3)); then replication=3; min_isr=2; fi
  mkdir -p "$dir"
  cat >"$dir/server.properties" <<EOF
# Written by scripts/services.sh; edits are overwritten.
process.roles=broker,controller
node.id=$node
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$((KAFKA_CLIENT_PORT_BASE + node)),SECURE://127.0.0.1:$((KAFKA_SECURE_PORT_BASE + node)),CONTROLLER://127.0.0.1:$((KAFKA_CONTROLLER_PORT_BASE + node))
advertised.listeners=PLAINTEXT://127.0.0.1:$((KAFKA_CLIENT_PORT_BASE + node)),SECURE://127.0.0.1:$((KAFKA_SECURE_PORT_BASE + node))
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SECURE:SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.secure.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PKCS12
ssl.keystore.location=$KAFKA_TLS_DIR/broker.p12
ssl.keystore.password=$KAFKA_KEYSTORE_PASSWORD
ssl.key.password=$KAFKA_KEYSTORE_PASSWORD
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS
log.dirs=$dir/data
num.partitions=6
default.replication.factor=$replication
min.insync.replicas=$min_isr
offsets.topic.replication.factor=$replication
transaction.state.log.replication.factor=$replication
transaction.state.log.min.isr=$min_isr
unclean.leader.election.enable=false
auto.create.topics.enable=true
delete.topic.enable=true
group.initial.rebalance.delay.ms=0
EOF
}

kafka_node_pid() { cat "$(kafka_node_dir "$1")/kafka.pid" 2>/dev/null || true; }

kafka_node_running() { local pid; pid="$(kafka_node_pid "$1")"; [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; }

kafka_node_started() {
  kafka_node_running "$1" && port_open 127.0.0.1 $((KAFKA_CLIENT_PORT_BASE + $1)) \
    && grep -q "Kafka Server started" "$(kafka_node_dir "$1")/kafka.log" 2>/dev/null
}

# Starts broker N in the background. A broker already running is left as it is (`up`), or,
# with a second argument `restart` (`kafka-start N`), is an error: a fault test that restarts
# a broker must know it had been down.
kafka_start_node() {
  local node="$1" mode="${2:-}" dir
  dir="$(kafka_node_dir "$node")"
  if kafka_node_running "$node"; then
    [[ "$mode" != restart ]] || die "kafka node $node is already running (pid $(kafka_node_pid "$node")): nothing to restart"
    return
  fi
  [[ -f "$dir/server.properties" ]] || die "kafka node $node does not exist under $KAFKA_DIR"
  : >"$dir/kafka.log"
  # shellcheck disable=SC2086  # KAFKA_HEAP holds several JVM options
  nohup java $KAFKA_HEAP -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" \
    -cp "$KAFKA_LIBS/*" kafka.Kafka "$dir/server.properties" >>"$dir/kafka.log" 2>&1 &
  echo $! >"$dir/kafka.pid"
}

kafka_up() {
  local bootstrap="${KAFKA_BOOTSTRAP_SERVERS:-$(kafka_default_bootstrap)}"
  local first="${bootstrap%%,*}"
  local running_mode=""
  [[ -f "$KAFKA_DIR/brokers" ]] && running_mode="$(cat "$KAFKA_DIR/brokers")"
  if port_open "${first%%:*}" "${first##*:}" && ! kafka_node_running 1; then
    log kafka "already answering at $bootstrap; using it"
    return
  fi
  if kafka_node_running 1 && [[ "$running_mode" != "$KAFKA_BROKERS" ]]; then
    die "a ${running_mode}-node Kafka started by this project is running; run 'make services-down' before asking for $KAFKA_BROKERS"
  fi
  [[ "$KAFKA_BROKERS" == 1 || "$KAFKA_BROKERS" == 3 ]] || die "KAFKA_BROKERS must be 1 or 3, got '$KAFKA_BROKERS'"
  require_java
  kafka_fetch
  mkdir -p "$KAFKA_DIR"
  cat >"$KAFKA_DIR/log4j2.properties" <<'EOF'
status = warn
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
logger.appinfo.name = org.apache.kafka.common.utils.AppInfoParser
logger.appinfo.level = INFO
EOF
  # A cluster formatted for another size cannot be reused: its quorum differs.
  if [[ "$running_mode" != "$KAFKA_BROKERS" ]]; then
    rm -rf "$KAFKA_DIR"/node-*
  fi
  local cluster_id node
  if [[ -f "$KAFKA_DIR/cluster-id" && "$running_mode" == "$KAFKA_BROKERS" ]]; then
    cluster_id="$(cat "$KAFKA_DIR/cluster-id")"
  else
    cluster_id="$(kafka_java kafka.tools.StorageTool random-uuid | tail -n 1)"
    echo "$cluster_id" >"$KAFKA_DIR/cluster-id"
  fi
  echo "$KAFKA_BROKERS" >"$KAFKA_DIR/brokers"
  kafka_tls_make
  for ((node = 1; node <= KAFKA_BROKERS; node++)); do
    kafka_write_config "$node" "$KAFKA_BROKERS"
    if [[ ! -f "$(kafka_node_dir "$node")/data/meta.properties" ]]; then
      kafka_java kafka.tools.StorageTool format -t "$cluster_id" \
        -c "$(kafka_node_dir "$node")/server.properties" >/dev/null
    fi
  done
  for ((node = 1; node <= KAFKA_BROKERS; node++)); do kafka_start_node "$node"; done
  for ((node = 1; node <= KAFKA_BROKERS; node++)); do
    wait_for "kafka node $node" kafka_node_started "$node"
  done
  log kafka "Apache Kafka $(kafka_version) (KRaft, $KAFKA_BROKERS node(s)) at $(kafka_default_bootstrap); SASL_SSL at 127.0.0.1:$((KAFKA_SECURE_PORT_BASE + 1))"
}

# Stops broker N with SIGTERM (controlled shutdown) or SIGKILL and waits until its process is
# gone; one that ignores SIGTERM for WAIT_SECONDS is killed. A broker that is not running is
# an error: a fault test must know its fault happened. Leaves the pid it stopped in
# KAFKA_STOPPED_PID, and KAFKA_STOP_FORCED=1 when SIGTERM had to be followed by SIGKILL.
# The pid of broker `node`, which must be running (dies otherwise, saying what it was asked
# to do); a pid file left behind by a broker that is gone is removed.
kafka_running_pid() {
  local node="$1" doing="$2" pid dir
  dir="$(kafka_node_dir "$node")"
  pid="$(kafka_node_pid "$node")"
  if [[ -z "$pid" ]] || ! kill -0 "$pid" 2>/dev/null; then
    rm -f "$dir/kafka.pid"
    die "kafka node $node is not running${pid:+ (its pid $pid is gone)}: nothing to $doing"
  fi
  # A pid file left by a broker that died, whose pid another process has taken since.
  if [[ -r "/proc/$pid/cmdline" ]] \
    && ! tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "node-$node/server.properties"; then
    rm -f "$dir/kafka.pid"
    die "kafka node $node is not running: its pid $pid now belongs to another process"
  fi
  echo "$pid"
}

# Sends `signal` to each pid and waits until all are gone; SIGKILL to those still there after
# WAIT_SECONDS. STOP_FORCED says whether it took a SIGKILL.
stop_process() {
  local signal="$1" deadline=$((SECONDS + WAIT_SECONDS)) pid alive
  shift
  STOP_FORCED=0
  kill "-$signal" "$@"
  while :; do
    alive=()
    for pid in "$@"; do
      if kill -0 "$pid" 2>/dev/null; then alive+=("$pid"); fi
    done
    ((${#alive[@]})) || break
    if ((SECONDS >= deadline && ! STOP_FORCED)); then
      kill -KILL "${alive[@]}" 2>/dev/null || true
      STOP_FORCED=1
    fi
    sleep 0.2
  done
}

# The state letter of a process (ps(1)): T once SIGSTOP has taken effect.
process_state() { awk '{print $3}' "/proc/$1/stat" 2>/dev/null; }

# SIGSTOP (pause) or SIGCONT (resume) to broker `node`; waits until the kernel shows the
# process stopped, or no longer stopped, and reports its pid.
kafka_signal_node() {
  local node="$1" signal="$2" pid
  pid="$(kafka_running_pid "$node" "signal with SIG$signal")" || exit 1
  kill "-$signal" "$pid"
  paused() { [[ "$(process_state "$pid")" == T ]]; }
  running() { ! paused; }
  if [[ "$signal" == STOP ]]; then
    wait_for "kafka node $node stopped by SIGSTOP" paused
    log kafka "node $node paused: pid $pid, SIGSTOP"
  else
    wait_for "kafka node $node resumed by SIGCONT" running
    log kafka "node $node resumed: pid $pid, SIGCONT"
  fi
}

kafka_stop_node() {
  local node="$1" signal="${2:-TERM}" pid dir
  dir="$(kafka_node_dir "$node")"
  pid="$(kafka_running_pid "$node" "stop with SIG$signal")" || exit 1
  KAFKA_STOPPED_PID="$pid"
  stop_process "$signal" "$pid"
  KAFKA_STOP_FORCED="$STOP_FORCED"
  rm -f "$dir/kafka.pid"
}

# Every broker at once: stopped one after another, the last ones' controlled shutdown waits
# for a controller quorum that the first ones took away, until WAIT_SECONDS runs out.
kafka_down() {
  local node pids=() dirs=()
  for dir in "$KAFKA_DIR"/node-*; do
    [[ -d "$dir" ]] || continue
    node="${dir##*-}"
    if kafka_node_running "$node"; then
      pids+=("$(kafka_running_pid "$node" stop)") dirs+=("$dir")
    fi
  done
  if ((${#pids[@]} == 0)); then
    log kafka "not started by this project"
    return
  fi
  stop_process TERM "${pids[@]}"
  for dir in "${dirs[@]}"; do rm -f "$dir/kafka.pid"; done
  if ((STOP_FORCED)); then log kafka "stopped (SIGKILL after ${WAIT_SECONDS}s)"; else log kafka stopped; fi
}

kafka_status() {
  local bootstrap="${KAFKA_BOOTSTRAP_SERVERS:-$(kafka_default_bootstrap)}" server healthy=0
  IFS=',' read -ra servers <<<"$bootstrap"
  for server in "${servers[@]}"; do
    if port_open "${server%%:*}" "${server##*:}"; then
      log kafka "healthy at $server"; healthy=1
    else
      log kafka "down at $server"
    fi
  done
  ((healthy))
}

# --- Zipkin (traces) ---------------------------------------------------------------------

ZIPKIN_VERSION=3.6.1
ZIPKIN_PORT="${ZIPKIN_PORT:-9411}"
ZIPKIN_HEAP="${ZIPKIN_HEAP:--Xms64m -Xmx512m}"
# Zipkin's default, 500,000, outgrows the heap: a traced `make run` with its demo traffic
# makes about 15 spans a payment (the SQL statements' among them).
ZIPKIN_MAX_SPANS="${ZIPKIN_MAX_SPANS:-100000}"
ZIPKIN_DIR="$LOCAL_DIR/zipkin"
ZIPKIN_JAR="$ZIPKIN_DIR/zipkin-server-$ZIPKIN_VERSION-exec.jar"
ZIPKIN_JAR_URL="https://repo1.maven.org/maven2/io/zipkin/zipkin-server/$ZIPKIN_VERSION/zipkin-server-$ZIPKIN_VERSION-exec.jar"
ZIPKIN_PIDFILE="$ZIPKIN_DIR/zipkin.pid"
ZIPKIN_LOG="$ZIPKIN_DIR/zipkin.log"

tracing_enabled() { local tracing="${TRACING:-}"; [[ "${tracing,,}" =~ ^(1|true|yes)$ ]]; }

zipkin_fetch() {
  [[ -f "$ZIPKIN_JAR" ]] && return
  command -v curl >/dev/null || die "curl not found: Zipkin's jar is fetched from Maven Central with curl (Debian: apt-get install curl)"
  mkdir -p "$ZIPKIN_DIR"
  log zipkin "fetching Zipkin $ZIPKIN_VERSION from Maven Central"
  local expected actual
  expected="$(curl -fsSL --retry 3 "$ZIPKIN_JAR_URL.sha1")" || die "could not fetch $ZIPKIN_JAR_URL.sha1"
  expected="${expected%% *}"
  [[ "$expected" =~ ^[0-9a-f]{40}$ ]] || die "$ZIPKIN_JAR_URL.sha1 holds no SHA-1: '$expected'"
  # A temporary name, so that an interrupted download is never taken for the jar.
  curl -fsSL --retry 3 -o "$ZIPKIN_JAR.tmp" "$ZIPKIN_JAR_URL" || { rm -f "$ZIPKIN_JAR.tmp"; die "could not fetch $ZIPKIN_JAR_URL"; }
  actual="$(sha1sum "$ZIPKIN_JAR.tmp" | cut -d ' ' -f 1)"
  if [[ "$actual" != "$expected" ]]; then
    rm -f "$ZIPKIN_JAR.tmp"
    die "the Zipkin jar from $ZIPKIN_JAR_URL has SHA-1 $actual; Maven Central publishes $expected"
  fi
  mv "$ZIPKIN_JAR.tmp" "$ZIPKIN_JAR"
}

zipkin_pid() { cat "$ZIPKIN_PIDFILE" 2>/dev/null || true; }

# Whether the Zipkin this LOCAL_DIR started runs: its pid is alive and is still a Zipkin of
# this folder (a pid file left by a Zipkin that died may name another process by now).
zipkin_running() {
  local pid; pid="$(zipkin_pid)"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null \
    && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$ZIPKIN_DIR/zipkin-server-"
}

zipkin_ready() {
  [[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$ZIPKIN_PORT/health")" == 200 ]]
}

zipkin_started() {
  zipkin_running || die "Zipkin exited while starting; the end of $ZIPKIN_LOG: $(tail -n 5 "$ZIPKIN_LOG" 2>/dev/null)"
  zipkin_ready
}

zipkin_up() {
  if zipkin_running; then
    wait_for zipkin zipkin_started
    log zipkin "running at http://127.0.0.1:$ZIPKIN_PORT (pid $(zipkin_pid))"
    return
  fi
  if port_open 127.0.0.1 "$ZIPKIN_PORT"; then
    zipkin_ready || die "something answers at 127.0.0.1:$ZIPKIN_PORT, but not GET /health with 200: no Zipkin? Set ZIPKIN_PORT to a free port"
    log zipkin "already answering at 127.0.0.1:$ZIPKIN_PORT; using it"
    return
  fi
  require_java
  command -v setsid >/dev/null || die "setsid not found (Debian: apt-get install util-linux)"
  zipkin_fetch
  local started=$SECONDS
  rm -f "$ZIPKIN_PIDFILE"
  : >"$ZIPKIN_LOG"
  # In its own session, so that Ctrl-C in the terminal that ran `make run` leaves it running,
  # as the other services keep running. The shell that writes the pid file execs into Java,
  # so the file holds Java's pid. An empty environment besides PATH and HOME: Zipkin (Spring
  # Boot) reads any variable that names one of its settings, and turns on a collector for each
  # of KAFKA_BOOTSTRAP_SERVERS, RABBIT_URI, ACTIVEMQ_URL... it finds. This project sets the
  # first for itself, and Zipkin would consume (and create) a topic `zipkin` in our Kafka.
  # The listener is given whole (address, port, protocol) to bind loopback only.
  # shellcheck disable=SC2016,SC2086  # $0 and $@ are the inner shell's; ZIPKIN_HEAP holds several options
  setsid env -i PATH="$PATH" HOME="${HOME:-/}" STORAGE_TYPE=mem MEM_MAX_SPANS="$ZIPKIN_MAX_SPANS" \
    QUERY_PORT="$ZIPKIN_PORT" \
    bash -c 'echo $$ >"$0"; exec java "$@"' "$ZIPKIN_PIDFILE" \
    $ZIPKIN_HEAP -jar "$ZIPKIN_JAR" \
    '--armeria.ports[0].ip=127.0.0.1' "--armeria.ports[0].port=$ZIPKIN_PORT" \
    '--armeria.ports[0].protocols[0]=http' \
    </dev/null >>"$ZIPKIN_LOG" 2>&1 &
  # The pid file exists once the inner shell has run; until then zipkin_running is false.
  local deadline=$((SECONDS + 10))
  until [[ -s "$ZIPKIN_PIDFILE" ]]; do
    ((SECONDS < deadline)) || die "Zipkin did not start (no pid in $ZIPKIN_PIDFILE); see $ZIPKIN_LOG"
    sleep 0.1
  done
  wait_for zipkin zipkin_started
  log zipkin "Zipkin $ZIPKIN_VERSION started at http://127.0.0.1:$ZIPKIN_PORT in $((SECONDS - started))s (pid $(zipkin_pid); UI /zipkin/, log $ZIPKIN_LOG)"
}

# SIGTERM, and SIGKILL if Zipkin is still there after WAIT_SECONDS.
zipkin_down() {
  if ! zipkin_running; then
    rm -f "$ZIPKIN_PIDFILE"
    log zipkin "not started by this project"
    return
  fi
  stop_process TERM "$(zipkin_pid)"
  rm -f "$ZIPKIN_PIDFILE"
  if ((STOP_FORCED)); then log zipkin "stopped (SIGTERM ignored for ${WAIT_SECONDS}s, then SIGKILL)"; else log zipkin stopped; fi
}

# Down is a failure only when TRACING asks for Zipkin.
zipkin_status() {
  if zipkin_running; then
    if zipkin_ready; then
      log zipkin "running at http://127.0.0.1:$ZIPKIN_PORT (pid $(zipkin_pid))"
    else
      log zipkin "starting at http://127.0.0.1:$ZIPKIN_PORT (pid $(zipkin_pid)), not healthy yet"
      return 1
    fi
  elif zipkin_ready; then
    log zipkin "running at http://127.0.0.1:$ZIPKIN_PORT (not started by this project)"
  else
    log zipkin "not running (TRACING=1 starts it)"
    ! tracing_enabled
  fi
}

# --- entry point -------------------------------------------------------------------------

command="${1:-}"
case "$command" in
  up)
    mkdir -p "$LOCAL_DIR"
    postgres_standby_clear
    postgres_up
    postgres_standby_forget
    pgbouncer_up
    redis_up
    kafka_up
    if tracing_enabled; then zipkin_up; fi
    ;;
  down)
    zipkin_down
    kafka_down
    redis_down
    pgbouncer_down
    pg_dir_stop "$PG_STANDBY_DATA"
    postgres_down
    ;;
  status)
    status=0
    postgres_status || status=1
    pgbouncer_status || status=1
    redis_status || status=1
    kafka_status || status=1
    zipkin_status || status=1
    exit "$status"
    ;;
  zipkin-up)
    mkdir -p "$LOCAL_DIR"
    zipkin_up
    ;;
  zipkin-down) zipkin_down ;;
  kafka-up)
    mkdir -p "$LOCAL_DIR"
    kafka_up
    ;;
  kafka-down) kafka_down ;;
  kafka-start)
    # A restart: the broker must be down. Reports its new pid.
    kafka_start_node "${2:?broker number}" restart
    wait_for "kafka node $2" kafka_node_started "$2"
    log kafka "node $2 started: pid $(kafka_node_pid "$2")"
    ;;
  kafka-stop | kafka-kill)
    # Reports the pid stopped; exits non-zero when the broker was not running.
    if [[ "$command" == kafka-stop ]]; then signal=TERM; else signal=KILL; fi
    kafka_stop_node "${2:?broker number}" "$signal"
    if ((KAFKA_STOP_FORCED)); then
      log kafka "node $2 stopped: pid $KAFKA_STOPPED_PID, SIG$signal (ignored for ${WAIT_SECONDS}s, then SIGKILL)"
    else
      log kafka "node $2 stopped: pid $KAFKA_STOPPED_PID, SIG$signal"
    fi
    ;;
  kafka-pause) kafka_signal_node "${2:?broker number}" STOP ;;
  kafka-resume) kafka_signal_node "${2:?broker number}" CONT ;;
  postgres-crash)
    # Immediate mode: no checkpoint, clients cut off; recovery replays the WAL at start.
    # Reports the postmaster's pid; exits non-zero when this project's server is not running.
    pid="$(head -n 1 "$PG_DATA/postmaster.pid" 2>/dev/null || true)"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null \
      || die "PostgreSQL is not running from $PG_DATA: nothing to crash"
    as_postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -m immediate -w stop >/dev/null
    postmaster_gone() { ! kill -0 "$pid" 2>/dev/null; }
    wait_for "the end of postmaster $pid" postmaster_gone
    log postgres "stopped in immediate mode: postmaster pid $pid"
    ;;
  postgres-start)
    parse_database_url
    as_postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t "$WAIT_SECONDS" \
      -o "$(pg_server_options)" start >/dev/null
    wait_for postgres pg_ready
    log postgres "started: postmaster pid $(head -n 1 "$PG_DATA/postmaster.pid")"
    ;;
  postgres-standby)
    # A standby of the primary on PG_STANDBY_PORT (sync, the default, or async replication).
    parse_database_url
    mode="$(pg_replication_mode "${2:-}")"
    pg_replica_start "$PG_STANDBY_DATA" "$PG_STANDBY_PORT" "$PG_STANDBY_LOG" "$PG_PORT"
    pg_replication_set "$PG_PORT" "$mode"
    wait_for "the standby's replication" pg_replica_streaming "$PG_PORT" "$mode"
    log postgres "standby on port $PG_STANDBY_PORT streaming ($mode): postmaster pid $(postmaster_pid_of "$PG_STANDBY_DATA")"
    ;;
  postgres-kill)
    # A primary's machine lost: SIGKILL to its postmaster and every backend at once.
    pid="$(postmaster_pid_of "$PG_DATA")"
    pg_dir_running "$PG_DATA" || die "PostgreSQL is not running from $PG_DATA: nothing to kill"
    # shellcheck disable=SC2046
    kill -KILL "$pid" $(pgrep -P "$pid") 2>/dev/null || true
    postmaster_gone() { ! kill -0 "$pid" 2>/dev/null; }
    wait_for "the end of postmaster $pid" postmaster_gone
    log postgres "killed: postmaster pid $pid"
    ;;
  postgres-promote)
    parse_database_url
    pg_dir_running "$PG_STANDBY_DATA" || die "no standby runs from $PG_STANDBY_DATA"
    pg_promote "$PG_STANDBY_DATA" "$PG_STANDBY_PORT"
    log postgres "standby on port $PG_STANDBY_PORT promoted: postmaster pid $(postmaster_pid_of "$PG_STANDBY_DATA")"
    ;;
  postgres-rejoin)
    # The old primary back as a standby of the promoted one: its data folder made afresh
    # from it (a machine replaced, or pg_rewind's result), on its own port again.
    parse_database_url
    mode="$(pg_replication_mode "${2:-}")"
    pg_replica_start "$PG_DATA" "$PG_PORT" "$PG_LOG" "$PG_STANDBY_PORT"
    pg_replication_set "$PG_STANDBY_PORT" "$mode"
    wait_for "the old primary's replication" pg_replica_streaming "$PG_STANDBY_PORT" "$mode"
    log postgres "old primary on port $PG_PORT streaming ($mode): postmaster pid $(postmaster_pid_of "$PG_DATA")"
    ;;
  postgres-switchback)
    # A clean switchover to the server on PG_PORT: the promoted standby stops (a fast
    # shutdown sends its standby every WAL record first), PG_PORT's is promoted, and the
    # standby's folder goes.
    parse_database_url
    [[ -f "$PG_DATA/standby.signal" ]] || die "$PG_DATA is no standby: nothing to switch back to"
    pg_dir_stop "$PG_STANDBY_DATA"
    pg_promote "$PG_DATA" "$PG_PORT"
    rm -rf "$PG_STANDBY_DATA"
    log postgres "primary on port $PG_PORT again: postmaster pid $(postmaster_pid_of "$PG_DATA")"
    ;;
  redis-stop)
    # A fault: reports the pid stopped; exits non-zero when this project's Redis was not
    # running (`down` stops it only if it is).
    pid="$(cat "$REDIS_PIDFILE" 2>/dev/null || true)"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null \
      || die "Redis is not running from $(dirname "$REDIS_PIDFILE"): nothing to stop"
    redis_down
    log redis "stopped: pid $pid"
    ;;
  redis-start) redis_up ;;
  *)
    echo "usage: $0 up|down|status|kafka-start N|kafka-stop N|kafka-kill N|kafka-pause N|kafka-resume N|postgres-crash|postgres-start|postgres-standby [sync|async]|postgres-kill|postgres-promote|postgres-rejoin [sync|async]|postgres-switchback|redis-stop|redis-start|zipkin-up|zipkin-down|kafka-up|kafka-down" >&2
    exit 2
    ;;
esac

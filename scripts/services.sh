#!/usr/bin/env bash
# scripts/services.sh — bring up REAL local backing services for docstream,
# natively (no Docker): a private PostgreSQL cluster and a single-node KRaft
# Apache Kafka broker, or a three-node KRaft cluster.
#
#   scripts/services.sh up       start (installing what is missing); idempotent
#   scripts/services.sh up --kafka-nodes 3
#                                Postgres and a three-node Kafka cluster instead of
#                                the single broker (replication factor 3,
#                                min.insync.replicas 2; ports 59101-59103, the
#                                controllers 59111-59113); it can run beside the
#                                single node
#   scripts/services.sh up --postgres-standby [--sync]
#                                also a streaming standby of Postgres on 55433
#                                (synchronous with --sync, else asynchronous)
#   scripts/services.sh up --secure
#                                also a second broker and Postgres that take TLS only:
#                                SASL_SSL (SCRAM-SHA-512) on 59096, SSL with client
#                                certificates on 59098, Postgres with ssl=on on 55434,
#                                and a test CA in .services/tls (scripts/services/secure.sh)
#   scripts/services.sh up --pooler
#                                also two PgBouncers in front of Postgres: session mode
#                                on 55435, transaction mode on 55436 (scripts/services/pooler.sh)
#   scripts/services.sh promote-postgres-standby
#                                make the standby a primary (failover tests)
#   scripts/services.sh down     stop everything, keep data
#   scripts/services.sh down --kafka-nodes 3
#                                stop only the three-node cluster
#   scripts/services.sh down --postgres-standby
#                                stop only the standby (commits go asynchronous)
#   scripts/services.sh status   exit 0 if both are up, 3 otherwise
#   scripts/services.sh env      print the export lines for the test suite
#                                (`env --kafka-nodes 3`: for the cluster)
#   scripts/services.sh reset    down + delete all state (keeps the Kafka jar cache)
#   scripts/services.sh kill kafka|postgres
#                                SIGKILL the broker / the postmaster and wait until it
#                                is gone (fault tests; `up` brings it back)
#   scripts/services.sh kill|stop|start kafka-node N
#                                SIGKILL, SIGTERM (controlled shutdown) or start
#                                node N (1-3) of the cluster, each waiting until done
#   scripts/services.sh restart-postgres
#                                a fast restart (pg_ctl -m fast): sessions are cut
#   scripts/services.sh kafka-tool CLASS [ARGS...]
#                                run a Kafka CLI class with the broker's classpath, e.g.
#                                kafka-tool org.apache.kafka.tools.TopicCommand --list
#                                (--bootstrap-server is added when not given)
#
# Usage in CI / tests:
#   scripts/services.sh up && eval "$(scripts/services.sh env)"
#
# Ports (override with env vars; use the same values for every subcommand):
#   DOCSTREAM_PG_PORT                  55432  Postgres, 127.0.0.1 only
#   DOCSTREAM_KAFKA_PORT               59092  Kafka PLAINTEXT listener, 127.0.0.1 only
#   DOCSTREAM_KAFKA_CONTROLLER_PORT    59093  KRaft controller listener
#   DOCSTREAM_KAFKA_PROXIED_PORT       59094  a second PLAINTEXT listener, for clients
#                                             behind a fault proxy: it advertises
#   DOCSTREAM_KAFKA_PROXY_PORT         59095  the proxy's port, so every connection a
#                                             client opens goes through the proxy
#
# State lives in $REPO/.services/ (git-ignored):
#   .services/postgres/   data/ (PGDATA), run/ (unix socket), postgres.log
#                         (a symlink into /var/tmp/docstream-<hash>/ when the
#                         postgres OS user cannot reach the repo folder)
#   .services/kafka/      libs/ (jars from scripts/kafka/pom.xml), data/,
#                         server.properties, log4j2.properties, kafka.pid, kafka.log
#   .services/kafka-cluster/  cluster-id, node1..node3/ (data/, server.properties,
#                         kafka.pid, kafka.log)
#
# Must run as root (it apt-installs and switches to the postgres user).

set -euo pipefail

# --------------------------------------------------------------------------
# Locations and settings
# --------------------------------------------------------------------------
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
STATE="$REPO/.services"

PG_PORT="${DOCSTREAM_PG_PORT:-55432}"
PG_STANDBY_PORT="${DOCSTREAM_PG_STANDBY_PORT:-55433}"
KAFKA_PORT="${DOCSTREAM_KAFKA_PORT:-59092}"
KAFKA_CTRL_PORT="${DOCSTREAM_KAFKA_CONTROLLER_PORT:-59093}"
KAFKA_PROXIED_PORT="${DOCSTREAM_KAFKA_PROXIED_PORT:-59094}"
KAFKA_PROXY_PORT="${DOCSTREAM_KAFKA_PROXY_PORT:-59095}"
HOST=127.0.0.1

PG_USER=docstream PG_PASSWORD=docstream PG_DB=docstream
PG_LINK="$STATE/postgres"          # a real dir, or a symlink to the fallback dir
# Fallback for when the postgres OS user cannot traverse $REPO (e.g. /root/...).
PG_FALLBACK="/var/tmp/docstream-$(printf '%s' "$REPO" | sha1sum | cut -c1-10)/postgres"

KAFKA_DIR="$STATE/kafka"
KAFKA_LIBS="$KAFKA_DIR/libs"
KAFKA_DATA="$KAFKA_DIR/data"
KAFKA_CONF="$KAFKA_DIR/server.properties"
KAFKA_LOG4J="$KAFKA_DIR/log4j2.properties"
KAFKA_PID="$KAFKA_DIR/kafka.pid"
KAFKA_LOG="$KAFKA_DIR/kafka.log"
KAFKA_POM="$REPO/scripts/kafka/pom.xml"
# Broker JVM: small heap, the machine is shared with cargo builds.
KAFKA_HEAP_OPTS="${DOCSTREAM_KAFKA_HEAP_OPTS:--Xms256m -Xmx768m}"
# CLI tools: tiny heap, fast start-up.
TOOL_JVM_OPTS=(-Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1)

# The three-node cluster (`up --kafka-nodes 3`): node i's broker listens on
# CLUSTER_BASE_PORT+i, its controller on CLUSTER_BASE_PORT+10+i.
CLUSTER_DIR="$STATE/kafka-cluster"
CLUSTER_NODES=3
CLUSTER_BASE_PORT="${DOCSTREAM_KAFKA_CLUSTER_PORT:-59100}"
# Three JVMs share 2 cores with Postgres, cargo and the tests: a small heap and
# few GC and compiler threads each.
NODE_JVM_OPTS="${DOCSTREAM_KAFKA_NODE_JVM_OPTS:--Xms128m -Xmx512m -XX:ParallelGCThreads=1 -XX:ConcGCThreads=1 -XX:CICompilerCount=2}"

DEADLINE_SECS=90

# Is PID a live (non-zombie) process?  PID 1 on some sandboxes reaps orphans
# lazily, so a killed daemon can linger as a zombie for seconds; `kill -0` and
# `pg_ctl status` would call that "running".
proc_alive() {
    local st
    st="$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" || return 1
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

log() { printf '[services] %s\n' "$*" >&2; }
# shellcheck source=scripts/services/secure.sh
source "$REPO/scripts/services/secure.sh"
# shellcheck source=scripts/services/pooler.sh
source "$REPO/scripts/services/pooler.sh"
die() { log "ERROR: $*"; exit 1; }

# --------------------------------------------------------------------------
# Installing what is missing (Debian / apt)
# --------------------------------------------------------------------------
APT_UPDATED=0
apt_install() {
    [ "$(id -u)" = 0 ] || die "need root to apt-get install $*"
    if [ "$APT_UPDATED" = 0 ]; then
        log "apt-get update"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        APT_UPDATED=1
    fi
    log "apt-get install -y $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@" >/dev/null
}

# Newest /usr/lib/postgresql/<ver>/bin, or the one matching an existing cluster.
pg_bindir() {
    local want="" d
    if [ -f "$PG_LINK/data/PG_VERSION" ]; then
        want="$(cat "$PG_LINK/data/PG_VERSION")"
        d="/usr/lib/postgresql/$want/bin"
        [ -x "$d/postgres" ] || die "cluster in $PG_LINK/data is PostgreSQL $want but $d is missing (apt-get install postgresql-$want, or: $0 reset)"
        echo "$d"; return
    fi
    # shellcheck disable=SC2012
    d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)"
    [ -n "$d" ] && [ -x "$d/initdb" ] && echo "$d"
}

ensure_packages() {
    local pkgs=()
    if [ -z "$(pg_bindir || true)" ] || ! command -v pg_isready >/dev/null; then
        pkgs+=(postgresql postgresql-client)
    fi
    command -v java >/dev/null || pkgs+=(openjdk-17-jre-headless)
    # Maven is only needed when the Kafka jars are not cached yet.
    if ! kafka_libs_ok && ! command -v mvn >/dev/null; then pkgs+=(maven); fi
    command -v flock >/dev/null || pkgs+=(util-linux)
    if [ "${#pkgs[@]}" -gt 0 ]; then apt_install "${pkgs[@]}"; fi
    # postgresql-common creates this user; make sure it exists anyway.
    id -u postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
    PG_BIN="$(pg_bindir)" || die "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin"
}

# --------------------------------------------------------------------------
# Postgres
# --------------------------------------------------------------------------
# Run a command as the postgres OS user (postgres refuses to run as root), from
# "/" so it does not trip over an unreadable cwd.
as_pg() { (cd / && runuser -u postgres -- "$@"); }

# Pick where the cluster lives.  Preferred: $STATE/postgres (a real dir).
# If the postgres user cannot reach it, or the unix-socket path would be too
# long (limit ~107 bytes), use $PG_FALLBACK and symlink $STATE/postgres to it.
pg_prepare_dir() {
    if [ -L "$PG_LINK" ]; then
        local target; target="$(readlink "$PG_LINK")"
        mkdir -p "$target"; chown postgres:postgres "$target"; chmod 700 "$target"
        chmod 755 "$(dirname "$target")"
    elif [ ! -d "$PG_LINK" ]; then
        local probe="$STATE/.pg-probe"
        mkdir -p "$probe"; chown postgres:postgres "$probe"
        local sock="$PG_LINK/run/.s.PGSQL.$PG_PORT.lock"
        if [ "${#sock}" -lt 100 ] && as_pg test -w "$probe" -a -x "$probe"; then
            mv "$probe" "$PG_LINK"
        else
            rmdir "$probe"
            log "postgres user cannot use $STATE (or path too long); cluster goes to $PG_FALLBACK"
            mkdir -p "$PG_FALLBACK"; chmod 755 "$(dirname "$PG_FALLBACK")"
            chown postgres:postgres "$PG_FALLBACK"; chmod 700 "$PG_FALLBACK"
            ln -sfn "$PG_FALLBACK" "$PG_LINK"
        fi
    fi
    # From here on use the resolved physical path (what postgres sees).
    PG_HOME="$(cd "$PG_LINK" && pwd -P)"
    PG_DATA="$PG_HOME/data"
    PG_SOCK="$PG_HOME/run"
    PG_LOGFILE="$PG_HOME/postgres.log"
    as_pg mkdir -p "$PG_SOCK"
}

# Our settings, included from postgresql.conf.  Defaults otherwise; fsync stays
# ON on purpose (tests check durability claims).
pg_render_conf() {
    cat <<EOF
# Written by scripts/services.sh — edits are overwritten on every 'up'.
listen_addresses = '$HOST'
port = $PG_PORT
unix_socket_directories = '$PG_SOCK'
max_connections = 300
shared_buffers = 128MB
# Per-statement timings: \`docstream bench\` reports where the server's time goes.
shared_preload_libraries = 'pg_stat_statements'
# Job rows are rewritten several times in a few seconds; look for tables to
# vacuum every 5 s instead of every minute so dead versions do not pile up.
autovacuum_naptime = 5s
log_line_prefix = '%m [%p] %q%u@%d '
log_timezone = 'UTC'
timezone = 'UTC'
EOF
}

# Postmaster alive?  (pid from postmaster.pid, must be a live postgres process
# for this data dir; a stale pid file or a zombie counts as not running.)
# Is the process of pid file $1 alive, and does its command line name $2?
# (A stale pid file may name a pid reused since.) Prints the pid if so.
pid_running_as() {
    local pid
    pid="$(head -n1 "$1" 2>/dev/null || true)"
    [ -n "$pid" ] && proc_alive "$pid" \
        && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$2" \
        && echo "$pid"
}
# Is the cluster of data folder $1 running?
pg_cluster_running() { pid_running_as "$1/postmaster.pid" "$1" >/dev/null; }
pg_running() { pg_cluster_running "$PG_DATA"; }
pg_start_once() {
    (cd / && setsid runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_LOGFILE" \
        -w -t "$DEADLINE_SECS" start >/dev/null 2>&1 </dev/null 9>&-)
}
pg_ready()   { "$PG_BIN/pg_isready" -q -h "$HOST" -p "$PG_PORT" -d postgres -t 3 >/dev/null 2>&1; }
pg_sql()     { as_pg "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$PG_SOCK" -p "$PG_PORT" -U postgres -d postgres "$@"; }

pg_up() {
    pg_prepare_dir
    if [ ! -f "$PG_DATA/PG_VERSION" ]; then
        log "initdb $PG_DATA"
        as_pg "$PG_BIN/initdb" -D "$PG_DATA" -U postgres -E UTF8 --locale=C \
            --auth-local=trust --auth-host=scram-sha-256 >/dev/null
        echo "include_if_exists = 'docstream.conf'" | as_pg tee -a "$PG_DATA/postgresql.conf" >/dev/null
    fi

    # (Re)write our config; restart a running server if it changed (e.g. port).
    local new old=""; new="$(pg_render_conf)"
    [ -f "$PG_DATA/docstream.conf" ] && old="$(cat "$PG_DATA/docstream.conf")"
    local changed=0
    if [ "$new" != "$old" ]; then
        printf '%s\n' "$new" | as_pg tee "$PG_DATA/docstream.conf" >/dev/null
        changed=1
    fi

    if pg_running; then
        if [ "$changed" = 1 ]; then
            log "postgres config changed; restarting"
            as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w -t 60 stop >/dev/null
        elif pg_ready; then
            pg_ensure_db; return
        fi
    fi
    if ! pg_running; then
        port_open "$PG_PORT" && die "port $HOST:$PG_PORT is taken by another process (another checkout's services? stop them, or set DOCSTREAM_PG_PORT)"
        log "starting postgres on $HOST:$PG_PORT (log: $PG_LINK/postgres.log)"
        # setsid: own session, so the server outlives this script and the terminal.
        # postgres itself ignores a stale postmaster.pid, but refuses to start while
        # leftovers of a killed server (zombie postmaster, orphaned backends holding
        # shared memory) are still around: retry until they are gone.
        local t1=$SECONDS
        until pg_start_once; do
            if (( SECONDS - t1 > DEADLINE_SECS )); then
                tail -n 30 "$PG_LOGFILE" >&2 || true
                die "postgres failed to start (log: $PG_LINK/postgres.log)"
            fi
            log "postgres did not start; retrying in 2s ($(tail -n1 "$PG_LOGFILE" 2>/dev/null | cut -c1-160))"
            sleep 2
        done
    fi
    local t0=$SECONDS
    until pg_ready; do
        if (( SECONDS - t0 > DEADLINE_SECS )); then
            tail -n 30 "$PG_LOGFILE" >&2 || true
            die "postgres not accepting connections on $HOST:$PG_PORT after ${DEADLINE_SECS}s"
        fi
        sleep 0.5
    done
    pg_ensure_db
}

# Superuser role + database (idempotent).
pg_ensure_db() {
    pg_sql <<SQL
DO \$\$BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN
    CREATE ROLE $PG_USER LOGIN SUPERUSER PASSWORD '$PG_PASSWORD';
  END IF;
END\$\$;
SQL
    if [ -z "$(pg_sql -tA -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" ]; then
        pg_sql -c "CREATE DATABASE $PG_DB OWNER $PG_USER"
    fi
}

pg_down() {
    [ -e "$PG_LINK" ] || return 0
    PG_BIN="$(pg_bindir)" || return 0
    PG_DATA="$(cd "$PG_LINK" && pwd -P)/data"
    pg_running || { log "postgres: not running"; return 0; }
    log "stopping postgres"
    # fast = roll back open transactions and disconnect clients (SIGINT), clean
    # checkpoint.  Then immediate (SIGQUIT), then SIGKILL as a last resort.
    as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w -t 30 stop >/dev/null 2>&1 && return 0
    as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -m immediate -w -t 10 stop >/dev/null 2>&1 && return 0
    local pid; pid="$(head -n1 "$PG_DATA/postmaster.pid" 2>/dev/null || true)"
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
}

pg_status() {
    [ -e "$PG_LINK" ] || return 1
    PG_BIN="$(pg_bindir)" || return 1
    PG_DATA="$(cd "$PG_LINK" && pwd -P)/data"
    pg_running && pg_ready
}

# --------------------------------------------------------------------------
# A streaming standby of the Postgres cluster (`up --postgres-standby`), for
# the failover tests: a copy made with pg_basebackup that replays the
# primary's WAL on PG_STANDBY_PORT. `--sync` makes it synchronous: a commit on
# the primary returns only once the standby has it, so a promotion loses no
# acknowledged transaction; without it, the last commits may be lost.
# `promote-postgres-standby` makes it a primary. `down`/`reset` remove it with
# the rest; `up --postgres-standby` after a promotion makes a fresh copy.
# --------------------------------------------------------------------------
STANDBY_NAME=docstream_standby

standby_paths() {
    pg_prepare_dir
    STANDBY_DATA="$PG_HOME/standby"
    STANDBY_SOCK="$PG_HOME/standby-run"
    STANDBY_LOG="$PG_HOME/standby.log"
}

standby_running() { pg_cluster_running "$STANDBY_DATA"; }

# The primary's setting for synchronous replication: the standby's name, or
# empty (asynchronous). A reload applies it.
pg_set_sync() {
    local names="$1"
    pg_sql -c "ALTER SYSTEM SET synchronous_standby_names = '$names'" >/dev/null
    pg_sql -c "SELECT pg_reload_conf()" >/dev/null
}

standby_up() {
    local sync="$1"
    standby_paths
    # A standby that was promoted (no standby.signal) is a primary now:
    # replace it with a fresh copy.
    if [ -d "$STANDBY_DATA" ] && [ ! -f "$STANDBY_DATA/standby.signal" ]; then
        log "the standby was promoted; making a fresh copy"
        standby_stop
        rm -rf "$STANDBY_DATA"
    fi
    if [ ! -f "$STANDBY_DATA/PG_VERSION" ]; then
        log "pg_basebackup of the primary into $STANDBY_DATA"
        as_pg rm -rf "$STANDBY_DATA"
        as_pg env PGPASSWORD="$PG_PASSWORD" "$PG_BIN/pg_basebackup" -D "$STANDBY_DATA" \
            -h "$HOST" -p "$PG_PORT" -U "$PG_USER" -X stream -c fast -R \
            -d "application_name=$STANDBY_NAME" >/dev/null
    fi
    as_pg mkdir -p "$STANDBY_SOCK"
    # The copy carries the primary's docstream.conf: give it its own port and
    # socket, and no synchronous standby of its own once promoted.
    pg_render_conf | sed -e "s|^port = .*|port = $PG_STANDBY_PORT|" \
        -e "s|^unix_socket_directories = .*|unix_socket_directories = '$STANDBY_SOCK'|" \
        | as_pg tee "$STANDBY_DATA/docstream.conf" >/dev/null
    as_pg sed -i '/^synchronous_standby_names/d' "$STANDBY_DATA/postgresql.auto.conf"
    if ! standby_running; then
        port_open "$PG_STANDBY_PORT" && die "port $HOST:$PG_STANDBY_PORT is taken (set DOCSTREAM_PG_STANDBY_PORT)"
        log "starting the postgres standby on $HOST:$PG_STANDBY_PORT (log: $STANDBY_LOG)"
        (cd / && setsid runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$STANDBY_DATA" -l "$STANDBY_LOG" \
            -w -t "$DEADLINE_SECS" start >/dev/null 2>&1 </dev/null 9>&-) \
            || { tail -n 20 "$STANDBY_LOG" >&2; die "the standby did not start"; }
    fi
    if [ "$sync" = sync ]; then pg_set_sync "$STANDBY_NAME"; else pg_set_sync ""; fi
    # Streaming: the primary sees it, in the mode asked for.
    local want=async t0=$SECONDS state=""
    [ "$sync" = sync ] && want=sync
    until [ "$state" = "$want" ]; do
        state="$(pg_sql -tA -c "SELECT sync_state FROM pg_stat_replication WHERE application_name = '$STANDBY_NAME'" 2>/dev/null || true)"
        if (( SECONDS - t0 > DEADLINE_SECS )); then
            tail -n 20 "$STANDBY_LOG" >&2 || true
            die "the standby is not streaming ($want) after ${DEADLINE_SECS}s (state: ${state:-none})"
        fi
        [ "$state" = "$want" ] || sleep 0.5
    done
}

# A primary waiting for a synchronous standby that is gone (stopped, or
# promoted in a failover test) would hang every commit: go asynchronous.
pg_sync_off_without_a_standby() {
    [ -n "$(pg_sql -tA -c "SHOW synchronous_standby_names")" ] || return 0
    standby_paths
    if ! standby_running || [ ! -f "$STANDBY_DATA/standby.signal" ]; then
        log "no standby streams: postgres commits asynchronously again"
        pg_set_sync ""
    fi
}

standby_stop() {
    standby_running || return 0
    log "stopping the postgres standby"
    as_pg "$PG_BIN/pg_ctl" -D "$STANDBY_DATA" -m fast -w -t 30 stop >/dev/null 2>&1 \
        || as_pg "$PG_BIN/pg_ctl" -D "$STANDBY_DATA" -m immediate -w -t 10 stop >/dev/null 2>&1 || true
}

cmd_promote_standby() {
    ensure_packages
    standby_paths
    standby_running || die "no standby is running (up --postgres-standby)"
    [ -f "$STANDBY_DATA/standby.signal" ] || die "the standby was promoted already"
    log "promoting the postgres standby on $HOST:$PG_STANDBY_PORT"
    as_pg "$PG_BIN/pg_ctl" -D "$STANDBY_DATA" -w -t 60 promote >/dev/null
}

# --------------------------------------------------------------------------
# Kafka
# --------------------------------------------------------------------------
kafka_libs_ok() {
    [ -f "$KAFKA_LIBS/.complete" ] && [ "$(cat "$KAFKA_LIBS/.complete")" = "$(sha1sum < "$KAFKA_POM")" ]
}

kafka_fetch_libs() {
    kafka_libs_ok && return 0
    log "resolving Kafka jars from Maven Central (scripts/kafka/pom.xml)"
    rm -rf "$KAFKA_LIBS"
    mkdir -p "$KAFKA_DIR"
    local tmp="$KAFKA_LIBS.tmp.$$"
    rm -rf "$tmp"
    if ! mvn -q -B -Dstyle.color=never -f "$KAFKA_POM" dependency:copy-dependencies \
            -DoutputDirectory="$tmp" >"$KAFKA_DIR/mvn.log" 2>&1; then
        tail -n 30 "$KAFKA_DIR/mvn.log" >&2
        rm -rf "$tmp"; die "mvn could not resolve Kafka jars (see $KAFKA_DIR/mvn.log)"
    fi
    sha1sum < "$KAFKA_POM" > "$tmp/.complete"
    mv "$tmp" "$KAFKA_LIBS"
}

kafka_render_conf() {
    cat <<EOF
# Written by scripts/services.sh — edits are overwritten on every 'up'.
# Single node KRaft: this process is both broker and controller.
process.roles=broker,controller
node.id=1
# Static single-voter quorum (kraft.version 0): survives port changes, no
# --standalone bootstrap needed.
controller.quorum.voters=1@$HOST:$KAFKA_CTRL_PORT
# PROXIED is for clients behind a fault proxy (toxiproxy in tests/it/faults.rs):
# it advertises the proxy's port, so the client's every connection crosses it.
listeners=PLAINTEXT://$HOST:$KAFKA_PORT,CONTROLLER://$HOST:$KAFKA_CTRL_PORT,PROXIED://$HOST:$KAFKA_PROXIED_PORT
advertised.listeners=PLAINTEXT://$HOST:$KAFKA_PORT,PROXIED://$HOST:$KAFKA_PROXY_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PROXIED:PLAINTEXT
log.dirs=$KAFKA_DATA

$(kafka_single_node_conf)
EOF
}

# The topic and group settings of a single-node broker (the plaintext one
# and the secured one).
kafka_single_node_conf() {
    cat <<EOF
num.partitions=6
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=false
delete.topic.enable=true

offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1

$(kafka_group_conf)
EOF
}

# The consumer-group settings of every broker, single node or cluster.
kafka_group_conf() {
    cat <<EOF
# Tests: no 3 s wait before the first rebalance. Both group protocols (classic
# and KIP-848's consumer) are on by default since Kafka 4.0.
group.initial.rebalance.delay.ms=0
# Fault tests pair short leases with short consumer sessions, so a killed
# worker's partitions move on about when its claims expire. The broker defaults
# (6 s classic, 45 s consumer protocol) are production floors, not laws.
group.min.session.timeout.ms=2000
group.consumer.min.session.timeout.ms=2000
group.consumer.session.timeout.ms=6000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.heartbeat.interval.ms=1000
EOF
}

kafka_render_log4j() {
    cat <<'EOF'
# Written by scripts/services.sh.  Everything to stdout -> .services/kafka/kafka.log
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.kafkareq.name = kafka.request.logger
logger.kafkareq.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = WARN
logger.clients.name = org.apache.kafka.clients
logger.clients.level = WARN
# One line per partition created/loaded: far too chatty for test suites that
# create many topics.  Topic creation is still logged by the controller.
logger.partition.name = kafka.cluster.Partition
logger.partition.level = WARN
logger.logmanager.name = kafka.log.LogManager
logger.logmanager.level = WARN
logger.storagelog.name = org.apache.kafka.storage.internals.log
logger.storagelog.level = WARN
logger.replctl.name = org.apache.kafka.controller.ReplicationControlManager
logger.replctl.level = WARN
logger.partchange.name = org.apache.kafka.controller.PartitionChangeBuilder
logger.partchange.level = WARN
EOF
}

# PID of the broker run with config $1 (pid file $2) if it is alive (guards
# against stale pid files and reused pids).
broker_pid() {
    local pid
    pid="$(cat "$2" 2>/dev/null || true)"
    [ -n "$pid" ] && proc_alive "$pid" || return 1
    tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF -- "kafka.Kafka $1" || return 1
    echo "$pid"
}
kafka_pid() { broker_pid "$KAFKA_CONF" "$KAFKA_PID"; }

port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# Run a Kafka CLI class with the broker's jars.
kafka_tool() {
    java "${TOOL_JVM_OPTS[@]}" -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2-tools.properties" \
        -cp "$KAFKA_LIBS/*" "$@"
}

# Real readiness check: the broker on port $1 (default: the single node's)
# answers a metadata request (lists topics).
kafka_ready() {
    local port="${1:-$KAFKA_PORT}"
    port_open "$port" || return 1
    timeout 30 java "${TOOL_JVM_OPTS[@]}" -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2-tools.properties" \
        -cp "$KAFKA_LIBS/*" org.apache.kafka.tools.TopicCommand \
        --bootstrap-server "$HOST:$port" --command-config "$KAFKA_DIR/tools.properties" \
        --list >/dev/null 2>&1
}

# Starts a broker JVM in its own session and returns at once: config $1, log
# $2 (the previous one is kept as $2.1), pid file $3, heap options $4. The
# inner shell writes its own pid and then execs java, so the pid file is the
# JVM's.
broker_launch() {
    local conf="$1" logf="$2" pidf="$3" heap="$4"
    rm -f "$pidf"
    [ -f "$logf" ] && mv -f "$logf" "$logf.1"
    # shellcheck disable=SC2016,SC2086
    setsid bash -c 'echo $$ > "$1.tmp" && mv -f "$1.tmp" "$1"; shift; exec "$@"' _ "$pidf" \
        nohup java -server $heap -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
            -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
            -Dlog4j2.configurationFile="$KAFKA_LOG4J" \
            -cp "$KAFKA_LIBS/*" kafka.Kafka "$conf" \
        >>"$logf" 2>&1 </dev/null 9>&- &
    disown || true
}

# Waits until the broker of pid file $1 and log $2 has started and listens on
# port $3 (and, with $4 = probe, answers a metadata request there); dies (with
# the log's tail) if it exits or is not ready within DEADLINE_SECS. A cluster
# node is not probed: the CLI tool's JVM is slow to start on a loaded machine,
# and the fault tests wait for the node's replicas to be in sync instead.
broker_wait_started() {
    local pidf="$1" logf="$2" port="$3" probe="${4:-}" t0=$SECONDS pid
    until [ -s "$pidf" ] || (( SECONDS - t0 > 10 )); do sleep 0.1; done
    pid="$(cat "$pidf" 2>/dev/null || true)"
    [ -n "$pid" ] || die "kafka launcher did not write $pidf"
    while :; do
        if ! proc_alive "$pid"; then
            tail -n 40 "$logf" >&2 || true
            die "kafka process exited (log: $logf)"
        fi
        # "Kafka Server started" is logged once the broker is unfenced.
        if port_open "$port" && grep -q "Kafka Server started" "$logf" 2>/dev/null \
                && { [ "$probe" != probe ] || kafka_ready "$port"; }; then
            return 0
        fi
        if (( SECONDS - t0 > DEADLINE_SECS )); then
            tail -n 40 "$logf" >&2 || true
            die "kafka not ready on $HOST:$port after ${DEADLINE_SECS}s (log: $logf)"
        fi
        sleep 1
    done
}

# SIGTERMs the broker $1 (a pid) and waits for its controlled shutdown;
# SIGKILL after 30 s.
broker_stop() {
    local pid="$1" name="$2" i
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 60); do
        proc_alive "$pid" || return 0
        sleep 0.5
    done
    log "$name did not stop within 30s; SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
}

# The log4j configs of the brokers and the CLI tools, and the tools' client
# settings (shared by the single node and the cluster).
kafka_write_shared_files() {
    mkdir -p "$KAFKA_DIR"
    kafka_render_log4j > "$KAFKA_LOG4J"
    cat > "$KAFKA_DIR/log4j2-tools.properties" <<'EOF'
status = error
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
EOF
    printf 'request.timeout.ms=5000\ndefault.api.timeout.ms=8000\n' > "$KAFKA_DIR/tools.properties"
}

kafka_write_files() {
    kafka_write_shared_files
    # Returns 0 if server.properties changed.
    local new; new="$(kafka_render_conf)"
    if [ ! -f "$KAFKA_CONF" ] || [ "$new" != "$(cat "$KAFKA_CONF")" ]; then
        printf '%s\n' "$new" > "$KAFKA_CONF"
        return 0
    fi
    return 1
}

kafka_up() {
    kafka_fetch_libs
    local changed=0
    kafka_write_files && changed=1

    # Format the storage once (meta.properties marks a formatted log dir).
    if [ ! -f "$KAFKA_DATA/meta.properties" ]; then
        local cid
        cid="$(kafka_tool kafka.tools.StorageTool random-uuid)"
        log "formatting Kafka storage (cluster id $cid)"
        kafka_tool kafka.tools.StorageTool format -t "$cid" -c "$KAFKA_CONF" >/dev/null
    fi

    local pid
    if pid="$(kafka_pid)"; then
        if [ "$changed" = 1 ]; then
            log "kafka config changed; restarting"
            kafka_down
        elif port_open "$KAFKA_PORT"; then
            return 0    # warm path: running and listening
        fi
    fi

    if ! kafka_pid >/dev/null; then
        rm -f "$KAFKA_PID"   # stale
        local p
        for p in "$KAFKA_PORT" "$KAFKA_CTRL_PORT" "$KAFKA_PROXIED_PORT"; do
            port_open "$p" && die "port $HOST:$p is taken by another process (another checkout's services? stop them, or set DOCSTREAM_KAFKA_PORT / DOCSTREAM_KAFKA_CONTROLLER_PORT)"
        done
        log "starting kafka on $HOST:$KAFKA_PORT (log: $KAFKA_LOG)"
        broker_launch "$KAFKA_CONF" "$KAFKA_LOG" "$KAFKA_PID" "$KAFKA_HEAP_OPTS"
    fi
    broker_wait_started "$KAFKA_PID" "$KAFKA_LOG" "$KAFKA_PORT" probe
}

kafka_down() {
    local pid
    if ! pid="$(kafka_pid)"; then
        rm -f "$KAFKA_PID"
        log "kafka: not running"
        return 0
    fi
    broker_stop "$pid" kafka
    rm -f "$KAFKA_PID"
}

kafka_status() { kafka_pid >/dev/null && port_open "$KAFKA_PORT"; }

# --------------------------------------------------------------------------
# A three-node Kafka cluster (`up --kafka-nodes 3`): what production runs
# (replication factor 3, min.insync.replicas 2), for the cluster fault tests.
# Each node is broker and controller; the three controllers form the quorum.
# It shares the jars and log4j config of the single node, and can run beside
# it. Node i (1-3) listens on CLUSTER_BASE_PORT+i, its controller on
# CLUSTER_BASE_PORT+10+i.
# --------------------------------------------------------------------------
node_dir()       { echo "$CLUSTER_DIR/node$1"; }
node_port()      { echo $(( CLUSTER_BASE_PORT + $1 )); }
node_ctrl_port() { echo $(( CLUSTER_BASE_PORT + 10 + $1 )); }
node_pid()       { broker_pid "$(node_dir "$1")/server.properties" "$(node_dir "$1")/kafka.pid"; }
cluster_bootstrap() {
    local i out=""
    for i in $(seq 1 "$CLUSTER_NODES"); do out="${out:+$out,}$HOST:$(node_port "$i")"; done
    echo "$out"
}

node_render_conf() {
    local i="$1" voters="" j
    for j in $(seq 1 "$CLUSTER_NODES"); do voters="${voters:+$voters,}$j@$HOST:$(node_ctrl_port "$j")"; done
    cat <<EOF
# Written by scripts/services.sh — edits are overwritten on every 'up'.
# Node $i of a $CLUSTER_NODES-node KRaft cluster: broker and controller.
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=PLAINTEXT://$HOST:$(node_port "$i"),CONTROLLER://$HOST:$(node_ctrl_port "$i")
advertised.listeners=PLAINTEXT://$HOST:$(node_port "$i")
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$(node_dir "$i")/data

num.partitions=6
# What a production cluster runs: every record on three brokers, a write
# acknowledged (acks=all) once two of them have it, and no out-of-sync
# replica ever elected leader.
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
auto.create.topics.enable=false
delete.topic.enable=true

offsets.topic.replication.factor=3
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2

# Few threads: three nodes share a small machine (defaults: 3 network, 8 I/O).
num.network.threads=2
num.io.threads=2
num.replica.fetchers=1
background.threads=2

# A SIGTERMed node hands its leaderships over before it stops (controlled
# shutdown); a SIGKILLed one is fenced after this long without a heartbeat.
broker.session.timeout.ms=6000
broker.heartbeat.interval.ms=1000

$(kafka_group_conf)
EOF
}

# Starts node $1 unless it runs; returns at once (node_wait waits).
node_launch() {
    local i="$1" dir; dir="$(node_dir "$i")"
    node_pid "$i" >/dev/null && return 0
    port_open "$(node_port "$i")" && die "port $HOST:$(node_port "$i") is taken by another process (set DOCSTREAM_KAFKA_CLUSTER_PORT)"
    log "starting kafka node $i on $HOST:$(node_port "$i") (log: $dir/kafka.log)"
    broker_launch "$dir/server.properties" "$dir/kafka.log" "$dir/kafka.pid" "$NODE_JVM_OPTS"
}
node_wait() {
    local dir; dir="$(node_dir "$1")"
    broker_wait_started "$dir/kafka.pid" "$dir/kafka.log" "$(node_port "$1")"
}

cluster_up() {
    kafka_fetch_libs
    kafka_write_shared_files
    mkdir -p "$CLUSTER_DIR"
    local i dir new changed=()
    for i in $(seq 1 "$CLUSTER_NODES"); do
        dir="$(node_dir "$i")"; mkdir -p "$dir"
        new="$(node_render_conf "$i")"
        if [ ! -f "$dir/server.properties" ] || [ "$new" != "$(cat "$dir/server.properties")" ]; then
            printf '%s\n' "$new" > "$dir/server.properties"
            changed+=("$i")
        fi
    done
    # One cluster id for the three log dirs, formatted once.
    [ -s "$CLUSTER_DIR/cluster-id" ] || kafka_tool kafka.tools.StorageTool random-uuid > "$CLUSTER_DIR/cluster-id"
    for i in $(seq 1 "$CLUSTER_NODES"); do
        dir="$(node_dir "$i")"
        if [ ! -f "$dir/data/meta.properties" ]; then
            log "formatting kafka node $i's storage (cluster id $(cat "$CLUSTER_DIR/cluster-id"))"
            kafka_tool kafka.tools.StorageTool format -t "$(cat "$CLUSTER_DIR/cluster-id")" \
                -c "$dir/server.properties" >/dev/null
        fi
    done
    local pid
    for i in "${changed[@]}"; do
        if pid="$(node_pid "$i")"; then
            log "kafka node $i's config changed; restarting it"
            broker_stop "$pid" "kafka node $i"
        fi
    done
    # All at once: a node waits for a quorum of controllers before it starts.
    for i in $(seq 1 "$CLUSTER_NODES"); do node_launch "$i"; done
    for i in $(seq 1 "$CLUSTER_NODES"); do node_wait "$i"; done
}

cluster_down() {
    [ -d "$CLUSTER_DIR" ] || return 0
    local i pids=()
    # SIGTERM all first: the last node of a quorum cannot shut down cleanly
    # alone, so they go together.
    for i in $(seq 1 "$CLUSTER_NODES"); do
        if pid="$(node_pid "$i")"; then
            log "stopping kafka node $i (pid $pid)"
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
    done
    local t0=$SECONDS p
    for p in "${pids[@]}"; do
        while proc_alive "$p" && (( SECONDS - t0 < 30 )); do sleep 0.5; done
        proc_alive "$p" && { log "kafka pid $p did not stop within 30s; SIGKILL"; kill -KILL "$p" 2>/dev/null || true; }
    done
    return 0
}

node_arg() {
    case "${1:-}" in
        [1-9]) [ "$1" -le "$CLUSTER_NODES" ] || die "no kafka node $1 (the cluster has $CLUSTER_NODES)"; echo "$1" ;;
        *) die "usage: $0 kill|stop|start kafka-node N (N in 1..$CLUSTER_NODES)" ;;
    esac
}

# --------------------------------------------------------------------------
# Housekeeping
# --------------------------------------------------------------------------
ensure_state_dir() {
    mkdir -p "$STATE"
    chmod 755 "$STATE"
    # Keep state (and cargo output) out of git.
    local gi="$REPO/.gitignore" line
    touch "$gi"
    for line in ".services/" "/target"; do
        grep -qxF "$line" "$gi" || {
            [ -s "$gi" ] && [ -n "$(tail -c1 "$gi")" ] && echo >> "$gi"
            echo "$line" >> "$gi"
        }
    done
}

# Serialise concurrent invocations (e.g. two test jobs running 'up').
take_lock() {
    mkdir -p "$STATE"
    exec 9>"$STATE/.lock"
    flock -w 300 9 || die "another services.sh holds $STATE/.lock (see: fuser -v $STATE/.lock)"
}

# The export lines; with $1 = 3, DOCSTREAM_KAFKA_BROKERS names the cluster.
print_env() {
    local brokers="$HOST:$KAFKA_PORT"
    [ "${1:-1}" = "$CLUSTER_NODES" ] && brokers="$(cluster_bootstrap)"
    echo "export DATABASE_URL=postgres://$PG_USER:$PG_PASSWORD@$HOST:$PG_PORT/$PG_DB"
    echo "export DOCSTREAM_KAFKA_BROKERS=$brokers"
    # For the fault tests: where a proxy in front of the broker listens (the
    # port the PROXIED listener advertises) and what it forwards to.
    echo "export DOCSTREAM_TEST_KAFKA_PROXY=$HOST:$KAFKA_PROXY_PORT"
    echo "export DOCSTREAM_TEST_KAFKA_PROXIED=$HOST:$KAFKA_PROXIED_PORT"
    # For the cluster fault tests: where `up --kafka-nodes 3` puts the cluster,
    # and `up --postgres-standby` the standby.
    echo "export DOCSTREAM_TEST_KAFKA_CLUSTER=$(cluster_bootstrap)"
    echo "export DOCSTREAM_TEST_PG_STANDBY=$HOST:$PG_STANDBY_PORT"
    secure_print_env
    pooler_print_env
}

# --------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------
# The services' ports lie inside Linux's ephemeral range (32768-60999): any
# outgoing connection, or a test's listener on port 0, may be given one of
# them, and a broker restarted while it is taken fails to bind ("Address
# already in use"). Reserve them, so the kernel never hands them out.
reserve_ports() {
    local file=/proc/sys/net/ipv4/ip_local_reserved_ports
    [ -w "$file" ] || return 0
    local ours="$PG_PORT,$PG_STANDBY_PORT,$KAFKA_PORT,$KAFKA_CTRL_PORT,$KAFKA_PROXIED_PORT,$KAFKA_PROXY_PORT,$(secure_ports),$(pooler_ports)" i
    for i in $(seq 1 "$CLUSTER_NODES"); do ours="$ours,$(node_port "$i"),$(node_ctrl_port "$i")"; done
    local current; current="$(cat "$file")"
    echo "${current:+$current,}$ours" > "$file" 2>/dev/null \
        || log "could not reserve ports $ours (ip_local_reserved_ports)"
}

# The arguments of `up`, `down` and `env`: KAFKA_NODES (1, or 3 with
# `--kafka-nodes 3`) and STANDBY (none, async with `--postgres-standby`, sync
# with `--postgres-standby --sync`).
parse_args() {
    KAFKA_NODES=1 STANDBY=none SECURE=0 POOLER=0
    local sync=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --kafka-nodes)
                case "${2:-}" in
                    1|"$CLUSTER_NODES") KAFKA_NODES="$2" ;;
                    *) die "--kafka-nodes takes 1 or $CLUSTER_NODES" ;;
                esac
                shift ;;
            --postgres-standby) STANDBY=async ;;
            --sync) sync=1 ;;
            --secure) SECURE=1 ;;
            --pooler) POOLER=1 ;;
            *) die "unknown argument: $1" ;;
        esac
        shift
    done
    if [ "$sync" = 1 ]; then
        [ "$STANDBY" = async ] || die "--sync goes with --postgres-standby"
        STANDBY=sync
    fi
}

cmd_up() {
    [ "$(id -u)" = 0 ] || die "run as root"
    parse_args "$@"
    local t0=$SECONDS
    ensure_state_dir
    take_lock
    reserve_ports
    ensure_packages
    pg_up
    if [ "$STANDBY" = none ]; then
        pg_sync_off_without_a_standby
    else
        standby_up "$STANDBY"
    fi
    if [ "$SECURE" = 1 ]; then
        secure_up
    fi
    if [ "$POOLER" = 1 ]; then
        pooler_up
    fi
    if [ "$KAFKA_NODES" = 1 ]; then
        kafka_up
        log "up in $(( SECONDS - t0 ))s: postgres $HOST:$PG_PORT, kafka $HOST:$KAFKA_PORT"
    else
        cluster_up
        log "up in $(( SECONDS - t0 ))s: postgres $HOST:$PG_PORT, kafka cluster $(cluster_bootstrap)"
    fi
}

# Everything; with `--kafka-nodes 3`, only the cluster; with
# `--postgres-standby`, only the standby (the primary goes back to
# asynchronous commits).
cmd_down() {
    parse_args "$@"
    [ -d "$STATE" ] || { log "nothing to stop"; return 0; }
    take_lock
    if [ "$STANDBY" != none ]; then
        ensure_packages
        standby_paths
        standby_stop
        pg_status && pg_set_sync ""
        return 0
    fi
    cluster_down
    [ "$KAFKA_NODES" = 1 ] || return 0
    secure_down
    pooler_down
    kafka_down
    if [ -e "$PG_LINK" ] && PG_BIN="$(pg_bindir)"; then
        standby_paths
        standby_stop
    fi
    pg_down
}

cmd_status() {
    local rc=0 i pid
    if pg_status; then echo "postgres: up   ($HOST:$PG_PORT)"; else echo "postgres: down"; rc=3; fi
    if [ -e "$PG_LINK" ]; then
        standby_paths
        if standby_running; then
            echo "postgres standby: up ($HOST:$PG_STANDBY_PORT$([ -f "$STANDBY_DATA/standby.signal" ] || echo ", promoted"))"
        fi
    fi
    if broker_pid "$SECURE_KAFKA_CONF" "$SECURE_KAFKA_PID" >/dev/null; then
        echo "secured kafka: up ($SECURE_NAME:$SECURE_KAFKA_PORT SASL_SSL, $SECURE_NAME:$SECURE_KAFKA_MTLS_PORT SSL)"
    fi
    if kafka_status; then echo "kafka:    up   ($HOST:$KAFKA_PORT, pid $(kafka_pid))"; else echo "kafka:    down"; rc=3; fi
    if [ -d "$CLUSTER_DIR" ]; then
        for i in $(seq 1 "$CLUSTER_NODES"); do
            if pid="$(node_pid "$i")"; then echo "kafka node $i: up ($HOST:$(node_port "$i"), pid $pid)"; else echo "kafka node $i: down"; fi
        done
    fi
    return "$rc"
}

cmd_reset() {
    [ -d "$STATE" ] || { log "no state"; return 0; }
    cmd_down
    local target=""
    [ -L "$PG_LINK" ] && target="$(readlink "$PG_LINK")"
    if [ -n "$target" ]; then
        rm -rf "$target"
        rmdir "$(dirname "$target")" 2>/dev/null || true
    fi
    # Keep the Kafka jar cache: it only depends on scripts/kafka/pom.xml.
    find "$STATE" -mindepth 1 -maxdepth 1 ! -name kafka ! -name .lock -exec rm -rf {} +
    [ -d "$KAFKA_DIR" ] && find "$KAFKA_DIR" -mindepth 1 -maxdepth 1 ! -name libs -exec rm -rf {} +
    rm -rf "$CLUSTER_DIR"
    log "state deleted (kept $KAFKA_LIBS)"
}

# SIGKILL, then wait until the process is gone (a zombie counts as gone).
kill_hard() {
    local pid="$1" name="$2"
    log "SIGKILL $name (pid $pid)"
    kill -KILL "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 100); do
        proc_alive "$pid" || return 0
        sleep 0.1
    done
    die "$name (pid $pid) still alive 10 s after SIGKILL"
}

cmd_kill() {
    local pid i
    case "${1:-}" in
        kafka)
            pid="$(kafka_pid)" || die "kafka is not running"
            kill_hard "$pid" kafka ;;
        kafka-node)
            i="$(node_arg "${2:-}")"
            pid="$(node_pid "$i")" || die "kafka node $i is not running"
            kill_hard "$pid" "kafka node $i" ;;
        postgres)
            pg_status || die "postgres is not running"
            pid="$(head -n1 "$PG_DATA/postmaster.pid")"
            # The backends notice their postmaster died and exit; the next
            # start runs crash recovery.
            kill_hard "$pid" "postgres postmaster" ;;
        *) die "usage: $0 kill kafka|kafka-node N|postgres" ;;
    esac
}

# SIGTERM node N of the cluster and wait for its controlled shutdown.
cmd_stop() {
    [ "${1:-}" = kafka-node ] || die "usage: $0 stop kafka-node N"
    local i pid; i="$(node_arg "${2:-}")"
    pid="$(node_pid "$i")" || die "kafka node $i is not running"
    broker_stop "$pid" "kafka node $i"
}

# Start node N of the cluster again and wait until it serves.
cmd_start() {
    [ "${1:-}" = kafka-node ] || die "usage: $0 start kafka-node N"
    local i; i="$(node_arg "${2:-}")"
    [ -f "$(node_dir "$i")/server.properties" ] || die "no cluster yet: run '$0 up --kafka-nodes $CLUSTER_NODES'"
    node_launch "$i"
    node_wait "$i"
}

cmd_restart_postgres() {
    pg_status || die "postgres is not running"
    PG_LOGFILE="$(cd "$PG_LINK" && pwd -P)/postgres.log"
    log "restarting postgres (fast)"
    as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w -t 60 stop >/dev/null
    pg_start_once || die "postgres did not start again (log: $PG_LOGFILE)"
}

cmd_kafka_tool() {
    [ $# -ge 1 ] || die "usage: $0 kafka-tool CLASS [ARGS...]"
    kafka_libs_ok || die "kafka jars missing; run '$0 up' first"
    local cls="$1"; shift
    case " $* " in
        *" --bootstrap-server "*) ;;
        *) set -- --bootstrap-server "$HOST:$KAFKA_PORT" "$@" ;;
    esac
    exec java "${TOOL_JVM_OPTS[@]}" -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2-tools.properties" \
        -cp "$KAFKA_LIBS/*" "$cls" "$@"
}

case "${1:-}" in
    up)         shift; cmd_up "$@" ;;
    down)       shift; cmd_down "$@" ;;
    status)     cmd_status ;;
    env)        shift; parse_args "$@"; print_env "$KAFKA_NODES" ;;
    reset)      cmd_reset ;;
    kafka-tool) shift; cmd_kafka_tool "$@" ;;
    kill)       shift; cmd_kill "$@" ;;
    stop)       shift; cmd_stop "$@" ;;
    start)      shift; cmd_start "$@" ;;
    restart-postgres) cmd_restart_postgres ;;
    promote-postgres-standby) cmd_promote_standby ;;
    *)
        # Print the header comment as usage.
        awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2
        exit 2 ;;
esac

# Sourced by scripts/services.sh: two PgBouncers (Debian's package) in front
# of the plaintext Postgres (`up --pooler`), for tests/it/pooler.rs: one in
# session mode on 55435, which docstream supports, and one in transaction
# mode on 55436, which it refuses at start. Each forwards any database name
# (tests make their own) to the cluster on PG_PORT, and logs in as docstream
# with the password of its auth_file.
#
# The state (configuration, auth_file, pid, log, socket) lives beside the
# cluster's, where the postgres OS user PgBouncer runs as can reach it.

POOLER_SESSION_PORT="${DOCSTREAM_POOLER_SESSION_PORT:-55435}"
POOLER_TRANSACTION_PORT="${DOCSTREAM_POOLER_TRANSACTION_PORT:-55436}"

pooler_ports() { echo "$POOLER_SESSION_PORT,$POOLER_TRANSACTION_PORT"; }

pooler_dir() { echo "$PG_HOME/pgbouncer-$1"; }

# The pid of mode $1's PgBouncer, if it runs.
pooler_pid() { pid_running_as "$(pooler_dir "$1")/pgbouncer.pid" "$(pooler_dir "$1")/pgbouncer.ini"; }

# One PgBouncer: mode $1 (session|transaction) on port $2.
pooler_start() {
    local mode="$1" port="$2" dir
    dir="$(pooler_dir "$mode")"
    as_pg mkdir -p "$dir"
    as_pg tee "$dir/userlist.txt" >/dev/null <<EOF
"$PG_USER" "$PG_PASSWORD"
EOF
    as_pg tee "$dir/pgbouncer.ini" >/dev/null <<EOF
; Written by scripts/services.sh (up --pooler) — edits are overwritten on every 'up'.
[databases]
* = host=$HOST port=$PG_PORT

[pgbouncer]
listen_addr = $HOST
listen_port = $port
unix_socket_dir = $dir
auth_type = scram-sha-256
auth_file = $dir/userlist.txt
pool_mode = $mode
default_pool_size = 200
max_client_conn = 1000
; sqlx sets extra_float_digits when it connects; PgBouncer forwards only a
; few startup parameters and refuses the rest unless told to drop them.
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
    # A running one rereads its file (a changed port needs `down` first).
    pooler_pid "$mode" >/dev/null && { as_pg kill -HUP "$(pooler_pid "$mode")"; return 0; }
    port_open "$port" && die "port $HOST:$port is taken (set DOCSTREAM_POOLER_SESSION_PORT / DOCSTREAM_POOLER_TRANSACTION_PORT)"
    log "starting pgbouncer ($mode mode) on $HOST:$port (log: $dir/pgbouncer.log)"
    (cd / && runuser -u postgres -- pgbouncer -d "$dir/pgbouncer.ini" </dev/null >/dev/null 2>&1 9>&-) \
        || { tail -n 20 "$dir/pgbouncer.log" >&2 || true; die "pgbouncer ($mode) did not start"; }
    local t0=$SECONDS
    until port_open "$port"; do
        (( SECONDS - t0 > 30 )) && { tail -n 20 "$dir/pgbouncer.log" >&2 || true; die "pgbouncer ($mode) not listening on $port"; }
        sleep 0.2
    done
}

pooler_up() {
    command -v pgbouncer >/dev/null || apt_install pgbouncer
    pg_prepare_dir
    pooler_start session "$POOLER_SESSION_PORT"
    pooler_start transaction "$POOLER_TRANSACTION_PORT"
}

pooler_down() {
    [ -e "$PG_LINK" ] || return 0
    PG_HOME="$(cd "$PG_LINK" && pwd -P)"
    local mode pid
    for mode in session transaction; do
        pid="$(pooler_pid "$mode")" || continue
        log "stopping pgbouncer ($mode)"
        kill -INT "$pid" 2>/dev/null || true
        local i
        for i in $(seq 1 50); do proc_alive "$pid" || break; sleep 0.1; done
    done
}

# The export lines of the poolers, for tests/it/pooler.rs.
pooler_print_env() {
    echo "export DOCSTREAM_TEST_POOLER_SESSION=$HOST:$POOLER_SESSION_PORT"
    echo "export DOCSTREAM_TEST_POOLER_TRANSACTION=$HOST:$POOLER_TRANSACTION_PORT"
}

# Sourced by scripts/test.sh and scripts/fuzz-api.sh.
#
# `ensure_schemathesis` installs schemathesis (from PyPI, pinned) into a
# virtualenv under .services/tools/ (git-ignored), once, installing Debian's
# python3 and python3-venv first when they are missing, and exports
# DOCSTREAM_SCHEMATHESIS with the path of its command.
#
# `fuzz_api` fuzzes the HTTP API against its own OpenAPI document: it starts a
# `serve` of ./target/debug/docstream on a database of its own (made and dropped
# here) and the topics `fuzz-api.*` of the local broker, makes a tenant and an
# API key with the CLI, and runs schemathesis (scripts/fuzz/: its settings
# and hooks) on `GET /openapi.json` with every check, on every operation, with
# valid and invalid data, then the stateful phase (the document's links:
# submit -> read -> cancel). The WebSocket routes are described under
# `x-websockets`, outside `paths`, so no fuzzer takes their 101 for an HTTP
# answer; what flows on the sockets is tested in tests/.
# It fails on any failure (a 5xx, an answer the document does not describe, a
# valid request refused, an invalid one accepted), or when the server panicked
# or died. Needs DATABASE_URL and DOCSTREAM_KAFKA_BROKERS (see
# scripts/lib/prepare.sh). FUZZ_MAX_EXAMPLES (50) bounds the examples per
# operation and phase; FUZZ_SEED makes a run repeatable (schemathesis prints
# the seed of each run). The serve log and JUnit reports are written to
# target/tmp/fuzz-api/.

SCHEMATHESIS_VERSION=4.32.5

ensure_schemathesis() {
    local dir; dir="$(pwd -P)/.services/tools/schemathesis-$SCHEMATHESIS_VERSION"
    # The marker is written last: an interrupted install is redone next time.
    if [ ! -e "$dir/.installed" ]; then
        local probe; probe="$(mktemp -d)"
        if ! command -v python3 >/dev/null || ! python3 -m venv "$probe/venv" >/dev/null 2>&1; then
            echo "installing python3 and python3-venv (for schemathesis)" >&2
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
        fi
        rm -rf "$probe"
        if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
            echo "schemathesis $SCHEMATHESIS_VERSION needs Python 3.11 or later; python3 is $(python3 -V 2>&1)" >&2
            return 1
        fi
        echo "installing schemathesis $SCHEMATHESIS_VERSION into $dir" >&2
        rm -rf "$dir"
        python3 -m venv "$dir"
        "$dir/bin/pip" install --quiet --disable-pip-version-check \
            "schemathesis==$SCHEMATHESIS_VERSION" >&2
        touch "$dir/.installed"
    fi
    export DOCSTREAM_SCHEMATHESIS="$dir/bin/schemathesis"
}

# A free port on 127.0.0.1 (bound, then released).
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The psql of the local services (Debian's postgresql-client, or the server's).
find_psql() {
    command -v psql && return
    local found
    for found in /usr/lib/postgresql/*/bin/psql; do
        [ -x "$found" ] && echo "$found" && return
    done
    echo "psql not found (scripts/services.sh up installs it)" >&2
    return 1
}

fuzz_api() (
    set -euo pipefail
    local started=$SECONDS
    local repo; repo="$(pwd -P)"
    local bin="$repo/target/debug/docstream"
    local st="${DOCSTREAM_SCHEMATHESIS:?run ensure_schemathesis first}"
    local work="$repo/target/tmp/fuzz-api"
    mkdir -p "$work"
    rm -f "$work"/*.log "$work"/*.xml
    local psql; psql="$(find_psql)"

    # A database of its own, so the jobs it submits land nowhere else.
    local db="docstream_fuzz_$$"
    local admin="$DATABASE_URL"
    local url="${DATABASE_URL%/*}/$db"
    "$psql" -X -q -v ON_ERROR_STOP=1 "$admin" -c "CREATE DATABASE \"$db\""
    local port; port="$(free_port)"
    export DATABASE_URL="$url"
    export DOCSTREAM_TOPIC_PREFIX=fuzz-api.
    export DOCSTREAM_HTTP_ADDR="127.0.0.1:$port"
    export DOCSTREAM_METRICS_ADDR=127.0.0.1:0
    export DOCSTREAM_LOG=info,rdkafka=warn,sqlx=warn
    # The limits are settings, and the document states the server's: small
    # ones make schemathesis's boundary cases (one past maxItems, maxLength)
    # small requests instead of 60 MB ones, and reach the body limit.
    export DOCSTREAM_MAX_FIELDS=10
    export DOCSTREAM_MAX_PAGES=5
    export DOCSTREAM_MAX_WORDS_PER_PAGE=20
    export DOCSTREAM_HTTP_BODY_LIMIT_BYTES=65536
    # Uploaded files go to the run's own folder, at most 64 KiB each.
    export DOCSTREAM_FILES_DIR="$work/files"
    export DOCSTREAM_FILE_MAX_BYTES=65536
    # A machine busy with builds must not turn slow inserts into 503s: here a
    # 503 is a finding, as it is nowhere else.
    export DOCSTREAM_HTTP_ANSWER_TIMEOUT_S=10

    local serve_pid=""
    cleanup() {
        if [ -n "$serve_pid" ]; then
            kill -TERM "$serve_pid" 2>/dev/null || true
            wait "$serve_pid" 2>/dev/null || true
        fi
        "$psql" -X -q "$admin" -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
    }
    trap cleanup EXIT

    "$bin" migrate >/dev/null
    "$bin" topics >/dev/null
    local key
    "$bin" tenants create fuzz >/dev/null
    # Every scope, so that every route is exercised past its scope check.
    key="$("$bin" keys create fuzz --scopes submit,read,cancel,export,admin,delete |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["api_key"])')"
    # Quotas are not what this run is about: no 429 in the way of valid submits.
    "$bin" tenants set-quota fuzz --submit-rate-per-s 0 >/dev/null

    "$bin" serve >"$work/serve.log" 2>&1 &
    serve_pid=$!
    local deadline=$((SECONDS + 60))
    until python3 - "http://127.0.0.1:$port/readyz" <<'EOF' 2>/dev/null
import sys, urllib.request
sys.exit(urllib.request.urlopen(sys.argv[1], timeout=2).status != 200)
EOF
    do
        if ! kill -0 "$serve_pid" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
            echo "fuzz-api: serve did not become ready; its log:" >&2
            tail -n 30 "$work/serve.log" >&2
            return 1
        fi
        sleep 0.5
    done

    local common=(
        --config-file "$repo/scripts/fuzz/schemathesis.toml"
        run "http://127.0.0.1:$port/openapi.json"
        --checks all
        --max-examples "${FUZZ_MAX_EXAMPLES:-50}"
        --request-timeout 30
        --no-color
    )
    [ -n "${FUZZ_SEED:-}" ] && common+=(--seed "$FUZZ_SEED")
    export SCHEMATHESIS_HOOKS="$repo/scripts/fuzz/hooks.py"
    export PYTHONDONTWRITEBYTECODE=1 # no __pycache__ next to the hooks
    export DOCSTREAM_FUZZ_API_KEY="$key" # scripts/fuzz/schemathesis.toml sends it
    local result=0
    cd "$work" # schemathesis keeps its example database (.hypothesis/) here
    echo "fuzz-api: schemathesis $SCHEMATHESIS_VERSION against http://127.0.0.1:$port/openapi.json" >&2
    "$st" "${common[@]}" --report junit --report-junit-path "$work/junit.xml" || result=$?

    local alive=0
    kill -0 "$serve_pid" 2>/dev/null || alive=1
    local panics; panics="$(grep -c 'panicked' "$work/serve.log" || true)"
    echo "fuzz-api: $((SECONDS - started)) s; schemathesis exit $result; serve $( [ "$alive" = 0 ] && echo alive || echo DEAD ), $panics panics in target/tmp/fuzz-api/serve.log" >&2
    [ "$result" = 0 ] && [ "$alive" = 0 ] && [ "$panics" = 0 ]
)

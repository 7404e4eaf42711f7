#!/usr/bin/env bash
# scripts/bench/river.sh — a second peer job queue for `docstream bench`:
# River (Go, riverpgxv5; pinned in scripts/bench/river/go.mod) on the same
# Postgres.  In a fresh, throw-away database it runs River's migrations and
# queues N no-op jobs (untimed), then starts a client with W workers
# (FetchCooldown 1 ms, FetchPollInterval 20 ms) and times until all N jobs
# have completed.
#
#   scripts/bench/river.sh --jobs N [--mode noop|chain|chain-tx] [--max-workers W]
#                          [--max-conns C] [--database-url URL]
#
# --mode noop (the default): one-stage no-op jobs.  chain: the first job's
# worker inserts a second job (ClientFromContext(ctx).Insert); chain-tx: it
# inserts the second job and completes itself in one transaction (InsertTx and
# JobCompleteTx).  River documents both ways of chaining.
#
# --max-workers defaults to 1000; --database-url to $DATABASE_URL (the role
# must be able to create databases).  Last stdout line, one JSON object:
#   {"peer":"river","version":"0.51.2","mode":M,"stages":1|2,"documents":N,"jobs":N*stages,
#    "max_workers":W,"max_conns":C,"fetch_cooldown_ms":1,"fetch_poll_interval_ms":20,"seconds":S,
#    "jobs_per_s":X,"documents_per_s":D}
# Progress goes to stderr; exits non-zero on failure.
# The driver (scripts/bench/river/main.go) is built with `go build` into
# $REPO/.bench/river (git-ignored), again only when its sources change.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
SRC="$REPO/scripts/bench/river"
DEST="$REPO/.bench/river"

die() { echo "river.sh: $*" >&2; exit 1; }

JOBS="" MODE=noop MAX_WORKERS=1000 MAX_CONNS=0 DB_URL="${DATABASE_URL:-}"
while [ $# -gt 0 ]; do
    case "$1" in
        --jobs) JOBS="${2:-}"; shift 2 ;;
        --mode) MODE="${2:-}"; shift 2 ;;
        --max-workers) MAX_WORKERS="${2:-}"; shift 2 ;;
        --max-conns) MAX_CONNS="${2:-}"; shift 2 ;;
        --database-url) DB_URL="${2:-}"; shift 2 ;;
        *) die "unknown argument '$1' (usage: --jobs N [--mode noop|chain|chain-tx] [--max-workers W] [--database-url URL])" ;;
    esac
done
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || die "--jobs N (a positive integer) is required"
[[ "$MODE" =~ ^(noop|chain|chain-tx)$ ]] || die "--mode must be noop, chain or chain-tx"
[[ "$MAX_WORKERS" =~ ^[1-9][0-9]*$ ]] || die "--max-workers must be a positive integer"
[[ "$MAX_CONNS" =~ ^[0-9]+$ ]] || die "--max-conns must be a number (0: pgxpool's default)"
[ -n "$DB_URL" ] || die "no database: pass --database-url or set DATABASE_URL"

# Go: the machine's (also /usr/local/go), else Debian's golang-go.
command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
if ! command -v go >/dev/null; then
    echo "river.sh: installing golang-go" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >&2
fi
# River needs a newer Go (go.mod) than some distributions ship; Go 1.21 and
# later fetch that toolchain from the module proxy by themselves.
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
GO=go
minor="$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')"
if [[ "$minor" =~ ^[0-9]+$ ]] && [ "$minor" -lt 21 ]; then
    die "$(go env GOVERSION) cannot fetch the Go that River needs; install Go 1.21 or later"
fi

# The driver, rebuilt only when its sources (or the Go toolchain) change.
stamp="$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" <("$GO" version) | sha1sum | cut -d' ' -f1)"
if [ "$(cat "$DEST/.stamp" 2>/dev/null || true)" != "$stamp" ] || [ ! -x "$DEST/river-bench" ]; then
    echo "river.sh: go build into $DEST" >&2
    mkdir -p "$DEST"
    t0=$SECONDS
    (cd "$SRC" && "$GO" build -buildvcs=false -o "$DEST/river-bench" . >&2) || die "go build failed"
    echo "river.sh: built in $((SECONDS - t0)) s" >&2
    echo "$stamp" > "$DEST/.stamp"
fi

exec "$DEST/river-bench" -jobs "$JOBS" -mode "$MODE" -max-workers "$MAX_WORKERS" -max-conns "$MAX_CONNS" -database-url "$DB_URL"

#!/usr/bin/env bash
# scripts/bench/peer.sh — the peer job queue for `docstream bench`:
# graphile-worker (pinned in scripts/bench/peer/package-lock.json) on the same
# Postgres.  In a fresh, throw-away database it installs graphile-worker's
# schema and queues N no-op jobs (untimed), then starts a worker with
# concurrency C and times until the job table is empty.
#
#   scripts/bench/peer.sh --jobs N [--mode noop|chain] [--concurrency C] [--database-url URL]
#
# --database-url defaults to $DATABASE_URL; the role must be able to create
# databases.  --mode noop (the default) queues one-stage no-op jobs; --mode
# chain queues N first-stage jobs whose task adds a second-stage job
# (`helpers.addJob`), as graphile-worker's documentation chains work.  Last
# stdout line, one JSON object:
#   {"peer":"graphile-worker","version":"0.16.6","mode":M,"stages":1|2,"documents":N,
#    "jobs":N*stages,"concurrency":C,"seconds":S,"jobs_per_s":X,"documents_per_s":D}
# Progress goes to stderr; exits non-zero on failure.
# graphile-worker is installed with `npm ci` into $REPO/.bench/peer (git-ignored).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
SRC="$REPO/scripts/bench/peer"
DEST="$REPO/.bench/peer"

die() { echo "peer.sh: $*" >&2; exit 1; }

JOBS="" MODE=noop CONCURRENCY=16 DB_URL="${DATABASE_URL:-}"
while [ $# -gt 0 ]; do
    case "$1" in
        --jobs) JOBS="${2:-}"; shift 2 ;;
        --mode) MODE="${2:-}"; shift 2 ;;
        --concurrency) CONCURRENCY="${2:-}"; shift 2 ;;
        --database-url) DB_URL="${2:-}"; shift 2 ;;
        *) die "unknown argument '$1' (usage: --jobs N [--mode noop|chain] [--concurrency C] [--database-url URL])" ;;
    esac
done
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || die "--jobs N (a positive integer) is required"
[[ "$MODE" =~ ^(noop|chain)$ ]] || die "--mode must be noop or chain"
[[ "$CONCURRENCY" =~ ^[1-9][0-9]*$ ]] || die "--concurrency must be a positive integer"
[ -n "$DB_URL" ] || die "no database: pass --database-url or set DATABASE_URL"

# Node and npm from Debian's packages when missing.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "peer.sh: installing nodejs npm" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >&2
fi

# graphile-worker, exactly as locked; reinstalled only when the lock changes.
stamp="$(cat "$SRC/package.json" "$SRC/package-lock.json" | sha1sum | cut -d' ' -f1)"
if [ "$(cat "$DEST/.stamp" 2>/dev/null || true)" != "$stamp" ]; then
    echo "peer.sh: npm ci into $DEST" >&2
    mkdir -p "$DEST"
    cp "$SRC/package.json" "$SRC/package-lock.json" "$DEST/"
    (cd "$DEST" && npm ci --no-audit --no-fund --loglevel=error >&2) || die "npm ci failed"
    echo "$stamp" > "$DEST/.stamp"
fi

exec env NODE_PATH="$DEST/node_modules" PEER_JOBS="$JOBS" PEER_CONCURRENCY="$CONCURRENCY" PEER_MODE="$MODE" \
    PEER_DATABASE_URL="$DB_URL" node "$SRC/run.js"

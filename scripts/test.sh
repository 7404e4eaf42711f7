#!/usr/bin/env bash
# The whole test suite, on a machine that may never have seen the project:
# start the real services (installing them if needed), apply migrations to the
# main database, then run every test. Exits with the suite's exit code.
#
#   scripts/test.sh           the suite (10 minutes warm here; 22 from a fresh clone, builds included)
#   scripts/test.sh --long    also the long variants: the 30 s broker outage
# Other arguments go to `cargo test` (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--long" ]; then
    export DOCSTREAM_TEST_LONG=1
    shift
fi

source scripts/lib/prepare.sh
source scripts/lib/toxiproxy.sh
prepare
ensure_toxiproxy

cargo build --locked --bins
./target/debug/docstream migrate

# Tests isolate themselves (own database, topic prefix and group ids), so the
# suite needs no cleanup and can be re-run at once.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
set +e
cargo test --locked --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

# One closing line for the whole suite, summed over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"

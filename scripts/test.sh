#!/usr/bin/env bash
# The whole test suite, on a machine that may never have seen the project:
# start the real services (installing them if needed), apply migrations to the
# main database, then run every test. Exits with the suite's exit code.
#
#   scripts/test.sh           the suite (33 to 35 minutes from a fresh clone of a 2-core machine, about half of it building the tools and docstream)
#   scripts/test.sh --long    also the long variants: the 30 s broker outage, the
#                             three-node cluster's faults, and the Postgres failovers
#                             and split brains (tests/it/faults.rs, about 25 minutes)
# Other arguments go to `cargo test` (e.g. a test name filter).
# Before the cargo tests, promtool checks the compose stack's Prometheus config
# and alert rules and runs the rules' unit tests (seconds). After them, a
# separate step fuzzes the HTTP API against its OpenAPI document with
# schemathesis (scripts/fuzz-api.sh; under a minute). Before both, cargo-deny
# checks the dependency graph against deny.toml (licences, duplicate versions,
# sources; seconds, after a one-time build of the tool of about 4 minutes).
# The file tests keep uploads in s3s-fs, an S3-compatible server built once
# from crates.io (scripts/lib/s3.sh; about 4 minutes).
# The Helm chart (deploy/helm/docstream) is linted and rendered with helm,
# built once from its Go module (scripts/lib/helm.sh; about 4 minutes of
# CPU), and every object it renders validated offline (seconds).
# The manual (docs/) is built with mdBook, installed once from crates.io (about
# two minutes), and its links checked (scripts/lib/book.sh; seconds).
# The console's browser test (tests/it/console.rs) runs in Debian's chromium,
# driven by Playwright for Python, both installed here once (about a minute).
# Last, the Python client (clients/python/test.sh): mypy --strict, its models
# against docs/openapi.json, and its tests against a live `docstream all`
# (under a minute, after a one-time install from PyPI of about a minute).
# The suite fails if any step does. With a test filter, only the tests run.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--long" ]; then
    export DOCSTREAM_TEST_LONG=1
    shift
fi

source scripts/lib/prepare.sh
source scripts/lib/toxiproxy.sh
source scripts/lib/s3.sh
source scripts/lib/pypdf.sh
source scripts/lib/fuzz-api.sh
source scripts/lib/promtool.sh
source scripts/lib/deny.sh
source scripts/lib/browser.sh
source scripts/lib/book.sh
source scripts/lib/helm.sh
prepare
# The secured broker and Postgres of tests/it/secure.rs (TLS only), and the
# PgBouncers of tests/it/pooler.rs.
bash scripts/services.sh up --secure --pooler
ensure_toxiproxy
ensure_s3
ensure_pypdf
ensure_schemathesis
ensure_promtool
ensure_cargo_deny
ensure_browser
if [ $# -eq 0 ]; then ensure_chart_tools; fi

deps=skipped
alerts=skipped
book=skipped
if [ $# -eq 0 ]; then
    echo "== deps: cargo deny check licenses bans sources ==" >&2
    set +e
    check_dependencies
    deps=$?
    set -e
    echo "== alerts: promtool check config, check rules, test rules ==" >&2
    set +e
    check_alerts
    alerts=$?
    set -e
    echo "== book: mdbook build docs, and its links ==" >&2
    ensure_mdbook
    set +e
    check_book
    book=$?
    set -e
fi

cargo build --locked --bins
./target/debug/docstream migrate

# The Helm chart, offline: lint, render with each ci/ values file, validate
# every object, and check each container's settings with the binary above.
chart=skipped
if [ $# -eq 0 ]; then
    echo "== chart: helm lint and template; objects validated, settings checked ==" >&2
    set +e
    check_chart ./target/debug/docstream
    chart=$?
    set -e
fi

# Tests isolate themselves (own database, topic prefix and group ids), so the
# suite needs no cleanup and can be re-run at once.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# The integration tests are one binary, `it` (tests/it/main.rs). Its `faults`
# and `limits` areas run in passes of their own, after the rest, as they did
# when each area was a binary: the faults stop the services every test
# shares, and some limits tests flood the machine or time its answers. With a
# test filter, one `cargo test` runs with it.
status=0
run_tests() {
    echo "== cargo test $* ==" >&2
    cargo test --locked --no-fail-fast "$@" 2>&1 | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" != 0 ]; then status=$rc; fi
}
set +e
if [ $# -eq 0 ]; then
    run_tests --lib --bins
    run_tests --doc
    run_tests --test it -- --skip faults:: --skip limits::
    run_tests --test it limits::
    run_tests --test it faults::
else
    run_tests "$@"
fi
set -e

# ---------------------------------------------------------------------------
# The API fuzz: schemathesis against a live `serve`, with every check, on the
# document it serves (scripts/lib/fuzz-api.sh). Its own step, after the tests,
# run whatever they did: 0 server errors and 0 answers outside the document.
fuzz=skipped
if [ $# -eq 0 ]; then
    echo "== fuzz: the HTTP API against its OpenAPI document (schemathesis) ==" >&2
    set +e
    fuzz_api
    fuzz=$?
    set -e
fi

# The Python client: its own virtualenv, its own database and topics, the
# docstream binary built above.
pyclient=skipped
if [ $# -eq 0 ]; then
    echo "== pyclient: the Python client against a live docstream (clients/python) ==" >&2
    set +e
    DOCSTREAM_BIN="$PWD/target/debug/docstream" bash clients/python/test.sh
    pyclient=$?
    set -e
fi

# One closing line for the whole suite, summed over every pass and test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
case "$deps" in
    0) echo "deps: passed" ;;
    skipped) echo "deps: skipped (a test filter was given)"; deps=0 ;;
    *) echo "deps: FAILED (cargo deny, deny.toml)" ;;
esac
case "$alerts" in
    0) echo "alerts: passed" ;;
    skipped) echo "alerts: skipped (a test filter was given)"; alerts=0 ;;
    *) echo "alerts: FAILED (promtool, scripts/compose/prometheus/)" ;;
esac
case "$book" in
    0) echo "book: passed" ;;
    skipped) echo "book: skipped (a test filter was given; scripts/book.sh builds it alone)"; book=0 ;;
    *) echo "book: FAILED (scripts/book.sh: mdbook build docs, then its links)" ;;
esac
case "$chart" in
    0) echo "chart: passed" ;;
    skipped) echo "chart: skipped (a test filter was given)"; chart=0 ;;
    *) echo "chart: FAILED (deploy/helm/docstream; scripts/lib/helm.sh)" ;;
esac
case "$fuzz" in
    0) echo "fuzz: passed" ;;
    skipped) echo "fuzz: skipped (a test filter was given; scripts/fuzz-api.sh runs it alone)"; fuzz=0 ;;
    *) echo "fuzz: FAILED (scripts/fuzz-api.sh; logs in target/tmp/fuzz-api/)" ;;
esac
case "$pyclient" in
    0) echo "pyclient: passed" ;;
    skipped) echo "pyclient: skipped (a test filter was given; clients/python/test.sh runs it alone)"; pyclient=0 ;;
    *) echo "pyclient: FAILED (clients/python/test.sh)" ;;
esac
if [ "$status" != 0 ]; then exit "$status"; fi
if [ "$deps" != 0 ]; then exit "$deps"; fi
if [ "$alerts" != 0 ]; then exit "$alerts"; fi
if [ "$book" != 0 ]; then exit "$book"; fi
if [ "$chart" != 0 ]; then exit "$chart"; fi
if [ "$pyclient" != 0 ]; then exit "$pyclient"; fi
exit "$fuzz"

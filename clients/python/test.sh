#!/usr/bin/env bash
# Tests the Python client (clients/python) against a live docstream:
#   1. starts the local Postgres and Kafka when they are not up (scripts/services.sh);
#   2. installs the package with its test extras into a virtualenv under
#      .services/tools/pyclient-venv (git-ignored): the dependencies once (again
#      when pyproject.toml changes), the package itself anew on every run, the
#      way a user installs it (pip install ./clients/python);
#   3. runs mypy --strict on the package;
#   4. runs pytest: the models against docs/openapi.json, then the live tests,
#      which start `docstream all` from $DOCSTREAM_BIN (default
#      target/debug/docstream; build it first) on a database of their own,
#      the topics pyclient.* and 127.0.0.1:18080 (PYCLIENT_HTTP_ADDR).
# Extra arguments go to pytest, e.g. `clients/python/test.sh -k export -x`.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$(pwd -P)"
started=$SECONDS

if ! bash scripts/services.sh status >/dev/null 2>&1; then
    bash scripts/services.sh up
fi
eval "$(bash scripts/services.sh env)"

export DOCSTREAM_BIN="${DOCSTREAM_BIN:-$repo/target/debug/docstream}"
case "$DOCSTREAM_BIN" in /*) ;; *) DOCSTREAM_BIN="$repo/$DOCSTREAM_BIN" ;; esac
if [ ! -x "$DOCSTREAM_BIN" ]; then
    echo "pyclient: no docstream binary at $DOCSTREAM_BIN (cargo build --bin docstream, or set DOCSTREAM_BIN)" >&2
    exit 1
fi

# psql, for the tests' own database: Debian's client, or the server's.
if ! command -v psql >/dev/null; then
    for found in /usr/lib/postgresql/*/bin; do
        [ -x "$found/psql" ] && PATH="$found:$PATH" && break
    done
fi

if ! command -v python3 >/dev/null || ! python3 -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "pyclient: installing python3 and python3-venv" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
fi
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "pyclient: the client needs Python 3.11 or later; python3 is $(python3 -V 2>&1)" >&2
    exit 1
}

venv="$repo/.services/tools/pyclient-venv"
stamp="$(sha256sum clients/python/pyproject.toml | cut -c1-16)"
# The marker is written last: an interrupted install is redone next time.
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$stamp" ]; then
    echo "pyclient: installing the test dependencies into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "./clients/python[test]"
    echo "$stamp" >"$venv/.installed"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall ./clients/python

echo "pyclient: mypy --strict" >&2
(cd clients/python && "$venv/bin/mypy" --strict --cache-dir=/dev/null src/docstream tests)

echo "pyclient: pytest" >&2
result=0
(cd clients/python && PYTHONDONTWRITEBYTECODE=1 "$venv/bin/pytest" -p no:cacheprovider -q "$@") || result=$?
echo "pyclient: $((SECONDS - started)) s" >&2
exit "$result"

#!/usr/bin/env bash
# Fuzzes the HTTP API against its OpenAPI document (GET /openapi.json) with
# schemathesis: starts the local services, builds docstream, installs
# schemathesis once, and runs `fuzz_api` (scripts/lib/fuzz-api.sh) against a
# live `serve`. Exits non-zero on any server error, any answer the document
# does not describe, any valid request refused or invalid one accepted.
# scripts/test.sh runs it after the cargo tests. About 40 s of fuzzing here
# (1,000 requests), a minute with the build; installing schemathesis once, 25 s.
#
#   scripts/fuzz-api.sh
#   FUZZ_MAX_EXAMPLES=200 FUZZ_SEED=1234 scripts/fuzz-api.sh
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib/prepare.sh
source scripts/lib/fuzz-api.sh
prepare
ensure_schemathesis

cargo build --locked --bin docstream
fuzz_api

#!/usr/bin/env bash
# The benchmark: start the local services, build in release, and run `docstream
# bench` (Postgres and Kafka ceilings, graphile-worker, docstream's burn-down and
# steady state, in one run). Extra arguments go to `docstream bench`, e.g.
#   scripts/bench.sh --jobs 50000 --rate 1000 --duration-s 30
#   scripts/bench.sh --skip peer,kafka
# The table is printed; the JSON goes to target/bench/latest.json.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib/prepare.sh
prepare

cargo build --locked --release --bin docstream
./target/release/docstream bench "$@"

#!/usr/bin/env bash
# The main job: start the local services, prepare the database and topics, and
# run the pipeline on the shipped sample documents. It prints the console's URL
# and a key; --stay keeps it serving afterwards. Extra arguments go to
# `docstream demo` (e.g. --documents 1000).
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib/prepare.sh
prepare

cargo build --locked --release --bin docstream
bin=./target/release/docstream
"$bin" migrate
"$bin" topics
"$bin" demo "$@"

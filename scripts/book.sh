#!/usr/bin/env bash
# Builds the manual (docs/) into target/book/ and checks its links: open
# target/book/index.html. Installs mdBook from crates.io the first time
# (about two minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/book.sh
ensure_mdbook
check_book
echo "the manual: $(pwd -P)/target/book/index.html"

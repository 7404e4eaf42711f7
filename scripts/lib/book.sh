# Sourced by scripts/test.sh and scripts/book.sh: `ensure_mdbook` installs
# mdBook (from crates.io, with `cargo install`) into .services/tools/
# (git-ignored), once; `check_book` builds the manual (docs/book.toml) into
# target/book/ and fails on a warning from mdBook or on a link inside the
# book that leads nowhere: a missing page, or an anchor no page has.

MDBOOK_VERSION=0.5.4

ensure_mdbook() {
    local dir; dir="$(pwd -P)/.services/tools/mdbook-$MDBOOK_VERSION"
    if [ ! -x "$dir/bin/mdbook" ]; then
        echo "building mdbook $MDBOOK_VERSION into $dir" >&2
        # Its own target folder, so the project's builds keep theirs; removed
        # after. Without the `serve` and `watch` features: nothing here
        # serves or watches the book, and they are most of its dependencies.
        CARGO_TARGET_DIR="$dir/build" cargo install --locked --quiet \
            --no-default-features --features search \
            --root "$dir" "mdbook@$MDBOOK_VERSION" >&2
        rm -rf "$dir/build"
    fi
    MDBOOK="$dir/bin/mdbook"
}

check_book() {
    local log; log="$(mktemp)"
    if ! "$MDBOOK" build docs >"$log" 2>&1; then
        cat "$log" >&2; rm -f "$log"; return 1
    fi
    if grep -E ' (WARN|ERROR) ' "$log" >&2; then
        rm -f "$log"; return 1
    fi
    rm -f "$log"
    python3 scripts/lib/book_links.py target/book
}

# Sourced by scripts/test.sh: `ensure_cargo_deny` installs cargo-deny (from
# crates.io, with `cargo install`) into .services/tools/ (git-ignored), once;
# `check_dependencies` runs it against deny.toml: licences, banned duplicate
# versions and the allowed sources. Not advisories: their database is a git
# repository this machine cannot fetch (see deny.toml).

CARGO_DENY_VERSION=0.20.2

ensure_cargo_deny() {
    local dir; dir="$(pwd -P)/.services/tools/cargo-deny-$CARGO_DENY_VERSION"
    if [ ! -x "$dir/bin/cargo-deny" ]; then
        echo "building cargo-deny $CARGO_DENY_VERSION into $dir" >&2
        # Its own target folder, so the project's builds keep theirs; removed after.
        CARGO_TARGET_DIR="$dir/build" cargo install --locked --quiet \
            --root "$dir" "cargo-deny@$CARGO_DENY_VERSION" >&2
        rm -rf "$dir/build"
    fi
    CARGO_DENY="$dir/bin/cargo-deny"
}

check_dependencies() {
    "$CARGO_DENY" --log-level warn --locked check licenses bans sources
}

# Sourced by scripts/test.sh: `ensure_pypdf` installs pypdf (from PyPI, pinned)
# into a virtualenv under .services/tools/ (git-ignored), once, and exports
# DOCSTREAM_TEST_PYPDF_PYTHON with the path of its python. The Python example
# provider (examples/extractor-provider/) reads a PDF's text layer with it in
# extractor protocol version 2, and tests/it/files.rs runs a PDF through it.

PYPDF_VERSION=7.1.1

ensure_pypdf() {
    local dir; dir="$(pwd -P)/.services/tools/pypdf-$PYPDF_VERSION"
    # The marker is written last: an interrupted install is redone next time.
    if [ ! -e "$dir/.installed" ]; then
        if ! command -v python3 >/dev/null || ! python3 -m venv --help >/dev/null 2>&1; then
            echo "installing python3 and python3-venv (for pypdf)" >&2
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
        fi
        echo "installing pypdf $PYPDF_VERSION into $dir" >&2
        rm -rf "$dir"
        python3 -m venv "$dir"
        "$dir/bin/pip" install --quiet --disable-pip-version-check "pypdf==$PYPDF_VERSION" >&2
        touch "$dir/.installed"
    fi
    export DOCSTREAM_TEST_PYPDF_PYTHON="$dir/bin/python"
}

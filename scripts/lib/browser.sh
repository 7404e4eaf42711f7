# The browser tests' tools: Debian's `chromium` (apt; no browser download)
# and Playwright for Python with axe-core's checks (PyPI, pinned: axe-playwright-python
# carries axe.min.js, so nothing is fetched at run time) in a virtualenv under
# .services/tools/, driven by tests/it/console/browser.py from tests/it/console.rs.
# `ensure_browser` installs both once and exports DOCSTREAM_TEST_PLAYWRIGHT
# (the virtualenv's python), which the console test needs to run.

PLAYWRIGHT_VERSION=1.65.2
AXE_PLAYWRIGHT_VERSION=0.1.8

ensure_browser() {
    if ! command -v chromium >/dev/null; then
        echo "installing chromium (Debian's, for the console's browser test)" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    fi
    local dir; dir="$(pwd -P)/.services/tools/playwright-$PLAYWRIGHT_VERSION-axe-$AXE_PLAYWRIGHT_VERSION"
    # The marker is written last: an interrupted install is redone next time.
    if [ ! -e "$dir/.installed" ]; then
        echo "installing playwright $PLAYWRIGHT_VERSION and axe-playwright-python $AXE_PLAYWRIGHT_VERSION into $dir" >&2
        rm -rf "$dir"
        python3 -m venv "$dir"
        "$dir/bin/pip" install --quiet --disable-pip-version-check \
            "playwright==$PLAYWRIGHT_VERSION" \
            "axe-playwright-python==$AXE_PLAYWRIGHT_VERSION" >&2
        touch "$dir/.installed"
    fi
    export DOCSTREAM_TEST_PLAYWRIGHT="$dir/bin/python"
    export CHROMIUM="$(command -v chromium)"
}

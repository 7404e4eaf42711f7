# Sourced by scripts/test.sh: `ensure_promtool` unpacks promtool from Debian's
# `prometheus` package into .services/tools/ (git-ignored), once, without
# installing the package (which would start a Prometheus server), and exports
# DOCSTREAM_TEST_PROMTOOL with its path. `check_alerts` runs promtool's checks
# of the compose stack's Prometheus config and the unit tests of its alerts.

ensure_promtool() {
    local dir; dir="$(pwd -P)/.services/tools/promtool"
    if [ ! -x "$dir/promtool" ]; then
        echo "unpacking promtool from Debian's prometheus package into $dir" >&2
        local work; work="$(mktemp -d)"
        # apt-get download writes to the working directory; _apt cannot
        # write to a mktemp directory, so it downloads as root (a warning).
        (cd "$work" && apt-get download prometheus >&2 2>/dev/null) || {
            apt-get update -qq
            (cd "$work" && apt-get download prometheus >&2)
        }
        dpkg-deb -x "$work"/prometheus_*.deb "$work/x"
        mkdir -p "$dir"
        cp "$work/x/usr/bin/promtool" "$dir/promtool"
        rm -rf "$work"
    fi
    export DOCSTREAM_TEST_PROMTOOL="$dir/promtool"
}

check_alerts() {
    local promtool="$DOCSTREAM_TEST_PROMTOOL" dir=scripts/compose/prometheus
    "$promtool" check config "$dir/prometheus.yml" &&
        "$promtool" check rules "$dir/alerts.yml" &&
        (cd "$dir" && "$promtool" test rules alerts.test.yml)
}

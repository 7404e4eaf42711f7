# Sourced by scripts/test.sh: `ensure_toxiproxy` builds the fault proxy the
# fault tests put between docstream and its dependencies (toxiproxy, from the Go
# module proxy) into .services/tools/ (git-ignored), once, and exports
# DOCSTREAM_TEST_TOXIPROXY with the server's path.

TOXIPROXY_VERSION=v2.5.0

ensure_toxiproxy() {
    local dir; dir="$(pwd -P)/.services/tools/toxiproxy-$TOXIPROXY_VERSION"
    if [ ! -x "$dir/server" ]; then
        # Go: the machine's (also /usr/local/go), else Debian's golang-go.
        command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
        if ! command -v go >/dev/null; then
            echo "installing golang-go (to build toxiproxy)" >&2
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null
        fi
        echo "building toxiproxy $TOXIPROXY_VERSION into $dir" >&2
        mkdir -p "$dir"
        GOBIN="$dir" GOFLAGS=-buildvcs=false \
            go install "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION" >&2
    fi
    export DOCSTREAM_TEST_TOXIPROXY="$dir/server"
}

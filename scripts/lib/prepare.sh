# Sourced by the scripts that build and run: `prepare` makes sure the Rust
# toolchain and the C build tools librdkafka needs are present (installing the
# latter from Debian's packages when missing), starts the local services, and
# exports DATABASE_URL and DOCSTREAM_KAFKA_BROKERS.

ensure_build_tools() {
    if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        echo "cargo not found: install Rust (https://rustup.rs), then re-run" >&2
        exit 1
    fi
    local missing=()
    command -v cc >/dev/null 2>&1 || missing+=(build-essential)
    command -v make >/dev/null 2>&1 || missing+=(make)
    command -v perl >/dev/null 2>&1 || missing+=(perl)
    command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
    [ -e /usr/include/zlib.h ] || missing+=(zlib1g-dev)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing build tools: ${missing[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

prepare() {
    ensure_build_tools
    bash scripts/services.sh up
    eval "$(bash scripts/services.sh env)"
}

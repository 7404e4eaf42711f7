# Sourced by the scripts that build and run: `prepare` makes sure the Rust
# toolchain and the C build tools and libraries librdkafka needs are present (installing the
# latter from Debian's packages when missing), and the programs workers read
# scans with (Tesseract 5 with its English and orientation models, poppler's
# pdftoppm, ImageMagick's convert, util-linux's prlimit) and the sample scans are made with
# (Python's PIL), starts the local services, and exports DATABASE_URL and
# DOCSTREAM_KAFKA_BROKERS.

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
    # librdkafka's TLS and SASL (Debian's OpenSSL), and the libcurl its
    # OAUTHBEARER token requests use.
    pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev)
    pkg-config --exists libcurl 2>/dev/null || missing+=(libcurl4-openssl-dev)
    command -v openssl >/dev/null 2>&1 || missing+=(openssl)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing build tools: ${missing[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

# The packages of deploy/runtime-packages.txt (the image's runtime stage
# installs the same list), and Python's PIL for making the sample scans.
ensure_ocr_tools() {
    local missing=() package
    while read -r package; do
        dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
    done < <(grep -v '^#' deploy/runtime-packages.txt | grep .)
    /usr/bin/python3 -c 'import PIL' 2>/dev/null || missing+=(python3-pil)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing the runtime packages: ${missing[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

prepare() {
    ensure_build_tools
    ensure_ocr_tools
    bash scripts/services.sh up
    eval "$(bash scripts/services.sh env)"
}

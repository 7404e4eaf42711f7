# Sourced by scripts/test.sh: `ensure_s3` installs an S3-compatible server the
# file tests keep uploads in (s3s-fs, an S3 server on a folder, from crates.io)
# into .services/tools/ (git-ignored), once, and exports DOCSTREAM_TEST_S3 with
# its path. Each test starts its own on a free loopback port.

S3S_FS_VERSION=0.14.1

ensure_s3() {
    local dir; dir="$(pwd -P)/.services/tools/s3s-fs-$S3S_FS_VERSION"
    if [ ! -x "$dir/bin/s3s-fs" ]; then
        echo "building s3s-fs $S3S_FS_VERSION into $dir" >&2
        # Its published lock file pins what it was released with.
        cargo install --quiet --locked --version "$S3S_FS_VERSION" --features binary \
            --root "$dir" s3s-fs >&2
    fi
    export DOCSTREAM_TEST_S3="$dir/bin/s3s-fs"
}

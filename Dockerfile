# syntax=docker/dockerfile:1
# docstream: one image, every role (`serve`, `worker`, `bbox-worker`, `migrate`, `topics`, ...).
#   docker build -t docstream:local .
# Used by docker-compose.kafka.yml.  Not needed for development without Docker:
# scripts/services.sh starts Kafka and Postgres natively.

# ---- build ------------------------------------------------------------------
FROM rust:1-bookworm AS builder
# librdkafka (built from source by rdkafka-sys) needs a C toolchain, make, perl,
# pkg-config and zlib; cmake for the cmake-build variant of rdkafka-sys; and
# Debian's OpenSSL and libcurl for TLS, SASL and OAUTHBEARER's token requests.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake pkg-config perl zlib1g-dev \
    libssl-dev libcurl4-openssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Sources, migrations (embedded by sqlx::migrate!) and Avro schemas.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin docstream \
 && install -Dm755 target/release/docstream /out/docstream

# ---- runtime ----------------------------------------------------------------
FROM debian:bookworm-slim
# deploy/runtime-packages.txt: TLS, and the OCR tools (Tesseract, poppler,
# ImageMagick), the list scripts/test.sh installs too. curl: the compose
# file's healthchecks (GET /healthz).
COPY deploy/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl $(grep -v '^#' /tmp/runtime-packages.txt) \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && useradd --system --uid 10001 --no-create-home docstream \
 && install -d -o docstream -g docstream /var/lib/docstream/files
COPY --from=builder /out/docstream /usr/local/bin/docstream
USER docstream
# Uploaded documents: every process that reads or writes them must see the
# same folder (the compose stack mounts one volume there in each).
ENV DOCSTREAM_HTTP_ADDR=0.0.0.0:8080 \
    DOCSTREAM_METRICS_ADDR=0.0.0.0:9464 \
    DOCSTREAM_FILES_DIR=/var/lib/docstream/files
EXPOSE 8080 9464
ENTRYPOINT ["docstream"]
CMD ["--help"]

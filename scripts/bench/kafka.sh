#!/usr/bin/env bash
# scripts/bench/kafka.sh — Kafka's own ceiling on this machine, for `docstream
# bench`: Kafka's perf tools (ProducerPerformance, ConsumerPerformance) against
# the local broker, on a fresh topic (P partitions, replication 1) that is
# deleted afterwards.  The producer uses docstream's settings (acks=all,
# enable.idempotence=true, linger.ms=$DOCSTREAM_PUBLISHER_LINGER_MS or 5) without
# throttling; the consumer then reads all N records.
#
#   scripts/bench/kafka.sh --records N --record-size B [--partitions P]
#
# Broker: $DOCSTREAM_KAFKA_BROKERS (default 127.0.0.1:59092).  Jars come from
# scripts/services.sh (.services/kafka/libs).  Last stdout line, one JSON object:
#   {"records":N,"record_size":B,"partitions":P,"producer_records_per_s":..,
#    "producer_mb_per_s":..,"producer_avg_latency_ms":..,"producer_p99_latency_ms":..,
#    "consumer_records_per_s":..,"consumer_mb_per_s":..,
#    "consumer_fetch_records_per_s":..,"consumer_fetch_mb_per_s":..}
# consumer_* covers the whole run, group join included; consumer_fetch_* leaves
# the join (rebalance) time out.  Progress goes to stderr; non-zero on failure.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
KAFKA_DIR="$REPO/.services/kafka"
BROKERS="${DOCSTREAM_KAFKA_BROKERS:-127.0.0.1:59092}"
# As docstream's publisher; Java's linger.ms takes whole milliseconds.
LINGER_MS="$(printf '%.0f' "${DOCSTREAM_PUBLISHER_LINGER_MS:-5}")" \
    || { echo "kafka.sh: DOCSTREAM_PUBLISHER_LINGER_MS is not a number" >&2; exit 1; }

log() { echo "kafka.sh: $*" >&2; }
die() { log "$*"; exit 1; }

RECORDS="" SIZE="" PARTITIONS=6
while [ $# -gt 0 ]; do
    case "$1" in
        --records) RECORDS="${2:-}"; shift 2 ;;
        --record-size) SIZE="${2:-}"; shift 2 ;;
        --partitions) PARTITIONS="${2:-}"; shift 2 ;;
        *) die "unknown argument '$1' (usage: --records N --record-size B [--partitions P])" ;;
    esac
done
for flag in records:RECORDS record-size:SIZE partitions:PARTITIONS; do
    v="${flag#*:}"
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] \
        || die "--${flag%:*} must be a positive integer (usage: --records N --record-size B [--partitions P])"
done

# The broker's jars (and a running broker) come from services.sh.
if [ ! -f "$KAFKA_DIR/libs/.complete" ] || [ ! -f "$KAFKA_DIR/tools.properties" ]; then
    bash "$REPO/scripts/services.sh" up >&2 || die "scripts/services.sh up failed"
fi

# Like kafka-run-class.sh for tools: small heap, but the full JIT (not the
# C1-only start-up flags services.sh uses), since these clients are measured.
# Not `services.sh kafka-tool`: it adds --bootstrap-server, which
# ProducerPerformance does not accept.
tool() {
    java -Xmx256m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2-tools.properties" \
        -cp "$KAFKA_DIR/libs/*" "$@"
}
topics() {   # tools.properties: short admin timeouts (from services.sh)
    tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$BROKERS" \
        --command-config "$KAFKA_DIR/tools.properties" "$@"
}

TOPIC="bench-kafka-$$-$(date +%s%N)"
log "creating topic $TOPIC ($PARTITIONS partitions) on $BROKERS"
topics --create --topic "$TOPIC" --partitions "$PARTITIONS" --replication-factor 1 >&2 \
    || die "could not create topic $TOPIC (is the broker up? scripts/services.sh up)"
OUT="$(mktemp -d)"   # the tools' outputs
cleanup() {
    rm -rf "$OUT"
    [ -n "$TOPIC" ] || return 0
    topics --delete --topic "$TOPIC" >/dev/null 2>&1 || log "could not delete topic $TOPIC"
    TOPIC=""
}
trap cleanup EXIT
trap 'exit 130' INT   # bash skips the EXIT trap when killed by a signal
trap 'exit 143' TERM

log "producing $RECORDS records of $SIZE bytes"
tool org.apache.kafka.tools.ProducerPerformance --topic "$TOPIC" --num-records "$RECORDS" \
    --record-size "$SIZE" --throughput -1 --producer-props bootstrap.servers="$BROKERS" \
    acks=all enable.idempotence=true linger.ms="$LINGER_MS" | tee "$OUT/producer" >&2 \
    || die "ProducerPerformance failed"
# Last line: "N records sent, X records/sec (Y MB/sec), A ms avg latency, M ms max
# latency, p50 ms 50th, p95 ms 95th, p99 ms 99th, p999 ms 99.9th."
read -r P_RPS P_MBS P_AVG P_P99 < <(grep ' records sent, ' "$OUT/producer" | tail -n1 |
    sed -E 's/.* records sent, ([0-9.]+) records\/sec \(([0-9.]+) MB\/sec\), ([0-9.]+) ms avg latency.* ([0-9]+) ms 99th.*/\1 \2 \3 \4/') \
    || true
[[ "${P_P99:-}" =~ ^[0-9]+$ ]] || die "could not parse ProducerPerformance output"

log "consuming $RECORDS records"
tool org.apache.kafka.tools.ConsumerPerformance --bootstrap-server "$BROKERS" --topic "$TOPIC" \
    --messages "$RECORDS" --group "$TOPIC" --timeout 30000 | tee "$OUT/consumer" >&2 \
    || die "ConsumerPerformance failed"
# Header "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg,
# nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec", then values.
read -r C_N C_RPS C_MBS C_FRPS C_FMBS < <(awk -F', *' '
    /^start\.time/ { for (i = 1; i <= NF; i++) col[$i] = i; next }
    "nMsg.sec" in col && NF >= col["fetch.nMsg.sec"] {
        print $col["data.consumed.in.nMsg"], $col["nMsg.sec"], $col["MB.sec"],
              $col["fetch.nMsg.sec"], $col["fetch.MB.sec"] }' "$OUT/consumer" | tail -n1) \
    || true
[[ "${C_N:-}" =~ ^[0-9]+$ ]] || die "could not parse ConsumerPerformance output"
[ "$C_N" -ge "$RECORDS" ] || die "consumer read only $C_N of $RECORDS records"

cleanup   # before answering: the JSON line means "done"
printf '{"records":%s,"record_size":%s,"partitions":%s,"producer_records_per_s":%s,"producer_mb_per_s":%s,"producer_avg_latency_ms":%s,"producer_p99_latency_ms":%s,"consumer_records_per_s":%s,"consumer_mb_per_s":%s,"consumer_fetch_records_per_s":%s,"consumer_fetch_mb_per_s":%s}\n' \
    "$RECORDS" "$SIZE" "$PARTITIONS" "$P_RPS" "$P_MBS" "$P_AVG" "$P_P99" \
    "$C_RPS" "$C_MBS" "$C_FRPS" "$C_FMBS"

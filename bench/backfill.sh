#!/usr/bin/env bash
# Backfill benchmark: N outbox rows (PAD bytes of padding each) re-published by `outboxd backfill`
#   1. --sink null: reading pages and routing, no broker,
#   2. --sink kafka into a local Apache Kafka broker (scripts/kafka),
# each timed with /usr/bin/time (wall seconds, rows/s, peak RSS). The point of the RSS column is
# that it does not grow with N: pages are bounded by --batch-size and the in-flight window.
# Usage: bench/backfill.sh [N] [PAD]   (defaults 100000 rows, 2048 bytes)
# OUTBOXD_BIN=path uses that binary instead of building the release one (label the numbers).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
N=${1:-100000}
PAD=${2:-2048}
ensure_tools
if [ -z "${OUTBOXD_BIN:-}" ]; then
  cargo build --release --bin outboxd >/dev/null 2>&1
  OUTBOXD_BIN=./target/release/outboxd
fi
echo "binary: $OUTBOXD_BIN"

work=$(mktemp -d /tmp/outboxd-bench-backfill.XXXXXX)
trap 'stop_all; rm -rf "$work"' EXIT
port=$((57000 + RANDOM % 1000))
pg_start "$work/pg" "$port"
kafka_start "$work/kafka"; kport=$KPORT
pg_psql -q -f sql/01_outbox.sql
echo "inserting $N rows of ~$PAD B..."
pg_psql -q -c "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
  SELECT 'order', (g % 1000)::text, 'order.paid.v1', jsonb_build_object('orderId', g, 'pad', repeat('x', $PAD)),
         now() - interval '1 hour' + g * interval '1 ms' FROM generate_series(1, $N) g"
data_mb=$(pg_psql -qAt -c "SELECT pg_total_relation_size('outbox') / 1048576")

run_backfill() { # sink
  /usr/bin/time -f '%e %M' -o "$work/time.$1" "$OUTBOXD_BIN" backfill \
    --postgres-url "postgres://postgres@/app?host=$PG_SOCKET&port=$port" --since 2h \
    --sink "$1" --kafka-brokers "127.0.0.1:$kport" >"$work/$1.log" 2>&1 || { cat "$work/$1.log"; exit 1; }
  grep -q "$N rows read, $N delivered" "$work/$1.log" || { cat "$work/$1.log"; exit 1; }
  cat "$work/time.$1"
}
read -r null_s null_kb < <(run_backfill null)
read -r kafka_s kafka_kb < <(run_backfill kafka)

rate() { awk "BEGIN {printf \"%.0f\", $N / $1}"; }
echo "table: $N rows, ${data_mb} MiB on disk"
printf '%-28s %10s %12s %10s\n' "backfill" "seconds" "rows/s" "peak RSS"
printf '%-28s %10.2f %12s %9sM\n' "outboxd backfill --sink null" "$null_s" "$(rate "$null_s")" "$((null_kb / 1024))"
printf '%-28s %10.2f %12s %9sM\n' "outboxd backfill --sink kafka" "$kafka_s" "$(rate "$kafka_s")" "$((kafka_kb / 1024))"

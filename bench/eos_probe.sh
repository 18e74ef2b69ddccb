#!/usr/bin/env bash
# bench/eos_probe.sh — where exactly-once's drain cost goes: 100,000 single-row transactions drained by
# outboxd in each --delivery mode (MODES, alternating, each from its own slot; a trailing digit
# repeats a mode), printing seconds, the broker's CPU (ticks of 10 ms, from /proc) and outboxd's
# Kafka transaction count and commit time. BIN (default target/release/outboxd), EXTRA (extra flags),
# PIN=1 (the broker on CPU 1, PostgreSQL and outboxd on CPU 0).
#   MODES="at-least-once exactly-once at-least-once2 exactly-once2" bench/eos_probe.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
dir=$(mktemp -d /tmp/eosprobe.XXXX)
trap 'stop_all; rm -rf "$dir"' EXIT
bench_cluster "$dir"
# PIN=1: the broker on CPU 1, PostgreSQL and outboxd on CPU 0 (the broker on a host of its own, as
# in production, on a 2-core box).
pin_others=""
if [ "${PIN:-0}" = 1 ]; then
  for p in $(pgrep -f "$dir/kafka"); do taskset -a -p -c 1 "$p" >/dev/null; done
  for p in $(pgrep -f "$dir/pg/data"); do taskset -a -p -c 0 "$p" >/dev/null; done
  pin_others="taskset -c 0"
fi
for mode in ${MODES:-at-least-once exactly-once}; do
  slot=s_${mode//-/_}
  pg_psql -q -c "SELECT pg_create_logical_replication_slot('$slot', 'pgoutput')" >/dev/null
done
pg_psql -q -c "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('t','w','warm','{}')"
for i in $(seq 1 100); do echo "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) SELECT 't', 'k'||g, 'e', jsonb_build_object('pad', repeat('x', 250)) FROM generate_series(1,1) g;"; done > "$dir/one.sql"
# 100,000 single-row transactions: 1000 psql batches of 100 autocommit INSERTs.
for j in $(seq 1 1000); do cat "$dir/one.sql"; done | pg_psql -q >/dev/null
end=$(pg_psql -Atc "SELECT pg_current_wal_lsn()")
bpid=$(pgrep -f "$dir/kafka" | head -1)
cpu() { awk '{print $14+$15}' /proc/$bpid/stat; }
for mode in ${MODES:-at-least-once exactly-once}; do
  slot=s_${mode//-/_}
  port=$(free_port 59600 300)
  c0=$(cpu); t0=$(date +%s.%N)
  $pin_others "${BIN:-target/release/outboxd}" run --postgres-url "postgres://postgres@127.0.0.1:$PORT/app" --slot "$slot" --kafka-brokers "$KAFKA_BOOTSTRAP" \
    --delivery "${mode%[23]}" --status-interval 100ms ${EXTRA:-} --metrics-addr "127.0.0.1:$port" > "$dir/$slot.log" 2>&1 &
  pid=$!
  until [ "$(pg_psql -Atc "SELECT confirmed_flush_lsn >= '$end' FROM pg_replication_slots WHERE slot_name='$slot'")" = t ]; do sleep 0.05; done
  t1=$(date +%s.%N)
  c1=$(cpu); echo "$mode: $(echo "$t1 - $t0" | bc) s, broker cpu $(( c1 - c0 )) ticks"
  curl -s "127.0.0.1:$port/metrics" | grep -E "^outboxd_kafka_transaction(s_total.*committed|_commit_seconds_sum)" || true
  kill $pid; wait $pid || true
done

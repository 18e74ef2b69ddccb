#!/usr/bin/env bash
# Drain benchmark: N pre-inserted single-row outbox transactions, drained by
#   1. pg_recvlogical (pgoutput, to /dev/null): the floor set by PostgreSQL's walsender itself,
#   2. outboxd --sink null: our decode/route/ack path without a broker,
#   3. outboxd --sink kafka into a local tansu broker,
# each from its own slot created before the backlog, in the same run on the same cluster.
# Prints events/s and each rate as a ratio of pg_recvlogical's. Usage: bench/drain.sh [N]
# Superseded by `bench/run drain` (CPU, RSS, repetitions, medians); kept as the quick original.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
N=${1:-100000}
ensure_tools
cargo build --release --bin outboxd >/dev/null 2>&1

work=$(mktemp -d /tmp/outboxd-bench.XXXXXX)
trap 'stop_all; rm -rf "$work"' EXIT
port=$((56000 + RANDOM % 1000)); kport=$((19100 + RANDOM % 800))
pg_start "$work/pg" "$port"
broker_start "$work/broker" "$kport"
pg_psql -q -f sql/01_outbox.sql
pg_psql -q -f sql/04_publication.sql
for s in bench_recvlogical bench_null bench_kafka; do
  pg_psql -qAt -c "SELECT pg_create_logical_replication_slot('$s', 'pgoutput')" >/dev/null
done

echo "inserting $N single-row transactions..."
pg_psql -q -c "DO \$\$ BEGIN FOR i IN 1..$N LOOP
  INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
  VALUES ('order', (i % 1000)::text, 'order.paid.v1', jsonb_build_object('orderId', i, 'total', 10.5, 'currency', 'EUR'));
  COMMIT; END LOOP; END \$\$;"
END_LSN=$(pg_psql -qAt -c "SELECT pg_current_wal_insert_lsn()")
echo "backlog ends at $END_LSN"

now() { date +%s.%N; }
confirmed_past_end() {
  [ "$(pg_psql -qAt -c "SELECT confirmed_flush_lsn >= '$END_LSN' FROM pg_replication_slots WHERE slot_name = '$1'")" = t ]
}

t0=$(now)
"$(pg_bindir)/pg_recvlogical" -h "$PG_SOCKET" -p "$port" -U postgres -d app --slot bench_recvlogical --start \
  -o proto_version=1 -o publication_names=outboxd --endpos "$END_LSN" -f /dev/null
t1=$(now)
recv_s=$(awk "BEGIN {print $t1 - $t0}")

run_outboxd() { # slot sink
  local slot=$1 sink=$2 t0 t1 pid hwm
  t0=$(now)
  ./target/release/outboxd run --postgres-url "postgres://postgres@/app?host=$PG_SOCKET&port=$port" \
    --slot "$slot" --sink "$sink" --kafka-brokers "127.0.0.1:$kport" --status-interval 100ms \
    >"$work/$slot.log" 2>&1 &
  pid=$!
  until confirmed_past_end "$slot"; do sleep 0.05; kill -0 "$pid" || { cat "$work/$slot.log"; exit 1; }; done
  t1=$(now)
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
  kill -TERM "$pid"; wait "$pid"
  echo "$(awk "BEGIN {print $t1 - $t0}") $hwm"
}
read -r null_s null_kb < <(run_outboxd bench_null null)
read -r kafka_s kafka_kb < <(run_outboxd bench_kafka kafka)

rate() { awk "BEGIN {printf \"%.0f\", $N / $1}"; }
ratio() { awk "BEGIN {printf \"%.2f\", $recv_s / $1}"; }
printf '%-22s %10s %12s %8s %10s\n' "reader" "seconds" "events/s" "ratio" "peak RSS"
printf '%-22s %10.2f %12s %8s %10s\n' "pg_recvlogical" "$recv_s" "$(rate "$recv_s")" "1.00" "-"
printf '%-22s %10.2f %12s %8s %9sM\n' "outboxd --sink null" "$null_s" "$(rate "$null_s")" "$(ratio "$null_s")" "$((null_kb / 1024))"
printf '%-22s %10.2f %12s %8s %9sM\n' "outboxd --sink kafka" "$kafka_s" "$(rate "$kafka_s")" "$(ratio "$kafka_s")" "$((kafka_kb / 1024))"
echo "(ratio = pg_recvlogical seconds / reader seconds; 1.00 means as fast as PostgreSQL's own client)"

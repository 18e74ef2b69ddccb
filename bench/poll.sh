#!/usr/bin/env bash
# Poll benchmark (issue 12): drain an N-row outbox backlog (default 200,000; 1000 aggregates, in
# transactions of 100 rows) with, in the same run on the same cluster and broker:
#   1. outboxd run --sink kafka (its slot created before the backlog): the replication path;
#   2. outboxd poll, 1 poller;            3. outboxd poll, 4 pollers (same backlog, marks reset);
#   4. the seed's own worker loop (bench/seed_worker.rs; to the topic `run` created), 1 and 4 workers, on SEED_N rows (it is
#      far too slow for N), and 1 worker without its 10 ms flush timer (linger 0).
# REPS repetitions (default 5); prints each, then median [min..max] events/s per reader.
# Then the latency run: LAT_N rows inserted at LAT_RATE/s (each its own transaction) while one
# poller with the NOTIFY wake-up relays them; p50/p99/max of published_at - created_at (insert to
# marked published, which follows the ack).
# Usage: bench/poll.sh   (env: N REPS SEED_N LAT_N LAT_RATE PROFILE)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
N=${N:-200000}; REPS=${REPS:-5}; SEED_N=${SEED_N:-2000}; LAT_N=${LAT_N:-10000}; LAT_RATE=${LAT_RATE:-1000}
ensure_tools
# PROFILE=debug only to try the script out: figures come from release builds.
PROFILE=${PROFILE:-release}
cargo build --profile "${PROFILE/debug/dev}" --bin outboxd --example seed_worker >/dev/null 2>&1
OUTBOXD=./target/$PROFILE/outboxd; SEED=./target/$PROFILE/examples/seed_worker

work=$(mktemp -d /tmp/outboxd-pollbench.XXXXXX)
trap 'stop_all; rm -rf "$work"' EXIT
bench_cluster "$work"
pg_psql -q -f sql/05_poll.sql
URL="postgres://postgres@/app?host=$PG_SOCKET&port=$PORT"
now() { date +%s.%N; }
unpublished() { pg_psql -qAt -c "SELECT count(*) FROM outbox WHERE published_at IS NULL"; }

fill() { # rows
  pg_psql -q -c "TRUNCATE outbox"
  pg_psql -q -c "DO \$\$ BEGIN FOR b IN 0..($1 - 1) / 100 LOOP
    INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
    SELECT 'order', (i % 1000)::text, 'order.paid.v1', jsonb_build_object('orderId', i, 'total', 10.5, 'currency', 'EUR')
    FROM generate_series(b * 100 + 1, least(b * 100 + 100, $1)) i;
    COMMIT; END LOOP; END \$\$;"
  pg_psql -q -c "VACUUM ANALYZE outbox"
}

run_drain() { # -> seconds for `outboxd run` to confirm the slot past the backlog
  local t0 pid end
  end=$(pg_psql -qAt -c "SELECT pg_current_wal_insert_lsn()")
  t0=$(now)
  $OUTBOXD run --postgres-url "$URL" --slot bench_run --kafka-brokers "127.0.0.1:$KPORT" --status-interval 100ms \
    --metrics-addr off >"$work/run.log" 2>&1 &
  pid=$!
  until [ "$(pg_psql -qAt -c "SELECT confirmed_flush_lsn >= '$end' FROM pg_replication_slots WHERE slot_name = 'bench_run'")" = t ]; do
    sleep 0.05; kill -0 "$pid" || { cat "$work/run.log" >&2; exit 1; }
  done
  awk "BEGIN {print $(now) - $t0}"
  kill -TERM "$pid"; wait "$pid" || true
}

poll_drain() { # pollers -> seconds until no row is unpublished
  local t0 pids=() i
  t0=$(now)
  for i in $(seq 1 "$1"); do
    $OUTBOXD poll --postgres-url "$URL" --kafka-brokers "127.0.0.1:$KPORT" --metrics-addr off >"$work/poll$i.log" 2>&1 &
    pids+=($!)
  done
  until [ "$(unpublished)" = 0 ]; do
    sleep 0.05; kill -0 "${pids[0]}" || { cat "$work/poll1.log" >&2; exit 1; }
  done
  awk "BEGIN {print $(now) - $t0}"
  for i in "${pids[@]}"; do kill -TERM "$i"; wait "$i" || true; done
}

seed_drain() { # workers linger_ms -> seconds until no row is unpublished
  local t0 pids=() i
  t0=$(now)
  for i in $(seq 1 "$1"); do
    $SEED "$URL" "127.0.0.1:$KPORT" order.paid.v1.events --linger-ms "$2" >"$work/seed$i.log" 2>&1 &
    pids+=($!)
  done
  until [ "$(unpublished)" = 0 ]; do sleep 0.05; kill -0 "${pids[0]}" || { cat "$work/seed1.log" >&2; exit 1; }; done
  awk "BEGIN {print $(now) - $t0}"
  for i in "${pids[@]}"; do kill "$i"; wait "$i" 2>/dev/null || true; done
}

declare -A R
names=(run poll1 poll4 seed1 seed4 seed1_nolinger)
for rep in $(seq 1 "$REPS"); do
  pg_psql -qAt -c "SELECT pg_drop_replication_slot('bench_run') FROM pg_replication_slots WHERE slot_name = 'bench_run'" >/dev/null
  pg_psql -qAt -c "SELECT pg_create_logical_replication_slot('bench_run', 'pgoutput')" >/dev/null
  fill "$N"
  s=$(run_drain); R[run]+="$(awk "BEGIN {printf \"%.0f\", $N / $s}") "
  s=$(poll_drain 1); R[poll1]+="$(awk "BEGIN {printf \"%.0f\", $N / $s}") "
  pg_psql -q -c "UPDATE outbox SET published_at = NULL" -c "VACUUM ANALYZE outbox"
  s=$(poll_drain 4); R[poll4]+="$(awk "BEGIN {printf \"%.0f\", $N / $s}") "
  fill "$SEED_N"; s=$(seed_drain 1 10); R[seed1]+="$(awk "BEGIN {printf \"%.1f\", $SEED_N / $s}") "
  fill "$SEED_N"; s=$(seed_drain 4 10); R[seed4]+="$(awk "BEGIN {printf \"%.1f\", $SEED_N / $s}") "
  fill "$SEED_N"; s=$(seed_drain 1 0); R[seed1_nolinger]+="$(awk "BEGIN {printf \"%.1f\", $SEED_N / $s}") "
  echo "rep $rep:$(for n in "${names[@]}"; do printf ' %s=%s' "$n" "$(echo "${R[$n]}" | awk '{print $NF}')"; done)"
done

stat() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2; printf "%s [%s..%s]", m, a[1], a[NR]}'; }
echo
printf '%-34s %s\n' "reader (N=$N; seed rows: $SEED_N)" "events/s: median [min..max] of $REPS"
printf '%-34s %s\n' "outboxd run --sink kafka" "$(echo "${R[run]}" | stat)"
printf '%-34s %s\n' "outboxd poll, 1 poller" "$(echo "${R[poll1]}" | stat)"
printf '%-34s %s\n' "outboxd poll, 4 pollers" "$(echo "${R[poll4]}" | stat)"
printf '%-34s %s\n' "seed loop, 1 worker" "$(echo "${R[seed1]}" | stat)"
printf '%-34s %s\n' "seed loop, 4 workers" "$(echo "${R[seed4]}" | stat)"
printf '%-34s %s\n' "seed loop, 1 worker, linger 0" "$(echo "${R[seed1_nolinger]}" | stat)"

# Latency: rows inserted at LAT_RATE/s, each its own transaction, one poller woken by NOTIFY.
pg_psql -q -c "TRUNCATE outbox"
$OUTBOXD poll --postgres-url "$URL" --kafka-brokers "127.0.0.1:$KPORT" --metrics-addr off >"$work/lat.log" 2>&1 &
lat_pid=$!
wait_for_log "$work/lat.log" polling 30
sleep 1
pg_psql -q -c "DO \$\$ DECLARE t0 timestamptz := clock_timestamp(); BEGIN FOR i IN 1..$LAT_N LOOP
  INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
  VALUES ('order', (i % 1000)::text, 'order.paid.v1', jsonb_build_object('orderId', i));
  COMMIT;
  PERFORM pg_sleep(greatest(0, extract(epoch FROM t0 + (i * interval '1 second') / $LAT_RATE - clock_timestamp())));
  END LOOP; END \$\$;"
until [ "$(unpublished)" = 0 ]; do sleep 0.1; done
kill -TERM "$lat_pid"; wait "$lat_pid" || true
echo
echo "latency, insert -> marked published (after the ack), $LAT_N rows at ${LAT_RATE}/s, 1 poller, NOTIFY:"
pg_psql -qAt -c "SELECT format('p50 %s ms, p99 %s ms, max %s ms, achieved rate %s/s',
    round((percentile_cont(0.5) WITHIN GROUP (ORDER BY ms))::numeric, 1),
    round((percentile_cont(0.99) WITHIN GROUP (ORDER BY ms))::numeric, 1), round(max(ms)::numeric, 1),
    round(count(*) / extract(epoch FROM max(created_at) - min(created_at))::numeric))
  FROM (SELECT created_at, extract(epoch FROM published_at - created_at) * 1000 AS ms FROM outbox) s"

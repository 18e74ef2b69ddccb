#!/usr/bin/env bash
# Kinesis benchmark (issue 39; `bench/run kinesis` runs it): the same backlog of N single-row
# transactions (~100 B jsonb payload, KEYS aggregates) drained, in each of REPS repetitions, by
#   1. pg_recvlogical (pgoutput, the ceiling of the replication side), from its own slot;
#   2. outboxd --sink kinesis into a local Kinesis (moto's server mode, scripts/aws) stream of
#      SHARDS shards: the shipped rule, one record of a key in flight;
#   3. the same with the rule lifted (OUTBOXD_KINESIS_UNORDERED=1, which only benchmarks set);
#   4. and 5. both again through tools/aws/throttle_proxy.py with share FAIL_SHARE: that share of
#      PutRecords calls answered ProvisionedThroughputExceeded, as many again with 40 % of their
#      records refused (the partial failure);
# every slot created before the backlog, every outboxd run on a fresh stream, timed from launch
# until the slot is confirmed past the backlog. Then moto's own ceiling, alone: boto3 PutRecords
# (500 a call) of N records of the payload's size over KEYS keys (tools/aws/kinesis.py ceiling).
# Prints each run, then median (min..max) events/s per reader.
# Usage: bench/kinesis.sh   (env: N=20000 REPS=5 KEYS=1000 SHARDS=4 FAIL_SHARE=0.1
#   PROFILE=release; PROFILE=debug only to try the script out)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
N=${N:-20000}; REPS=${REPS:-5}; KEYS=${KEYS:-1000}; SHARDS=${SHARDS:-4}; FAIL_SHARE=${FAIL_SHARE:-0.1}
PROFILE=${PROFILE:-release}
ensure_tools
# NO_BUILD=1 BIN=PATH: measure that binary (e.g. the release build CI made for the gate).
[ "${NO_BUILD:-0}" = 1 ] || cargo build --profile "${PROFILE/debug/dev}" --bin outboxd >/dev/null 2>&1
OUTBOXD=${BIN:-./target/$PROFILE/outboxd}
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test

work=$(mktemp -d /tmp/outboxd-kinesisbench.XXXXXX)
PROXY_PID=""
trap 'kill $PROXY_PID 2>/dev/null || true; bash scripts/aws stop "$work/moto" --kill || true; stop_all; rm -rf "$work"' EXIT
PORT=$(free_port 58600 800)
pg_start "$work/pg" "$PORT"
pg_psql -q -f sql/01_outbox.sql
pg_psql -q -f sql/04_publication.sql
MOTO=$(bash scripts/aws start "$work/moto" --parent $$)
kin() { bash scripts/aws python tools/aws/kinesis.py "$MOTO" "$@"; }
bash scripts/aws python tools/aws/throttle_proxy.py "$MOTO" "$work/proxy.port" "$work/proxy.stats" "$FAIL_SHARE" &
PROXY_PID=$!
until [ -s "$work/proxy.port" ]; do sleep 0.1; done
PROXY="http://127.0.0.1:$(cat "$work/proxy.port")"
URL="postgres://postgres@/app?host=$PG_SOCKET&port=$PORT"
now() { date +%s.%N; }

fill() { # rows: single-row transactions
  pg_psql -q -c "TRUNCATE outbox"
  pg_psql -q -c "DO \$\$ BEGIN FOR i IN 1..$1 LOOP
    INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
    VALUES ('order', (i % $KEYS)::text, 'order.paid.v1', jsonb_build_object('orderId', i, 'total', 10.5, 'currency', 'EUR'));
    COMMIT; END LOOP; END \$\$;"
}

recv() { # slot end -> seconds
  local t0; t0=$(now)
  "$(pg_bindir)/pg_recvlogical" -d "$URL" --slot "$1" --start -o proto_version=1 -o publication_names=outboxd \
    --endpos "$2" -f /dev/null
  awk "BEGIN {print $(now) - $t0}"
}

kinesis() { # slot end endpoint unordered(0|1) -> seconds
  local t0 pid stream=$1
  kin create-stream "$stream" "$SHARDS" >/dev/null
  t0=$(now)
  OUTBOXD_KINESIS_UNORDERED=$4 $OUTBOXD run --postgres-url "$URL" --slot "$1" --sink kinesis --kinesis-stream "$stream" \
    --aws-endpoint-url "$3" --aws-region us-east-1 --on-bad-event fail --status-interval 100ms --metrics-addr off \
    >"$work/$1.log" 2>&1 &
  pid=$!
  until [ "$(pg_psql -qAt -c "SELECT confirmed_flush_lsn >= '$2' FROM pg_replication_slots WHERE slot_name = '$1'")" = t ]; do
    sleep 0.05; kill -0 "$pid" 2>/dev/null || { tail -20 "$work/$1.log" >&2; exit 1; }
  done
  awk "BEGIN {print $(now) - $t0}"
  kill -TERM "$pid"; wait "$pid" || true
}

READERS="recv ordered unordered ordered_fail unordered_fail ceiling"
declare -A RATES
for r in $(seq 1 "$REPS"); do
  for s in recv ordered unordered ordered_fail unordered_fail; do
    pg_psql -qAt -c "SELECT pg_create_logical_replication_slot('${s}_$r', 'pgoutput')" >/dev/null
  done
  fill "$N"
  end=$(pg_psql -qAt -c "SELECT pg_current_wal_insert_lsn()")
  line="rep $r:"
  for s in recv ordered unordered ordered_fail unordered_fail; do
    case $s in
      recv) secs=$(recv "${s}_$r" "$end") ;;
      ordered) secs=$(kinesis "${s}_$r" "$end" "$MOTO" 0) ;;
      unordered) secs=$(kinesis "${s}_$r" "$end" "$MOTO" 1) ;;
      ordered_fail) secs=$(kinesis "${s}_$r" "$end" "$PROXY" 0) ;;
      unordered_fail) secs=$(kinesis "${s}_$r" "$end" "$PROXY" 1) ;;
    esac
    rate=$(awk "BEGIN {printf \"%d\", $N / $secs}")
    RATES[$s]="${RATES[$s]:-} $rate"
    line="$line $s=$rate/s"
    pg_psql -qAt -c "SELECT pg_drop_replication_slot('${s}_$r')" >/dev/null
  done
  kin create-stream "ceiling_$r" "$SHARDS" >/dev/null
  read -r _ secs < <(kin ceiling "ceiling_$r" "$N" 60 "$KEYS")
  rate=$(awk "BEGIN {printf \"%d\", $N / $secs}")
  RATES[ceiling]="${RATES[ceiling]:-} $rate"
  echo "$line ceiling=$rate/s"
done
echo "injected by the proxy: $(cat "$work/proxy.stats" 2>/dev/null)"
echo "N=$N REPS=$REPS KEYS=$KEYS SHARDS=$SHARDS FAIL_SHARE=$FAIL_SHARE PROFILE=$PROFILE $(bash scripts/aws version)"
for s in $READERS; do
  # shellcheck disable=SC2086
  printf '%-15s %s\n' "$s" "$(printf '%s\n' ${RATES[$s]} | sort -n | awk '{a[NR]=$1} END {printf "median %d (%d..%d) events/s", a[int((NR+1)/2)], a[1], a[NR]}')"
done

#!/usr/bin/env bash
# SQS benchmark (issue 39; `bench/run sqs` runs it, `bench/run sns` runs it with SINK=sns): the
# same backlog of N single-row transactions (~100 B jsonb payload, KEYS aggregates) drained, in
# each of REPS repetitions, by
#   1. pg_recvlogical (pgoutput, the ceiling of the replication side), from its own slot;
#   2. outboxd --sink sqs into a standard queue of a local SQS (moto's server mode, scripts/aws);
#   3. outboxd --sink sqs into a FIFO queue (group id = key: one message of a key in flight,
#      deduplication id = event id);
# (SINK=sns: outboxd --sink sns to a standard topic and to a FIFO topic, each with no subscriber)
# every slot created before the backlog, every outboxd run on a fresh queue or topic, timed from
# launch until the slot is confirmed past the backlog. Then moto's own ceiling, alone: boto3
# SendMessageBatch (PublishBatch for sns), 10 messages a call, of N messages of the payload's size
# to a fresh standard and FIFO queue (topic), the FIFO one with a group per key
# (tools/aws/client.py ceiling), one call at a time, then CALLS (8, outboxd's) calls at a time.
# Prints each run, then median (min..max) events/s per reader.
# Usage: bench/sqs.sh   (env: SINK=sqs|sns N=10000 REPS=5 KEYS=1000 CALLS=8 PROFILE=release;
#   PROFILE=debug only to try the script out; NO_BUILD=1 BIN=PATH to measure a given binary)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
SINK=${SINK:-sqs}; N=${N:-10000}; REPS=${REPS:-5}; KEYS=${KEYS:-1000}
# The concurrent ceiling's calls in flight: outboxd's own (sink/aws/publisher.rs REQUESTS).
CALLS=${CALLS:-8}
PROFILE=${PROFILE:-release}
case $SINK in sqs | sns) ;; *) echo "bench/sqs.sh: SINK is sqs or sns" >&2; exit 2 ;; esac
ensure_tools
# NO_BUILD=1 BIN=PATH: measure that binary (e.g. the release build CI made for the gate).
[ "${NO_BUILD:-0}" = 1 ] || cargo build --profile "${PROFILE/debug/dev}" --bin outboxd >/dev/null 2>&1
OUTBOXD=${BIN:-./target/$PROFILE/outboxd}
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test

work=$(mktemp -d /tmp/outboxd-sqsbench.XXXXXX)
trap 'bash scripts/aws stop "$work/moto" --kill || true; stop_all; rm -rf "$work"' EXIT
PORT=$(free_port 58600 800)
pg_start "$work/pg" "$PORT"
pg_psql -q -f sql/01_outbox.sql
pg_psql -q -f sql/04_publication.sql
MOTO=$(bash scripts/aws start "$work/moto" --parent $$)
aws_client() { bash scripts/aws python tools/aws/client.py "$MOTO" "$@"; }
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

# A fresh queue or topic named NAME (FIFO when $2 = fifo): its URL or ARN.
destination() {
  if [ "$SINK" = sqs ]; then aws_client create-queue "$1" $2; else aws_client create-topic "$1" $2; fi
}

relay() { # slot end fifo(""|fifo) -> seconds
  local t0 pid dest name=$1
  [ "$3" = fifo ] && name="$1.fifo"
  dest=$(destination "$name" "$3")
  local flag=--sqs-queue-url
  [ "$SINK" = sns ] && flag=--sns-topic-arn
  t0=$(now)
  $OUTBOXD run --postgres-url "$URL" --slot "$1" --sink "$SINK" "$flag" "$dest" \
    --aws-endpoint-url "$MOTO" --aws-region us-east-1 --on-bad-event fail --status-interval 100ms --metrics-addr off \
    >"$work/$1.log" 2>&1 &
  pid=$!
  until [ "$(pg_psql -qAt -c "SELECT confirmed_flush_lsn >= '$2' FROM pg_replication_slots WHERE slot_name = '$1'")" = t ]; do
    sleep 0.05; kill -0 "$pid" 2>/dev/null || { tail -20 "$work/$1.log" >&2; exit 1; }
  done
  awk "BEGIN {print $(now) - $t0}"
  kill -TERM "$pid"; wait "$pid" || true
}

READERS="recv standard fifo ceiling_standard ceiling_fifo ceiling${CALLS}_standard ceiling${CALLS}_fifo"
declare -A RATES
for r in $(seq 1 "$REPS"); do
  for s in recv standard fifo; do
    pg_psql -qAt -c "SELECT pg_create_logical_replication_slot('${s}_$r', 'pgoutput')" >/dev/null
  done
  fill "$N"
  end=$(pg_psql -qAt -c "SELECT pg_current_wal_insert_lsn()")
  line="rep $r:"
  for s in recv standard fifo; do
    case $s in
      recv) secs=$(recv "${s}_$r" "$end") ;;
      standard) secs=$(relay "${s}_$r" "$end" "") ;;
      fifo) secs=$(relay "${s}_$r" "$end" fifo) ;;
    esac
    rate=$(awk "BEGIN {printf \"%d\", $N / $secs}")
    RATES[$s]="${RATES[$s]:-} $rate"
    line="$line $s=$rate/s"
    pg_psql -qAt -c "SELECT pg_drop_replication_slot('${s}_$r')" >/dev/null
  done
  for calls in 1 "$CALLS"; do
    for f in "" fifo; do
      name="ceiling${calls}_$r"; [ "$f" = fifo ] && name="$name.fifo"
      dest=$(destination "$name" "$f")
      read -r _ secs < <(export CALLS=$calls; aws_client ceiling "$SINK" "$dest" "$N" 60 "$KEYS" $f)
      rate=$(awk "BEGIN {printf \"%d\", $N / $secs}")
      s=ceiling_${f:-standard}; [ "$calls" = 1 ] || s=ceiling${calls}_${f:-standard}
      RATES[$s]="${RATES[$s]:-} $rate"
      line="$line $s=$rate/s"
    done
  done
  echo "$line"
done
echo "SINK=$SINK N=$N REPS=$REPS KEYS=$KEYS CALLS=$CALLS PROFILE=$PROFILE $(bash scripts/aws version)"
for s in $READERS; do
  # shellcheck disable=SC2086
  printf '%-17s %s\n' "$s" "$(printf '%s\n' ${RATES[$s]} | sort -n | awk '{a[NR]=$1} END {printf "median %d (%d..%d) events/s", a[int((NR+1)/2)], a[1], a[NR]}')"
done

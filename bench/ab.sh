#!/usr/bin/env bash
# bench/ab.sh — two outboxd builds side by side on one backlog: drain seconds and CPU (all threads)
# per repetition, alternating A and B (order swapped every repetition), each from its own slot made
# before the backlog, beside pg_recvlogical. For before/after comparisons of a change; bench/run is
# the full suite.
#
#   bench/ab.sh OLD_BINARY NEW_BINARY            (default: 50000 single-row transactions, 5 reps)
#   N=20000 PER=1000 REPS=3 SINK=kafka bench/ab.sh A B
#
# Needs the release examples (bench_reader): cargo build --release --examples.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
A=$1 B=$2
N=${N:-50000} PER=${PER:-1} REPS=${REPS:-5} SINK=${SINK:-kafka}
EX=$PWD/target/release/examples
ensure_tools
work=$(mktemp -d /tmp/outboxd-ab.XXXXXX)
trap 'stop_all; rm -rf "$work"' EXIT
bench_cluster "$work" 40
CONN="host=$PG_SOCKET port=$PORT user=postgres dbname=app"
URL="postgres://postgres@/app?host=$PG_SOCKET&port=$PORT"
rows() { # ROWS PER_TXN: the same ~300 B rows as bench/run (bench/fill.sql)
  pg_psql -q -f bench/fill.sql
  pg_psql -q -c "CALL bench_fill($1, $2)"
}
slot() { pg_psql -qAt -c "SELECT pg_create_logical_replication_slot('$1', 'pgoutput')" >/dev/null; }
outboxd() { # BIN SLOT END -> "seconds cpu hwm walsender_cpu"
  "$EX/bench_reader" --pg "$CONN" --slot "$2" --end "$3" --until confirmed --log "$work/$2.log" -- \
    "$1" run --postgres-url "$URL" --slot "$2" --sink "$SINK" --kafka-brokers "127.0.0.1:$KPORT" \
    --status-interval 100ms --metrics-addr 127.0.0.1:0
}
# Warm-up: the topic exists before any measured run.
slot warm; rows 5 1
outboxd "$B" warm "$(pg_psql -qAt -c "SELECT pg_current_wal_insert_lsn()")" >/dev/null
pg_psql -qAt -c "SELECT pg_drop_replication_slot('warm')" >/dev/null
for r in $(seq 1 "$REPS"); do slot "a_$r"; slot "b_$r"; slot "r_$r"; done
rows "$N" "$PER"
END=$(pg_psql -qAt -c "SELECT pg_current_wal_insert_lsn()")
pg_psql -q -c "CHECKPOINT"
echo "# $N rows, $PER per transaction, --sink $SINK; A=$A B=$B"
printf 'rep\treader\tseconds\tcpu_s\thwm_kib\twalsender_cpu_s\n'
for r in $(seq 1 "$REPS"); do
  order="a b r"; [ $((r % 2)) = 0 ] && order="r b a"
  for w in $order; do
    case $w in
      a) printf '%s\tA\t%s\n' "$r" "$(outboxd "$A" "a_$r" "$END" | tr ' ' '\t')" ;;
      b) printf '%s\tB\t%s\n' "$r" "$(outboxd "$B" "b_$r" "$END" | tr ' ' '\t')" ;;
      r) out=$("$EX/bench_reader" --pg "$CONN" --slot "r_$r" --end "$END" --until exit --log "$work/r_$r.log" -- \
           /usr/bin/time -f "%U %S %M" -o "$work/r_$r.time" "$(pg_bindir)/pg_recvlogical" -d "$CONN" --slot "r_$r" \
           --start -o proto_version=1 -o publication_names=outboxd --endpos "$END" -f /dev/null)
         read -r secs _ _ ws <<<"$out"; read -r u s m < <(tail -1 "$work/r_$r.time")
         printf '%s\tpg_recvlogical\t%s\t%s\t%s\t%s\n' "$r" "$secs" "$(awk -v u="$u" -v s="$s" 'BEGIN { print u + s }')" "$m" "$ws" ;;
    esac
  done
done

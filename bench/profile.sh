#!/usr/bin/env bash
# bench/profile.sh — load-independent cost figures for outboxd's hot path: instruction counts
# (valgrind --tool=callgrind, user space, all threads) and context switches, wake-ups and system
# calls (perf stat tracepoints, whole process), per event, on fixed backlogs. Unlike bench/run's
# wall-clock and CPU-time figures these barely move when other work shares the machine, so they
# compare builds (before/after a change) on a busy box.
#
#   bench/profile.sh                     every shape, both sinks, both tools
#   SHAPES=single SINKS=kafka TOOLS=perf bench/profile.sh
#
# Shapes (each its own backlog, drained from fresh slots created before it):
#   single  N_SINGLE single-row transactions            (default 20000)
#   big     N_BIG rows in BIG_TXN_ROWS-row transactions  (default 20000 in 1000-row txns)
#   huge    one transaction of N_HUGE rows                (default 100000)
# Sinks: null, kafka (a local Apache Kafka broker; the topic is created by a warm-up run before any
# measured one, so topic creation stays out of the figures).
# Tools: callgrind (Ir = instructions executed in user space, every thread of outboxd),
#        perf (perf stat: context switches, sched_wakeup events raised by outboxd's threads,
#        system calls, futex calls; task-clock is shown but is load-dependent).
# Fixed costs (start-up, set-up checks, connections, shutdown) are measured on an empty backlog
# and subtracted, so "per event" is the marginal cost: (run − empty run) / events. With BASE_ROWS=B
# the subtracted run drains a backlog of B rows (same shape) instead, and the measured one B + N:
# the first records' one-off costs (a topic's metadata, a relation's description, buffers
# growing to size) then cancel too, so a short backlog already gives the long one's figure
# (bench/gate.sh does this; B must be a multiple of BIG_TXN_ROWS for the big shape).
#
# Other knobs: BIN (default target/release/outboxd, built unless NO_BUILD=1), OUT (directory for
# callgrind files and the summary; default bench/profile-out), OUTBOXD_EXTRA (extra flags for
# outboxd, e.g. "--kafka-property linger.ms=1"), LABEL (a name for this build in the summary),
# METRICS_ADDR (default 127.0.0.1:0: metrics and the status page on a free port; "off" runs without
# either), SETUP_SQL (SQL run once after the outbox table is made, before any backlog: e.g. a
# tracingspancontext column with a default, so every row carries a trace context).
# Prints one TSV line per (shape, sink, tool) and appends them to $OUT/summary.tsv.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

SHAPES=${SHAPES:-"single big huge"}
SINKS=${SINKS:-"null kafka"}
TOOLS=${TOOLS:-"callgrind perf"}
N_SINGLE=${N_SINGLE:-20000}
N_BIG=${N_BIG:-20000}
BIG_TXN_ROWS=${BIG_TXN_ROWS:-1000}
N_HUGE=${N_HUGE:-100000}
BASE_ROWS=${BASE_ROWS:-0}
OUT=${OUT:-bench/profile-out}
OUTBOXD_EXTRA=${OUTBOXD_EXTRA:-}
METRICS_ADDR=${METRICS_ADDR:-127.0.0.1:0}
SETUP_SQL=${SETUP_SQL:-}
LABEL=${LABEL:-$(git rev-parse --short HEAD 2>/dev/null || echo build)$(git diff --quiet 2>/dev/null || echo +dirty)}
BIN=${BIN:-$PWD/target/release/outboxd}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

ensure_tools
if [ "${NO_BUILD:-0}" != 1 ]; then
  cargo build --release --bin outboxd >/dev/null 2>"$OUT/build.log" || { cat "$OUT/build.log" >&2; exit 1; }
fi

work=$(mktemp -d /tmp/outboxd-profile.XXXXXX)
trap 'stop_all; rm -rf "$work"' EXIT
bench_cluster "$work" 32
[ -z "$SETUP_SQL" ] || pg_psql -q -c "$SETUP_SQL"
# Generous connect timeout: under valgrind, start-up on a busy box takes seconds.
URL="postgres://postgres@/app?host=$PG_SOCKET&port=$PORT&connect_timeout=120"

# The same rows bench/run inserts (bench/fill.sql): ~300 B of jsonb, 1,000 aggregates, 5 event types.
insert_rows() { # ROWS PER_TXN
  pg_psql -q -f bench/fill.sql
  pg_psql -q -c "CALL bench_fill($1, $2)"
}
slot_ok() { [ "$(pg_psql -qAt -c "SELECT confirmed_flush_lsn >= '$2' FROM pg_replication_slots WHERE slot_name = '$1'")" = t ]; }
new_slot() { pg_psql -qAt -c "SELECT pg_create_logical_replication_slot('$1', 'pgoutput')" >/dev/null; }
drop_slots() {
  pg_psql -qAt -c "SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots WHERE NOT active" >/dev/null
}

# run_under SLOT SINK END PREFIX...: outboxd under PREFIX until the slot is confirmed past END.
run_under() {
  local slot=$1 sink=$2 end=$3 pid; shift 3
  # shellcheck disable=SC2086 # OUTBOXD_EXTRA is a list of flags
  "$@" "$BIN" run --postgres-url "$URL" --slot "$slot" --sink "$sink" --kafka-brokers "127.0.0.1:$KPORT" \
    --status-interval 100ms --metrics-addr "$METRICS_ADDR" $OUTBOXD_EXTRA >"$work/$slot.log" 2>&1 &
  pid=$!
  until slot_ok "$slot" "$end"; do
    kill -0 "$pid" 2>/dev/null || { echo "outboxd on $slot ended early:" >&2; tail -20 "$work/$slot.log" >&2; return 1; }
    sleep 0.1
  done
  # valgrind runs outboxd in this very process; perf stat runs it as its child: stop outboxd,
  # and perf ends with it.
  kill -TERM "$(pgrep -P "$pid" | head -1 || true)" 2>/dev/null || kill -TERM "$pid"
  wait "$pid" || true
}

# measure SHAPE SINK TOOL SLOT END EVENTS -> "key=value ..." figures of one run
measure() {
  local shape=$1 sink=$2 tool=$3 slot=$4 end=$5 f
  case $tool in
    callgrind)
      f="$OUT/callgrind.$LABEL.$shape.$sink.$slot.out"
      # quanta (the metrics recorder's clock) calibrates the TSC against the wall clock once at
      # start-up, in a loop whose length depends on the machine's load: 1-4 M instructions that
      # varied from run to run by more than a 4,000-row backlog's 5%. Not counted: collection is
      # off inside it (--toggle-collect alone would also turn it off at start, hence atstart=yes).
      run_under "$slot" "$sink" "$end" valgrind --tool=callgrind --callgrind-out-file="$f" --quiet \
        --toggle-collect='quanta::Clock::new*' --collect-atstart=yes
      # Sum over every thread's file (callgrind writes one per thread with --separate-threads=no: one file).
      local ir tls rdk clk ann
      ir=$(awk '/^summary:/ { s += $2 } /^totals:/ { t += $2 } END { print (s ? s : t) + 0 }' "$f"*)
      ann=$(callgrind_annotate --inclusive=yes "$f" 2>/dev/null)
      # incl NAME...: the inclusive instructions of these functions (their own lines only: the ones
      # that end in the binary's name, not the per-file lines of code inlined into them).
      incl() { awk -v names="$*" 'BEGIN { n = split(names, w, " ") }
        { for (i = 1; i <= n; i++) if (index($0, ":" w[i] " [")) { v = $1; gsub(",", "", v); t += v } }
        END { print t + 0 }' <<<"$ann"; }
      # Building an OpenSSL connector per PostgreSQL connection (it loads the system CA bundle)
      # costs ~240M instructions each, and how many connections a run opens varies: also report
      # the total without it, which is what compares builds per event.
      tls=$(incl 'outboxd::pg::tls::make_tls')
      # librdkafka's own threads (the broker thread's socket I/O and request building, the main
      # thread's timers) run on wall-clock timeouts and batch by timing: under callgrind's
      # serialised threads their count for one binary moved by 4-10 M instructions between runs
      # (17% of the 1-row Kafka figure). bench/gate.sh holds builds to the rest (Ir_gate), which
      # keeps every instruction our threads execute, librdkafka calls made from them included.
      rdk=$(incl rd_kafka_thread_main rd_kafka_broker_thread_main)
      # Work on a clock, not per event: the status page's sampler (renders and parses the metrics
      # every 5 s, ~0.3-0.5 M instructions a sample) and the metrics recorder's upkeep (every 1 s).
      # A run that takes longer does more of it: between two gate runs of one binary it was 1.8 M
      # of a 4,000-row figure's 2.0 M difference (4.7% of the 1-row null figure, next to the 5%
      # limit). Reported as Ir_clock; Ir_gate leaves it out (the instructions per wall-clock
      # second it costs are in bench/RESULTS.md, issue 40's feature costs).
      # Except the histograms' samples: the recorder files each one into its buckets when it drains
      # them, inside those two tasks, so that part is per-event work (one commit-to-ack sample per
      # transaction; a per-record histogram someone adds) and stays in Ir_gate.
      clk=$(incl 'outboxd::status::StatusPage::start::{{closure}}' 'outboxd::metrics::install_recorder::{{closure}}')
      clk=$((clk - $(incl 'metrics_exporter_prometheus::recorder::Inner::drain_histograms_to_distributions')))
      echo "Ir=$ir Ir_without_pg_tls_setup=$((ir - tls)) Ir_clock=$clk Ir_gate=$((ir - tls - rdk - clk))"
      ;;
    perf)
      f="$work/$slot.perf"
      run_under "$slot" "$sink" "$end" perf stat -x, -o "$f" \
        -e task-clock,context-switches,sched:sched_wakeup,raw_syscalls:sys_enter,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_poll,syscalls:sys_enter_ppoll
      awk -F, '$1 ~ /^[0-9.]+$/ { n = $3; sub(/^.*:/, "", n); printf "%s=%s ", n, $1 }' "$f"
      ;;
  esac
}

per_event() { # RUN_KV EMPTY_KV EVENTS -> per-event figures
  awk -v run="$1" -v empty="$2" -v n="$3" 'BEGIN {
    m = split(empty, e, " "); for (i = 1; i <= m; i++) { split(e[i], kv, "="); base[kv[1]] = kv[2] }
    m = split(run, r, " ");
    for (i = 1; i <= m; i++) { split(r[i], kv, "="); if (kv[1] == "") continue
      printf "%s/ev=%.3f ", kv[1], (kv[2] - base[kv[1]]) / n }
  }'
}

echo "# $(date -u '+%F %T') UTC, build $LABEL, extra flags: ${OUTBOXD_EXTRA:-none}, metrics: $METRICS_ADDR, setup SQL: ${SETUP_SQL:-none}" | tee -a "$OUT/summary.tsv"
# Warm-up: create the Kafka topic outside every measured run.
new_slot warm
insert_rows 10 1
end=$(pg_psql -qAt -c "SELECT pg_current_wal_insert_lsn()")
run_under warm kafka "$end" env
drop_slots

for shape in $SHAPES; do
  case $shape in
    single) rows=$N_SINGLE per=1 ;;
    big) rows=$N_BIG per=$BIG_TXN_ROWS ;;
    huge) rows=$N_HUGE per=$N_HUGE ;;
    *) echo "unknown shape $shape" >&2; exit 2 ;;
  esac
  pg_psql -q -c "TRUNCATE outbox" -c "CHECKPOINT"
  # Empty runs first (their slots see no backlog), then slots for the measured runs, then the rows.
  end0=$(pg_psql -qAt -c "SELECT pg_current_wal_insert_lsn()")
  declare -A EMPTY=()
  for sink in $SINKS; do for tool in $TOOLS; do
    new_slot "e_${shape}_${sink}_$tool"
  done; done
  if [ "$BASE_ROWS" -gt 0 ]; then
    [ $((BASE_ROWS % per)) = 0 ] || { echo "BASE_ROWS=$BASE_ROWS is not a multiple of $per (shape $shape)" >&2; exit 2; }
    insert_rows "$BASE_ROWS" "$per"
  else
    pg_psql -q -c "SELECT pg_logical_emit_message(false, 'outboxd.heartbeat', '')" >/dev/null
  fi
  end0=$(pg_psql -qAt -c "SELECT pg_current_wal_insert_lsn()")
  for sink in $SINKS; do for tool in $TOOLS; do
    EMPTY[$sink.$tool]=$(measure "$shape" "$sink" "$tool" "e_${shape}_${sink}_$tool" "$end0")
  done; done
  for sink in $SINKS; do for tool in $TOOLS; do new_slot "m_${shape}_${sink}_$tool"; done; done
  insert_rows $((BASE_ROWS + rows)) "$per"
  end=$(pg_psql -qAt -c "SELECT pg_current_wal_insert_lsn()")
  pg_psql -q -c "CHECKPOINT"
  for sink in $SINKS; do for tool in $TOOLS; do
    kv=$(measure "$shape" "$sink" "$tool" "m_${shape}_${sink}_$tool" "$end")
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$LABEL" "$shape" "$sink" "$tool" "$(per_event "$kv" "${EMPTY[$sink.$tool]}" "$rows")" "run: $kv| empty: ${EMPTY[$sink.$tool]}" | tee -a "$OUT/summary.tsv"
  done; done
  unset EMPTY
  drop_slots
done

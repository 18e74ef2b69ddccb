#!/usr/bin/env bash
# bench/gate.sh — the cost gate: instructions per event must not rise more than GATE_TOLERANCE
# percent (default 5) above the figures committed in bench/baseline.tsv.
#
#   bench/gate.sh            measure, print one verdict line per row, exit 1 if any row is over
#   bench/gate.sh --bless    measure and rewrite bench/baseline.tsv with the figures (commit it,
#                            saying why the cost may rise; that is the only way a baseline rises)
#
# What it measures: bench/profile.sh's callgrind figure (user-space instructions of outboxd's
# threads, release build), for the single-row and 1000-row shapes and the null and Kafka sinks,
# without librdkafka's own threads (profile.sh's Ir_gate): their count follows wall-clock timeouts
# and how records happen to batch, and moved by up to 17% between two runs of one binary. Every
# librdkafka call our threads make (producing, serving delivery reports) still counts.
# The figure is a marginal cost: the run that drains GATE_BASE + GATE_ROWS rows minus the run that
# drains GATE_BASE rows, over GATE_ROWS (profile.sh's BASE_ROWS). Subtracting a run that did real
# work, rather than an empty one, cancels the start-up and the first records' one-off costs, so
# a backlog of a few thousand rows gives what profile.sh's 20,000 do. Instruction counts do not
# depend on the machine's load, except for work that runs on a clock: the status page's sampler
# (every 5 s) and the metrics recorder's upkeep (every 1 s) are left out too (profile.sh's
# Ir_clock): a slower run did more of them, up to 1,257 instructions per event in one repetition,
# and the figure then moved by 12% across ten repetitions of one binary (0.7-2.3% without them;
# bench/RESULTS.md, 2026-12-06). What still moves is the standby status updates, the health
# ticks and how delivery reports batch: a few hundred instructions per event at most.
#
# Knobs: GATE_REPS (repetitions, default 2; a row's lowest figure counts), GATE_ROWS (default
# 4000), GATE_BASE (default 1000; a multiple of 1000), GATE_TOLERANCE
# (percent, default 5), GATE_BASELINE (default bench/baseline.tsv), NO_BUILD=1 and BIN as for
# profile.sh, GATE_KEEP=DIR keeps the callgrind files there. Needs valgrind (scripts/lib.sh
# ensure_tools installs it), a PostgreSQL build and Kafka's jars, as profile.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."

bless=0
case ${1:-} in
  --bless) bless=1 ;;
  "") ;;
  *) echo "usage: bench/gate.sh [--bless]" >&2; exit 2 ;;
esac
GATE_ROWS=${GATE_ROWS:-4000}
GATE_BASE=${GATE_BASE:-1000}
GATE_TOLERANCE=${GATE_TOLERANCE:-5}
GATE_BASELINE=${GATE_BASELINE:-bench/baseline.tsv}
GATE_REPS=${GATE_REPS:-2}
[ $bless = 1 ] || [ -f "$GATE_BASELINE" ] || {
  echo "gate: no baseline $GATE_BASELINE; take one with bench/gate.sh --bless" >&2; exit 2; }

out=${GATE_KEEP:-$(mktemp -d /tmp/outboxd-gate.XXXXXX)}
mkdir -p "$out"
[ -n "${GATE_KEEP:-}" ] || trap 'rm -rf "$out"' EXIT
started=$(date +%s)
# Each repetition measures every row; a row's figure is its lowest. What still varies between runs
# of one binary is the clock-driven work left in (status updates, health ticks, how delivery
# reports batch): a slower run does more of it, never less, so the lowest is the run with the
# least of it, and the baseline is taken the same way.
: >"$out/lines"
for rep in $(seq 1 "$GATE_REPS"); do
  SHAPES="single big" SINKS="null kafka" TOOLS=callgrind N_SINGLE=$GATE_ROWS N_BIG=$GATE_ROWS \
    BIG_TXN_ROWS=1000 BASE_ROWS=$GATE_BASE OUT="$out/rep$rep" LABEL=gate OUTBOXD_EXTRA= METRICS_ADDR=127.0.0.1:0 SETUP_SQL= \
    bash bench/profile.sh >>"$out/lines" 2>"$out/errors" || { cat "$out/errors" >&2; exit 1; }
done
# profile.sh's lines: LABEL shape sink tool "Ir/ev=… …" "run: …| empty: …"
all=$(awk -F'\t' '$1 == "gate" && $4 == "callgrind" {
  n = split($5, kv, " "); for (i = 1; i <= n; i++) if (sub(/^Ir_gate\/ev=/, "", kv[i])) printf "%s\t%s\t%.0f\n", $2, $3, kv[i] }' "$out/lines")
measured=$(echo "$all" | awk -F'\t' '{ k = $1 "\t" $2; if (!(k in m) || $3 + 0 < m[k] + 0) m[k] = $3 + 0; if (!(k in o)) { o[k] = ++n; key[n] = k }
  runs[k] = runs[k] (runs[k] == "" ? "" : ",") $3 }
  END { for (i = 1; i <= n; i++) printf "%s\t%s\t%s\n", key[i], m[key[i]], runs[key[i]] }')
[ "$(echo "$measured" | grep -c .)" = 4 ] || { echo "gate: profile.sh gave no figures:" >&2; cat "$out/lines" "$out/errors" >&2; exit 1; }
secs=$(($(date +%s) - started))

if [ $bless = 1 ]; then
  {
    echo "# Instructions per event that bench/gate.sh holds every build to (+${GATE_TOLERANCE}% at most)."
    echo "# callgrind, release build, marginal cost of $GATE_ROWS rows over a $GATE_BASE-row base run."
    echo "# Taken $(date -u '+%F %H:%M') UTC on $(git rev-parse --short HEAD)$(git diff --quiet || echo +dirty) by bench/gate.sh --bless;"
    echo "# raising a figure is a deliberate commit that says why."
    printf 'shape\tsink\tinstructions_per_event\n'
    echo "$measured" | cut -f1-3
  } >"$GATE_BASELINE"
  echo "gate: wrote $GATE_BASELINE (${secs}s):"
  echo "$measured" | awk -F'\t' '{ printf "gate: %s %s %d instructions per event (lowest of %s)\n", $1, $2, $3, $4 }'
  exit 0
fi

fail=0
while IFS=$'\t' read -r shape sink now runs; do
  base=$(awk -F'\t' -v s="$shape" -v k="$sink" '$1 == s && $2 == k { print $3 }' "$GATE_BASELINE")
  if [ -z "$base" ]; then
    echo "gate: $shape $sink: $now instructions per event, no baseline row: FAIL (bench/gate.sh --bless)"
    fail=1; continue
  fi
  verdict=$(awk -v now="$now" -v base="$base" -v tol="$GATE_TOLERANCE" 'BEGIN {
    d = 100 * (now - base) / base
    printf "%+.1f%% (limit +%s%%): %s", d, tol, (d > tol ? "FAIL" : "ok") }')
  echo "gate: $shape $sink: $now instructions per event (lowest of $runs), baseline $base, $verdict"
  case $verdict in *FAIL) fail=1 ;; esac
done <<<"$measured"
echo "gate: $([ $fail = 0 ] && echo passed || echo FAILED) in ${secs}s ($GATE_REPS repetitions of $GATE_ROWS rows over a $GATE_BASE-row base per shape)"
exit $fail

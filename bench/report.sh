#!/usr/bin/env bash
# The benchmark report of issue 13: `daisychain bench --json` on random-weight models of the
# real shapes (tools/make_model presets smollm-135m and qwen2.5-0.5b), 1 and 2 threads, each
# figure the median of REPEAT runs, printed as one Markdown table. The ring and lookahead
# columns are "not yet": pipelined ring prefill and lookahead drafting are not built yet.
# Usage: bench/report.sh [REPEAT] [PRESETS...]     (env: BUILD=build, THREADS="1 2")
set -euo pipefail
BUILD=${BUILD:-build}
BIN=$BUILD/apps/cli/daisychain
MAKE_MODEL=$BUILD/tools/make_model
REPEAT=${1:-3}
shift || true
PRESETS=("$@")
[ ${#PRESETS[@]} -gt 0 ] || PRESETS=(smollm-135m qwen2.5-0.5b)
THREADS=${THREADS:-"1 2"}
for f in "$BIN" "$MAKE_MODEL"; do
  [ -x "$f" ] || { echo "report.sh: $f not found; build first (cmake --build $BUILD)" >&2; exit 1; }
done
TMP=$(mktemp -d /tmp/daisy-report-XXXXXX)
cleanup() { rm -rf "$TMP"; }
trap cleanup EXIT
# The backend choice is cached here once, so every run uses the same one.
export DAISY_HOME=$TMP/home
# One table row from the JSON lines of the runs: the median of each figure.
cat >"$TMP/row.py" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in sys.stdin if line.strip()]
def med(key):
    return statistics.median(r[key] for r in runs)
c = runs[0]["backend_choice"]
mib = 1 << 20
cells = [sys.argv[1], sys.argv[2],
         f"{med('decode_tokens_per_s'):.1f}", f"{med('decode_bandwidth_ratio'):.2f}",
         f"{med('read_bandwidth_gbps'):.1f}", f"{med('decode_bytes_per_token') / 1e6:.1f}",
         f"{med('prefill64_tokens_per_s'):.0f}", f"{med('prefill512_tokens_per_s'):.0f}",
         f"{med('prefill_kernel_ratio'):.2f}", f"{med('gemm_gops'):.0f}",
         f"{med('peak_rss_bytes') / mib:.0f}", f"{med('rss_budget_bytes') / mib:.0f}",
         f"{c['gemv']}/{c['gemm']}/{c['attention']}", "not yet", "not yet"]
print("| " + " | ".join(cells) + " |")
PY

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores;" \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| model | threads | decode tok/s | bandwidth ratio | read GB/s | MB/token | prefill 64 tok/s | prefill 512 tok/s | kernel ratio | GEMM GOP/s | peak RSS MiB | RSS budget MiB | backends (gemv/gemm/attention) | ring 2 stages ÷ 1 | lookahead gain |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for preset in "${PRESETS[@]}"; do
  model=$TMP/$preset
  "$MAKE_MODEL" --preset "$preset" --out "$model" >/dev/null
  for t in $THREADS; do
    runs=()
    for r in $(seq "$REPEAT"); do
      runs+=("$("$BIN" bench --model "$model" --threads "$t" --prompt-tokens 128 --decode-tokens 64 --json 2>/dev/null | tail -n 1)")
    done
    printf '%s\n' "${runs[@]}" | python3 "$TMP/row.py" "$preset" "$t"
  done
  rm -rf "$model"
done
echo
echo "medians of $REPEAT runs; load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

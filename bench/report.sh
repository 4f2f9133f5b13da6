#!/usr/bin/env bash
# The benchmark report of issue 13: `daisychain bench --json` on random-weight models of the
# real shapes (tools/make_model presets smollm-135m and qwen2.5-0.5b, with the project's copy
# of each family's tokenizer), 1 and 2 threads, each figure the median of REPEAT runs,
# printed as one Markdown table. Per model also bench/ring_bench.sh (2 stages of 1 thread
# against 1 stage of 1 thread on loopback: the 512-token prefill and decode) and, as root,
# bench/lookahead_bench.sh (2 stages, 4 ms per leg, in network namespaces it creates: decode
# with drafts against without, on code / a list / a story). Random weights rarely repeat
# themselves, so their drafts are rarely kept; the same lookahead figures for the bundled
# (trained) stories260K follow the table.
# Usage: bench/report.sh [REPEAT] [PRESETS...]
# Environment: BUILD=build, THREADS="1 2", SKIP_RING=1, SKIP_LOOKAHEAD=1.
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
         f"{med('decode_products_share'):.2f}", f"{med('decode_products_ratio'):.2f}",
         f"{med('prefill64_tokens_per_s'):.0f}", f"{med('prefill512_tokens_per_s'):.0f}",
         f"{med('prefill_kernel_ratio'):.2f}", f"{med('gemm_gops'):.0f}",
         f"{med('prefill_model_gemm_ratio'):.2f}", f"{med('model_gemm_gops'):.0f}",
         f"{med('peak_rss_bytes') / mib:.0f}", f"{med('rss_budget_bytes') / mib:.0f}",
         f"{c['gemv']}/{c['gemm']}/{c['attention']}", sys.argv[3], sys.argv[4]]
print("| " + " | ".join(cells) + " |")
PY

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores;" \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| model | threads | decode tok/s | bandwidth ratio | read GB/s | MB/token | products' share of a layer | products ÷ ceiling | prefill 64 tok/s | prefill 512 tok/s | kernel ratio | GEMM GOP/s | ratio to own products | own products GOP/s | peak RSS MiB | RSS budget MiB | backends (gemv/gemm/attention) | ring 2 stages ÷ 1 | lookahead gain |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
# One RESULT line of ring_bench.sh / lookahead_bench.sh as "key=value" words.
result() { grep '^RESULT' | tail -n 1 | cut -d' ' -f2-; }
value() { tr ' ' '\n' | grep "^$1=" | cut -d= -f2; }
lookahead_cells() {  # model -> "code xA, list xB, story xC" (root only)
  if [ "${SKIP_LOOKAHEAD:-0}" = 1 ]; then echo "not run (SKIP_LOOKAHEAD)"; return; fi
  if [ "$(id -u)" != 0 ]; then echo "not run (needs root)"; return; fi
  local r
  r=$(BIN=$BIN bash "$HERE/lookahead_bench.sh" "$1" 64 "$REPEAT" 4 2 2>/dev/null | result) || { echo "failed"; return; }
  echo "code x$(echo "$r" | value gain_code), list x$(echo "$r" | value gain_list), story x$(echo "$r" | value gain_story)"
}
for preset in "${PRESETS[@]}"; do
  model=$TMP/$preset
  case $preset in
    qwen*) tok=$ROOT/testdata/tokenizers/qwen3 ;;
    *) tok=$ROOT/testdata/tokenizers/smollm ;;
  esac
  "$MAKE_MODEL" --preset "$preset" --out "$model" --tokenizer "$tok" >/dev/null
  ring="not run"
  if [ "${SKIP_RING:-0}" != 1 ]; then
    r=$(BIN=$BIN PREFILL=512 THREADS=1 bash "$HERE/ring_bench.sh" "$model" 32 "$REPEAT" 2>/dev/null | result) || r=""
    ring="prefill x$(echo "$r" | value prefill_ratio_2), decode x$(echo "$r" | value decode_ratio_2)"
  fi
  look=$(lookahead_cells "$model")
  for t in $THREADS; do
    runs=()
    for r in $(seq "$REPEAT"); do
      runs+=("$("$BIN" bench --model "$model" --threads "$t" --prompt-tokens 128 --decode-tokens 64 --json 2>/dev/null | tail -n 1)")
    done
    printf '%s\n' "${runs[@]}" | python3 "$TMP/row.py" "$preset" "$t" "$ring" "$look"
  done
  rm -rf "$model"
done
if [ -d "$ROOT/models/stories260K" ]; then
  echo
  echo "lookahead gain on the bundled stories260K (trained weights), 2 stages, 4 ms per leg: $(lookahead_cells "$ROOT/models/stories260K")"
fi
echo
echo "medians of $REPEAT runs; load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# Weight range prefetch overlap: how long a model takes to load from the test Hub server
# with a bandwidth limit, against its download time alone and its conversion time alone.
# With the download running ahead of the conversion (src/tensor/fetch.cc) the load takes
# about max(download, conversion), not their sum. The bandwidth defaults to the one that
# makes download time equal conversion time, where overlap matters most. Prints medians of
# REPEAT runs and the ratio load / max(download, conversion).
# Usage: bench/load_overlap.sh [PRESET] [REPEAT]     (PRESET: tools/make_model, default smollm-135m)
#        BANDWIDTH=BYTES_PER_S bench/load_overlap.sh  to fix the bandwidth instead
set -euo pipefail
BIN=${BIN:-build/apps/cli/daisychain}
MAKE_MODEL=${MAKE_MODEL:-build/tools/make_model}
TESTHUB=${TESTHUB:-build/tests/support/testhub}
PRESET=${1:-smollm-135m}
REPEAT=${2:-3}
TMP=$(mktemp -d /tmp/daisy-load-overlap-XXXXXX)
cleanup() { kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
median() { python3 -c 'import sys,statistics; print(f"{statistics.median(float(x) for x in sys.argv[1:]):.3f}")' "$@"; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

MODEL=$TMP/root/bench/model
$MAKE_MODEL --preset "$PRESET" --out "$MODEL" --tokenizer testdata/tokenizers/smollm --vocab tokenizer >/dev/null
BYTES=$(stat -c %s "$MODEL/model.safetensors")
gen() { $BIN generate "$@" --prompt "Once upon a time" -n 1 --threads 1 --json 2>/dev/null | field "['load_seconds']"; }

# Conversion alone: the file from a local folder, already in the page cache.
gen --model "$MODEL" >/dev/null
conv=(); for _ in $(seq "$REPEAT"); do conv+=("$(gen --model "$MODEL")"); done
CONV=$(median "${conv[@]}")
BANDWIDTH=${BANDWIDTH:-$(python3 -c "print(int($BYTES / $CONV))")}

$TESTHUB --root "$TMP/root" --bandwidth "$BANDWIDTH" >"$TMP/hub.port" 2>"$TMP/hub.log" &
for _ in $(seq 100); do [ -s "$TMP/hub.port" ] && break; sleep 0.1; done
ENDPOINT=http://127.0.0.1:$(head -1 "$TMP/hub.port")

down=(); load=()
for i in $(seq "$REPEAT"); do
  # Download alone: the same bytes through the same limit, thrown away.
  down+=("$(curl -s -o /dev/null -w '%{time_total}' "$ENDPOINT/bench/model/resolve/main/model.safetensors")")
  # The load from the Hub: fetch and convert, with a fresh cache each time.
  load+=("$(unset HF_TOKEN; export HF_ENDPOINT="$ENDPOINT" DAISY_CACHE_DIR="$TMP/cache$i" HF_TOKEN_PATH="$TMP/no-token"
             gen --model bench/model)")
done
DOWN=$(median "${down[@]}")
LOAD=$(median "${load[@]}")
python3 - "$PRESET" "$BYTES" "$BANDWIDTH" "$CONV" "$DOWN" "$LOAD" <<'PY'
import sys
preset, size, bw, conv, down, load = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *map(float, sys.argv[4:])
print(f"model {preset}: {size/1e6:.1f} MB BF16, bandwidth limit {bw/1e6:.1f} MB/s, 1 thread, medians of 3")
print(f"conversion alone   {conv:7.2f} s")
print(f"download alone     {down:7.2f} s")
print(f"load from the Hub  {load:7.2f} s  = {load/max(conv, down):.2f} x max(download, conversion)"
      f"  ({load/(conv+down):.2f} x their sum)")
PY

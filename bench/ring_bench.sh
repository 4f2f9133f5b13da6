#!/usr/bin/env bash
# Ring throughput on loopback: decode tok/s with 1, 2 and 3 stages for one model, and the
# share of a lap spent outside the head (transport + remote compute). Prints numbers only;
# figures are medians of REPEAT runs. Usage: bench/ring_bench.sh MODEL_DIR [TOKENS] [REPEAT]
set -euo pipefail
BIN=${BIN:-build/apps/cli/daisychain}
MODEL=${1:?usage: bench/ring_bench.sh MODEL_DIR [TOKENS] [REPEAT]}
TOKENS=${2:-64}
REPEAT=${3:-3}
TMP=$(mktemp -d /tmp/daisy-ring-bench-XXXXXX)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cleanup() { kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

DAISY_HOME=$TMP/serve $BIN serve --port "$PORT" --auto-approve --no-compute >"$TMP/serve.log" 2>&1 &
# The nodes open the local model only under a folder they are given (--models-dir).
MODELS_DIR=$(cd "$MODEL" && pwd)
for i in 1 2; do DAISY_HOME=$TMP/node$i $BIN node --join 127.0.0.1:$PORT --name node$i --models-dir "$MODELS_DIR" >"$TMP/node$i.log" 2>&1 & done
sleep 2

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(d$1)"; }

echo "model $MODEL, $TOKENS tokens, median of $REPEAT runs"
single=()
for r in $(seq "$REPEAT"); do
  single+=("$(DAISY_HOME=$TMP/gen $BIN generate --model "$MODEL" --prompt "Once upon a time" -n "$TOKENS" --json 2>/dev/null | field "['decode_tokens_per_s']")")
done
s1=$(printf '%s\n' "${single[@]}" | median)
echo "1 stage (generate):        decode $s1 tok/s"
for stages in 2 3; do
  tps=(); lapshare=()
  for r in $(seq "$REPEAT"); do
    out=$(DAISY_HOME=$TMP/head $BIN run --join 127.0.0.1:$PORT --model "$MODEL" --prompt "Once upon a time" -n "$TOKENS" --stages $stages --json 2>/dev/null)
    tps+=("$(echo "$out" | field "['tokens_per_s']")")
    lapshare+=("$(echo "$out" | field "['lap_seconds'] / (d['prefill_seconds'] + d['decode_seconds'])")")
  done
  t=$(printf '%s\n' "${tps[@]}" | median)
  l=$(printf '%s\n' "${lapshare[@]}" | median)
  ratio=$(python3 -c "print(f'{$t/$s1:.2f}')")
  echo "$stages stages (ring, loopback): decode $t tok/s (x$ratio of 1 stage); share of the turn inside laps: $l"
done

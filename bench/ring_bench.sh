#!/usr/bin/env bash
# Ring throughput on loopback: decode tok/s with 1, 2 and 3 stages for one model, and the
# share of a lap spent outside the head (transport + remote compute), one position per lap
# (--no-lookahead: bench/lookahead_bench.sh measures the drafts); then the prefill of a
# PREFILL-token prompt (default 512) with 1, 2 and 3 stages of THREADS kernel threads each
# (default 1): pipelined chunks keep every stage busy at once. Prints numbers only; figures
# are medians of REPEAT runs. Usage: bench/ring_bench.sh MODEL_DIR [TOKENS] [REPEAT]
# Environment: PREFILL (prompt tokens), THREADS (per stage), SKIP_DECODE=1 (prefill only),
# PREFILL_CHUNK (the ring's chunk, `run --prefill-chunk`; default: the head's choice).
set -euo pipefail
BIN=${BIN:-build/apps/cli/daisychain}
MODEL=${1:?usage: bench/ring_bench.sh MODEL_DIR [TOKENS] [REPEAT]}
TOKENS=${2:-64}
REPEAT=${3:-3}
PREFILL=${PREFILL:-512}
THREADS=${THREADS:-1}
TMP=$(mktemp -d /tmp/daisy-ring-bench-XXXXXX)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cleanup() { kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

DAISY_HOME=$TMP/serve $BIN serve --port "$PORT" --auto-approve --no-compute >"$TMP/serve.log" 2>&1 &
# The nodes open the local model only under a folder they are given (--models-dir).
MODELS_DIR=$(cd "$MODEL" && pwd)
for i in 1 2; do
  DAISY_HOME=$TMP/node$i $BIN node --join 127.0.0.1:$PORT --name node$i --models-dir "$MODELS_DIR" --threads "$THREADS" \
    >"$TMP/node$i.log" 2>&1 &
done
sleep 2

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(d$1)"; }

echo "model $MODEL, $TOKENS tokens, median of $REPEAT runs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
RESULT=""  # the ratios again on one last line, for bench/report.sh
if [ "${SKIP_DECODE:-0}" != 1 ]; then
single=()
for r in $(seq "$REPEAT"); do
  single+=("$(DAISY_HOME=$TMP/gen $BIN generate --model "$MODEL" --prompt "Once upon a time" -n "$TOKENS" --no-lookahead --json 2>/dev/null | field "['decode_tokens_per_s']")")
done
s1=$(printf '%s\n' "${single[@]}" | median)
echo "1 stage (generate):        decode $s1 tok/s"
for stages in 2 3; do
  tps=(); lapshare=()
  for r in $(seq "$REPEAT"); do
    out=$(DAISY_HOME=$TMP/head $BIN run --join 127.0.0.1:$PORT --model "$MODEL" --prompt "Once upon a time" -n "$TOKENS" --stages $stages --no-lookahead --json 2>/dev/null)
    tps+=("$(echo "$out" | field "['tokens_per_s']")")
    lapshare+=("$(echo "$out" | field "['lap_seconds'] / (d['prefill_seconds'] + d['decode_seconds'])")")
  done
  t=$(printf '%s\n' "${tps[@]}" | median)
  l=$(printf '%s\n' "${lapshare[@]}" | median)
  ratio=$(python3 -c "print(f'{$t/$s1:.2f}')")
  echo "$stages stages (ring, loopback): decode $t tok/s (x$ratio of 1 stage); share of the turn inside laps: $l"
  RESULT="$RESULT decode_ratio_$stages=$ratio"
done
fi

# A prompt of exactly PREFILL tokens (with the tokenizer's special tokens): words are added,
# then the surplus is trimmed, until the model's tokenizer counts PREFILL.
PROMPT=$(BIN=$BIN MODEL=$MODEL PREFILL=$PREFILL python3 - <<'PY'
import json, os, subprocess
words = ("the quick brown fox jumps over a lazy dog while seven small birds sing in the old green tree "
         "and a river runs past the quiet town where people walk to work every morning").split()
n = int(os.environ["PREFILL"])
count = lambda text: len(json.loads(subprocess.run([os.environ["BIN"], "tokenize", "--model", os.environ["MODEL"], "--json", text],
                                                   capture_output=True, text=True, check=True).stdout)["ids"])
k = n
for _ in range(20):
    text = " ".join(words[i % len(words)] for i in range(k))
    c = count(text)
    if c == n:
        break
    k += n - c
print(text)
PY
)
PROMPT_IDS=$($BIN tokenize --model "$MODEL" --json "$PROMPT" | field "['ids'].__len__()")
# An even split: on one shared machine each process measures its capacity at a different
# moment under a different load, and the plan would follow that noise (21 + 9 layers of 30
# was seen), which measures the plan, not the pipeline.
LAYERS=$(python3 -c "import json; print(json.load(open('$MODEL/config.json'))['num_hidden_layers'])")
even() { python3 -c "n, k = $LAYERS, $1; print(','.join(str(n // k + (1 if i >= k - n % k else 0)) for i in range(k)))"; }
echo "prefill of $PROMPT_IDS tokens, $THREADS thread(s) per stage, layers split evenly:"
p1=()
for r in $(seq "$REPEAT"); do
  p1+=("$(DAISY_HOME=$TMP/gen $BIN generate --model "$MODEL" --prompt "$PROMPT" -n 1 --threads "$THREADS" --json 2>/dev/null |
          field "['prefill_tokens_per_s']")")
done
pf1=$(printf '%s\n' "${p1[@]}" | median)
echo "1 stage (generate):        prefill $(printf %.1f "$pf1") tok/s"
for stages in 2 3; do
  ps=(); busy=()
  for r in $(seq "$REPEAT"); do
    out=$(DAISY_HOME=$TMP/head $BIN run --join 127.0.0.1:$PORT --model "$MODEL" --prompt "$PROMPT" -n 1 --stages $stages \
          --plan "$(even $stages)" --threads "$THREADS" --prefill-chunk "${PREFILL_CHUNK:-0}" --json 2>/dev/null)
    ps+=("$(echo "$out" | field "['prompt_ids'].__len__() / d['prefill_seconds']")")
    # How much of the prefill each node spent inside its layers: near 1 when the chunks keep
    # it busy (pipelined), about 1/stages when it waits for one chunk at a time.
    busy+=("$(echo "$out" | field "['stage_latency'] and min(s['compute_seconds'] for s in d['stage_latency'][1:]) / d['prefill_seconds']")")
  done
  p=$(printf '%s\n' "${ps[@]}" | median)
  b=$(printf '%s\n' "${busy[@]}" | median)
  pr=$(python3 -c "print(f'{$p/$pf1:.2f}')")
  echo "$stages stages (ring, loopback, plan $(even $stages)): prefill $(printf %.1f "$p") tok/s (x$pr of 1 stage); the least busy node computed $(printf %.2f "$b") of the time"
  RESULT="$RESULT prefill_ratio_$stages=$pr"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "RESULT$RESULT"

#!/usr/bin/env bash
# A model bigger than any one device (a benchmark, not a test): the Llama-3.1-8B shape
# (random weights, 16 GB BF16 in 4 shards) served by the test Hub server on 127.0.0.1,
# split over a head and 3 nodes whose memory budgets could not hold the ~8.6 GB int8 model
# alone, each fetching only its own slice; then a stage-by-stage Verify on the head.
# Prints the time to ready, each stage's peak RSS against its budget, decode tok/s, and the
# Verify's time and peak memory.
#
#   bench/big_model.sh [DIR]   (DIR, or $DAISY_BIG_DIR, default /tmp/daisy_big_model: where
#                               the model is made once and kept; ~16 GB of disk)
# Settings (environment): PRESET (llama-3.1-8b | mistral-7b), NODE_BUDGET (4G),
# HEAD_BUDGET (4G), TOKENS (8), CTX (the model's default, 4096 at most), BIN, MAKE_MODEL, TESTHUB.
set -euo pipefail
BIN=${BIN:-build/apps/cli/daisychain}
MAKE_MODEL=${MAKE_MODEL:-build/tools/make_model}
TESTHUB=${TESTHUB:-build/tests/support/testhub}
DIR=${1:-${DAISY_BIG_DIR:-/tmp/daisy_big_model}}
PRESET=${PRESET:-llama-3.1-8b}
NODE_BUDGET=${NODE_BUDGET:-4G}
HEAD_BUDGET=${HEAD_BUDGET:-4G}
TOKENS=${TOKENS:-8}
CTX_ARGS=()
if [[ -n "${CTX:-}" ]]; then CTX_ARGS=(--ctx "$CTX"); fi
case "$PRESET" in
  llama-3.1-8b) TOKENIZER=testdata/tokenizers/llama3 ;;
  mistral-7b) TOKENIZER=testdata/tokenizers/mistral ;;
  *) echo "big_model.sh: PRESET must be llama-3.1-8b or mistral-7b, got '$PRESET'" >&2; exit 2 ;;
esac
REPO=bench/$PRESET
MODEL_DIR=$DIR/repos/$REPO

# The model, made once: make_model writes tensor by tensor and never holds the model.
if [[ ! -f "$MODEL_DIR/model.safetensors.index.json" ]]; then
  mkdir -p "$MODEL_DIR"
  echo "making $PRESET in $MODEL_DIR (about 16 GB; minutes)"
  /usr/bin/time -f "make_model: %e s, peak RSS %M KiB" "$MAKE_MODEL" --preset "$PRESET" --out "$MODEL_DIR" --shards 4 \
    --tokenizer "$TOKENIZER"
fi

TMP=$(mktemp -d /tmp/daisy-big-bench-XXXXXX)
cleanup() { kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

# The test Hub server: every device fetches its own byte ranges over HTTP, as from the Hub.
"$TESTHUB" --root "$DIR/repos" >"$TMP/hub.port" 2>"$TMP/hub.log" &
for _ in $(seq 100); do [[ -s "$TMP/hub.port" ]] && break; sleep 0.1; done
export HF_ENDPOINT="http://127.0.0.1:$(head -1 "$TMP/hub.port")"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
DAISY_HOME=$TMP/serve $BIN serve --port "$PORT" --auto-approve --no-compute >"$TMP/serve.log" 2>&1 &
sleep 1
# The nodes keep no slice cache (it would be 12 GB more on disk); the head caches what it
# fetches (in $TMP, removed at the end), so a second Verify would read its disk.
for i in 1 2 3; do
  DAISY_HOME=$TMP/node$i $BIN node --join 127.0.0.1:$PORT --name node$i --max-memory "$NODE_BUDGET" --no-cache \
    >"$TMP/node$i.log" 2>&1 &
done
sleep 2

echo "$PRESET from the test Hub server, head budget $HEAD_BUDGET, 3 nodes of $NODE_BUDGET, $TOKENS tokens"
set +e
DAISY_HOME=$TMP/head $BIN run --join 127.0.0.1:$PORT --name head --model "$REPO" --prompt "Once upon a time" \
  -n "$TOKENS" "${CTX_ARGS[@]}" --stages 4 --max-memory "$HEAD_BUDGET" --verify --json --lap-timeout 600 \
  >"$TMP/run.json" 2>"$TMP/run.log"
rc=$?
set -e
grep -E "^stage|verif" "$TMP/run.log" || true
if [[ $rc -ne 0 && $rc -ne 3 ]]; then
  echo "run failed (exit $rc):"; tail -20 "$TMP/run.log"; for i in 1 2 3; do tail -3 "$TMP/node$i.log"; done
  exit $rc
fi
python3 - "$TMP/run.json" <<'EOF'
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
gib = lambda b: f"{b / 2**30:.2f} GiB"
print(f"time to ready (plan, every stage fetched and converted its slice): {d['ready_seconds']:.1f} s")
for i, s in enumerate(d['plan']):
    print(f"stage {i} {s['device']:6s} layers [{s['layers'][0]:2d}, {s['layers'][1]:2d}) downloaded {s['bytes'] / 1e9:5.2f} GB, "
          f"peak RSS {gib(s['peak_rss_bytes'])} of a {gib(s['budget_bytes'])} budget (plan counted {gib(s['need_bytes'])})")
print(f"prefill {len(d['prompt_ids'])} positions {d['prefill_seconds']:.1f} s, decode {len(d['ids'])} tokens {d['tokens_per_s']:.3f} tok/s")
print(f"verify ({d['verify_mode']}): {d['verify_seconds']:.1f} s, peak RSS {gib(d['verify_peak_rss_bytes'])}")
print(d['verify_message'])
EOF
exit $rc

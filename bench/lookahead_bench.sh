#!/usr/bin/env bash
# Lookahead drafting on a ring with hop latency: decode tok/s with and without drafts
# (--no-lookahead) on repetitive text (code, a list) and on a story, medians of REPEAT runs.
#
# The ring runs in two network namespaces this script creates, joined by a veth pair: the
# head and the rendezvous in one, the nodes in the other; never on the shared loopback.
# This machine's kernel has no netem qdisc ("Specified qdisc kind is unknown"), so each
# node's inbox sits behind bench/delay_relay.py, which holds every byte DELAY_MS in each
# direction: a lap of N stages crosses N-1 delayed legs (the return leg to the head is
# direct), so a 2-stage lap carries DELAY_MS as one round trip of that size would.
#
# Usage (root): bench/lookahead_bench.sh MODEL_DIR [TOKENS] [REPEAT] [DELAY_MS] [STAGES]
set -euo pipefail
BIN=$(realpath "${BIN:-build/apps/cli/daisychain}")
MODEL=$(cd "${1:?usage: bench/lookahead_bench.sh MODEL_DIR [TOKENS] [REPEAT] [DELAY_MS] [STAGES]}" && pwd)
TOKENS=${2:-96}
REPEAT=${3:-3}
DELAY_MS=${4:-4}
STAGES=${5:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
TAG=dcl$$
NS_HEAD=${TAG}h
NS_NODES=${TAG}n
A=10.213.$(( $$ % 200 )).1
B=10.213.$(( $$ % 200 )).2
TMP=$(mktemp -d /tmp/daisy_lookahead_bench_XXXXXX)
cleanup() {
  for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns pids "$NS_HEAD" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns pids "$NS_NODES" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$NS_HEAD" 2>/dev/null || true
  ip netns del "$NS_NODES" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

ip netns add "$NS_HEAD"
ip netns add "$NS_NODES"
ip link add "${TAG}a" type veth peer name "${TAG}b"
ip link set "${TAG}a" netns "$NS_HEAD"
ip link set "${TAG}b" netns "$NS_NODES"
ip -n "$NS_HEAD" addr add "$A/24" dev "${TAG}a"
ip -n "$NS_NODES" addr add "$B/24" dev "${TAG}b"
for ns in "$NS_HEAD" "$NS_NODES"; do ip -n "$ns" link set lo up; done
ip -n "$NS_HEAD" link set "${TAG}a" up
ip -n "$NS_NODES" link set "${TAG}b" up
inh() { ip netns exec "$NS_HEAD" "$@"; }
inn() { ip netns exec "$NS_NODES" "$@"; }

PORT=47100
inh env DAISY_HOME="$TMP/serve" "$BIN" serve --host "$A" --port $PORT --auto-approve --no-compute >"$TMP/serve.log" 2>&1 &
for i in $(seq 1 $((STAGES - 1))); do
  inner=$((47200 + i)); outer=$((47300 + i))
  inn python3 "$HERE/delay_relay.py" "$B:$outer" "127.0.0.1:$inner" "$DELAY_MS" >"$TMP/relay$i.log" 2>&1 &
  inn env DAISY_HOME="$TMP/node$i" "$BIN" node --join "$A:$PORT" --name "node$i" --host 127.0.0.1 --port $inner \
    --advertise "$B:$outer" --models-dir "$MODEL" >"$TMP/node$i.log" 2>&1 &
done
sleep 3
# The delay as measured: a round trip through a relay of the same kind to an echo server.
inn python3 -c "
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', 47299)); s.listen()
c, _ = s.accept()
while (d := c.recv(64)): c.sendall(d)" >/dev/null 2>&1 &
inn python3 "$HERE/delay_relay.py" "$B:47399" "127.0.0.1:47299" "$DELAY_MS" >/dev/null 2>&1 &
sleep 1
rtt=$(inh python3 -c "
import socket, time
s = socket.create_connection(('$B', 47399)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
best = []
for i in range(20):
    t = time.monotonic(); s.sendall(b'x'); s.recv(1); best.append((time.monotonic() - t) * 1000)
print(f'{sorted(best)[10]:.1f}')")
echo "model $MODEL, $STAGES stages, delay ${DELAY_MS} ms per leg into a node (a byte there and back through one: median $rtt ms), $TOKENS tokens, medians of $REPEAT"

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(d$1)"; }

CODE='def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def mul(a, b):
    return a * b


def div(a, b):
    return a / b


def'
LIST='Shopping list:
1. apples
2. bread
3. milk
4. eggs
5. apples
6. bread
7.'
STORY='Once upon a time, there was a little girl named Lily. She loved to play outside in the park.'

run_case() {  # name prompt
  local name=$1 prompt=$2
  local on=() off=() acc=() drf=() same=yes ids_on="" ids_off=""
  for r in $(seq "$REPEAT"); do
    out=$(inh env DAISY_HOME="$TMP/head" "$BIN" run --join "$A:$PORT" --host "$A" --model "$MODEL" --prompt "$prompt" \
      -n "$TOKENS" --stages "$STAGES" --json 2>"$TMP/head.err") || { cat "$TMP/head.err" >&2; exit 1; }
    on+=("$(echo "$out" | field "['tokens_per_s']")")
    acc+=("$(echo "$out" | field "['accepted']")"); drf+=("$(echo "$out" | field "['drafted']")")
    ids_on=$(echo "$out" | field "['ids']")
    out=$(inh env DAISY_HOME="$TMP/head" "$BIN" run --join "$A:$PORT" --host "$A" --model "$MODEL" --prompt "$prompt" \
      -n "$TOKENS" --stages "$STAGES" --json --no-lookahead 2>"$TMP/head.err") || { cat "$TMP/head.err" >&2; exit 1; }
    off+=("$(echo "$out" | field "['tokens_per_s']")")
    ids_off=$(echo "$out" | field "['ids']")
    [ "$ids_on" = "$ids_off" ] || same=no
  done
  local t_on t_off
  t_on=$(printf '%s\n' "${on[@]}" | median); t_off=$(printf '%s\n' "${off[@]}" | median)
  RESULT="$RESULT gain_$name=$(python3 -c "print(f'{$t_on/$t_off:.2f}')")"
  printf '%-6s decode %7.1f tok/s with drafts, %7.1f without: x%.2f; drafts kept %s of %s (median); same ids: %s\n' \
    "$name" "$t_on" "$t_off" "$(python3 -c "print($t_on/$t_off)")" "$(printf '%s\n' "${acc[@]}" | median)" \
    "$(printf '%s\n' "${drf[@]}" | median)" "$same"
}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
RESULT=""  # the gains again on one last line, for bench/report.sh
run_case code "$CODE"
run_case list "$LIST"
run_case story "$STORY"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "RESULT$RESULT"

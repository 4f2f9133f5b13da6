#!/usr/bin/env bash
# Runs the libFuzzer targets built in $FUZZ_BUILD (default build-fuzz).
#   scripts/fuzz.sh smoke SECONDS   replay every seed and regression input, then fuzz each
#                                   target for SECONDS (make test: a few seconds each)
#   scripts/fuzz.sh run SECONDS     fuzz each target for SECONDS (make fuzz: 600 by default)
# Grown corpora stay in $FUZZ_BUILD/corpus/<target>; a crash leaves its input in
# $FUZZ_BUILD/crashes/ — copy it to fuzz/regressions/<target>/ with the fix, so the smoke
# run replays it forever. Prints executions per target.
set -euo pipefail
mode=${1:-smoke}
seconds=${2:-5}
build=${FUZZ_BUILD:-build-fuzz}
targets=(safetensors_fuzz config_fuzz tokenizer_fuzz wire_fuzz chat_template_fuzz)
mkdir -p "$build/crashes"
status=0
for t in "${targets[@]}"; do
  bin="$build/fuzz/$t"
  [[ -x $bin ]] || { echo "fuzz: $bin is missing (make fuzz-build)"; exit 1; }
  seeds="fuzz/corpus/$t"
  regressions="fuzz/regressions/$t"
  work="$build/corpus/$t"
  mkdir -p "$work" "$regressions"
  opts=(-timeout=10 -rss_limit_mb=2048 -artifact_prefix="$build/crashes/$t-" -print_final_stats=1)
  if [[ $mode == smoke ]]; then
    # Every known input once: a crash found earlier stays fixed.
    if ! "$bin" "${opts[@]}" -runs=0 "$seeds" "$regressions" >"$build/$t.replay.log" 2>&1; then
      echo "fuzz: $t crashed on a seed or regression input:"; tail -30 "$build/$t.replay.log"; status=1; continue
    fi
  fi
  if ! "$bin" "${opts[@]}" -max_total_time="$seconds" "$work" "$seeds" "$regressions" >"$build/$t.log" 2>&1; then
    echo "fuzz: $t found a crash (input in $build/crashes/):"; tail -40 "$build/$t.log"; status=1; continue
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/$t.log" | grep -o '[0-9]*$' || echo "?")
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$build/$t.log" | grep -o '[0-9]*$' || echo "?")
  echo "fuzz: $t clean: $execs executions in ${seconds} s ($rate/s)"
done
exit $status

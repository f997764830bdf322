#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, no libtorch; every library instrumented for
# coverage) in build/fuzz and runs each for
# SECONDS (default 60) from a copy of its committed seed corpus; new inputs stay in
# build/fuzz/corpus/NAME, a crash in build/fuzz/crash-NAME-*. Exits 1 if any target crashed.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (targets: see tests/fuzz/CMakeLists.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
shift || true
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(op_harness safetensors gguf config_json tokenizer_json experiment_config jsonl_workload)
BUILD=build/fuzz
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER=clang -DVTOKEN_WITH_TORCH=OFF -DVTOKEN_WITH_CUDA=OFF -DVTOKEN_BUILD_BENCH=OFF \
  -DVTOKEN_BUILD_FUZZ=ON -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$BUILD" --target "${TARGETS[@]/%/_fuzz}" -j "$(nproc)" >/dev/null
corpus_of() { [[ $1 == op_harness ]] && echo tests/fuzz/corpus || echo "tests/fuzz/corpus_$1"; }
status=0
for t in "${TARGETS[@]}"; do
  work="$BUILD/corpus/$t"
  mkdir -p "$work"
  cp -n "$(corpus_of "$t")"/* "$work"/ 2>/dev/null || true
  log="$BUILD/$t.log"
  if "$BUILD/tests/fuzz/${t}_fuzz" "$work" -max_total_time="$SECONDS_EACH" -timeout=10 \
       -rss_limit_mb=2048 -artifact_prefix="$BUILD/crash-$t-" -print_final_stats=1 >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo '?')
    echo "$t: ok, $runs inputs in ${SECONDS_EACH}s, coverage $cov edges, corpus $(ls "$work" | wc -l)"
  else
    echo "$t: CRASH (see $log and $BUILD/crash-$t-*)"
    status=1
  fi
done
exit $status

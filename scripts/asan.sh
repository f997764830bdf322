#!/usr/bin/env bash
# ASan + UBSan over the torch-free code: lib/core, lib/engine and the model-io readers, with
# their tests and the fuzz corpora replayed (preset `asan`, build/asan). Any sanitizer report
# fails the test that hit it. .ci/run runs this after `make test`.
# Usage: scripts/asan.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset asan >/dev/null
targets=()
for t in tests/core/*_test.cc tests/engine/*_test.cc; do targets+=("$(basename "$t" .cc)"); done
for t in tests/model/*_test.cc; do
  name=$(basename "$t" .cc)
  [[ $name =~ ^(llama|paged|sampler|trainer|torch)_ ]] || targets+=("$name")
done
targets+=(op_harness_fuzz_replay safetensors_fuzz_replay gguf_fuzz_replay config_json_fuzz_replay
          tokenizer_json_fuzz_replay experiment_config_fuzz_replay jsonl_workload_fuzz_replay)
cmake --build build/asan --target "${targets[@]}" -j "$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
cd build/asan
ctest -L 'core|model|engine|fuzz' -j "$(nproc)" --output-on-failure --timeout 900

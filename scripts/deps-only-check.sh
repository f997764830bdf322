#!/usr/bin/env bash
# deps-only-check.sh: proves that the build needs nothing from the system beyond a compiler and
# CMake when .device-deps/ (scripts/device-deps.sh) is given, as on the GPU machine (docs/GPU.md).
# Configures with the system prefixes ignored (-DCMAKE_IGNORE_PREFIX_PATH="/usr;/usr/local;/":
# Debian's /bin is /usr/bin, so "/" is a system prefix too) and .device-deps/usr as the only
# prefix, torch-free and CUDA-free (on the GPU machine torch and CUDA come from the image), then:
#   1. every dependency CMake found is inside the deps folder (CMakeCache.txt);
#   2. builds vtoken-cli (core, policies, model io, sim, engine, toml++, CLI11, SQLite) and one test
#      per layer: virtual_kv_cache_test (core, xxhash), tokenizer_test (model io, nlohmann-json),
#      result_store_test (engine, SQLite), read_commands_test (vtoken-cli on result databases), and
#      core_bench (Google Benchmark);
#   3. no object file read a dependency's header from /usr/include (ninja's dependency log), and
#      every built binary loads the dependencies' shared libraries from the deps folder (ldd);
#   4. runs those tests, `vtoken-cli check` and `policies`, a short core_bench, and writes the
#      corpus with the folder's own bible (byte-identical to Debian's when that one is installed).
# About 4 CPU-minutes (2-2.5 minutes on 2 idle cores; CI: .ci/run), almost all of it the build.
#
# Usage: scripts/deps-only-check.sh          (from anywhere)
# Environment: JOBS (default 2), BUILD_DIR (default build/deps-only), VTOKEN_DEVICE_DEPS (default
# .device-deps; written by scripts/device-deps.sh when absent).
set -euo pipefail

die() { echo "deps-only-check: error: $*" >&2; exit 1; }

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
DEPS="${VTOKEN_DEVICE_DEPS:-$REPO/.device-deps}"
B="${BUILD_DIR:-build/deps-only}"
JOBS="${JOBS:-2}"
start=$(date +%s)
say() { echo "deps-only-check +$(($(date +%s) - start))s: $*"; }

if [[ ! -d "$DEPS/usr" ]]; then
  say "no $DEPS: writing it with scripts/device-deps.sh"
  bash scripts/device-deps.sh "$DEPS" || die "scripts/device-deps.sh failed"
fi
DEPS="$(cd "$DEPS" && pwd)"

targets=(vtoken-cli virtual_kv_cache_test tokenizer_test result_store_test read_commands_test
         core_bench)
tests=(virtual_kv_cache_test tokenizer_test result_store_test read_commands_test)

say "configure $B (system prefixes ignored, prefix $DEPS/usr)"
mkdir -p "$B"
# --fresh: a new cache (nothing found by an earlier configure is kept); objects are reused.
# Build type None (no -O, no -g): the check is about what is found, and compiles fastest.
cmake --fresh -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=None -DVTOKEN_WITH_TORCH=OFF \
  -DVTOKEN_WITH_CUDA=OFF -DVTOKEN_BUILD_TESTS=ON -DVTOKEN_BUILD_BENCH=ON \
  "-DCMAKE_IGNORE_PREFIX_PATH=/usr;/usr/local;/" "-DCMAKE_PREFIX_PATH=$DEPS/usr" \
  -DCMAKE_DISABLE_FIND_PACKAGE_Python3=ON >"$B/configure.log" 2>&1 ||
  die "configure failed (see $B/configure.log): $(grep -m1 -A2 'CMake Error' "$B/configure.log" | tr '\n' ' ')"
grep 'vtoken: ' "$B/configure.log"

# 1. What CMake found. Each entry must name a path under the deps folder.
for var in XXHASH_INCLUDE_DIR XXHASH_LIBRARY SQLite3_INCLUDE_DIR SQLite3_LIBRARY nlohmann_json_DIR \
           tomlplusplus_DIR CLI11_DIR GTest_DIR benchmark_DIR; do
  value="$(sed -n "s/^$var:[A-Z]*=//p" "$B/CMakeCache.txt")"
  [[ "$value" == "$DEPS"/* ]] || die "$var is '$value', not inside $DEPS"
done
say "every dependency was found in $DEPS"

say "build ${targets[*]} (-j $JOBS)"
cmake --build "$B" -j "$JOBS" --target "${targets[@]}" >"$B/build.log" 2>&1 ||
  die "build failed (see $B/build.log): $(grep -m1 -B2 'error' "$B/build.log" | tr '\n' ' ')"

# 2. Headers: ninja's log of what each object file included. A dependency header from the system
# means a target reaches it without the imported target (the GPU machine has none of them).
ninja -C "$B" -t deps >"$B/deps.txt"
system_headers="$(grep -E '^ +/usr/(local/)?include/(xxhash\.h|sqlite3\.h|nlohmann/|toml\+\+/|CLI/|gtest/|gmock/|benchmark/)' \
  "$B/deps.txt" | sort -u || true)"
[[ -z "$system_headers" ]] || die "system headers used: $(echo "$system_headers" | head -3 | tr -s ' \n' ' ')"
for header in xxhash.h sqlite3.h nlohmann/json.hpp toml++/toml.h CLI/CLI.hpp gtest/gtest.h \
              benchmark/benchmark.h; do
  grep -q "^ *$DEPS/usr/include/$header\$" "$B/deps.txt" || die "no object file included $DEPS/usr/include/$header"
done

# 3. Shared libraries: each one a built binary needs from the dependencies resolves into DEPS.
binaries=("$B/apps/vtoken-cli/vtoken-cli" "$B/bench/core_bench")
for t in "${tests[@]}"; do binaries+=("$(find "$B/tests" -name "$t" -type f -executable)"); done
for bin in "${binaries[@]}"; do
  [[ -x "$bin" ]] || die "missing binary $bin"
  outside="$(ldd "$bin" | grep -E '^\s*lib(xxhash|sqlite3|tomlplusplus|benchmark)\.' |
             grep -v "=> $DEPS/" || true)"
  [[ -z "$outside" ]] || die "$bin loads $(echo "$outside" | tr -s ' \t\n' ' ')"
done
[[ "$(ldd "$B/apps/vtoken-cli/vtoken-cli")" == *"libsqlite3.so.0 => $DEPS/"* ]] ||
  die "vtoken-cli does not load libsqlite3 from $DEPS"
say "headers and shared libraries all come from $DEPS"

# 4. Run what was built.
for t in "${tests[@]}"; do
  bin="$(find "$B/tests" -name "$t" -type f -executable)"
  VTOKEN_SOURCE_DIR="$REPO" OMP_WAIT_POLICY=PASSIVE "$bin" --gtest_brief=1 >"$B/$t.log" 2>&1 ||
    die "$t failed (see $B/$t.log): $(grep -m1 'FAILED' "$B/$t.log")"
  say "$t: $(grep -m1 -E '^\[  PASSED  \]' "$B/$t.log")"
done
"$B/apps/vtoken-cli/vtoken-cli" policies >"$B/policies.txt" || die "vtoken-cli policies failed"
grep -q h2o "$B/policies.txt" || die "vtoken-cli policies does not list h2o"
"$B/apps/vtoken-cli/vtoken-cli" check --steps 2000 --seed 7 >"$B/check.log" 2>&1 ||
  die "vtoken-cli check failed (see $B/check.log)"
"$B/bench/core_bench" --benchmark_min_time=0.01 --benchmark_filter=BM_SyncNewTokensDecode >"$B/bench.log" 2>&1 ||
  die "core_bench failed (see $B/bench.log)"
PATH="$DEPS/bin:$PATH"
[[ "$(command -v bible)" == "$DEPS/bin/bible" ]] || die "bible is not the deps folder's"
bash scripts/make-corpus.sh "$B/corpus" >/dev/null || die "make-corpus.sh failed with $DEPS/bin/bible"
if [[ -s build/corpus/kjv.txt ]] && [[ "$(tail -n 1 build/corpus/kjv.txt)" == "$(tail -n 1 "$B/corpus/kjv.txt")" ]]; then
  cmp -s build/corpus/kjv.txt "$B/corpus/kjv.txt" || die "the corpus differs from build/corpus/kjv.txt"
fi
say "OK: tests, vtoken-cli, core_bench and the corpus, all on $DEPS only ($(($(date +%s) - start))s)"

#!/usr/bin/env bash
# device-check.sh: builds vToken with CUDA (and libtorch from the machine's Python, when it has
# one), runs the CUDA tests, the GPU benchmarks, then the rest of the tests and benchmarks, on a
# machine with a GPU and no internet. Made for a 10-minute slot: stages run in order of value
# (GPU results first), each under a timeout cut to the time left, and a failing stage does not
# stop the next ones. Everything lands in a few files under $OUT; the summary is printed last.
#
# Usage:
#   scripts/device-check.sh              run the check (from anywhere; it cds to the repo root)
#   scripts/device-check.sh --cuda-only  only the CUDA stages (configure, build, test, benchmark)
#   scripts/device-check.sh --fetch-deps on a Debian 12 machine with apt: download the packages
#                                        the build needs into .device-deps/ (see below)
# Environment (all optional):
#   OUT        output folder (default: ./device-check-out)
#   JOBS       build and test parallelism (default: nproc)
#   BUILD_DIR  build folder (default: build/device)
#   BUDGET_S   seconds the whole run may take (default: 570)
#   VTOKEN_DEVICE_DEPS  folder of unpacked Debian packages (default: .device-deps). GPU machines
#              built around a Python stack often lack libxxhash-dev, GoogleTest, Google Benchmark,
#              CLI11, toml++ and nlohmann-json; `--fetch-deps` unpacks them here (apt-get download
#              + dpkg -x, about 10 MB), and the check puts that folder on the compiler's search
#              paths. The folder is not tracked: copy it along with the working tree.
#
# Files written under $OUT: summary.txt (one line per stage), device-check.log (every stage's
# output), env.txt, ctest-cuda.xml and ctest-rest.xml (JUnit), cuda-bench.jsonl (one JSON object
# per measurement), core-bench.json (Google Benchmark JSON).
set -u

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 1
DEPS="${VTOKEN_DEVICE_DEPS:-$REPO/.device-deps}"

if [[ "${1:-}" == "--fetch-deps" ]]; then
  set -e
  packages=(libxxhash-dev libxxhash0 libgtest-dev libgmock-dev libbenchmark-dev
            libbenchmark1debian libcli11-dev libtomlplusplus-dev libtomlplusplus3
            nlohmann-json3-dev libsqlite3-dev libsqlite3-0)
  download="$(mktemp -d)"
  (cd "$download" && apt-get download "${packages[@]}")
  rm -rf "$DEPS"
  mkdir -p "$DEPS"
  for deb in "$download"/*.deb; do dpkg -x "$deb" "$DEPS"; done
  rm -rf "$download"
  echo "device-check: unpacked ${#packages[@]} packages into $DEPS ($(du -sh "$DEPS" | cut -f1))"
  exit 0
fi
CUDA_ONLY=0
if [[ "${1:-}" == "--cuda-only" ]]; then
  CUDA_ONLY=1
  shift
fi
if [[ $# -gt 0 ]]; then
  echo "usage: $0 [--cuda-only | --fetch-deps]" >&2
  exit 2
fi

OUT="${OUT:-$REPO/device-check-out}"
JOBS="${JOBS:-$(nproc)}"
BUILD_DIR="${BUILD_DIR:-build/device}"
BUDGET_S="${BUDGET_S:-570}"
mkdir -p "$OUT"
LOG="$OUT/device-check.log"
SUMMARY="$OUT/summary.txt"
: >"$LOG"
: >"$SUMMARY"
START=$(date +%s)
FAILED=0
export OMP_WAIT_POLICY=PASSIVE

log() { echo "[device-check +$(($(date +%s) - START))s] $*" | tee -a "$LOG"; }

# stage NAME MAX_SECONDS COMMAND...: runs COMMAND under a timeout of MAX_SECONDS, cut to the time
# left in the budget; output goes to the log; the result goes to the summary. A stage that cannot
# get 10 seconds is skipped. Returns the command's status.
stage() {
  local name="$1" max="$2"
  shift 2
  local left=$((BUDGET_S - ($(date +%s) - START)))
  local limit=$((max < left ? max : left))
  if ((limit < 10)); then
    log "stage $name: skipped (${left}s left in the budget)"
    printf '%-18s SKIPPED  (out of time)\n' "$name" >>"$SUMMARY"
    FAILED=1
    return 124
  fi
  log "stage $name: start (limit ${limit}s): $*"
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
  rc=$?
  local took=$(($(date +%s) - t0))
  local result=OK
  if ((rc == 124 || rc == 137)); then
    result=TIMEOUT
  elif ((rc != 0)); then
    result="FAILED(rc=$rc)"
  fi
  ((rc != 0)) && FAILED=1
  log "stage $name: $result in ${took}s"
  printf '%-18s %-14s %5ss\n' "$name" "$result" "$took" >>"$SUMMARY"
  return $rc
}

# Records a stage that did not run because an earlier one failed.
not_run() {
  log "stage $1: not run ($2)"
  printf '%-18s NOT RUN  (%s)\n' "$1" "$2" >>"$SUMMARY"
  FAILED=1
}

environment() {
  echo "date: $(date -u +%FT%TZ)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo none)"
  echo "dirty files: $(git status --porcelain 2>/dev/null | wc -l)"
  uname -a
  nproc
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  echo "nvcc: ${NVCC:-not found}"
  [[ -n "${NVCC:-}" ]] && "$NVCC" --version
  cmake --version | head -1
  ninja --version
  c++ --version | head -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"available", torch.cuda.is_available())' 2>&1 || true
  echo "torch cmake prefix: ${TORCH_PREFIX:-none}"
  echo "deps folder: $DEPS ($([[ -d "$DEPS" ]] && echo present || echo absent))"
  echo "missing: ${MISSING[*]:-nothing}"
}

# --- Locate tools and dependencies. ---------------------------------------------------------
NVCC=""
for candidate in "$(command -v nvcc 2>/dev/null)" "${CUDA_HOME:-}/bin/nvcc" /usr/local/cuda/bin/nvcc; do
  if [[ -n "$candidate" && -x "$candidate" ]]; then NVCC="$candidate"; break; fi
done
TORCH_PREFIX="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)"

PREFIXES=()
if [[ -d "$DEPS/usr" ]]; then
  PREFIXES+=("$DEPS/usr")
  multiarch="$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
  export CPATH="$DEPS/usr/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$DEPS/usr/lib/$multiarch${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$DEPS/usr/lib/$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
[[ -n "$TORCH_PREFIX" ]] && PREFIXES+=("$TORCH_PREFIX")

INCLUDE_DIRS=(/usr/include /usr/local/include "$DEPS/usr/include")
CMAKE_DIRS=(/usr/lib /usr/local/lib /usr/share /usr/local/share "$DEPS/usr/lib")
# has_header PATH: whether PATH (e.g. CLI/CLI.hpp) is in a standard or the deps include folder.
has_header() {
  local dir
  for dir in "${INCLUDE_DIRS[@]}"; do [[ -e "$dir/$1" ]] && return 0; done
  return 1
}
# has_cmake_package NAME: whether a NAMEConfig.cmake is where find_package looks (or in deps).
has_cmake_package() {
  local dir
  for dir in "${CMAKE_DIRS[@]}"; do
    [[ -d "$dir" ]] && [[ -n "$(find "$dir" -maxdepth 4 -name "$1Config.cmake" -print -quit 2>/dev/null)" ]] &&
      return 0
  done
  return 1
}
MISSING=()
[[ -z "$NVCC" ]] && MISSING+=("nvcc")
[[ -z "$TORCH_PREFIX" ]] && MISSING+=("PyTorch for python3: building without lib/model")
has_header xxhash.h || MISSING+=("xxhash.h (libxxhash-dev)")
has_cmake_package GTest || MISSING+=("GoogleTest (libgtest-dev)")
has_header CLI/CLI.hpp || MISSING+=("CLI11 (libcli11-dev): vtoken-cli will not build")
has_header toml++/toml.h || MISSING+=("toml++ (libtomlplusplus-dev): vtoken-cli will not build")
has_header nlohmann/json.hpp ||
  MISSING+=("nlohmann/json.hpp (nlohmann-json3-dev): lib/model/io will not build")
BENCH=ON
if ! has_cmake_package benchmark; then
  MISSING+=("Google Benchmark (libbenchmark-dev): bench/ skipped")
  BENCH=OFF
fi

environment >"$OUT/env.txt" 2>&1
log "repo $REPO, out $OUT, jobs $JOBS, budget ${BUDGET_S}s"
log "nvcc: ${NVCC:-none}; torch cmake prefix: ${TORCH_PREFIX:-none}"
((${#MISSING[@]} > 0)) && log "missing: ${MISSING[*]} -- on a Debian machine run" \
  "'scripts/device-check.sh --fetch-deps' and bring .device-deps along"
stage gpu 20 nvidia-smi -L

# --- Configure: CUDA + torch; without torch when that fails (the CUDA checks matter most). ---
prefix_path="$(IFS=';'; echo "${PREFIXES[*]:-}")"
common=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DVTOKEN_WITH_CUDA=ON -DVTOKEN_BUILD_TESTS=ON
        "-DVTOKEN_BUILD_BENCH=$BENCH" "-DCMAKE_PREFIX_PATH=$prefix_path")
[[ -n "$NVCC" ]] && common+=("-DCMAKE_CUDA_COMPILER=$NVCC")
# Torch's CMake config asks for the architectures to build its extensions for; the H200 is 9.0.
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
B="$BUILD_DIR"
CONFIGURED=0
if [[ -n "$TORCH_PREFIX" ]] &&
   stage configure 150 cmake -S . -B "$B" "${common[@]}" -DVTOKEN_WITH_TORCH=ON; then
  CONFIGURED=1
else
  # A failed torch configure leaves its cache behind: start the fallback in a fresh folder.
  [[ -n "$TORCH_PREFIX" ]] && B="$BUILD_DIR-notorch"
  stage configure-notorch 90 cmake -S . -B "$B" "${common[@]}" -DVTOKEN_WITH_TORCH=OFF &&
    CONFIGURED=1
fi

# --- GPU first: the CUDA library, its tests and benchmarks. ----------------------------------
cuda_targets=(vtoken_cuda vtoken-cuda-bench)
for src in tests/cuda/*_test.cc; do cuda_targets+=("$(basename "$src" .cc)"); done
if ((CONFIGURED)); then
  if stage build-cuda 240 cmake --build "$B" -j "$JOBS" --target "${cuda_targets[@]}"; then
    stage test-cuda 120 ctest --test-dir "$B" -L cuda --output-on-failure --timeout 100 \
      --output-junit "$OUT/ctest-cuda.xml"
    # The tests skip without a device; on this machine a skip is a failure of the check.
    if grep -q '<skipped' "$OUT/ctest-cuda.xml" 2>/dev/null; then
      log "stage test-cuda: some CUDA tests were SKIPPED (no usable device?)"
      printf '%-18s %s\n' "test-cuda-skips" "FAILED (tests skipped on a GPU machine)" >>"$SUMMARY"
      FAILED=1
    fi
    stage bench-cuda 90 bash -c "set -o pipefail; '$B/lib/cuda/vtoken-cuda-bench' | tee '$OUT/cuda-bench.jsonl'"
  else
    not_run test-cuda "build-cuda failed"
    not_run bench-cuda "build-cuda failed"
  fi

  # --- Then everything else: the whole build (keep going past broken targets), all other
  # --- tests, CPU benchmarks.
  if ((CUDA_ONLY)); then
    log "--cuda-only: build-all, test-rest and bench-core not run"
  else
  stage build-all 240 cmake --build "$B" -j "$JOBS" -- -k 0
  stage test-rest 180 ctest --test-dir "$B" -LE cuda -j "$JOBS" --output-on-failure \
    --timeout 170 --output-junit "$OUT/ctest-rest.xml"
  if [[ -x "$B/bench/core_bench" ]]; then
    stage bench-core 60 "$B/bench/core_bench" --benchmark_min_time=0.05 \
      --benchmark_out="$OUT/core-bench.json" --benchmark_out_format=json
  else
    not_run bench-core "bench/core_bench was not built"
  fi
  fi
else
  not_run build-cuda "configure failed"
fi

log "done in $(($(date +%s) - START))s"
{
  echo "== device-check summary ($(date -u +%FT%TZ), $(($(date +%s) - START))s, build dir $B)"
  cat "$SUMMARY"
  ((${#MISSING[@]} > 0)) && echo "missing: ${MISSING[*]}"
  if ((FAILED)); then echo "RESULT: FAILED (details in $LOG)"; else echo "RESULT: OK"; fi
} | tee "$SUMMARY.tmp"
mv "$SUMMARY.tmp" "$SUMMARY"
exit $FAILED

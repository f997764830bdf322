#!/usr/bin/env bash
# device-check.sh (v2): the GPU evaluation on a bare GPU machine (one H200, CUDA 13 nvcc, Python
# with PyTorch, CMake and ninja; no apt, no internet): docs/GPU.md says how to call it through the
# device tool. It uses only the image and .device-deps/ (scripts/device-deps.sh, carried along):
# libtorch comes from python3's torch, every other dependency from the deps folder.
#
# Usage:
#   scripts/device-check.sh          every stage (budgets add up to under 8 minutes on 16 cores)
#   scripts/device-check.sh --quick  configure, CUDA build, GPU tests, the quick GPU benchmark
#                                    (under 4 minutes)
#   scripts/device-check.sh --plan   print the stages and their budgets; runs nothing
# Environment (all optional):
#   OUT         output folder (default: ./device-check-out)
#   JOBS        build parallelism (default: nproc)
#   BUILD_DIR   build folder (default: build/device)
#   CUDA_ARCH   CUDA architecture to build for (default: 90, the H200)
#   TORCH_PREFIX  libtorch's CMake prefix (default: python3's torch.utils.cmake_prefix_path)
#   VTOKEN_DEVICE_DEPS  the unpacked packages (default: .device-deps)
#   BUDGET_SCALE  multiplies every stage's budget (default 1; a rehearsal on a 2-core machine)
#   VTOKEN_DEVICE_CMAKE_ARGS  extra configure arguments, one per line
#
# Each stage runs under a timeout of its budget; a failed stage stops only the stages that need
# it. At most 8 files land in $OUT (the device tool returns no more):
#   summary.md        every stage with its time, the test counts, every benchmark figure, the
#                     engine comparison (the file to read first)
#   device-check.log  every stage's command and output
#   env.txt           nvidia-smi, nvcc, gcc, cmake, ninja, torch version / CUDA / CXX11 ABI, commit
#   ctest-cuda.xml    JUnit of `ctest -L cuda` (a skipped test counts as a failure here)
#   cuda-bench.jsonl  vtoken-cuda-bench, one JSON object per measurement
#   model-bench.json  torch_gpu_bench (Google Benchmark JSON): the model's decode step
#   gpu.db            the engine evaluation's result database (experiments/gpu/*.toml)
#   compare.txt       `vtoken-cli compare` of each evaluation's runs
# Exit status 0 when every stage passed, else 1 (the failed stages are named on the last line).
set -u

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 1

MODE=full
case "${1:-}" in
  "") ;;
  --quick) MODE=quick ;;
  --plan) MODE=plan ;;
  *) echo "device-check: error: unknown argument '$1' (usage: $0 [--quick | --plan])" >&2; exit 2 ;;
esac
[[ $# -le 1 ]] || { echo "device-check: error: one argument at most" >&2; exit 2; }

# The stages in order: name, budget in seconds (on 16 cores), modes it runs in, what it does.
STAGES=(
  "env|10|quick full|record the machine: nvidia-smi, nvcc, gcc, cmake, torch (version, CUDA, CXX11 ABI)"
  "configure|40|quick full|cmake: CUDA arch 90 (CUDA_ARCH), libtorch from python3, deps from .device-deps, -DVTOKEN_WERROR=OFF"
  "configure-notorch|30|fallback|only when configure fails: the same without libtorch (GPU stages only)"
  "build-cuda|80|quick full|ninja: vtoken_cuda, vtoken-cuda-bench, tests/cuda/*_test"
  "test-cuda|40|quick full|ctest -L cuda (relocation, hash, paged attention vs CPU references); a skip fails"
  "bench-cuda|25|full|vtoken-cuda-bench: relocation vs cudaMemcpy, copy engine, hash, paged attention"
  "bench-cuda-quick|25|quick|vtoken-cuda-bench --quick: the same benchmarks on smaller shapes"
  "build-eval|125|full|ninja: vtoken-cli, bench/torch_gpu_bench and the model's CUDA tests, with libtorch and lib/cuda"
  "test-model-cuda|45|full|ctest CudaAttentionTest + TorchDeviceTest + StaticDecodeCudaTest + ForwardTokenCudaTest: ForwardPaged on CUDA vs the CPU reference, device and dtype handling, CUDA graph replay vs eager, argmax and sampling on the device; a skip fails"
  "bench-model|40|full|torch_gpu_bench: synthetic 8B bf16 decode step, batch x context, scattered vs contiguous slots"
  "eval-quickstart|25|full|vtoken-cli run experiments/gpu/quickstart.toml (vt-tiny, 16 requests, 3 modes)"
  "eval-8b|40|full|vtoken-cli run experiments/gpu/synthetic_8b.toml (synthetic weights, 16 requests, 3 modes)"
  "compare|5|full|vtoken-cli compare of each evaluation's three runs"
)
stage_field() { # stage_field NAME FIELD(1-4)
  local s
  for s in "${STAGES[@]}"; do
    [[ "${s%%|*}" == "$1" ]] && { echo "$s" | cut -d'|' -f"$2"; return; }
  done
}

if [[ "$MODE" == plan ]]; then
  for m in full quick; do
    total=0
    fallback=0
    echo "device-check $( [[ $m == quick ]] && echo --quick || echo '(full)'):"
    for s in "${STAGES[@]}"; do
      IFS='|' read -r name budget modes what <<<"$s"
      if [[ "$modes" == fallback ]]; then
        printf '  %-19s %4ss  %s\n' "[$name]" "$budget" "$what"
        fallback=$((fallback + budget))
        continue
      fi
      [[ " $modes " == *" $m "* ]] || continue
      printf '  %-19s %4ss  %s\n' "$name" "$budget" "$what"
      total=$((total + budget))
      [[ "$name" == build-eval || "$name" == eval-* || "$name" == compare ]] ||
        fallback=$((fallback + budget))
    done
    limit=$([[ $m == quick ]] && echo 240 || echo 480)
    printf '  %-19s %4ss  (limit %ss; plus 1-2 minutes of machine start)\n' total "$total" "$limit"
    printf '  %-19s %4ss  (configure-notorch instead of the evaluation)\n' "[total]" "$fallback"
    ((total < limit && fallback < limit)) || { echo "device-check: error: the $m plan's budgets exceed ${limit}s" >&2; exit 1; }
  done
  exit 0
fi

OUT="${OUT:-$REPO/device-check-out}"
JOBS="${JOBS:-$(nproc)}"
B="${BUILD_DIR:-build/device}"
CUDA_ARCH="${CUDA_ARCH:-90}"
BUDGET_SCALE="${BUDGET_SCALE:-1}"
[[ "$BUDGET_SCALE" =~ ^[1-9][0-9]*$ ]] || { echo "device-check: error: BUDGET_SCALE must be a positive integer" >&2; exit 2; }
DEPS="${VTOKEN_DEVICE_DEPS:-$REPO/.device-deps}"
mkdir -p "$OUT" || { echo "device-check: error: cannot create $OUT" >&2; exit 1; }
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/device-check.log"
STATUS="$(mktemp)"  # name|result|seconds|budget per stage, turned into summary.md at the end
trap 'rm -f "$STATUS"' EXIT
: >"$LOG"
START=$(date +%s)
export OMP_WAIT_POLICY=PASSIVE
# Torch's CMake config asks which architectures its extensions are for.
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-${CUDA_ARCH:0:1}.${CUDA_ARCH:1}}"

log() { echo "[device-check +$(($(date +%s) - START))s] $*" | tee -a "$LOG"; }

# stage NAME [--label TEXT] COMMAND...: runs COMMAND under a timeout of NAME's budget, output to
# the log, which names the stage by TEXT (default: the command).
stage() {
  local name="$1" budget label
  shift
  budget=$(($(stage_field "$name" 2) * BUDGET_SCALE))
  label="$*"
  [[ "$1" == --label ]] && { label="$2"; shift 2; }
  log "stage $name: start (budget ${budget}s): $label"
  local t0 rc result
  t0=$(date +%s)
  timeout --kill-after=5 "$budget" "$@" >>"$LOG" 2>&1
  rc=$?
  local took=$(($(date +%s) - t0))
  if ((rc == 124 || rc == 137)); then result=TIMEOUT
  elif ((rc != 0)); then result="FAILED (rc $rc)"
  else result=OK; fi
  log "stage $name: $result in ${took}s"
  echo "$name|$result|$took|$budget" >>"$STATUS"
  return $rc
}
# not_run NAME WHY: a stage skipped because one it needs failed.
not_run() {
  log "stage $1: not run ($2)"
  echo "$1|not run: $2|-|$(stage_field "$1" 2)" >>"$STATUS"
}

# --- Tools and dependencies. ------------------------------------------------------------------
NVCC=""
for c in "$(command -v nvcc 2>/dev/null)" "${CUDA_HOME:-/nonexistent}/bin/nvcc" /usr/local/cuda/bin/nvcc; do
  [[ -n "$c" && -x "$c" ]] && { NVCC="$c"; break; }
done
# torch's CMake config finds CUDA with its own FindCUDA (nvcc on PATH, CUDA_PATH), not from
# CMAKE_CUDA_COMPILER: point both at the toolkit of the nvcc found here.
if [[ -n "$NVCC" ]]; then
  CUDA_ROOT="$(cd "$(dirname "$NVCC")/.." && pwd)"
  export PATH="$CUDA_ROOT/bin:$PATH" CUDA_PATH="$CUDA_ROOT"
fi
TORCH_PREFIX="${TORCH_PREFIX:-$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)}"
PATH="$DEPS/bin:$PATH"  # the deps folder's sqlite3 and bible (scripts/make-corpus.sh)

environment() {
  echo "date: $(date -u +%FT%TZ)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo none)" \
    " dirty files: $(git status --porcelain 2>/dev/null | wc -l)"
  echo "mode: $MODE  jobs: $JOBS  cuda arch: $CUDA_ARCH  build dir: $B"
  uname -a
  echo "cpus: $(nproc)  memory: $(awk '/MemTotal/ {print int($2 / 1048576) " GiB"}' /proc/meminfo)"
  grep -m1 PRETTY_NAME /etc/os-release 2>/dev/null
  echo "--- nvidia-smi"
  nvidia-smi || echo "nvidia-smi failed"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  echo "--- nvcc: ${NVCC:-not found}"
  [[ -n "$NVCC" ]] && "$NVCC" --version | tail -2
  echo "--- compilers and build tools"
  c++ --version | head -1
  echo "c++ CXX11 ABI default: $(echo '#include <string>
_GLIBCXX_USE_CXX11_ABI' | c++ -x c++ -E -P - 2>/dev/null | tail -1)"
  cmake --version | head -1
  echo "ninja $(ninja --version)"
  echo "--- torch"
  python3 -c 'import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
print("cuda available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
print("torch CXX11 ABI", int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>&1
  echo "torch cmake prefix: ${TORCH_PREFIX:-none}"
  echo "--- deps: $DEPS ($([[ -d "$DEPS/usr" ]] && du -sh "$DEPS" | cut -f1 || echo absent))"
}

log "mode $MODE, repo $REPO, out $OUT, build $B, jobs $JOBS"
stage env --label "environment > env.txt" bash -c "$(declare -f environment); $(declare -p MODE JOBS CUDA_ARCH B NVCC TORCH_PREFIX DEPS); environment >'$OUT/env.txt' 2>&1"
cat "$OUT/env.txt" >>"$LOG"

# --- Configure. ---------------------------------------------------------------------------------
missing=()
[[ -n "$NVCC" ]] || missing+=("nvcc (CUDA_HOME or PATH)")
[[ -d "$DEPS/usr" ]] || missing+=("$DEPS (scripts/device-deps.sh, named in the carry list)")
config=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DVTOKEN_WITH_CUDA=ON -DVTOKEN_WITH_TORCH=ON
        -DVTOKEN_WERROR=OFF -DVTOKEN_BUILD_TESTS=ON -DVTOKEN_BUILD_BENCH=ON
        "-DVTOKEN_CUDA_ARCHITECTURES=$CUDA_ARCH" "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH"
        "-DCMAKE_CUDA_COMPILER=$NVCC" "-DCMAKE_PREFIX_PATH=$DEPS/usr;$TORCH_PREFIX"
        -DCMAKE_DISABLE_FIND_PACKAGE_pybind11=ON
        # CMake 4 (a pip cmake) refuses config files that ask for a policy version below 3.5.
        -DCMAKE_POLICY_VERSION_MINIMUM=3.5)
[[ -n "$NVCC" ]] && config+=("-DCUDA_TOOLKIT_ROOT_DIR=$CUDA_ROOT" "-DCUDAToolkit_ROOT=$CUDA_ROOT")
# The deps' CMake configs are under lib/x86_64-linux-gnu, which CMake searches on multiarch systems.
[[ -n "$(c++ -print-multiarch 2>/dev/null)" ]] || config+=(-DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu)
# TorchConfig.cmake's find_library(c10 ... PATHS <torch>/lib) searches the system folders first: on
# a machine with Debian's libtorch-dev beside the PyTorch it would link Debian's libc10 with the
# wheel's libtorch. Name the torch's own (docs/GPU.md, "Building against a PyTorch 2.x wheel").
torch_lib="$(cd "${TORCH_PREFIX:-/nonexistent}/../../lib" 2>/dev/null && pwd)"
[[ -n "$torch_lib" && -f "$torch_lib/libc10.so" ]] && config+=("-Dc10_LIBRARY=$torch_lib/libc10.so")
# A local rehearsal ignores the system's packages: -DCMAKE_IGNORE_PREFIX_PATH=/usr;/usr/local;/.
while IFS= read -r arg; do [[ -n "$arg" ]] && config+=("$arg"); done <<<"${VTOKEN_DEVICE_CMAKE_ARGS:-}"

CONFIGURED=0
if ((${#missing[@]} > 0)); then
  log "missing: ${missing[*]}"
  echo "configure|FAILED (missing: ${missing[*]})|-|$(stage_field configure 2)" >>"$STATUS"
else
  if [[ -z "$TORCH_PREFIX" ]]; then
    log "no libtorch: python3 cannot import torch and TORCH_PREFIX is unset"
    echo "configure|FAILED (no libtorch: python3's torch or TORCH_PREFIX)|-|$(stage_field configure 2)" >>"$STATUS"
  elif stage configure cmake --fresh -S . -B "$B" "${config[@]}"; then
    CONFIGURED=1
  fi
  if ((CONFIGURED == 0)); then
    # Without libtorch the GPU stages still run (the evaluation cannot), in a folder of their own.
    B="$B-notorch"
    stage configure-notorch cmake --fresh -S . -B "$B" "${config[@]}" -DVTOKEN_WITH_TORCH=OFF &&
      CONFIGURED=2
  fi
fi

# --- GPU: the CUDA library, its tests and benchmark. -------------------------------------------
cuda_targets=(vtoken_cuda vtoken-cuda-bench)
for src in tests/cuda/*_test.cc; do cuda_targets+=("$(basename "$src" .cc)"); done
bench_stage=bench-cuda
bench_args=()
[[ "$MODE" == quick ]] && { bench_stage=bench-cuda-quick; bench_args=(--quick); }
CUDA_BUILT=0
if ((CONFIGURED)); then
  stage build-cuda cmake --build "$B" -j "$JOBS" --target "${cuda_targets[@]}" && CUDA_BUILT=1
else
  not_run build-cuda "configure failed"
fi
if ((CUDA_BUILT)); then
  if stage test-cuda ctest --test-dir "$B" -L cuda -j 8 --output-on-failure --timeout 30 \
       --output-junit "$OUT/ctest-cuda.xml"; then
    # The tests skip without a usable device; on the GPU machine a skip is a failure.
    if grep -q '<skipped' "$OUT/ctest-cuda.xml" 2>/dev/null; then
      log "stage test-cuda: tests were SKIPPED (no usable GPU?)"
      sed -i 's/^test-cuda|OK|/test-cuda|FAILED (tests skipped)|/' "$STATUS"
    fi
  fi
  stage "$bench_stage" bash -c "set -o pipefail; '$B/lib/cuda/vtoken-cuda-bench' ${bench_args[*]} |
    tee '$OUT/cuda-bench.jsonl'"
else
  not_run test-cuda "build-cuda did not pass"
  not_run "$bench_stage" "build-cuda did not pass"
fi

# --- The engine evaluation on the GPU. ------------------------------------------------------------
CLI="$B/apps/vtoken-cli/vtoken-cli"
if [[ "$MODE" == full ]]; then
  EVAL_BUILT=0
  if ((CONFIGURED == 1)); then
    # -k 0: ninja goes on past a target that does not compile, so that it costs only the stages
    # that use it: each stage below checks for its own binaries.
    stage build-eval cmake --build "$B" -j "$JOBS" --target vtoken-cli torch_gpu_bench \
      llama_cuda_attention_test torch_device_test llama_static_decode_test -- -k 0
    EVAL_BUILT=1
  else
    not_run build-eval "configure with libtorch failed"
  fi
  evaluated=()
  if ((EVAL_BUILT)); then
    # The model on CUDA (the batched attention kernel inside ForwardPaged, device and dtype
    # handling); these tests skip without a GPU, and a skip fails here.
    # A binary that did not build registers only a <target>_NOT_BUILT placeholder, which the
    # filter would not match: check for the binaries, and let ctest fail when it finds no test.
    # The one test that skips *because* a GPU is present is left out.
    model_cuda_tests() {
      local out rc t
      for t in llama_cuda_attention_test torch_device_test llama_static_decode_test; do
        [[ -x "$B/tests/$t" ]] || { echo "$t did not build (see build-eval)"; return 1; }
      done
      out="$(ctest --test-dir "$B" -R 'CudaAttentionTest|TorchDeviceTest|StaticDecodeCudaTest|ForwardTokenCudaTest|GreedyArgMaxRowsTest' \
               -E 'CudaWithoutADeviceIsFailedPrecondition' --no-tests=error -j 8 \
               --output-on-failure --timeout 60 2>&1)"
      rc=$?
      echo "$out"
      ((rc == 0)) || return 1
      if grep -q 'Skipped' <<<"$out"; then echo "tests were SKIPPED (no usable GPU?)"; return 1; fi
    }
    stage test-model-cuda --label "ctest -R 'CudaAttentionTest|TorchDeviceTest|StaticDecodeCudaTest|ForwardTokenCudaTest|GreedyArgMaxRowsTest' (a skip fails)" \
      bash -c "$(declare -f model_cuda_tests); $(declare -p B); model_cuda_tests"
    if [[ -x "$B/bench/torch_gpu_bench" ]]; then
      stage bench-model --label "torch_gpu_bench > model-bench.json" \
        "$B/bench/torch_gpu_bench" --benchmark_format=json --benchmark_out="$OUT/model-bench.json"
    else
      not_run bench-model "torch_gpu_bench did not build (see build-eval in the log)"
    fi
    rm -f "$OUT/gpu.db"
    if [[ -x "$CLI" ]]; then
      if ! bash scripts/make-corpus.sh build/corpus >>"$LOG" 2>&1; then
        log "scripts/make-corpus.sh failed: eval-quickstart has no corpus"
      fi
      stage eval-quickstart "$CLI" run experiments/gpu/quickstart.toml --db "$OUT/gpu.db" &&
        evaluated+=(quickstart)
      stage eval-8b "$CLI" run experiments/gpu/synthetic_8b.toml --db "$OUT/gpu.db" &&
        evaluated+=(synthetic_8b)
    else
      not_run eval-quickstart "vtoken-cli did not build (see build-eval in the log)"
      not_run eval-8b "vtoken-cli did not build (see build-eval in the log)"
    fi
  else
    not_run test-model-cuda "configure with libtorch failed"
    not_run bench-model "configure with libtorch failed"
    not_run eval-quickstart "configure with libtorch failed"
    not_run eval-8b "configure with libtorch failed"
  fi
  if ((${#evaluated[@]} > 0)); then
    compare_all() {
      # Each evaluation's completed runs, found by model (a failed mode leaves the others).
      local name model ids
      for name in "${evaluated[@]}"; do
        model="$(sed -n 's/^path = "\(.*\)"/\1/p' "experiments/gpu/$name.toml")"
        ids="$(sqlite3 "$OUT/gpu.db" "select id from runs where status = 'completed' and
                                      model = '$model' order by id")" || return 1
        echo "## $name ($model)"
        [[ $model == synthetic:* ]] && echo "(synthetic weights: seeded random, not a trained model)"
        "$CLI" compare --db "$OUT/gpu.db" $ids || return 1
        echo
      done
    }
    stage compare --label "vtoken-cli compare (each evaluation's runs) > compare.txt" bash -c "$(declare -f compare_all); $(declare -p OUT CLI evaluated);
      set -o pipefail; compare_all | tee '$OUT/compare.txt'"
  else
    not_run compare "no evaluation completed"
  fi
fi

# --- summary.md ----------------------------------------------------------------------------------
write_summary() {
  python3 scripts/device_summary.py "$STATUS" "$OUT" "$MODE" "$(($(date +%s) - START))"
}
if ! write_summary >"$OUT/summary.md" 2>>"$LOG"; then
  { echo "# device-check ($MODE): summary.md could not be generated (python3?); stages:"
    sed 's/^/    /' "$STATUS"; } >"$OUT/summary.md"
fi
cat "$OUT/summary.md"
failed="$(grep -v '|OK|' "$STATUS" | cut -d'|' -f1 | tr '\n' ' ')"
log "done in $(($(date +%s) - START))s"
if [[ -n "$failed" ]]; then
  echo "device-check: FAILED: ${failed% } (see $LOG)" >&2
  exit 1
fi
echo "device-check: OK ($OUT/summary.md)"

#!/usr/bin/env bash
# torch2-check.sh: the tree against a PyTorch 2.x wheel on the CPU, as CI runs it (.ci/run) beside
# the default build on Debian's libtorch 1.13 (docs/GPU.md, "Building against a PyTorch 2.x
# wheel"). Fetches the wheel (scripts/torch-wheel.sh), configures build/torch<MAJOR.MINOR> (preset
# torch2.11 for 2.11.0, else the same settings with that version's folder), builds every target
# that the default build builds except the Python module and the tests of the torch-free code
# (VTOKEN_TORCH_FREE_TESTS=OFF: tests/core, engine, sim and the fuzz replays, which the default
# build and scripts/asan.sh build and run, and which do not depend on the libtorch), and runs the
# tests that exercise libtorch: labels model, kernel_emu and cli (the vtoken-cli binary links it),
# not slow, not configs (experiments_dry_run: the shipped TOML files, the same under any libtorch). Each test computes on one thread (OMP_NUM_THREADS=1):
# two tests at once on two cores, each with two threads that spin between calls, took 150 s where
# one thread each took 95 s (the SmolLM2 tests); tests that check thread counts set their own.
#
# Usage: scripts/torch2-check.sh [VERSION]     (default 2.11.0, the GPU machine's)
# Environment: JOBS (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

version=${1:-2.11.0}
[[ $version =~ ^([0-9]+)\.([0-9]+)\.[0-9]+$ ]] ||
  { echo "torch2-check: error: usage: scripts/torch2-check.sh [VERSION] (e.g. 2.11.0)" >&2; exit 2; }
jobs=${JOBS:-$(nproc)}
build=build/torch${BASH_REMATCH[1]}.${BASH_REMATCH[2]}
start=$(date +%s)
say() { echo "torch2-check +$(($(date +%s) - start))s: $*"; }

say "torch $version wheel"
scripts/torch-wheel.sh "$version" >/dev/null
say "configure $build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DVTOKEN_WITH_CUDA=OFF \
  "-DVTOKEN_TORCH_CPU_PREFIX=$PWD/.cache/torch/$version/torch" \
  -DCMAKE_DISABLE_FIND_PACKAGE_pybind11=ON -DVTOKEN_TORCH_FREE_TESTS=OFF >"$build.configure.log" 2>&1 ||
  { echo "torch2-check: error: configure failed (see $build.configure.log)" >&2; exit 1; }
say "build (-j $jobs)"
cmake --build "$build" -j "$jobs"
say "test: ctest -L 'model|kernel_emu|cli' -LE 'slow|configs', one thread per test"
cd "$build"
OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 ctest -L 'model|kernel_emu|cli' -LE 'slow|configs' -j "$jobs" \
  --output-on-failure --timeout 900
say "torch $version: passed"

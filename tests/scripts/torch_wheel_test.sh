#!/usr/bin/env bash
# scripts/torch-wheel.sh's promises on bad input, without the network or the real cache
# (VTOKEN_CACHE_DIR is a scratch folder, pip's index unreachable): a malformed command line, a
# wheel whose checksum differs from scripts/torch-wheels.sha256, a wheel with no checksum there
# and a version the index does not serve each fail with one line and exit 1, and nothing is
# unpacked.
# Usage: torch_wheel_test.sh SOURCE_DIR
set -euo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
script=$src/scripts/torch-wheel.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_test_lib.sh"
offline=(env "VTOKEN_CACHE_DIR=$work/cache" PIP_INDEX_URL=http://127.0.0.1:9/simple PIP_RETRIES=0
         PIP_TIMEOUT=2 PIP_NO_CACHE_DIR=1 PIP_CONFIG_FILE=/dev/null)

expect_fail no-version "usage: scripts/torch-wheel.sh [--cuda] VERSION" "${offline[@]}" bash "$script"
expect_fail bad-version "usage:" "${offline[@]}" bash "$script" 2.11
expect_fail two-versions "usage:" "${offline[@]}" bash "$script" 2.11.0 2.15.0
expect_fail unknown-flag "usage:" "${offline[@]}" bash "$script" --cpu 2.11.0

# A file named as the 2.11.0 wheel that is not it: the committed checksum catches it.
mkdir -p "$work/cache/torch/2.11.0/wheel"
echo "not a wheel" >"$work/cache/torch/2.11.0/wheel/torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl"
expect_fail checksum "scripts/torch-wheels.sha256 says 7aa2f9bb" "${offline[@]}" bash "$script" 2.11.0
# A version with no line in the checksum file: refused, with the checksum it observed.
mkdir -p "$work/cache/torch/9.9.9/wheel"
echo "not a wheel" >"$work/cache/torch/9.9.9/wheel/torch-9.9.9-cp311-cp311-manylinux_2_28_x86_64.whl"
expect_fail no-checksum "no sha256 for torch-9.9.9-cp311-cp311-manylinux_2_28_x86_64.whl" \
  "${offline[@]}" bash "$script" 9.9.9
# A version the (unreachable) index cannot give: pip's last line, in one.
expect_fail unreachable "pip download torch==8.8.8 failed" "${offline[@]}" bash "$script" 8.8.8
for v in 2.11.0 9.9.9 8.8.8; do
  if [[ -e $work/cache/torch/$v/torch || -e $work/cache/torch/$v/.unpacked ]]; then
    echo "FAIL unpacked something for $v: $(ls "$work/cache/torch/$v")"
    failures=$((failures + 1))
  fi
done
((failures == 0)) || { echo "$failures failure(s)"; exit 1; }
echo "torch_wheel: all passed"

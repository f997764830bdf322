#!/usr/bin/env bash
# Installs every system package vToken needs (Debian 12, root). Idempotent: when all
# packages are present it only runs dpkg-query and exits.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git clang
  clang-format               # scripts/format-check.sh (.ci/run)
  libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libsqlite3-dev sqlite3
  libtorch-dev libopenblas0-pthread
  unzip                      # scripts/torch-wheel.sh (the torch 2.x wheels CI builds against)
  bible-kjv bible-kjv-text
  python3 python3-pip python3-matplotlib
  python3-dev pybind11-dev python3-numpy python3-pandas python3-pytest
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

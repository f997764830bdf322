#!/usr/bin/env bash
# device-deps.sh: unpacks every third-party header, library and tool the build and the tests need
# into .device-deps/, for a machine that has a compiler, CMake and CUDA but no apt and no internet
# (the GPU machine: docs/GPU.md). Run it on a Debian 12 machine with apt (this one); copy the
# folder along with the working tree (it is git-ignored: name it in the device tool's carry list).
#
# Usage: scripts/device-deps.sh [DIR]     (default DIR: .device-deps in the repo root)
#
# What DIR holds (apt-get download + dpkg -x, documentation and manual pages left out):
#   usr/include, usr/lib/x86_64-linux-gnu  xxhash, GoogleTest + GoogleMock, Google Benchmark,
#                CLI11, toml++, nlohmann-json, SQLite: the build finds them with
#                -DCMAKE_PREFIX_PATH=DIR/usr (CMakeLists.txt names any that is missing)
#   bin/sqlite3  the sqlite3 shell the CLI tests query result databases with
#   bin/bible    Debian's KJV reader, which scripts/make-corpus.sh turns into build/corpus/kjv.txt
#   (both wrappers run the unpacked binaries on DIR's libraries; put DIR/bin first on PATH)
# The folder is rebuilt from scratch on every run; the last line is its size and the size of the
# tracked tree, which travel together (the device tool carries 64 MiB in all).
set -euo pipefail

die() { echo "device-deps: error: $*" >&2; exit 1; }

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPS="${1:-$REPO/.device-deps}"
[[ $# -le 1 ]] || { echo "usage: $0 [DIR]" >&2; exit 2; }
command -v apt-get >/dev/null && command -v dpkg >/dev/null ||
  die "needs apt-get and dpkg (a Debian 12 machine)"
arch="$(dpkg --print-architecture)"
[[ "$arch" == amd64 ]] || die "packages would be for $arch; the GPU machine is amd64"

packages=(
  libxxhash-dev libxxhash0                       # xxhash.h, libxxhash.so
  libgtest-dev libgmock-dev                      # static GoogleTest + GoogleMock, CMake config
  libbenchmark-dev libbenchmark1debian           # Google Benchmark
  libcli11-dev libtomlplusplus-dev libtomlplusplus3 nlohmann-json3-dev
  libsqlite3-dev libsqlite3-0                    # sqlite3.h, libsqlite3.so
  sqlite3 libreadline8                           # the sqlite3 shell (readline may be absent there)
  bible-kjv bible-kjv-text                       # the corpus source of scripts/make-corpus.sh
)

download="$(mktemp -d)"
trap 'rm -rf "$download"' EXIT
# apt-get download drops to the _apt user, which needs to write into the folder.
chmod 777 "$download"
(cd "$download" && apt-get download -q "${packages[@]}" >/dev/null) ||
  die "apt-get download failed (run apt-get update first?)"
(($(ls "$download"/*.deb | wc -l) == ${#packages[@]})) ||
  die "expected ${#packages[@]} .deb files in $download, got $(ls "$download"/*.deb | wc -l)"

rm -rf "$DEPS"
mkdir -p "$DEPS/bin"
for deb in "$download"/*.deb; do dpkg -x "$deb" "$DEPS"; done
rm -rf "$DEPS"/usr/share/{doc,doc-base,man,lintian,menu} "$DEPS"/usr/lib/menu "$DEPS"/usr/bin/randverse

# Wrappers: the Debian binaries with DIR's libraries first (libsqlite3, libreadline); bible is
# also told where its data is, since it only looks in ./ and /usr/lib/.
write_wrapper() {
  local name="$1" extra="$2"
  cat >"$DEPS/bin/$name" <<EOF
#!/bin/sh
# $name from .device-deps (scripts/device-deps.sh): Debian 12's binary on the folder's libraries.
here="\$(cd "\$(dirname "\$0")/.." && pwd)"
libs="\$here/usr/lib/x86_64-linux-gnu:\$here/lib/x86_64-linux-gnu"
LD_LIBRARY_PATH="\$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/usr/bin/$name"${extra:+ $extra} "\$@"
EOF
  chmod 755 "$DEPS/bin/$name"
}
write_wrapper sqlite3 ""
write_wrapper bible '-p "$here/usr/lib/"'

# The wrappers must work from the folder alone: the corpus is complete and sqlite3 answers.
corpus="$(mktemp -d)"
PATH="$DEPS/bin:$PATH" bash "$REPO/scripts/make-corpus.sh" "$corpus" >/dev/null ||
  die "scripts/make-corpus.sh failed with $DEPS/bin/bible"
rm -rf "$corpus"
[[ "$("$DEPS/bin/sqlite3" :memory: 'select 6*7')" == 42 ]] || die "$DEPS/bin/sqlite3 does not run"

deps_bytes="$(du -sb "$DEPS" | cut -f1)"
tree_bytes="$(cd "$REPO" && git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)"
mib() { echo "$(($1 / 1048576)).$((($1 % 1048576) * 10 / 1048576)) MiB"; }
echo "device-deps: ${#packages[@]} packages in $DEPS: $(mib "$deps_bytes"); tracked tree" \
  "$(mib "$tree_bytes"); together $(mib $((deps_bytes + tree_bytes))) of the 64 MiB carry limit"
# The device call carries both or nothing: a tree that outgrows the limit fails here (and so in
# CI, through scripts/deps-only-check.sh), not on the GPU machine.
((deps_bytes + tree_bytes <= 64 * 1048576)) ||
  die "the tracked tree and $DEPS together exceed the device tool's 64 MiB carry limit"

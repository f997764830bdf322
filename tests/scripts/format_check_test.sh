#!/usr/bin/env bash
# scripts/format-check.sh's promises, in a scratch git repository holding the script and the
# project's .clang-format: a formatted tree passes; a file clang-format would change fails with one
# line naming it and exit 1, over the whole tree and as a change since a revision; a revision
# whose changes are formatted passes though an older file is not.
# Usage: format_check_test.sh SOURCE_DIR
set -euo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/script_test_lib.sh"
repo=$work/repo
mkdir -p "$repo/scripts"
cp "$src/scripts/format-check.sh" "$repo/scripts/"
cp "$src/.clang-format" "$repo/"
cd "$repo"
git init -q && git config user.email t@t && git config user.name t
printf 'int Good(int a) { return a + 1; }\n' >good.cc
git add -A && git commit -qm formatted

expect_pass() {
  if bash scripts/format-check.sh "$@" >/dev/null 2>"$work/err"; then
    echo "ok   pass $*"
  else
    echo "FAIL pass $*: $(cat "$work/err")"
    failures=$((failures + 1))
  fi
}
expect_pass
printf 'int   Bad( int a ){return a+1;}\n' >bad.cc
git add bad.cc && git commit -qm unformatted
expect_fail whole-tree "not clang-formatted: bad.cc (fix: clang-format -i bad.cc)" \
  bash scripts/format-check.sh
expect_fail since-rev "not clang-formatted: bad.cc" bash scripts/format-check.sh HEAD~1
# The change since HEAD (a formatted new file) passes; the tree with bad.cc does not.
printf 'int Other() { return 2; }\n' >other.cc
git add other.cc && git commit -qm other
expect_pass HEAD~1
((failures == 0)) || { echo "$failures failures"; exit 1; }
echo "all passed"

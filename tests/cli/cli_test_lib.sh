# Shared by the shell tests of vtoken-cli, sourced with the test's arguments VTOKEN_CLI SOURCE_DIR:
#   source "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh" "$@"
# sets CLI, SRC and a scratch TMP (removed on exit), moves to SRC, counts failures into
# `failures`; a test ends with `finish NAME`.
set -u
CLI=$1
SRC=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$SRC" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# finish NAME: exit 1 with the failure count, or say NAME passed.
finish() {
  if ((failures > 0)); then
    echo "$failures failure(s)"
    exit 1
  fi
  echo "$1: all checks passed"
}

# expect_error PATTERN ARGS...: `vtoken-cli ARGS --db $TMP/bad.db` exits non-zero with exactly
# one stderr line matching PATTERN, and creates no database.
expect_error() {
  local pattern=$1
  shift
  "$CLI" "$@" --db "$TMP/bad.db" >"$TMP/bad.out" 2>"$TMP/bad.err"
  local rc=$?
  [[ $rc -ne 0 ]] || fail "'$*' exited 0"
  [[ $(wc -l <"$TMP/bad.err") -eq 1 ]] || fail "'$*' printed $(wc -l <"$TMP/bad.err") error lines: $(cat "$TMP/bad.err")"
  grep -q "$pattern" "$TMP/bad.err" || fail "'$*' error lacks '$pattern': $(cat "$TMP/bad.err")"
  [[ ! -e "$TMP/bad.db" ]] || fail "'$*' created the database"
}

# outputs DB MODE: the texts of DB's MODE run in request order, joined by '|'.
outputs() {
  sqlite3 "$1" "select group_concat(text, '|') from (select o.text from outputs o join runs r
    on r.id = o.run_id where r.mode='$2' order by o.request_id)"
}
# same_outputs DB: DB's naive and vtoken runs generated the same, non-empty, texts.
same_outputs() {
  local naive
  naive=$(outputs "$1" naive)
  [[ -n "$naive" && "$naive" == "$(outputs "$1" vtoken)" ]]
}

# Shared by the shell tests of vtoken-cli (sourced; needs CLI and TMP set, counts into `failures`).
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

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

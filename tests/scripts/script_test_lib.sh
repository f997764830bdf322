# Shared by the tests of scripts/*.sh that check one-line failures (fetch_model_test.sh,
# torch_wheel_test.sh), sourced after setting `work` (a scratch folder): counts failures into
# `failures`.
failures=0

# expect_fail NAME SUBSTRING CMD...: exit 1, exactly one stderr line containing SUBSTRING.
expect_fail() {
  local name=$1 want=$2
  shift 2
  local rc=0
  "$@" 2>"$work/err" >/dev/null || rc=$?
  local lines
  lines=$(wc -l <"$work/err")
  if [[ $rc -ne 1 || $lines -ne 1 ]] || ! grep -qF -- "$want" "$work/err"; then
    echo "FAIL $name: rc $rc, $lines lines: $(cat "$work/err")"
    failures=$((failures + 1))
  else
    echo "ok   $name: $(cat "$work/err")"
  fi
}

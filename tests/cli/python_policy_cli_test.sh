#!/usr/bin/env bash
# Python policies inside the engine (lib/pypolicy/python_policy.h): python/policies/py_h2o.py
# runs on vt-tiny through --python-policy and through VTOKEN_PYTHON_POLICIES, and its naive and
# vtoken runs generate exactly what the C++ h2o's do; `policies` lists it; a bad spec is one
# error line, a non-zero exit and no database; an exception during a run fails the run. Prints
# both runs' wall times (the Python cost). Runs record the hash of the policy's file. A Python
# policy reading expected_attention (query statistics) matches the C++ expected_attention, and
# one reading its per-layer view (expected_attention@layer) the C++ layer_union.
# Usage: python_policy_cli_test.sh VTOKEN_CLI SOURCE_DIR
source "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh" "$@"

bash scripts/make-corpus.sh build/corpus >/dev/null || { echo "FAIL: corpus"; exit 1; }
spec=python/policies/py_h2o.py:PyH2O
common=(--set workload.num_requests=12 --set 'modes=["naive","vtoken"]')

start=$(date +%s.%N)
"$CLI" run experiments/quickstart.toml "${common[@]}" --db "$TMP/cpp.db" >/dev/null \
  2>"$TMP/cpp.err" || fail "h2o run exited $?: $(tail -2 "$TMP/cpp.err")"
mid=$(date +%s.%N)
"$CLI" --python-policy "$spec" run experiments/quickstart.toml "${common[@]}" \
  --set policy.name=py_h2o --db "$TMP/py.db" >/dev/null 2>"$TMP/py.err" \
  || fail "py_h2o run exited $?: $(tail -2 "$TMP/py.err")"
end=$(date +%s.%N)
awk -v a="$start" -v b="$mid" -v c="$end" 'BEGIN { printf "wall: h2o %.1f s, py_h2o %.1f s (2 modes, 12 requests)\n", b - a, c - b }'
grep -q "policy py_h2o reads attn_sum (accumulated)" "$TMP/py.err" \
  || fail "no py_h2o signal line in the run header"
for mode in naive vtoken; do
  cpp=$(outputs "$TMP/cpp.db" "$mode")
  [[ -n "$cpp" && "$cpp" == "$(outputs "$TMP/py.db" "$mode")" ]] \
    || fail "$mode: py_h2o generated other texts than h2o"
done
same_outputs "$TMP/py.db" || fail "py_h2o: naive and vtoken differ"

# A Python policy reading a relative token signal over query statistics (expected_attention):
# the runner keeps them for it as for the C++ policy, which it then matches output for output.
cat >"$TMP/py_ea.py" <<'PY'
class PyEA:
    name = "py_ea"
    rule = "expected_attention in Python"
    signals = ["expected_attention"]
    params = {}

    def score(self, tokens, ctx):
        return tokens["expected_attention"].copy()
PY
ea=(run experiments/quickstart.toml --set workload.num_requests=6 --set 'modes=["naive"]')
"$CLI" "${ea[@]}" --set policy.name=expected_attention --db "$TMP/ea_cpp.db" >/dev/null \
  2>"$TMP/ea.err" || fail "expected_attention run exited $?: $(tail -2 "$TMP/ea.err")"
"$CLI" --python-policy "$TMP/py_ea.py:PyEA" "${ea[@]}" --set policy.name=py_ea \
  --db "$TMP/ea_py.db" >/dev/null 2>"$TMP/ea.err" || fail "py_ea run exited $?: $(tail -2 "$TMP/ea.err")"
cpp=$(outputs "$TMP/ea_cpp.db" naive)
[[ -n "$cpp" && "$cpp" == "$(outputs "$TMP/ea_py.db" naive)" ]] \
  || fail "py_ea generated other texts than expected_attention"

# A Python policy reading a token signal view (expected_attention@layer, one column per layer):
# layer_union in numpy generates exactly what the C++ layer_union does.
cat >"$TMP/py_lu.py" <<'PY'
import numpy as np


class PyLayerUnion:
    name = "py_layer_union"
    rule = "layer_union in Python"
    signals = ["expected_attention@layer"]

    def score(self, tokens, ctx):
        v = tokens["expected_attention@layer"]  # (live tokens, layers)
        n = v.shape[0]
        best = np.zeros(n, dtype=np.float32)
        for c in range(v.shape[1]):
            rank = np.empty(n, dtype=np.float32)
            rank[np.argsort(v[:, c], kind="stable")] = (
                np.arange(1, n + 1, dtype=np.float32) / np.float32(n))
            best = np.maximum(best, rank)
        return best
PY
"$CLI" "${ea[@]}" --set policy.name=layer_union --db "$TMP/lu_cpp.db" >/dev/null \
  2>"$TMP/lu.err" || fail "layer_union run exited $?: $(tail -2 "$TMP/lu.err")"
"$CLI" --python-policy "$TMP/py_lu.py:PyLayerUnion" "${ea[@]}" --set policy.name=py_layer_union \
  --db "$TMP/lu_py.db" >/dev/null 2>"$TMP/lu.err" \
  || fail "py_layer_union run exited $?: $(tail -2 "$TMP/lu.err")"
cpp=$(outputs "$TMP/lu_cpp.db" naive)
[[ -n "$cpp" && "$cpp" == "$(outputs "$TMP/lu_py.db" naive)" ]] \
  || fail "py_layer_union generated other texts than layer_union"
[[ "$cpp" != "$(outputs "$TMP/ea_cpp.db" naive)" ]] \
  || fail "layer_union generated what expected_attention did: its layer columns were not read"

VTOKEN_PYTHON_POLICIES="$spec" "$CLI" policies >"$TMP/policies.out" 2>&1 \
  || fail "policies with VTOKEN_PYTHON_POLICIES exited $?"
grep -q "^py_h2o .*h2o in Python" "$TMP/policies.out" || fail "policies does not list py_h2o"

expect_error "python policy 'nope.py:X': no file" --python-policy nope.py:X run \
  experiments/quickstart.toml
expect_error "expected FILE.py:CLASS" --python-policy py_h2o run experiments/quickstart.toml
expect_error "py_h2o.py has no class Nope" --python-policy python/policies/py_h2o.py:Nope run \
  experiments/quickstart.toml
# A run records the hash of the policy's file (policy.source_xxh64): an edited file gives another
# config hash, and the recorded config refuses to run the edited file.
mkdir -p "$TMP/edit"
cp python/policies/py_h2o.py "$TMP/edit/py_h2o.py"
small=(--set workload.num_requests=2 --set 'modes=["naive"]' --set policy.name=py_h2o)
"$CLI" --python-policy "$TMP/edit/py_h2o.py:PyH2O" run experiments/quickstart.toml "${small[@]}" \
  --db "$TMP/edit.db" >/dev/null 2>"$TMP/edit.err" || fail "edit run 1: $(tail -2 "$TMP/edit.err")"
sqlite3 "$TMP/edit.db" "select config_toml from runs" >"$TMP/recorded.toml"
grep -q "^source_xxh64 = '[0-9a-f]\{16\}'" "$TMP/recorded.toml" \
  || fail "the recorded config lacks policy.source_xxh64: $(grep -A3 '^\[policy\]' "$TMP/recorded.toml")"
echo "# edited" >>"$TMP/edit/py_h2o.py"
"$CLI" --python-policy "$TMP/edit/py_h2o.py:PyH2O" run experiments/quickstart.toml "${small[@]}" \
  --db "$TMP/edit.db" >/dev/null 2>"$TMP/edit.err" || fail "edit run 2: $(tail -2 "$TMP/edit.err")"
[[ $(sqlite3 "$TMP/edit.db" "select count(distinct config_hash) from runs") -eq 2 ]] \
  || fail "an edited Python policy file kept the config hash"
expect_error "it changed since the config was recorded" \
  --python-policy "$TMP/edit/py_h2o.py:PyH2O" run "$TMP/recorded.toml"
expect_error "is not a Python policy" run "$TMP/recorded.toml" --set policy.name=h2o

# An exception during a run fails the run like any other error: one line, a non-zero exit, the
# run recorded as failed.
cat >"$TMP/late.py" <<'PY'
class Late:
    name = "py_late"
    signals = ["attn"]

    def score(self, tokens, ctx):
        if ctx["step"] >= 3:
            raise RuntimeError("late failure at step %d" % ctx["step"])
        return tokens["attn"]
PY
"$CLI" --python-policy "$TMP/late.py:Late" run experiments/quickstart.toml \
  --set workload.num_requests=4 --set 'modes=["naive"]' --set policy.name=py_late \
  --db "$TMP/late.db" >/dev/null 2>"$TMP/late.err"
rc=$?
[[ $rc -ne 0 ]] || fail "a run whose Python policy raised exited 0"
[[ $(grep -c "error" "$TMP/late.err") -eq 1 ]] || fail "late failure: $(grep error "$TMP/late.err")"
grep -q "python policy py_late: score raised RuntimeError: late failure at step 3" "$TMP/late.err" \
  || fail "late failure not named: $(tail -2 "$TMP/late.err")"
[[ $(sqlite3 "$TMP/late.db" "select status from runs") == failed ]] \
  || fail "the failed run is recorded as $(sqlite3 "$TMP/late.db" "select status from runs")"
finish python_policy_cli

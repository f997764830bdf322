#!/usr/bin/env bash
# docs/WRITING_A_POLICY.md promises that a new policy is one new file in policies/ and touches no
# other file. This test keeps that promise honest: it copies the source tree into a scratch
# directory, adds one small real policy file there (and nothing else), configures the copy the
# way the doc does (no libtorch, no CUDA, no benchmarks), builds the CLI and the core tests that go
# over every registered policy, runs them, and checks that `vtoken-cli policies` lists the policy and that
# `vtoken-cli check --policy` runs it without a violation.
#
# Usage: new_policy_test.sh SOURCE_DIR SCRATCH_DIR
set -euo pipefail

src=$(cd "$1" && pwd)
work=$2
name=attn_rate
jobs=$(nproc)

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

rm -rf "$work"
mkdir -p "$work/src"

# The tree as a clone would have it: tracked files plus new files not yet committed (but not
# ignored ones such as build directories and databases), from a git checkout; otherwise the
# directory minus its build outputs.
if git -C "$src" rev-parse --show-toplevel >/dev/null 2>&1; then
  (cd "$src" && git ls-files -z --cached --others --exclude-standard |
     while IFS= read -r -d '' f; do [[ -f $f ]] && printf '%s\0' "$f"; done |
     tar --null -T - -cf -) | tar -C "$work/src" -xf -
else
  tar -C "$src" --exclude=./build --exclude=./results --exclude=./.git -cf - . |
    tar -C "$work/src" -xf -
fi
[[ -f $work/src/policies/h2o.cc ]] || fail "copy of $src has no policies/h2o.cc"
if grep -rq "\"$name\"" "$work/src/policies"; then
  fail "policy name '$name' is already taken in $src/policies"
fi

cat >"$work/src/policies/$name.cc" <<'EOF'
// Attention rate: the test policy of tests/cli/new_policy_test.sh (not part of the tree).
// Rule: keep the highest attention per step of life, attn_sum / (age + 1), so a token is
// judged by how much attention it draws on average, not by how long it has been collecting it.
// Defaults: no parameters.
#include "lib/core/policy.h"

namespace vtoken {
namespace {

class AttnRate final : public Policy {
 public:
  void Score(std::span<const TokenView> tokens, PolicyContext&,
             std::span<float> scores) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      scores[i] = tokens[i].attn_sum / static_cast<float>(tokens[i].age + 1);
    }
  }
};

}  // namespace

VTOKEN_REGISTER_POLICY(AttnRate, "attn_rate", "keep the highest attention per step of life");

}  // namespace vtoken
EOF

# -O1: the build is most of this test's time, and -O1 compiles in about two thirds of -O3's time
# while the core tests still run in seconds (at -O0 they take a minute).
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
start=$SECONDS
cmake -S "$work/src" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DVTOKEN_WITH_TORCH=OFF -DVTOKEN_WITH_CUDA=OFF -DVTOKEN_BUILD_BENCH=OFF >"$work/configure.log" 2>&1 ||
  { tail -30 "$work/configure.log" >&2; fail "configure of the copy failed"; }

# The core tests that a new policy can change: those that go over every registered policy
# (RegisteredPolicies). The others never see it, and building them was most of this test's time.
core_tests=()
for f in $(grep -l "RegisteredPolicies" "$work"/src/tests/core/*_test.cc); do
  core_tests+=("$(basename "$f" .cc)")
done
[[ ${#core_tests[@]} -ge 1 ]] || fail "no core test of the copy goes over RegisteredPolicies"
cmake --build "$work/build" -j "$jobs" --target vtoken-cli "${core_tests[@]}" >"$work/build.log" 2>&1 ||
  { grep -m 20 -B 2 -A 8 "error" "$work/build.log" >&2 || tail -40 "$work/build.log" >&2
    fail "build of the copy failed"; }
echo "configure + build: $((SECONDS - start)) s"

cli=$work/build/apps/vtoken-cli/vtoken-cli
policies=$("$cli" policies)
echo "$policies"
grep -Eq "^$name +[0-9]+  keep the highest attention per step of life$" <<<"$policies" ||
  fail "vtoken-cli policies does not list $name"

check=$("$cli" check --policy "$name" --steps 2000)
echo "$check"
grep -Eq '^  violations +0$' <<<"$check" || fail "check --policy $name reports violations"
grep -q "^  policy $name: budget" <<<"$check" || fail "check did not run policy $name"
victims=$(awk '/^  policy victims/ {print $3}' <<<"$check")
[[ ${victims:-0} -gt 0 ]] || fail "policy $name chose no victims"

start=$SECONDS
(cd "$work/build" && ctest -L core -j "$jobs" --output-on-failure --timeout 300) ||
  fail "core tests of the copy with $name failed"
[[ -n $(cd "$work/build" && ctest -N -L core | grep -E "^ +Test +#") ]] || fail "the copy ran no core test"
echo "ctest -L core: $((SECONDS - start)) s"
echo "PASS: policies/$name.cc alone added a policy that lists, checks and passes the core tests"

#!/usr/bin/env bash
# scripts/device-check.sh --plan, as docs/GPU.md promises it: the full run's stage budgets add up
# to under 480 s and --quick's to under 240 s (the script exits 1 otherwise), and every stage the
# script runs (each `stage NAME` call, found in the script itself) has a budget in the plan, so a
# stage added without one fails here instead of on the GPU machine; docs/GPU.md's table gives the
# same budgets and totals.
# Usage: device_plan_test.sh SOURCE_DIR
set -u
cd "$1" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

plan=$(bash scripts/device-check.sh --plan 2>&1) || fail "--plan exited non-zero: $plan"
for limit in 480 240; do
  grep -Eq "^  total +[0-9]+s  \(limit ${limit}s" <<<"$plan" || fail "no total against ${limit}s in: $plan"
done
while read -r total limit; do
  ((total < limit)) || fail "plan total ${total}s is not under ${limit}s"
done < <(sed -nE 's/^  total +([0-9]+)s  \(limit ([0-9]+)s.*/\1 \2/p' <<<"$plan")
# The stages the script runs: literal names, and the benchmark stage chosen by mode.
mapfile -t names < <(grep -oE '(^\s*|if |elif |&& *|\|\| *)stage [a-z][a-z0-9-]*' scripts/device-check.sh |
                     sed -E 's/.*stage //' | sort -u)
names+=(bench-cuda bench-cuda-quick)
((${#names[@]} >= 8)) || fail "found only ${#names[@]} stage calls: ${names[*]}"
for name in "${names[@]}"; do
  grep -Eq "^  \[?${name}\]? +[0-9]+s  " <<<"$plan" || fail "stage '$name' has no budget in --plan"
done
# docs/GPU.md's stage table and totals say what the plan says.
while read -r name budget; do
  if [[ "$name" == bench-cuda-quick ]]; then  # A column of bench-cuda's row.
    grep -Fq "| \`--quick\` shapes, ${budget} |" docs/GPU.md ||
      fail "docs/GPU.md's bench-cuda row does not give --quick's budget ${budget}"
  else
    grep -Fq "| ${name} | ${budget} |" docs/GPU.md ||
      fail "docs/GPU.md has no row '| ${name} | ${budget} |' (the plan's budget)"
  fi
done < <(sed -nE 's/^  \[?([a-z][a-z0-9-]*)\]? +([0-9]+)s  .*/\1 \2/p' <<<"$plan" | grep -v '^total ' | sort -u)
mapfile -t totals < <(sed -nE 's/^  \[?total\]? +([0-9]+)s  .*/\1/p' <<<"$plan")
if ((${#totals[@]} == 4)); then
  grep -Fq "Full run: ${totals[0]} s of budgets (limit 480); \`--quick\`: ${totals[2]} s (limit 240)" docs/GPU.md ||
    fail "docs/GPU.md does not give the plan's totals ${totals[0]} s and ${totals[2]} s"
  grep -Fq "instead of the evaluation, ${totals[1]} s and ${totals[3]} s" docs/GPU.md ||
    fail "docs/GPU.md does not give the fallback totals ${totals[1]} s and ${totals[3]} s"
else
  fail "expected 4 totals in the plan, found ${#totals[@]}"
fi
if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "device_plan: ${#names[@]} stages, all budgeted; totals under their limits"

#!/usr/bin/env bash
# Every experiment config the project ships (every .toml under experiments/, found here, not
# listed) validates: `run --dry-run` on each, and `sweep --dry-run` (every grid point) on those
# with a [sweep] table; the GPU configs with model.device=cpu (and CUDA graphs off), since this
# machine may have no GPU.
# A config left behind by a renamed key, policy or model fails here, not in a user's hands.
# Usage: experiments_dry_run_test.sh VTOKEN_CLI SOURCE_DIR
source "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh" "$@"

count=0
while IFS= read -r config; do
  count=$((count + 1))
  args=()
  grep -q '^device = "cuda' "$config" && args=(--set model.device=cpu)
  grep -q '^cuda_graphs = true' "$config" && args+=(--set engine.cuda_graphs=false)
  "$CLI" run "$config" "${args[@]}" --dry-run >/dev/null 2>"$TMP/err" \
    || fail "$config: run --dry-run exited $?: $(tail -1 "$TMP/err")"
  if grep -q '^\[sweep' "$config"; then
    "$CLI" sweep "$config" "${args[@]}" --dry-run >/dev/null 2>"$TMP/err" \
      || fail "$config: sweep --dry-run exited $?: $(tail -1 "$TMP/err")"
  fi
done < <(find experiments -name '*.toml' | sort)
((count >= 20)) || fail "only $count experiment configs found under experiments/"
finish "experiments_dry_run ($count configs)"

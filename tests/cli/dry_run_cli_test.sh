#!/usr/bin/env bash
# `run --dry-run` on a synthetic model validates everything a run would, without drawing the
# weights: the 8B shape in bf16 on the CPU prints its three resolved runs in well under the
# 16 GB its weights would take (peak memory of the process, measured), and the checks LoadModel
# makes before drawing still refuse what the run would refuse (a dtype this libtorch cannot run
# there, a model that does not fit), with one error line and no database.
# Usage: dry_run_cli_test.sh VTOKEN_CLI SOURCE_DIR
source "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh" "$@"

config=experiments/gpu/synthetic_8b.toml
had_db=0
[[ -e results/gpu.db ]] && had_db=1
# Peak resident memory (KiB) of the dry run, from the kernel's accounting of the child.
peak_kib=$(python3 - "$CLI" "$config" "$TMP" <<'PY'
import resource, subprocess, sys
cli, config, tmp = sys.argv[1:4]
with open(f"{tmp}/dry.out", "w") as out, open(f"{tmp}/dry.err", "w") as err:
    rc = subprocess.run([cli, "run", config, "--set", "model.device=cpu", "--dry-run"],
                        stdout=out, stderr=err).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if rc == 0 else -1)
PY
)
[[ "$peak_kib" -gt 0 ]] || fail "the dry run failed: $(cat "$TMP/dry.err")"
((peak_kib < 2 * 1024 * 1024)) || fail "the dry run peaked at ${peak_kib} KiB: weights were drawn?"
[[ $(grep -c '^# run [123]: ' "$TMP/dry.out") -eq 3 ]] || fail "not three resolved runs: $(head -5 "$TMP/dry.out")"
grep -q "^path = 'synthetic:llama-3.1-8b'" "$TMP/dry.out" || fail "resolved config lacks the model"
grep -q 'device cpu, dtype bfloat16, KV bfloat16 (dry run: synthetic weights not drawn)' "$TMP/dry.err" ||
  fail "no dry-run device line: $(cat "$TMP/dry.err")"
[[ $had_db -eq 1 || ! -e results/gpu.db ]] || fail "the dry run created the config's database"

# What the real run refuses, the dry run refuses.
# float16 on the CPU: Debian's libtorch 1.13 cannot run it, a 2.x wheel can (preset torch2).
if ! "$CLI" generate --prompt x --max-tokens 1 --dtype float16 >/dev/null 2>&1; then
  expect_error 'dtype float16 on cpu: not supported by this libtorch' \
    run "$config" --set model.device=cpu --set model.dtype=float16 --dry-run
fi
expect_error 'more than the .* GiB of memory available' \
  run "$config" --set model.device=cpu --set model.dtype=float32 --dry-run
expect_error 'unknown synthetic model' \
  run "$config" --set model.device=cpu --set model.path=synthetic:llama-9 --dry-run
finish dry_run_cli

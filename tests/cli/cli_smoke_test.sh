#!/usr/bin/env bash
# End-to-end checks of vtoken-cli as a user drives it: a sweep on the bundled model, report
# (tables + figures), runs/compare, and bad input giving one clear error line, a non-zero exit
# and nothing written to the results database.
# Usage: cli_smoke_test.sh VTOKEN_CLI SOURCE_DIR
source "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh" "$@"

bash scripts/make-corpus.sh build/corpus >/dev/null || { echo "FAIL: corpus"; exit 1; }

# A sweep, then its report.
"$CLI" sweep experiments/sweep_example.toml --db "$TMP/s.db" >"$TMP/sweep.out" 2>"$TMP/sweep.err" \
  || fail "sweep exited $?: $(tail -3 "$TMP/sweep.err")"
completed=$(sqlite3 "$TMP/s.db" "select count(*) from runs where status='completed'")
[[ "$completed" == 8 ]] || fail "sweep completed $completed runs, expected 8"

# model.threads: the run's header names the threads of its model step.
VTOKEN_CPU_ISA=baseline "$CLI" run experiments/sweep_example.toml --db "$TMP/t.db" \
  --set model.threads=1 >/dev/null 2>"$TMP/threads.err" \
  || fail "run with model.threads=1 exited $?: $(tail -3 "$TMP/threads.err")"
grep -q '^BLAS: .*; model step on 1 CPU thread(s)$' "$TMP/threads.err" \
  || fail "no 'model step on 1 CPU thread(s)' in the run header: $(grep BLAS "$TMP/threads.err")"
grep -q '^CPU: .*; kernels for baseline$' "$TMP/threads.err" \
  || fail "no 'kernels for baseline' in the run header: $(grep '^CPU' "$TMP/threads.err")"
# Each run records the host it measured on (summary_text: cpu_model, cpu_isa, cpu_threads, blas).
runs=$(sqlite3 "$TMP/t.db" "select count(*) from runs")
for fact in "cpu_isa|baseline" "cpu_threads|1"; do
  [[ "$(sqlite3 "$TMP/t.db" "select count(*) from summary_text where name || '|' || value = '$fact'")" == "$runs" ]] \
    || fail "not every one of $runs runs records $fact: $(sqlite3 "$TMP/t.db" 'select * from summary_text')"
done
[[ "$(sqlite3 "$TMP/t.db" "select count(*) from summary_text where name in ('cpu_model', 'blas') and value != ''")" == $((2 * runs)) ]] \
  || fail "runs lack cpu_model or blas: $(sqlite3 "$TMP/t.db" 'select * from summary_text')"
"$CLI" report --db "$TMP/s.db" --sweep sweep_example --out "$TMP/figs" >"$TMP/report.out" 2>&1 \
  || fail "report exited $?: $(tail -3 "$TMP/report.out")"
grep -q '^| ' "$TMP/report.out" || fail "report printed no markdown table"
ls "$TMP"/figs/*.png >/dev/null 2>&1 || fail "report wrote no figure"
# Without --out the figures go beside the database (figures/NAME), not into the working directory.
abs_cli=$(readlink -f "$CLI")
mkdir -p "$TMP/elsewhere"
(cd "$TMP/elsewhere" && VTOKEN_SOURCE_DIR="$SRC" "$abs_cli" report --db "$TMP/s.db" \
  --sweep sweep_example) >"$TMP/report2.out" 2>&1 || fail "report without --out exited $?"
grep -q "^Figures ($TMP/figures/sweep_example):" "$TMP/report2.out" \
  || fail "report without --out: $(grep '^Figures' "$TMP/report2.out")"
ls "$TMP"/figures/sweep_example/*.png >/dev/null 2>&1 || fail "no figure beside the database"
[[ -z "$(ls -A "$TMP/elsewhere")" ]] || fail "report wrote into the working directory: $(ls "$TMP/elsewhere")"
"$CLI" compare --db "$TMP/s.db" --last 2 >"$TMP/compare.out" 2>&1 || fail "compare exited $?"
grep -q "ROUGE-L vtoken vs naive" "$TMP/compare.out" || fail "compare table incomplete"
"$CLI" runs --db "$TMP/s.db" | grep -q completed || fail "runs lists no completed run"

# Bad input: one error line naming the problem, exit code != 0, nothing written.
printf 'name = "x"\n[engine\n' >"$TMP/malformed.toml"
expect_error "malformed.toml" run "$TMP/malformed.toml"
expect_error "unknown key 'engine.num_blockz'" run experiments/quickstart.toml --set engine.num_blockz=3
expect_error "engine.num_blocks" run experiments/quickstart.toml --set 'engine.num_blocks="many"'
expect_error "unknown policy" run experiments/quickstart.toml --set policy.name=nope
expect_error "block_size" run experiments/quickstart.toml --set engine.block_size=0
expect_error "pool too small" run experiments/quickstart.toml --set engine.num_blocks=40
expect_error "keep_ratio" run experiments/quickstart.toml --set policy.keep_ratio=1.5
expect_error "model models/none not found" run experiments/quickstart.toml --set model.path=models/none
expect_error "not found" run "$TMP/missing.toml"
expect_error "model.dtype" run experiments/quickstart.toml --set model.dtype=int8
expect_error "model.device" run experiments/quickstart.toml --set model.device=tpu
if ! nvidia-smi >/dev/null 2>&1; then
  expect_error "no CUDA device" run experiments/quickstart.toml --set model.device=cuda
fi
expect_error "model.device" run experiments/quickstart.toml --set model.device=cuda:x
# model.device / model.dtype at their defaults, given or not, record nothing: the resolved config
# (and hash) of runs made before the keys existed; another dtype is recorded.
"$CLI" run experiments/quickstart.toml --dry-run >"$TMP/dry.default" 2>/dev/null || fail "dry run"
"$CLI" run experiments/quickstart.toml --set model.device=cpu --set model.dtype=float32 --dry-run \
  >"$TMP/dry.explicit" 2>/dev/null || fail "dry run with explicit model defaults"
cmp -s "$TMP/dry.default" "$TMP/dry.explicit" || fail "explicit model.device/dtype defaults change the resolved config"
grep -q "^device = \|^dtype = " "$TMP/dry.default" && fail "the default device or dtype is recorded"
"$CLI" run experiments/quickstart.toml --set model.dtype=bfloat16 --dry-run 2>"$TMP/dry.err" \
  | grep -q "^dtype = 'bfloat16'" || fail "model.dtype = bfloat16 is not recorded"
grep -q "device cpu, dtype bfloat16, KV bfloat16, relocation by the torch copy engine" "$TMP/dry.err" \
  || fail "the run header does not name device, dtype, KV dtype and copy engine: $(cat "$TMP/dry.err")"
# model.kv_dtype: auto (the default) records nothing; float16 is recorded, and a real run over an
# fp16 KV store (the fused CPU path, relocations included) completes every mode and says so.
"$CLI" run experiments/quickstart.toml --set model.kv_dtype=auto --dry-run >"$TMP/dry.auto" 2>/dev/null \
  || fail "dry run with model.kv_dtype=auto"
cmp -s "$TMP/dry.default" "$TMP/dry.auto" || fail "model.kv_dtype=auto changes the resolved config"
"$CLI" run experiments/quickstart.toml --set model.kv_dtype=float16 --dry-run 2>/dev/null \
  | grep -q "^kv_dtype = 'float16'" || fail "model.kv_dtype = float16 is not recorded"
expect_error "model.kv_dtype" run experiments/quickstart.toml --set model.kv_dtype=int8
"$CLI" run experiments/sweep_example.toml --db "$TMP/kv16.db" --set model.kv_dtype=float16 \
  >/dev/null 2>"$TMP/kv16.err" || fail "run with model.kv_dtype=float16 exited $?: $(tail -3 "$TMP/kv16.err")"
grep -q "device cpu, dtype float32, KV float16, relocation by the" "$TMP/kv16.err" \
  || fail "the run header does not name the fp16 KV store: $(grep '^device' "$TMP/kv16.err")"
grep -q "KV [0-9]* bytes/token (.* x 2 B float16)" "$TMP/kv16.err" \
  || fail "the model line does not give fp16's 2 bytes per element: $(grep '^model:' "$TMP/kv16.err")"
[[ "$(sqlite3 "$TMP/kv16.db" "select count(*) from runs where status = 'completed'")" -ge 2 &&
   "$(sqlite3 "$TMP/kv16.db" "select count(*) from runs where status != 'completed'")" == 0 ]] \
  || fail "the fp16 KV run did not complete its modes: $(sqlite3 "$TMP/kv16.db" 'select mode, status from runs')"
mkdir -p "$TMP/corrupt" && cp models/vt-tiny/config.json models/vt-tiny/tokenizer.json "$TMP/corrupt/"
head -c 1000 models/vt-tiny/model.safetensors >"$TMP/corrupt/model.safetensors"
expect_error "model.safetensors" run experiments/quickstart.toml --set "model.path=\"$TMP/corrupt\""
"$CLI" check --bogus-flag >/dev/null 2>"$TMP/flag.err" && fail "unknown flag accepted"
grep -q "bogus-flag" "$TMP/flag.err" || fail "unknown flag error lacks its name"

finish "cli smoke test"

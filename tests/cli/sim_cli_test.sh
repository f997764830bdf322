#!/usr/bin/env bash
# The simulated backend from the command line: a paper-shape run (sim:llama-3.1-8b, pool sized
# by gpu_memory_utilization) completes, is labelled simulated, gives identical results twice,
# replays a recorded vt-tiny trace exactly, and bad [sim] input gives one error line, a non-zero
# exit and no database.
# Usage: sim_cli_test.sh VTOKEN_CLI SOURCE_DIR
source "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh" "$@"

cat >"$TMP/sim.toml" <<'TOML'
name = "sim_cli"
[model]
path = "sim:llama-3.1-8b"
[workload]
kind = "longbench_like"
num_requests = 8
input_min = 4096
input_max = 8192
output_min = 32
output_max = 64
arrival = "poisson"
rate = 4.0
[engine]
gpu_memory_utilization = 0.35
max_num_seqs = 4
max_prefill_chunk = 4096
max_batched_tokens = 4096
verify = true
[policy]
name = "h2o"
keep_ratio = 0.25
[reclaim]
low_watermark = 1.0
[sim.hardware]
preset = "h100-sxm-80g"
TOML
for db in a b; do
  "$CLI" run "$TMP/sim.toml" --db "$TMP/$db.db" >"$TMP/$db.out" 2>"$TMP/$db.err" \
    || fail "sim run exited $?: $(tail -2 "$TMP/$db.err")"
done
grep -q "simulated: no weights" "$TMP/a.err" || fail "the run header does not say simulated"
grep -q "5425 blocks" "$TMP/a.err" || fail "pool sizing not printed: $(grep pool "$TMP/a.err")"
grep -q "sim:llama-3.1-8b" "$TMP/a.out" || fail "the table does not name the sim model"
q="select name, value from summary where name in ('e2e_p95','ttft_p95','throughput_tok_s','blocks_mean','moves') order by run_id, name"
[[ "$(sqlite3 "$TMP/a.db" "$q")" == "$(sqlite3 "$TMP/b.db" "$q")" ]] \
  || fail "two identical sim runs differ"
[[ "$(sqlite3 "$TMP/a.db" "select count(*) from runs where status='completed'")" == 3 ]] \
  || fail "not 3 completed runs"
[[ "$(sqlite3 "$TMP/a.db" "select count(*) from summary where name='violations' and value = 0")" == 3 ]] \
  || fail "violations in a sim run"
[[ "$(sqlite3 "$TMP/a.db" "select value > 0 from summary s join runs r on r.id = s.run_id where r.mode='vtoken' and name='moves'")" == 1 ]] \
  || fail "the sim vtoken run moved nothing"

# Record a vt-tiny run's signals, replay them in the sim: the same evictions and block figures.
bash scripts/make-corpus.sh build/corpus >/dev/null || fail "corpus"
"$CLI" run experiments/quickstart.toml --db "$TMP/real.db" --set workload.num_requests=6 \
  --set 'modes=["naive","vtoken"]' --set engine.async_copies=false \
  --record-signals "$TMP/q.trace" >/dev/null 2>"$TMP/real.err" || fail "recording exited $?: $(tail -2 "$TMP/real.err")"
"$CLI" run experiments/quickstart.toml --db "$TMP/replay.db" --set workload.num_requests=6 \
  --set 'modes=["naive","vtoken"]' --set "model.path=\"sim:models/vt-tiny/config.json\"" \
  --set workload.corpus=\"\" --set "sim.attention=\"trace:$TMP/q.trace\"" --set sim.dtype=float32 \
  >/dev/null 2>"$TMP/replay.err" || fail "replay exited $?: $(tail -2 "$TMP/replay.err")"
q="select r.mode, s.name, s.value from summary s join runs r on r.id = s.run_id where s.name in ('evictions','moves','blocks_mean','blocks_final_mean','waste_ratio_mean','peak_running','util_hist_0') order by r.mode, s.name"
[[ "$(sqlite3 "$TMP/real.db" "$q")" == "$(sqlite3 "$TMP/replay.db" "$q")" ]] \
  || fail "trace replay differs from the recorded run: $(diff <(sqlite3 "$TMP/real.db" "$q") <(sqlite3 "$TMP/replay.db" "$q") | head -4)"
"$CLI" fit-signals "$TMP/q.trace" >"$TMP/fit.out" 2>&1 || fail "fit-signals exited $?"
grep -q "recency_exponent = " "$TMP/fit.out" || fail "fit-signals printed no parameters"

# sim.policy_time and sim.schedule_time: recorded only when measured, so configs from before the
# keys keep their hash.
"$CLI" run "$TMP/sim.toml" --dry-run >"$TMP/plain.dry" 2>/dev/null || fail "dry run"
for key in policy_time schedule_time; do
  "$CLI" run "$TMP/sim.toml" --set sim.$key=none --dry-run >"$TMP/none.dry" 2>/dev/null \
    || fail "dry run with $key none"
  cmp -s "$TMP/plain.dry" "$TMP/none.dry" || fail "$key = none changed the resolved config"
  "$CLI" run "$TMP/sim.toml" --set sim.$key=measured --dry-run >"$TMP/measured.dry" \
    2>/dev/null || fail "dry run with $key measured"
  grep -q "$key = .measured." "$TMP/measured.dry" \
    || fail "$key = measured is not in the resolved config"
  expect_error "sim.$key" run "$TMP/sim.toml" --set sim.$key=wall
done
expect_error "needs a sim: model" run experiments/quickstart.toml --set sim.dtype=float32
expect_error "needs a sim: model" run experiments/quickstart.toml --set engine.gpu_memory_utilization=0.5
expect_error "unknown hardware 'tpu-v9'" run "$TMP/sim.toml" --set sim.hardware.preset=tpu-v9
expect_error "sim.attention" run "$TMP/sim.toml" --set sim.attention=oracle
expect_error "signal trace $TMP/none.trace not found" run "$TMP/sim.toml" --set "sim.attention=\"trace:$TMP/none.trace\""
expect_error "leaves no KV block" run "$TMP/sim.toml" --set engine.gpu_memory_utilization=0.1
expect_error "engine.num_blocks. = 100 disagrees with the" run "$TMP/sim.toml" --set engine.num_blocks=100
expect_error "unknown key 'sim.hardware.hbm'" run "$TMP/sim.toml" --set sim.hardware.hbm=3
expect_error "memory_efficiency" run "$TMP/sim.toml" --set sim.hardware.memory_efficiency=2.0
expect_error "sim.parametric.noise_sigma" run "$TMP/sim.toml" --set sim.parametric.noise_sigma=-1
expect_error "unknown model 'gpt-5'\|gpt-5" run "$TMP/sim.toml" --set model.path=sim:gpt-5
expect_error "needs a real model" run "$TMP/sim.toml" --record-signals "$TMP/x.trace"
expect_error "max_batched_tokens" run "$TMP/sim.toml" --set engine.max_batched_tokens=2
printf 'not a trace' >"$TMP/junk.trace"
"$CLI" fit-signals "$TMP/junk.trace" >/dev/null 2>"$TMP/fit.err" && fail "fit-signals accepted junk"
grep -q "bad magic" "$TMP/fit.err" || fail "fit-signals error: $(cat "$TMP/fit.err")"

# A grid with [[sweep.exclude]] and [[sweep.add]] (docs/SWEEPS.md): PyramidKV needs per-layer or
# per-head liveness, so (token, pyramid) is left out, and a layer-granularity point is added after
# the product's. The dry run validates every point and lists them in that order.
cp "$TMP/sim.toml" "$TMP/grid.toml"
cat >>"$TMP/grid.toml" <<'TOML'
[sweep.grid]
"cache.granularity" = ["token", "head"]
"policy.budget_allocation" = ["uniform", "pyramid"]
[[sweep.exclude]]
"cache.granularity" = "token"
"policy.budget_allocation" = "pyramid"
[[sweep.add]]
"cache.granularity" = "layer"
TOML
"$CLI" sweep "$TMP/grid.toml" --db "$TMP/grid.db" --dry-run >"$TMP/grid.out" 2>"$TMP/grid.err" \
  || fail "sweep --dry-run with exclude and add exited $?: $(tail -2 "$TMP/grid.err")"
points=$(sed -n "s/^ *[0-9][0-9]* .*\(cache\.granularity='[a-z]*'\(, policy\.budget_allocation='[a-z]*'\)\{0,1\}\).*/\1/p" \
  "$TMP/grid.out")
expected="cache.granularity='token', policy.budget_allocation='uniform'
cache.granularity='head', policy.budget_allocation='uniform'
cache.granularity='head', policy.budget_allocation='pyramid'
cache.granularity='layer'"
[[ "$points" == "$expected" ]] || fail "sweep points with exclude and add: $(cat "$TMP/grid.out")"
[[ ! -e "$TMP/grid.db" ]] || fail "sweep --dry-run created its database"
# An existing database written by an older build is read as it is: a dry run migrates nothing
# (an older binary sweeping into it would then refuse the file).
cp tests/fixtures/results_v4.db "$TMP/old.db"
"$CLI" sweep "$TMP/grid.toml" --db "$TMP/old.db" --dry-run >/dev/null 2>"$TMP/old.err" \
  || fail "sweep --dry-run on an older database exited $?: $(tail -2 "$TMP/old.err")"
cmp -s tests/fixtures/results_v4.db "$TMP/old.db" || fail "sweep --dry-run changed an older database"

finish "sim cli"

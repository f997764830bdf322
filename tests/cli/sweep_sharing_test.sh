#!/usr/bin/env bash
# Per-policy parameter tables and shared runs in a sweep: a grid over policy.name x
# policy.params.decayed_attention.decay x 2 seeds on vt-tiny runs native once per seed (native
# records no [policy] / [reclaim]), h2o once per seed (the decay does not apply to it) and
# decayed_attention once per decay and seed; every vtoken run is scored against its native
# baseline (also at layer granularity); the applied parameter is recorded as policy.params.decay; `report` shows the points
# as mean ± 95% CI over 2 seeds; bad per-policy tables give one error line and no database.
# Usage: sweep_sharing_test.sh VTOKEN_CLI SOURCE_DIR
source "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh" "$@"
bash scripts/make-corpus.sh build/corpus >/dev/null || fail "corpus"

cat >"$TMP/s.toml" <<'TOML'
name = "sharing"
modes = ["native", "vtoken"]
[model]
path = "models/vt-tiny"
[workload]
kind = "longbench_like"
num_requests = 2
input_min = 64
input_max = 96
output_min = 6
output_max = 8
arrival = "all"
corpus = "build/corpus/kjv.txt"
[engine]
num_blocks = 32
max_num_seqs = 2
[policy]
name = "h2o"
keep_ratio = 0.5
[sweep]
seeds = [1, 2]
[sweep.grid]
"policy.name" = ["h2o", "decayed_attention"]
"policy.params.decayed_attention.decay" = [0.5, 0.75]
TOML

# runs DB WHERE: the number of completed runs matching the SQL condition.
runs() { sqlite3 "$1" "select count(*) from runs where status = 'completed' and ($2)"; }

"$CLI" sweep "$TMP/s.toml" --db "$TMP/s.db" --dry-run >"$TMP/dry.out" 2>&1 || fail "dry run: $(tail -2 "$TMP/dry.out")"
# 8 points (2 policies x 2 decays x 2 seeds); h2o at decay 0.75 shares everything with 0.5.
grep -q "policy.params.decayed_attention.decay=0.75" "$TMP/dry.out" \
  || fail "grid values are not in their shortest form: $(cat "$TMP/dry.out")"
[[ $(grep -c "native: point" "$TMP/dry.out") -eq 6 ]] \
  || fail "dry run: not 6 points sharing their native run: $(cat "$TMP/dry.out")"
[[ $(grep -c "vtoken: point" "$TMP/dry.out") -eq 2 ]] \
  || fail "dry run: not 2 h2o points sharing their vtoken run: $(cat "$TMP/dry.out")"

"$CLI" sweep "$TMP/s.toml" --db "$TMP/s.db" --jobs 2 >"$TMP/sweep.out" 2>"$TMP/sweep.err" \
  || fail "sweep exited $?: $(tail -3 "$TMP/sweep.err")"
[[ $(runs "$TMP/s.db" "mode = 'native'") -eq 2 ]] || fail "native ran $(runs "$TMP/s.db" "mode = 'native'") times, not once per seed"
[[ $(runs "$TMP/s.db" "policy = 'h2o'") -eq 2 ]] || fail "h2o ran $(runs "$TMP/s.db" "policy = 'h2o'") times, not once per seed"
[[ $(runs "$TMP/s.db" "policy = 'decayed_attention'") -eq 4 ]] || fail "decayed_attention did not run 4 times"
[[ $(runs "$TMP/s.db" "mode = 'native' and config_toml like '%[policy]%'") -eq 0 ]] \
  || fail "a native run records [policy]"
[[ $(runs "$TMP/s.db" "policy = 'decayed_attention' and config_toml like '%decay = 0.75%'") -eq 2 ]] \
  || fail "the applied decay is not recorded as policy.params.decay"
[[ $(runs "$TMP/s.db" "policy = 'h2o' and config_toml like '%decay%'") -eq 0 ]] \
  || fail "h2o records decayed_attention's parameter"
scored=$(sqlite3 "$TMP/s.db" "select count(*) from summary s join runs r on r.id = s.run_id
  where r.mode = 'vtoken' and s.name = 'rouge_l_vs_native' and s.value between 0 and 1")
[[ $scored -eq 6 ]] || fail "$scored of 6 vtoken runs are scored against their native run"
# Each request's ROUGE-L is stored with it (schema 5): both requests of every run, and the run's
# summary figure is their mean.
stored=$(sqlite3 "$TMP/s.db" "select count(*) from requests q join runs r on r.id = q.run_id
  where q.rouge_l_vs_native between 0 and 1 and (r.mode = 'vtoken' or q.rouge_l_vs_native = 1)
    and q.rouge_l_vs_naive is null and q.rouge_l_vs_reference is null")
[[ $stored -eq 16 ]] || fail "$stored of 16 requests store their ROUGE-L vs native"
off=$(sqlite3 "$TMP/s.db" "select count(*) from summary s where s.name = 'rouge_l_vs_native' and
  abs(s.value - (select avg(q.rouge_l_vs_native) from requests q where q.run_id = s.run_id)) > 1e-9")
[[ $off -eq 0 ]] || fail "$off runs' rouge_l_vs_native is not the mean of their requests'"
# ... and its interval over them: t(0.975, 1) * |a - b| / 2 for two requests a, b.
off=$(sqlite3 "$TMP/s.db" "select count(*) from runs r where r.status = 'completed' and not exists
  (select 1 from summary s where s.run_id = r.id and s.name = 'rouge_l_vs_native_ci95' and
   abs(s.value - 12.706 * abs((select max(rouge_l_vs_native) - min(rouge_l_vs_native) from requests
   q where q.run_id = r.id)) / 2) < 1e-9)")
[[ $off -eq 0 ]] || fail "$off runs lack rouge_l_vs_native_ci95 over their two requests"
# The same at layer granularity (the run splits the pool into KV-group blocks; the shared native
# run is still found, by the config as recorded): every vtoken run scored against it.
"$CLI" sweep "$TMP/s.toml" --db "$TMP/layer.db" --set cache.granularity=layer >"$TMP/layer.out" \
  2>"$TMP/layer.err" || fail "layer sweep exited $?: $(tail -3 "$TMP/layer.err")"
[[ $(runs "$TMP/layer.db" "mode = 'native'") -eq 2 ]] || fail "layer sweep: native not once per seed"
scored=$(sqlite3 "$TMP/layer.db" "select count(*) from summary s join runs r on r.id = s.run_id
  where r.mode = 'vtoken' and s.name = 'rouge_l_vs_native' and s.value between 0 and 1")
[[ $scored -eq 6 ]] || fail "layer sweep: $scored of 6 vtoken runs are scored against their native run"
# A second sweep over the same grid with --resume runs nothing.
"$CLI" sweep "$TMP/s.toml" --db "$TMP/s.db" --resume >"$TMP/resume.out" 2>&1 || fail "resume failed"
grep -q "done 0, skipped 8, failed 0 of 8 points" "$TMP/resume.out" || fail "resume: $(tail -1 "$TMP/resume.out")"

"$CLI" report --db "$TMP/s.db" --sweep sharing --no-figures >"$TMP/report.out" 2>&1 || fail "report failed"
grep -q "8 completed runs (4 points over their seeds: mean ± 95% CI)" "$TMP/report.out" \
  || fail "report header: $(grep completed "$TMP/report.out")"
grep -Eq "^\| [0-9]+ [0-9]+ \| 2 \| vtoken \| decayed_attention \|" "$TMP/report.out" \
  || fail "report has no 2-seed decayed_attention point: $(cat "$TMP/report.out")"
grep -q " ± " "$TMP/report.out" || fail "report shows no confidence interval"
# Native records no [policy] and has no say on the grid keys: only the applied decay varies.
grep -q "grid keys: policy.params.decay\.$" "$TMP/report.out" \
  || fail "report grid keys: $(grep -o 'grid keys: .*' "$TMP/report.out")"

expect_error "table 'policy.params.nope' is not a policy's" run "$TMP/s.toml" --set policy.params.nope.x=1
expect_error "policy.params.decayed_attention" run "$TMP/s.toml" --set policy.params.decayed_attention.bogus=1
expect_error "is given twice" run "$TMP/s.toml" --set policy.params.decay=0.5 \
  --set policy.name=decayed_attention --set policy.params.decayed_attention.decay=0.25
finish sweep_sharing

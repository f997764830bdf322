#!/usr/bin/env bash
# Released dataset formats through `vtoken-cli run` on vt-tiny: LongBench JSONL lines (context,
# input, answers) with prompts longer than the model's context cut from the middle, and a ShareGPT
# JSON array; both complete, report ROUGE-L against their references, and the LongBench run's
# header counts the cut prompts.
# Usage: datasets_cli_test.sh VTOKEN_CLI SOURCE_DIR
source "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh" "$@"
bash scripts/make-corpus.sh build/corpus >/dev/null || fail "corpus"

python3 - "$TMP" <<'PY'
import json, sys
tmp = sys.argv[1]
text = open("build/corpus/kjv.txt", encoding="utf-8").read()
with open(f"{tmp}/lb.jsonl", "w") as f:
    for i, (start, size) in enumerate([(1000, 8000), (50000, 900), (90000, 12000)]):
        f.write(json.dumps({"input": "Who spake unto Moses?", "context": text[start:start + size],
                            "answers": ["the LORD"], "length": size // 5, "dataset": "narrativeqa",
                            "language": "en", "all_classes": None, "_id": str(i)}) + "\n")
with open(f"{tmp}/sharegpt.json", "w") as f:
    json.dump([{"id": "a", "conversations": [{"from": "human", "value": text[2000:2600]},
                                             {"from": "gpt", "value": text[2600:2700]}]},
               {"id": "b", "conversations": [{"from": "human", "value": text[7000:7400]},
                                             {"from": "gpt", "value": text[7400:7480]}]}], f)
PY

cat >"$TMP/d.toml" <<'TOML'
name = "datasets_cli"
modes = ["naive", "vtoken"]
[model]
path = "models/vt-tiny"
[workload]
kind = "jsonl"
num_requests = 0
max_total_tokens = 1023
jsonl_default_max_tokens = 24
[engine]
num_blocks = 256
max_num_seqs = 4
verify = true
[policy]
name = "h2o"
keep_ratio = 0.25
TOML
"$CLI" run "$TMP/d.toml" --set workload.jsonl="'$TMP/lb.jsonl'" --set workload.truncate=middle \
  --db "$TMP/lb.db" >"$TMP/lb.out" 2>"$TMP/lb.err" || fail "LongBench run exited $?: $(tail -2 "$TMP/lb.err")"
grep -q 'workload: 2 of 3 prompts longer than workload.max_total_tokens allows (longest [0-9]* tokens) were cut (truncate = "middle")' "$TMP/lb.err" \
  || fail "the header does not count the cut prompts: $(grep workload "$TMP/lb.err")"
[[ "$(sqlite3 "$TMP/lb.db" "select count(*) from runs where status='completed'")" == 2 ]] || fail "LongBench: not 2 completed runs"
[[ "$(sqlite3 "$TMP/lb.db" "select count(*) from summary where name='rouge_l_vs_reference' and value >= 0 and value <= 1")" == 2 ]] \
  || fail "LongBench: no ROUGE-L against the answers"
"$CLI" run "$TMP/d.toml" --set workload.jsonl="'$TMP/sharegpt.json'" --db "$TMP/sg.db" \
  >"$TMP/sg.out" 2>"$TMP/sg.err" || fail "ShareGPT run exited $?: $(tail -2 "$TMP/sg.err")"
[[ "$(sqlite3 "$TMP/sg.db" "select count(*) from requests r join runs u on u.id = r.run_id where u.mode='naive'")" == 2 ]] \
  || fail "ShareGPT: not 2 requests"
[[ "$(sqlite3 "$TMP/sg.db" "select count(*) from summary where name='rouge_l_vs_reference' and value >= 0")" == 2 ]] \
  || fail "ShareGPT: no ROUGE-L against the gpt turns"
expect_error "key 'workload.truncate' = start: expected end or middle" run "$TMP/d.toml" \
  --set workload.jsonl="'$TMP/lb.jsonl'" --set workload.truncate=start

finish datasets_cli

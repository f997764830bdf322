#!/usr/bin/env bash
# Long-context tasks on the real model through the command line (the `smollm2` fixture fetches
# it; docs/TASKS.md):
#   - `tasks` writes the instances as JSON lines: one per request, lengths 99-100% of
#     context_tokens in the model's tokens, the answers in the prompt, readable back by kind jsonl;
#   - `run` scores every request: SmolLM2 finds a pass key in 512 tokens with a full cache
#     (accuracy 1.000, 0 +- 0), and the comparison table shows the accuracy row;
#   - query_agnostic runs in naive and vtoken with the same outputs;
#   - kind perplexity: a StreamingLLM cache of 64 tokens raises the NLL over the full cache;
#   - report takes a point's accuracy interval over its requests, across seeds;
#   - bad task settings are one-line errors that create no database.
# Usage: tasks_smollm2_cli_test.sh VTOKEN_CLI SOURCE_DIR
source "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh" "$@"
bash scripts/make-corpus.sh build/corpus >/dev/null || fail "corpus"

cat >"$TMP/t.toml" <<'TOML'
name = "tasks_cli"
modes = ["native"]
[model]
path = "smollm2-135m"
[workload]
kind = "task"
task = "passkey"
context_tokens = 512
depths = [0.0, 0.5, 1.0]
num_requests = 3
chat = true
corpus = "build/corpus/kjv.txt"
[engine]
num_blocks = 256
block_size = 16
stop_at_eos = true
[policy]
name = "h2o"
keep_ratio = 0.5
num_sink = 4
num_recent = 16
TOML

# The instances as JSON lines.
"$CLI" tasks "$TMP/t.toml" --set workload.task='"niah_multikey"' --set workload.filler='"corpus"' \
  --out "$TMP/t.jsonl" 2>"$TMP/tasks.err" || fail "tasks: $(cat "$TMP/tasks.err")"
python3 - "$TMP/t.jsonl" <<'PY' || fail "tasks JSONL"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len(lines) == 3, len(lines)
for i, j in enumerate(lines):
    assert j["id"] == i and j["task"] == "niah_multikey" and j["context_tokens"] == 512, j
    assert 512 - 16 <= j["input_tokens"] <= 512, j["input_tokens"]
    assert j["depth"] == [0.0, 0.5, 1.0][i] and abs(j["needle_depth"] - j["depth"]) <= 0.01, j
    assert j["answers"][0] in j["context"] and j["prompt"] == j["context"] + j["question"], j
    assert "<|im_start|>" not in j["prompt"]  # raw text: a reader applies its own template
print("tasks JSONL ok")
PY
# ... and read back by kind jsonl: the same prompts, the answer as the reference.
"$CLI" run "$TMP/t.toml" --db "$TMP/back.db" --set workload.kind='"jsonl"' \
  --set workload.jsonl="\"$TMP/t.jsonl\"" --dry-run >/dev/null 2>"$TMP/back.err" ||
  fail "jsonl read-back: $(tail -2 "$TMP/back.err")"

# A full cache finds every pass key.
"$CLI" run "$TMP/t.toml" --db "$TMP/t.db" >"$TMP/run.out" 2>"$TMP/run.err" ||
  fail "run: $(tail -3 "$TMP/run.err")"
grep -E "^task accuracy +1\.000$" "$TMP/run.out" || fail "accuracy: $(grep accuracy "$TMP/run.out")"
grep -E "^task accuracy 95% CI \(\+-\) +0\.000$" "$TMP/run.out" || fail "no CI row"
[[ $(sqlite3 "$TMP/t.db" "select value from summary where name = 'task_accuracy'") == 1.0 ]] ||
  fail "task_accuracy not recorded"
# Each request's task, depth, expected answer and score, in the requests table.
rows=$(sqlite3 "$TMP/t.db" "select task, context_tokens, depth, abs(needle_depth - depth) <= 0.01,
  json_array_length(expected), score from requests order by request_id" | tr '\n' ' ')
[[ $rows == "passkey|512|0.0|1|1|1.0 passkey|512|0.5|1|1|1.0 passkey|512|1.0|1|1|1.0 " ]] ||
  fail "request rows: $rows"

# Query-agnostic: the question after the eviction; naive and vtoken give the same outputs.
"$CLI" run "$TMP/t.toml" --db "$TMP/qa.db" --set 'modes=["naive","vtoken"]' \
  --set workload.protocol='"query_agnostic"' >"$TMP/qa.out" 2>"$TMP/qa.err" ||
  fail "query_agnostic: $(tail -3 "$TMP/qa.err")"
grep -q "^task accuracy " "$TMP/qa.out" || fail "query_agnostic: no accuracy row"
same_outputs "$TMP/qa.db" || fail "query_agnostic: naive and vtoken outputs differ"

# Perplexity under eviction: one prompt token, 255 forced; a 64-token StreamingLLM cache scores
# the same text worse than the full cache.
"$CLI" run "$TMP/t.toml" --db "$TMP/ppl.db" --set 'modes=["native","naive"]' \
  --set workload.kind='"perplexity"' --set workload.context_tokens=256 --set workload.chat=false \
  --set workload.num_requests=2 --set policy.name='"streaming_llm"' --set policy.keep_ratio=0 \
  --set policy.budget_tokens=64 >"$TMP/ppl.out" 2>"$TMP/ppl.err" ||
  fail "perplexity: $(tail -3 "$TMP/ppl.err")"
grep -E "^perplexity " "$TMP/ppl.out" || fail "no perplexity row"
worse=$(sqlite3 "$TMP/ppl.db" "select (select value from summary s join runs r on r.id = s.run_id
  where r.mode = 'naive' and s.name = 'nll_mean') > (select value from summary s join runs r
  on r.id = s.run_id where r.mode = 'native' and s.name = 'nll_mean')")
[[ $worse == 1 ]] || fail "evicting did not raise the NLL"
# Per request its mean NLL, per forced token its log-probability.
per=$(sqlite3 "$TMP/ppl.db" "select count(*), sum(json_array_length(o.token_logprobs) = 255),
  sum(q.nll_mean > 0) from outputs o join requests q using (run_id, request_id)")
[[ $per == "4|4|4" ]] || fail "per-token log-probabilities: $per"
expect_error "give the cache size as policy.budget_tokens" run "$TMP/t.toml" \
  --set 'modes=["naive"]' --set workload.kind='"perplexity"' --set workload.chat=false

# report: a point's accuracy interval is over the requests of all its seeds (8 here), not over
# the 2 seeds' means. vt-tiny (fast) runs, then the scores are set: seed 1 scores 1, 1, 0, 0 and
# seed 2 all 1: 0.75 +- t(0.975, 7) * s / sqrt(8) = 0.387 (over the two means it would be 3.18).
cat >"$TMP/vt.toml" <<'TOML'
name = "vt_tasks"
modes = ["native"]
[model]
path = "models/vt-tiny"
[workload]
kind = "task"
task = "passkey"
context_tokens = 400
num_requests = 4
[engine]
num_blocks = 128
[sweep]
name = "vt_tasks"
[sweep.grid]
seed = [1, 2]
TOML
"$CLI" sweep "$TMP/vt.toml" --db "$TMP/vt.db" >/dev/null 2>"$TMP/vt.err" || fail "vt-tiny sweep: $(tail -2 "$TMP/vt.err")"
sqlite3 "$TMP/vt.db" "update requests set score = case when run_id = (select min(id) from runs)
  and request_id >= 2 then 0.0 else 1.0 end"
"$CLI" report --db "$TMP/vt.db" --sweep vt_tasks --out "$TMP/vt_report" >"$TMP/vt_report.md" 2>&1 ||
  fail "report: $(tail -2 "$TMP/vt_report.md")"
grep -q "| 0.750 ± 0.387 |" "$TMP/vt_report.md" || fail "accuracy interval: $(grep -m1 '| 1 2 |' "$TMP/vt_report.md")"

# Bad task settings: one line, no database.
expect_error "unknown task (known: passkey," run "$TMP/t.toml" --set workload.task='"needle"'
expect_error "key 'workload.context_tokens' = 64: must be in \[128," run "$TMP/t.toml" \
  --set workload.context_tokens=64
expect_error "the model's context is 8192" run "$TMP/t.toml" --set workload.context_tokens=9000
expect_error "key 'workload.depths' = 2: must be in \[0, 1\]" run "$TMP/t.toml" --set 'workload.depths=[0.5, 2]'
expect_error "needs admission reserve" run "$TMP/t.toml" --set engine.admission='"greedy"' \
  --set workload.protocol='"query_agnostic"'
expect_error "protocol" run "$TMP/t.toml" --set workload.protocol='"sideways"'
expect_error "kind task needs a model with a tokenizer" run "$TMP/t.toml" \
  --set model.path='"synthetic:llama-3.1-8b"' --set model.dtype='"bfloat16"' --set workload.chat=false \
  --dry-run
"$CLI" tasks experiments/quickstart.toml --out "$TMP/none.jsonl" 2>"$TMP/none.err" &&
  fail "tasks on a non-task config exited 0"
grep -q 'not "task"' "$TMP/none.err" || fail "tasks error: $(cat "$TMP/none.err")"
[[ ! -e $TMP/none.jsonl ]] || fail "tasks wrote a file on error"

finish tasks_smollm2_cli

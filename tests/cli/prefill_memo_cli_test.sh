#!/usr/bin/env bash
# The prefill memo (lib/engine/prefill_memo.h) on vt-tiny: a sweep over policies and keep ratios
# in native, naive and vtoken mode, at token and at head granularity, gives the same outputs,
# per-request blocks and per-step pool figures with --prefill-memo as with --no-prefill-memo, and
# with the memo every run after the first restores its whole prompt prefill; by default only task
# workloads use it, and compare shows no times for the runs that restored; --prefill-memo-cache
# serves a later invocation the same way.
# Usage: prefill_memo_cli_test.sh VTOKEN_CLI SOURCE_DIR
source "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh" "$@"
bash scripts/make-corpus.sh build/corpus >/dev/null || fail "corpus"

cat >"$TMP/m.toml" <<'TOML'
name = "memo"
modes = ["native", "naive", "vtoken"]
[model]
path = "models/vt-tiny"
[workload]
kind = "longbench_like"
num_requests = 4
input_min = 150
input_max = 260
output_min = 8
output_max = 12
arrival = "all"
corpus = "build/corpus/kjv.txt"
[engine]
num_blocks = 64
max_num_seqs = 3
max_prefill_chunk = 64
[policy]
name = "h2o"
keep_ratio = 0.5
[sweep.grid]
"policy.name" = ["h2o", "knorm", "snapkv", "streaming_llm"]
"policy.keep_ratio" = [0.5, 0.25]
TOML

# facts DB: every recorded fact of every run that the memo must not change, one line per row,
# runs matched by (mode, config hash); times left out.
facts() {
  sqlite3 "$1" "
    select r.mode, r.config_hash, q.request_id, q.prompt_tokens, q.output_tokens, q.preemptions,
           q.blocks_mean, q.blocks_final, q.ideal_blocks_final
      from requests q join runs r on r.id = q.run_id order by r.config_hash, r.mode, q.request_id;
    select r.mode, r.config_hash, o.request_id, o.text
      from outputs o join runs r on r.id = o.run_id order by r.config_hash, r.mode, o.request_id;
    select r.mode, r.config_hash, s.step, s.num_running, s.allocated_blocks, s.waste_ratio
      from steps s join runs r on r.id = s.run_id order by r.config_hash, r.mode, s.step;
    select r.mode, r.config_hash, m.name, m.value from summary m join runs r on r.id = m.run_id
      where m.name like 'rouge%' or m.name like 'blocks%' or m.name like 'peak%'
      order by r.config_hash, r.mode, m.name;"
}

# restored DB: each run's prefill_restored_tokens, in run order, space-separated.
restored() {
  sqlite3 "$1" "select group_concat(cast(m.value as int), ' ') from summary m join runs r
    on r.id = m.run_id where m.name = 'prefill_restored_tokens' order by r.id"
}
# prompt_tokens DB: the prompt tokens of the native run's requests, with the BOS token the engine
# puts before each prompt.
prompt_tokens() {
  sqlite3 "$1" "select sum(prompt_tokens) + count(*) from requests q join runs r
    on r.id = q.run_id where r.mode = 'native'"
}

for gran in token head; do
  sets=(--set "cache.granularity=\"$gran\"")
  "$CLI" sweep "$TMP/m.toml" --db "$TMP/on-$gran.db" "${sets[@]}" --prefill-memo \
    >"$TMP/on.out" 2>"$TMP/on.err" \
    || fail "$gran: sweep with the memo exited $?: $(tail -3 "$TMP/on.err")"
  "$CLI" sweep "$TMP/m.toml" --db "$TMP/off-$gran.db" "${sets[@]}" --no-prefill-memo \
    >"$TMP/off.out" 2>"$TMP/off.err" \
    || fail "$gran: sweep without the memo exited $?: $(tail -3 "$TMP/off.err")"
  facts "$TMP/on-$gran.db" >"$TMP/on.facts"
  facts "$TMP/off-$gran.db" >"$TMP/off.facts"
  [[ $(wc -l <"$TMP/on.facts") -gt 100 ]] || fail "$gran: only $(wc -l <"$TMP/on.facts") facts"
  cmp -s "$TMP/on.facts" "$TMP/off.facts" \
    || fail "$gran: the memo changed results: $(diff "$TMP/on.facts" "$TMP/off.facts" | head -5)"
  # 1 native + 8 points x 2 modes; all but the first restore every prompt token (and the BOS
  # token the engine puts before each prompt).
  prompt=$(prompt_tokens "$TMP/on-$gran.db")
  restored=$(restored "$TMP/on-$gran.db")
  [[ "$restored" == "0$(printf " $prompt%.0s" {1..16})" ]] \
    || fail "$gran: restored tokens per run '$restored', want 0 then $prompt x 16"
  [[ -z $(sqlite3 "$TMP/off-$gran.db" "select 1 from summary where name =
             'prefill_restored_tokens'") ]] || fail "$gran: --no-prefill-memo recorded a memo figure"
  grep -q "differ from the memo" "$TMP/on.err" && fail "$gran: recomputed chunks differ: $(grep differ "$TMP/on.err" | head -2)"
done

# By default a longbench_like run computes every prefill; a task run restores them.
"$CLI" run "$TMP/m.toml" --db "$TMP/default.db" >"$TMP/run.out" 2>"$TMP/run.err" \
  || fail "run exited $?: $(tail -3 "$TMP/run.err")"
[[ -z $(sqlite3 "$TMP/default.db" "select 1 from summary where name = 'prefill_restored_tokens'") ]] \
  || fail "a longbench_like run used the memo by default"
grep -q "n/a" "$TMP/run.out" && fail "a run without the memo shows n/a times: $(cat "$TMP/run.out")"
cat >"$TMP/t.toml" <<'TOML'
name = "memo_task"
modes = ["native", "naive"]
[model]
path = "models/vt-tiny"
[workload]
kind = "task"
task = "passkey"
context_tokens = 200
num_requests = 2
[engine]
num_blocks = 64
max_prefill_chunk = 64
[policy]
name = "snapkv"
keep_ratio = 0.5
TOML
"$CLI" run "$TMP/t.toml" --db "$TMP/task.db" >"$TMP/task.out" 2>"$TMP/task.err" \
  || fail "task run exited $?: $(tail -3 "$TMP/task.err")"
restored=$(restored "$TMP/task.db")
prompt=$(prompt_tokens "$TMP/task.db")
[[ "$restored" == "0 $prompt" ]] || fail "task run: restored '$restored', want '0 $prompt'"
[[ $(sqlite3 "$TMP/task.db" "select group_concat(r.mode) from summary m join runs r on
      r.id = m.run_id where m.name in ('throughput_tok_s', 'ttft_p95', 'e2e_p95')") == \
   "native,native,native" ]] || fail "the restoring run recorded request times"
grep -q "^throughput (tok/s) .* n/a" "$TMP/task.out" \
  || fail "compare shows the restoring run's throughput: $(grep throughput "$TMP/task.out")"
grep -q "^n/a: the run restored" "$TMP/task.out" || fail "compare does not say what n/a means"

# --prefill-memo-cache keeps the memo across invocations: a second invocation (another policy)
# restores every prompt token, its native run's too, with the results of computing them.
cache="$TMP/cache"
"$CLI" run "$TMP/t.toml" --db "$TMP/c1.db" --prefill-memo-cache "$cache" >/dev/null \
  2>"$TMP/c1.err" || fail "cached run exited $?: $(tail -3 "$TMP/c1.err")"
grep -q "prefill memo $cache: 0 chunks" "$TMP/c1.err" || fail "new cache: $(grep memo "$TMP/c1.err")"
"$CLI" run "$TMP/t.toml" --db "$TMP/c2.db" --prefill-memo-cache "$cache" \
  --set policy.name='"knorm"' >/dev/null 2>"$TMP/c2.err" \
  || fail "second cached run exited $?: $(tail -3 "$TMP/c2.err")"
grep -q "prefill memo $cache: [1-9][0-9]* chunks" "$TMP/c2.err" \
  || fail "the cache held nothing: $(grep memo "$TMP/c2.err")"
restored=$(restored "$TMP/c2.db")
prompt=$(prompt_tokens "$TMP/c2.db")
[[ "$restored" == "$prompt $prompt" ]] || fail "second invocation restored '$restored', want '$prompt $prompt'"
"$CLI" run "$TMP/t.toml" --db "$TMP/c3.db" --no-prefill-memo --set policy.name='"knorm"' \
  >/dev/null 2>"$TMP/c3.err" || fail "uncached run exited $?: $(tail -3 "$TMP/c3.err")"
facts "$TMP/c2.db" >"$TMP/c2.facts"
facts "$TMP/c3.db" >"$TMP/c3.facts"
cmp -s "$TMP/c2.facts" "$TMP/c3.facts" \
  || fail "the cache changed results: $(diff "$TMP/c2.facts" "$TMP/c3.facts" | head -5)"
mkdir -p "$TMP/junk" && echo "not a memo" >"$TMP/junk/index"
expect_error "not a vtoken prefill memo's index" run "$TMP/t.toml" --prefill-memo-cache "$TMP/junk"
expect_error "contradict" run "$TMP/t.toml" --prefill-memo-cache "$cache" --no-prefill-memo
expect_error "contradict" run "$TMP/t.toml" --prefill-memo-cache "$cache" --prefill-memo-dir "$TMP"

expect_error "prefill-memo-gib must be > 0" run "$TMP/m.toml" --prefill-memo-gib 0
expect_error "contradict" run "$TMP/m.toml" --prefill-memo --no-prefill-memo
finish prefill_memo_cli

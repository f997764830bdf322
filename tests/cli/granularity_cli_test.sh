#!/usr/bin/env bash
# Per-layer / per-head KV groups from the command line (cache.granularity): on vt-tiny, head and
# layer runs complete with verification on, naive and vtoken produce identical outputs, vtoken
# moves group slots; on vt-tiny-gqa (2 KV heads per layer) head groups really differ from layer
# groups; a token-granularity config records no new keys (same config hash as before
# the feature); the simulated 8B shape runs per head; `check --granularity head` passes; bad
# combinations give one error line, a non-zero exit and no database.
# Usage: granularity_cli_test.sh VTOKEN_CLI SOURCE_DIR
source "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh" "$@"
bash scripts/make-corpus.sh build/corpus >/dev/null || fail "corpus"

cat >"$TMP/g.toml" <<'TOML'
name = "granularity_cli"
modes = ["naive", "vtoken"]
[model]
path = "models/vt-tiny"
[workload]
kind = "longbench_like"
num_requests = 6
input_min = 300
input_max = 400
output_min = 24
output_max = 32
arrival = "all"
corpus = "build/corpus/kjv.txt"
[engine]
num_blocks = 96
block_size = 16
headroom_blocks = 4
max_num_seqs = 6
verify = true
[policy]
name = "h2o"
keep_ratio = 0.25
num_sink = 4
num_recent = 16
[reclaim]
trigger = "always"
TOML
for g in layer head; do
  "$CLI" run "$TMP/g.toml" --set cache.granularity=$g --db "$TMP/$g.db" --sweep "g_$g" \
    >"$TMP/$g.out" 2>"$TMP/$g.err" \
    || fail "$g run exited $?: $(tail -2 "$TMP/$g.err")"
  grep -q "granularity $g" "$TMP/$g.err" || fail "$g: the run header does not name the granularity"
  [[ "$(sqlite3 "$TMP/$g.db" "select count(*) from runs where status='completed'")" == 2 ]] \
    || fail "$g: not 2 completed runs"
  [[ "$(sqlite3 "$TMP/$g.db" "select count(*) from summary where name='violations' and value = 0")" == 2 ]] \
    || fail "$g: verification found violations"
  [[ "$(sqlite3 "$TMP/$g.db" "select value from summary s join runs r on r.id = s.run_id where r.mode='vtoken' and name='kv_groups'")" == 6.0 ]] \
    || fail "$g: vt-tiny (6 layers, 1 KV head) should run 6 KV groups"
  [[ "$(sqlite3 "$TMP/$g.db" "select value > 0 from summary s join runs r on r.id = s.run_id where r.mode='vtoken' and name='moves'")" == 1 ]] \
    || fail "$g: the vtoken run moved nothing"
  same_outputs "$TMP/$g.db" || fail "$g: naive and vtoken outputs differ"
  # One unit, named: report's blocks per request are compare's token blocks, and both name the
  # granularity and the allocation.
  grep -q "^granularity / allocation .* $g / uniform" "$TMP/$g.out" \
    || fail "$g: compare does not name the granularity: $(grep granularity "$TMP/$g.out")"
  "$CLI" report --db "$TMP/$g.db" --sweep "g_$g" --no-figures >"$TMP/$g.report" 2>&1 \
    || fail "$g: report exited $?"
  compared=$(awk '/^blocks held \/ request \(mean\)/ {print $(NF - 1)}' "$TMP/$g.out")
  reported=$(awk -F' *\\| *' '$3 == "vtoken" && $5 == "'"$g"'" && $6 == "uniform" {print $7; exit}' \
    "$TMP/$g.report")
  [[ -n "$compared" && "$compared" == "$reported" ]] \
    || fail "$g: report's vtoken blocks/request '$reported' is not compare's '$compared'"
  grep -q "^Blocks are token blocks" "$TMP/$g.report" || fail "$g: report does not name its unit"
done
# Head and layer groups coincide on a model with one KV head: the same evictions, blocks, outputs.
q="select s.name, s.value from summary s join runs r on r.id = s.run_id where r.mode='naive' and s.name in ('evictions','blocks_mean','ideal_final_mean') order by s.name"
[[ "$(sqlite3 "$TMP/layer.db" "$q")" == "$(sqlite3 "$TMP/head.db" "$q")" ]] \
  || fail "layer and head runs differ on a one-KV-head model"
# Token granularity records what it recorded before KV groups existed.
"$CLI" run "$TMP/g.toml" --dry-run >"$TMP/token.dry" 2>/dev/null || fail "token dry run"
grep -q "^granularity =\|^budget_allocation =\|^\[cache\]" "$TMP/token.dry" \
  && fail "token granularity records new keys"
"$CLI" run "$TMP/g.toml" --set cache.granularity=head --dry-run >"$TMP/head.dry" 2>/dev/null
grep -q "^granularity = 'head'" "$TMP/head.dry" || fail "head granularity not in the resolved config"

# A trained model with 2 KV heads per layer (models/vt-tiny-gqa): head groups are half a layer's,
# so the head run evicts per head (12 groups, other victims than the layer run's 6), AdaKV splits
# a layer's budget between its heads, and vtoken still gives naive's outputs exactly.
for point in "layer uniform" "head uniform" "head adaptive"; do
  set -- $point
  "$CLI" run "$TMP/g.toml" --set model.path=models/vt-tiny-gqa --set cache.granularity=$1 \
    --set policy.budget_allocation=$2 --db "$TMP/gqa-$1-$2.db" >/dev/null 2>"$TMP/gqa.err" \
    || fail "vt-tiny-gqa $point run exited $?: $(tail -2 "$TMP/gqa.err")"
  db="$TMP/gqa-$1-$2.db"
  groups=$([[ $1 == head ]] && echo 12.0 || echo 6.0)
  [[ "$(sqlite3 "$db" "select count(*) from summary where name='kv_groups' and value = $groups")" == 2 ]] \
    || fail "vt-tiny-gqa $point: not $groups KV groups"
  [[ "$(sqlite3 "$db" "select count(*) from summary where name='violations' and value = 0")" == 2 ]] \
    || fail "vt-tiny-gqa $point: verification found violations"
  same_outputs "$db" || fail "vt-tiny-gqa $point: naive and vtoken outputs differ"
  # What the allocation kept where: per request, live tokens per layer (per KV head at head
  # granularity), summing to the live (token, group) entries at finish.
  python3 - "$db" "$1" <<'PY' || fail "vt-tiny-gqa $point: requests.live_per_group is wrong"
import json, sqlite3, sys
con = sqlite3.connect(sys.argv[1])
rows = con.execute("select r.mode, q.live_per_group from requests q join runs r on r.id = q.run_id").fetchall()
assert rows and all(v is not None for _, v in rows), rows
for mode, v in rows:
    groups = json.loads(v)
    assert len(groups) == 6, groups  # one entry per layer
    if sys.argv[2] == "head":
        assert all(isinstance(g, list) and len(g) == 2 for g in groups), groups
    else:
        assert all(isinstance(g, int) for g in groups), groups
for mode in ("naive", "vtoken"):
    total = [sum(sum(g) if isinstance(g, list) else g for g in json.loads(v))
             for m, v in rows if m == mode]
    (mean,) = con.execute("select value from summary s join runs r on r.id = s.run_id "
                          "where r.mode = ? and s.name = 'live_final_mean'", (mode,)).fetchone()
    assert abs(sum(total) / len(total) - mean) < 1e-9, (total, mean)
PY
done
"$CLI" run "$TMP/g.toml" --db "$TMP/token.db" >/dev/null 2>&1 || fail "token run exited $?"
[[ "$(sqlite3 "$TMP/token.db" "select count(*) from requests where live_per_group is null")" == 12 ]] \
  || fail "a token-granularity run records live_per_group"
[[ "$(outputs "$TMP/gqa-layer-uniform.db" naive)" != "$(outputs "$TMP/gqa-head-uniform.db" naive)" ]] \
  || fail "vt-tiny-gqa: per-head and per-layer budgets gave the same outputs"
[[ "$(outputs "$TMP/gqa-head-uniform.db" naive)" != "$(outputs "$TMP/gqa-head-adaptive.db" naive)" ]] \
  || fail "vt-tiny-gqa: adaptive and uniform head budgets gave the same outputs"

# Paper shape on the simulated backend, per head (256 groups), adaptive budgets.
cat >"$TMP/s.toml" <<'TOML'
name = "granularity_sim_cli"
[model]
path = "sim:llama-3.1-8b"
[workload]
kind = "longbench_like"
num_requests = 4
input_min = 1024
input_max = 2048
output_min = 16
output_max = 16
arrival = "all"
[engine]
num_blocks = 400
max_num_seqs = 4
max_prefill_chunk = 2048
verify = true
[cache]
granularity = "head"
[policy]
name = "h2o"
keep_ratio = 0.25
budget_allocation = "adaptive"
evict_interval = 4
TOML
"$CLI" run "$TMP/s.toml" --db "$TMP/s.db" >"$TMP/s.out" 2>"$TMP/s.err" \
  || fail "sim head run exited $?: $(tail -2 "$TMP/s.err")"
[[ "$(sqlite3 "$TMP/s.db" "select count(*) from summary where name='kv_groups' and value = 256")" == 3 ]] \
  || fail "the sim head run does not have 256 KV groups"
[[ "$(sqlite3 "$TMP/s.db" "select count(*) from summary where name='violations' and value = 0")" == 3 ]] \
  || fail "violations in the sim head run"

# The host-store check per head, with a policy and adaptive budgets.
"$CLI" check --granularity head --layers 4 --kv-heads 2 --steps 3000 --num-blocks 512 --async \
  --policy h2o --budget-allocation adaptive >"$TMP/check.out" 2>&1 || fail "check --granularity head: $(tail -3 "$TMP/check.out")"
grep -q "violations *0$" "$TMP/check.out" || fail "check reports violations"

# Bad combinations.
expect_error "needs cache.granularity" run "$TMP/g.toml" --set policy.budget_allocation=pyramid
expect_error "needs cache.granularity \"head\"" run "$TMP/g.toml" --set cache.granularity=layer \
  --set policy.budget_allocation=adaptive
expect_error "cache.granularity" run "$TMP/g.toml" --set cache.granularity=row
expect_error "pyramid_beta" run "$TMP/g.toml" --set cache.granularity=head \
  --set policy.budget_allocation=pyramid --set policy.pyramid_beta=0.5
expect_error "token-granularity" run "$TMP/s.toml" --set sim.attention=trace:/nonexistent.trace
"$CLI" check --granularity row >"$TMP/c.out" 2>&1 && fail "check --granularity row exited 0"
grep -q -- "--granularity: must be \"token\", \"layer\" or \"head\", got row" "$TMP/c.out" || fail "check --granularity row: $(cat "$TMP/c.out")"

finish granularity_cli

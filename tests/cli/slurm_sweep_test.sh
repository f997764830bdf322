#!/usr/bin/env bash
# experiments/slurm without Slurm: sweep.sbatch run by hand as each array task (the documented
# SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT way), then as the merge job, gives a database
# with exactly the completed runs (config hashes) of the same sweep run on one machine; the
# merge refuses, leaving no merged.db, when a shard failed, never ran or lacks a run; submit.sh
# submits the array 0..N-1 and an afterok merge (through a stand-in sbatch).
# Usage: slurm_sweep_test.sh VTOKEN_CLI SOURCE_DIR
source "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh" "$@"
bash scripts/make-corpus.sh build/corpus >/dev/null || fail "corpus"
SBATCH_SCRIPT=experiments/slurm/sweep.sbatch
export VTOKEN_CLI=$CLI

# 3 points, so the two shards differ in size (points 0, 2 and point 1).
cat >"$TMP/s.toml" <<'TOML'
name = "slurm_test"
modes = ["naive", "vtoken"]
[model]
path = "models/vt-tiny"
[workload]
kind = "longbench_like"
num_requests = 2
input_min = 96
input_max = 128
output_min = 8
output_max = 12
arrival = "all"
corpus = "build/corpus/kjv.txt"
[engine]
num_blocks = 32
max_num_seqs = 2
[policy]
name = "h2o"
keep_ratio = 0.25
[sweep.grid]
"engine.num_blocks" = [24, 32, 48]
TOML

# completed_hashes DB: the sorted config hashes of DB's completed runs, one a line.
completed_hashes() { sqlite3 "$1" "select config_hash from runs where status = 'completed' order by 1"; }

# run_shard OUTDIR I N: sweep.sbatch as array task I of N; its exit status.
run_shard() {
  SLURM_ARRAY_TASK_ID=$2 SLURM_ARRAY_TASK_COUNT=$3 bash "$SBATCH_SCRIPT" "$TMP/s.toml" "$1" \
    >"$1.shard-$2.log" 2>&1
}

# expect_merge_refused OUTDIR N PATTERN: the merge exits non-zero with one stderr line matching
# PATTERN and leaves neither merged.db nor a partial one.
expect_merge_refused() {
  bash "$SBATCH_SCRIPT" --merge "$2" "$TMP/s.toml" "$1" >/dev/null 2>"$TMP/merge.err" \
    && fail "merge of $1 exited 0"
  [[ $(wc -l <"$TMP/merge.err") -eq 1 ]] || fail "merge of $1: not one error line: $(cat "$TMP/merge.err")"
  grep -q "$3" "$TMP/merge.err" || fail "merge of $1: error lacks '$3': $(cat "$TMP/merge.err")"
  compgen -G "$1/merged.db*" >/dev/null && fail "merge of $1 left $(ls "$1"/merged.db*)"
  true
}

"$CLI" sweep "$TMP/s.toml" --db "$TMP/one.db" >/dev/null 2>"$TMP/one.err" \
  || fail "one-machine sweep exited $?: $(tail -1 "$TMP/one.err")"
completed_hashes "$TMP/one.db" >"$TMP/one.hashes"
[[ $(wc -l <"$TMP/one.hashes") -eq 6 && $(sort -u "$TMP/one.hashes" | wc -l) -eq 6 ]] \
  || fail "one machine: not 6 distinct completed runs: $(cat "$TMP/one.hashes")"

# Two shards and their merge: the same runs as on one machine.
for i in 0 1; do run_shard "$TMP/ok" $i 2 || fail "shard $i exited $?: $(tail -1 "$TMP/ok.shard-$i.log")"; done
[[ $(completed_hashes "$TMP/ok/shard-0.db" | wc -l) -eq 4 && $(completed_hashes "$TMP/ok/shard-1.db" | wc -l) -eq 2 ]] \
  || fail "shards hold $(completed_hashes "$TMP/ok/shard-0.db" | wc -l) + $(completed_hashes "$TMP/ok/shard-1.db" | wc -l) runs, not 4 + 2"
bash "$SBATCH_SCRIPT" --merge 2 "$TMP/s.toml" "$TMP/ok" >/dev/null 2>"$TMP/ok.merge.err" \
  || fail "merge exited $?: $(cat "$TMP/ok.merge.err")"
diff "$TMP/one.hashes" <(completed_hashes "$TMP/ok/merged.db") >/dev/null \
  || fail "merged runs differ from one machine's: $(diff "$TMP/one.hashes" <(completed_hashes "$TMP/ok/merged.db"))"
[[ ! -e "$TMP/ok/merged.db.partial" ]] || fail "merge left merged.db.partial"

# A failing shard: its status records the exit, and the merge refuses.
mkdir -p "$TMP/bad"
cp "$TMP/ok/shard-0.db" "$TMP/ok/shard-0.status" "$TMP/bad/"
VTOKEN_CLI=false run_shard "$TMP/bad" 1 2 && fail "a shard whose sweep fails exited 0"
grep -q "shard 1/2: vtoken-cli sweep exited 1" "$TMP/bad.shard-1.log" || fail "failing shard: $(cat "$TMP/bad.shard-1.log")"
[[ "$(cat "$TMP/bad/shard-1.status")" == 1 ]] || fail "failing shard's status is not 1"
expect_merge_refused "$TMP/bad" 2 "1 of 2 shards did not succeed (shard 1: exit 1); nothing merged"
expect_merge_refused "$TMP/bad" 3 "2 of 3 shards did not succeed (shard 1: exit 1; shard 2: no status"
# Rerun, the shard succeeds and the merge goes through.
run_shard "$TMP/bad" 1 2 || fail "rerun of shard 1 exited $?"
bash "$SBATCH_SCRIPT" --merge 2 "$TMP/s.toml" "$TMP/bad" >/dev/null 2>&1 || fail "merge after the rerun failed"
diff "$TMP/one.hashes" <(completed_hashes "$TMP/bad/merged.db") >/dev/null || fail "merge after the rerun: other runs"

# Every shard exited 0, but one of its runs is not completed: the merge sees the missing point.
mkdir -p "$TMP/gap"
cp "$TMP"/ok/shard-* "$TMP/gap/"
sqlite3 "$TMP/gap/shard-1.db" "update runs set status = 'failed' where mode = 'vtoken'"
expect_merge_refused "$TMP/gap" 2 "the merged shards lack runs of 1 points (1); nothing merged"

# Errors before anything runs.
VTOKEN_CLI=/nonexistent run_shard "$TMP/x" 0 2 && fail "a missing CLI exited 0"
grep -q "vtoken-cli '/nonexistent' not found" "$TMP/x.shard-0.log" || fail "missing CLI: $(cat "$TMP/x.shard-0.log")"
bash "$SBATCH_SCRIPT" "$TMP/s.toml" "$TMP/x" 2>"$TMP/x.err" && fail "outside an array task exited 0"
grep -q "not a job array task" "$TMP/x.err" || fail "outside an array task: $(cat "$TMP/x.err")"
SLURM_ARRAY_TASK_ID=0 SLURM_ARRAY_TASK_COUNT=2 bash "$SBATCH_SCRIPT" "$TMP/none.toml" "$TMP/x" 2>"$TMP/x.err" \
  && fail "a missing config exited 0"
grep -q "config '$TMP/none.toml': no such readable file" "$TMP/x.err" || fail "missing config: $(cat "$TMP/x.err")"

# submit.sh through a stand-in sbatch that logs its arguments and answers job ids 41, 42.
mkdir -p "$TMP/bin"
cat >"$TMP/bin/sbatch" <<'SH'
#!/usr/bin/env bash
n=$(($(cat "$SBATCH_LOG" 2>/dev/null | wc -l) + 41))
echo "$*" >>"$SBATCH_LOG"
echo "$n;cluster"
SH
chmod +x "$TMP/bin/sbatch"
export SBATCH_LOG=$TMP/sbatch.log
PATH=$TMP/bin:$PATH bash experiments/slurm/submit.sh "$TMP/s.toml" 2 "$TMP/sub" >"$TMP/sub.out" 2>&1 \
  || fail "submit.sh exited $?: $(cat "$TMP/sub.out")"
grep -q "array job 41 (2 shards of 3 points), merge job 42" "$TMP/sub.out" || fail "submit.sh said: $(cat "$TMP/sub.out")"
sed -n 1p "$SBATCH_LOG" | grep -q -- "--array=0-1 .*sweep.sbatch $TMP/s.toml $TMP/sub\$" || fail "array submission: $(sed -n 1p "$SBATCH_LOG")"
sed -n 2p "$SBATCH_LOG" | grep -q -- "--dependency=afterok:41 .*sweep.sbatch --merge 2 $TMP/s.toml $TMP/sub\$" \
  || fail "merge submission: $(sed -n 2p "$SBATCH_LOG")"
PATH=$TMP/bin:$PATH bash experiments/slurm/submit.sh "$TMP/s.toml" 4 "$TMP/sub" 2>"$TMP/sub.err" && fail "4 shards of 3 points exited 0"
grep -q "4 shards for 3 points: at most 3" "$TMP/sub.err" || fail "too many shards: $(cat "$TMP/sub.err")"
[[ $(wc -l <"$SBATCH_LOG") -eq 2 ]] || fail "a refused submit.sh called sbatch"

finish slurm_sweep

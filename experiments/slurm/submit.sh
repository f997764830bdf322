#!/usr/bin/env bash
# Submits one sweep to Slurm as N shards plus a merge (experiments/slurm/sweep.sbatch):
#   experiments/slurm/submit.sh CONFIG N OUTDIR [SWEEP OPTION...]
# e.g. experiments/slurm/submit.sh experiments/sweep_example.toml 2 results/slurm/sweep_example
# Validates the grid here first (`vtoken-cli sweep --dry-run`, so a bad config fails before
# anything is queued), then submits the array 0..N-1 and a merge job that runs only if every
# task succeeded (--dependency=afterok, and Slurm cancels it otherwise). Prints the two job ids;
# the result is OUTDIR/merged.db, the logs OUTDIR/shard-I.out and OUTDIR/merge.out.
#
# Run it from the directory the config's paths are relative to (the repository root for the
# bundled configs): the jobs run there. Cluster settings go through sbatch's own environment
# variables (SBATCH_PARTITION, SBATCH_TIMELIMIT, SBATCH_ACCOUNT, ...) or the #SBATCH lines of
# sweep.sbatch. VTOKEN_CLI names the binary (default: vtoken-cli on PATH); it must be reachable
# at the same path from the compute nodes.
set -u -o pipefail

die() {
  echo "submit.sh: error: $*" >&2
  exit 2
}

(($# >= 3)) || die "usage: submit.sh CONFIG N OUTDIR [SWEEP OPTION...]"
config=$1
num_shards=$2
outdir=$3
shift 3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

[[ -f "$config" && -r "$config" ]] || die "config '$config': no such readable file (working directory $PWD)"
[[ "$num_shards" =~ ^[1-9][0-9]*$ ]] || die "N: expected a positive shard count, got '$num_shards'"
cli=${VTOKEN_CLI:-vtoken-cli}
cli_path=$(type -P -- "$cli") || die "vtoken-cli '$cli' not found: set VTOKEN_CLI or put vtoken-cli on PATH"
[[ "$cli_path" == /* ]] || cli_path=$PWD/$cli_path
for opt in "$@"; do
  case "$opt" in
    --db | --db=* | --shard | --shard=* | --resume | --dry-run)
      die "$opt: set by sweep.sbatch itself; pass only options such as --set or --jobs" ;;
  esac
done
command -v sbatch >/dev/null || die "sbatch not found: is this a Slurm login node?"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

# The whole grid must validate, and every shard must get at least one point.
dry=$("$cli_path" sweep "$config" --dry-run --db "$(mktemp -u)" "$@" 2>&1) \
  || die "$config does not validate: $(grep -m1 error <<<"$dry" || tail -1 <<<"$dry")"
num_points=$(sed -n 's/^sweep .*: \([0-9]*\) of \([0-9]*\) points.*/\2/p' <<<"$dry" | head -1)
[[ -n "$num_points" ]] || die "cannot read the number of points from 'vtoken-cli sweep --dry-run'"
((num_shards <= num_points)) || die "$num_shards shards for $num_points points: at most $num_points"

mkdir -p -- "$outdir" || die "cannot create '$outdir'"
outdir=$(cd "$outdir" && pwd)
case "$config" in /*) ;; *) config=$PWD/$config ;; esac

common=(--parsable --chdir="$PWD" --export="ALL,VTOKEN_CLI=$cli_path")
array_job=$(sbatch "${common[@]}" --array="0-$((num_shards - 1))" --output="$outdir/shard-%a.out" \
  "$here/sweep.sbatch" "$config" "$outdir" "$@") || die "sbatch of the array failed"
array_job=${array_job%%;*}
merge_job=$(sbatch "${common[@]}" --dependency="afterok:$array_job" --kill-on-invalid-dep=yes \
  --job-name=vtoken-merge --output="$outdir/merge.out" \
  "$here/sweep.sbatch" --merge "$num_shards" "$config" "$outdir" "$@") || {
  scancel "$array_job"
  die "sbatch of the merge job failed; cancelled array job $array_job"
}
merge_job=${merge_job%%;*}
echo "submitted $config: array job $array_job ($num_shards shards of $num_points points), merge job $merge_job; result $outdir/merged.db"

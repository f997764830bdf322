#!/usr/bin/env bash
# Runs every paper-scale experiment (simulated backend) into one database and writes each
# sweep's report (markdown) and figures under OUT (default docs/figures/paper), timing each.
# Usage: experiments/paper/run_all.sh [DB] [OUT] [--set KEY=VALUE ...]
#        (from the source tree, after `make build`); the --set overrides go to every sweep, e.g.
#        another signal model's [sim.parametric] fit (docs/PAPER.md: the SmolLM2 fit).
set -euo pipefail
cd "$(dirname "$0")/../.."
DB=${1:-results/paper.db}
OUT=${2:-docs/figures/paper}
shift $(($# < 2 ? $# : 2))
EXTRA=("$@")
CLI=${CLI:-build/release/apps/vtoken-cli/vtoken-cli}
mkdir -p "$OUT" "$(dirname "$DB")"
sweep() {  # sweep NAME CONFIG: CONFIG's [sweep] name must be NAME
  local name=$1 config=$2
  local start=$SECONDS
  "$CLI" sweep "$config" --db "$DB" "${EXTRA[@]}" >"$OUT/$name.log" 2>&1
  echo "$name: $((SECONDS - start)) s"
  "$CLI" report --db "$DB" --sweep "$name" --out "$OUT/$name" >"$OUT/$name.md"
}
sweep capacity_llama31_8b experiments/paper/capacity_llama31_8b.toml
sweep capacity_llama31_8b_5427 experiments/paper/capacity_llama31_8b_5427.toml
sweep capacity_llama31_8b_050 experiments/paper/capacity_llama31_8b_050.toml
sweep capacity_qwen25_14b experiments/paper/capacity_qwen25_14b.toml
sweep sla_llama31_8b experiments/paper/sla_llama31_8b.toml
sweep retained_blocks_paper experiments/paper/retained_blocks_paper.toml
sweep prefix_sharing_paper experiments/paper/prefix_sharing_paper.toml
sweep block_size_paper experiments/paper/block_size_paper.toml
rm -f "$OUT"/*.log

#!/usr/bin/env bash
# The KV-group experiment of docs/RESULTS.md ("Per-layer and per-head KV budgets"):
#  1. experiments/granularity.toml: vt-tiny, token / layer / head granularity x h2o / snapkv / tova
#     (uniform budgets), native / naive / vtoken;
#  2. the same at head granularity with PyramidKV budgets (1 and 2 over workload seeds 1-5);
#  3. experiments/granularity_gqa.toml: the same on vt-tiny-gqa (2 KV heads per layer), then head
#     granularity with PyramidKV and with AdaKV budgets, over workload seeds 1-5 (tables:
#     experiments/granularity_table.py);
#  4. paper scale on the simulated backend (Llama-3.1-8B shape: 32 layers x 8 KV heads = 256 groups
#     per token): token vs head granularity, H2O at 25%, uniform and adaptive (AdaKV) budgets.
# Results go to results/granularity.db; `vtoken-cli export --db results/granularity.db` reads them.
set -euo pipefail
cd "$(dirname "$0")/.."
cli=${VTOKEN_CLI:-build/release/apps/vtoken-cli/vtoken-cli}
db=${DB:-results/granularity.db}
export OMP_WAIT_POLICY=PASSIVE
for seed in 1 2 3 4 5; do  # Five workloads: quality differences are small next to one's noise.
  "$cli" sweep experiments/granularity.toml --db "$db" --set workload.seed=$seed
  for policy in h2o snapkv tova; do
    "$cli" run experiments/granularity.toml --db "$db" --set workload.seed=$seed \
      --set cache.granularity=head --set policy.budget_allocation=pyramid --set policy.name="$policy"
  done
  "$cli" sweep experiments/granularity_gqa.toml --db "$db" --set workload.seed=$seed
  for allocation in pyramid adaptive; do
    for policy in h2o snapkv tova; do
      "$cli" run experiments/granularity_gqa.toml --db "$db" --set workload.seed=$seed \
        --set cache.granularity=head --set policy.budget_allocation="$allocation" \
        --set policy.name="$policy"
    done
  done
done
for point in "token uniform" "head uniform" "head adaptive"; do
  set -- $point
  "$cli" run experiments/granularity_sim.toml --db "$db" --set cache.granularity="$1" \
    --set policy.budget_allocation="$2"
done

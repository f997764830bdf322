#!/usr/bin/env python3
"""docs/RESULTS.md §9's tables: the runs of results/granularity.db (experiments/granularity.sh)
of one model, averaged over workload seeds, one row per (policy, granularity, budgets, mode).

Usage: vtoken-cli export --db results/granularity.db --table runs --out runs.csv
       /usr/bin/python3 experiments/granularity_table.py runs.csv models/vt-tiny-gqa

Columns: KV groups; blocks held per request (mean over the run, token-blocks: group blocks / G);
held / ideal at finish (blocks_final_mean / ideal_final_mean); peak concurrency; F (mean);
ROUGE-L vs native (mean over seeds, with the min and max); vtoken = naive (ROUGE-L vtoken vs
naive 1.0 in every seed). Then, paired by seed, each non-token split's ROUGE-L minus the
per-token run's (naive mode; vtoken's outputs are naive's). Needs pandas (python3-pandas).
"""
import sys

import pandas as pd

from seeds_table import rouge_cells


def main(csv, model):
    runs = pd.read_csv(csv)
    runs = runs[(runs["status"] == "completed") & (runs["model"] == model)].copy()
    if runs.empty:
        sys.exit(f"no completed runs of {model} in {csv}")
    runs["policy"] = runs["policy"].fillna("-")
    runs["cache.granularity"] = runs["cache.granularity"].fillna("token")
    runs["policy.budget_allocation"] = runs["policy.budget_allocation"].fillna("uniform")
    runs["workload.seed"] = runs["workload.seed"].fillna(1)
    runs["held_over_ideal"] = runs["blocks_final_mean"] / runs["ideal_final_mean"]
    keys = ["policy", "cache.granularity", "policy.budget_allocation", "mode"]
    order = {"token": 0, "layer": 1, "head": 2, "uniform": 0, "pyramid": 1, "adaptive": 2,
             "native": 0, "naive": 1, "vtoken": 2}
    print("| policy | granularity | budgets | mode | seeds | KV groups | blocks held / request "
          "(mean, token-blocks) | held / ideal at finish | peak concurrency | F (mean) | "
          "ROUGE-L vs native (min-max) | vtoken = naive |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    groups = runs.groupby(keys, dropna=False)
    rows = sorted(groups, key=lambda kv: (kv[0][0] if kv[0][3] != "native" else "",
                                          order[kv[0][1]], order[kv[0][2]], order[kv[0][3]]))
    for (policy, gran, alloc, mode), g in rows:
        if mode == "native":
            policy, alloc = "-", "-"
        rouge_text, same = rouge_cells(g, mode)
        print(f"| {policy} | {gran} | {alloc} | {mode} | {g['workload.seed'].nunique()} | "
              f"{g['kv_groups'].iloc[0]:.0f} | {g['blocks_mean_token_blocks'].mean():.1f} | "
              f"{g['held_over_ideal'].mean():.2f}x | {g['peak_running'].mean():.1f} | "
              f"{g['waste_ratio_mean'].mean():.3f} | {rouge_text} | {same} |")

    # Paired by seed: each budget split's ROUGE-L minus per-token uniform's, same policy and seed.
    naive = runs[runs["mode"] == "naive"]
    base = naive[(naive["cache.granularity"] == "token")].set_index(["policy", "workload.seed"])
    print()
    print("| policy | granularity | budgets | seeds | ROUGE-L vs native minus per-token's, "
          "mean (min, max) over seeds |")
    print("|---|---|---|---:|---|")
    for (policy, gran, alloc), g in sorted(
            naive.groupby(["policy", "cache.granularity", "policy.budget_allocation"]),
            key=lambda kv: (kv[0][0], order[kv[0][1]], order[kv[0][2]])):
        if gran == "token":
            continue
        d = [row["rouge_l_vs_native"] - base.loc[(policy, row["workload.seed"]),
                                                 "rouge_l_vs_native"]
             for _, row in g.iterrows() if (policy, row["workload.seed"]) in base.index]
        if d:
            print(f"| {policy} | {gran} | {alloc} | {len(d)} | {sum(d) / len(d):+.4f} "
                  f"({min(d):+.4f}, {max(d):+.4f}) |")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])

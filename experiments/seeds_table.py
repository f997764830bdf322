#!/usr/bin/env python3
"""A sweep's runs averaged over seeds: one row per (grid point, mode), for a sweep with `[sweep]
seeds` (the export's `seed` column) or run once per workload seed (`vtoken-cli sweep CONFIG --set
workload.seed=S` for several S: the `workload.seed` column). Beside `vtoken-cli export --table
points` (means with confidence intervals), it gives the min-max over seeds, naive's blocks over
vtoken's and the differences between points paired by seed.

Usage: vtoken-cli export --db DB --table runs --out runs.csv
       /usr/bin/python3 experiments/seeds_table.py runs.csv SWEEP KEY [KEY ...] [--pair KEY=VALUE]
           [--baseline NAME]
e.g.   /usr/bin/python3 experiments/seeds_table.py runs.csv quality policy policy.keep_ratio \
           --pair policy=streaming_llm

KEYs are the export's columns that tell the grid points apart. Columns: seeds; blocks held per
request (mean over the run); for vtoken, naive's blocks held over vtoken's (paired by seed, mean
with min-max); held / ideal at finish; F (mean); blocks under 50% used (the share of allocated
block-steps, util_hist_0 + util_hist_1, mean with min-max); ROUGE-L vs native, mean over
seeds with the min and max; vtoken = naive (ROUGE-L vtoken vs naive 1.0 in every seed). A native
run shared by several points (it does not depend on the policy) is listed once. With --pair
KEY=VALUE, a second table: paired by seed, each naive point's ROUGE-L vs native minus that of
the point with KEY=VALUE and the same other keys. With --baseline NAME, the runs named NAME that
belong to no sweep (`vtoken-cli run CONFIG`, one per seed) are listed first, one row per mode
with "-" for the KEYs, and a vtoken point with no naive run of its own takes its naive / vtoken
ratio from that baseline's naive run of the same seed: for a sweep of vtoken runs only (the
ablations). Needs pandas (python3-pandas).
"""
import sys

import pandas as pd


def rouge_cells(g, mode):
    """The ROUGE-L vs native cell (mean over seeds with min-max) and the vtoken = naive cell of
    one point's runs `g` in `mode`."""
    rouge = g["rouge_l_vs_native"]
    rouge_text = "-" if mode == "native" or rouge.isna().all() else (
        f"{rouge.mean():.4f} ({rouge.min():.4f}-{rouge.max():.4f})")
    same = "-"
    if mode == "vtoken" and "rouge_l_vs_naive" in g.columns and g["rouge_l_vs_naive"].notna().any():
        same = "yes" if (g["rouge_l_vs_naive"] == 1.0).all() else "no"
    return rouge_text, same


def sort_key(values):
    """Orders a point's key values: numbers (and booleans) by value before strings ("-")."""
    return tuple((isinstance(v, str), v) for v in values)


def below_half_cell(g):
    """Blocks under 50% used (util_hist_0 + util_hist_1), mean over seeds with min-max."""
    if "util_hist_0" not in g.columns or "util_hist_1" not in g.columns:
        return "-"
    below = g["util_hist_0"] + g["util_hist_1"]
    return f"{below.mean():.3f} ({below.min():.3f}-{below.max():.3f})"


def main(csv, sweep, keys, pair=None, baseline=None):
    every = pd.read_csv(csv)
    every = every[every["status"] == "completed"]
    runs = every[every["sweep"] == sweep].copy()
    if runs.empty:
        sys.exit(f"no completed runs of sweep {sweep} in {csv}")
    missing = [k for k in keys if k not in runs.columns]
    if missing:
        sys.exit(f"{csv} has no column {missing[0]}")
    runs["baseline"] = False
    if baseline is not None:
        base = every[every["sweep"].isna() & (every["name"] == baseline)].copy()
        if base.empty:
            sys.exit(f"no completed runs named {baseline} outside a sweep in {csv}")
        base[keys] = "-"
        base["baseline"] = True
        runs = pd.concat([base, runs], ignore_index=True)
    seed = "seed" if "seed" in runs.columns else "workload.seed"
    if seed not in runs.columns:
        sys.exit(f"{csv} has no seed or workload.seed column: the sweep has one seed")
    runs["policy"] = runs["policy"].fillna("-")
    native = runs["mode"] == "native"
    runs.loc[native, [k for k in keys if k.startswith("policy")]] = "-"
    runs["held_over_ideal"] = runs["blocks_final_mean"] / runs["ideal_final_mean"]
    modes = {"native": 0, "naive": 1, "vtoken": 2}
    # Naive's blocks over vtoken's, paired by seed and point.
    naive_blocks = {tuple(r[k] for k in keys) + (r[seed],): r["blocks_mean"]
                    for _, r in runs[runs["mode"] == "naive"].iterrows()}
    base_naive = {r[seed]: r["blocks_mean"]
                  for _, r in runs[(runs["mode"] == "naive") & runs["baseline"]].iterrows()}
    print("| " + " | ".join(keys) + " | mode | seeds | blocks held / request (mean) | "
          "naive / vtoken blocks (min-max) | held / ideal at finish | F (mean) | "
          "blocks <50% used (min-max) | ROUGE-L vs native (min-max) | vtoken = naive |")
    print("|" + "---|" * len(keys) + "---|---:|---:|---:|---:|---:|---:|---|---|")
    groups = runs.groupby([*keys, "mode", "baseline"], dropna=False)
    for key, g in sorted(groups, key=lambda kv: (not kv[0][-1], modes[kv[0][-2]] > 0,
                                                 sort_key(kv[0][:-2]), modes[kv[0][-2]])):
        g = g.drop_duplicates(seed)  # A shared native run appears once per seed.
        key = key[:-1]
        mode = key[-1]
        rouge_text, same = rouge_cells(g, mode)
        # Naive's blocks for each seed of the point: its own naive run, else the baseline's.
        own = [(naive_blocks.get(tuple(r[k] for k in keys) + (r[seed],)), r)
               for _, r in g.iterrows()]
        if all(blocks is None for blocks, _ in own):
            own = [(base_naive.get(r[seed]), r) for _, r in g.iterrows()]
        ratios = [blocks / r["blocks_mean"] for blocks, r in own if blocks is not None]
        ratio_text = "-" if mode != "vtoken" or not ratios else (
            f"{sum(ratios) / len(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
        cells = " | ".join(str(k) for k in key[:-1])
        print(f"| {cells} | {mode} | {g[seed].nunique()} | "
              f"{g['blocks_mean'].mean():.1f} | {ratio_text} | "
              f"{g['held_over_ideal'].mean():.2f}x | "
              f"{g['waste_ratio_mean'].mean():.3f} | {below_half_cell(g)} | {rouge_text} | "
              f"{same} |")
    if pair is None:
        return
    pair_key, pair_value = pair
    naive = runs[(runs["mode"] == "naive") & ~runs["baseline"]].copy()
    others = [k for k in keys if k != pair_key]
    base = {tuple(r[k] for k in others) + (r[seed],): r["rouge_l_vs_native"]
            for _, r in naive.iterrows() if str(r[pair_key]) == pair_value}
    print()
    print("| " + " | ".join(keys) + f" | seeds | ROUGE-L vs native minus {pair_key}="
          f"{pair_value}'s, mean (min, max) over seeds |")
    print("|" + "---|" * len(keys) + "---:|---|")
    points = {}
    for _, r in naive.iterrows():
        points.setdefault(tuple(r[k] for k in keys), []).append(r)
    for key, g in sorted(points.items()):
        if str(g[0][pair_key]) == pair_value:
            continue
        d = [r["rouge_l_vs_native"] - base[at] for r in g
             if (at := tuple(r[k] for k in others) + (r[seed],)) in base]
        if d:
            cells = " | ".join(str(k) for k in key)
            print(f"| {cells} | {len(d)} | {sum(d) / len(d):+.4f} ({min(d):+.4f}, "
                  f"{max(d):+.4f}) |")


if __name__ == "__main__":
    args, pair = sys.argv[1:], None
    if "--pair" in args:
        i = args.index("--pair")
        if i + 1 >= len(args) or "=" not in args[i + 1]:
            sys.exit("--pair needs KEY=VALUE")
        pair = tuple(args[i + 1].split("=", 1))
        del args[i:i + 2]
    baseline = None
    if "--baseline" in args:
        i = args.index("--baseline")
        if i + 1 >= len(args):
            sys.exit("--baseline needs a run name")
        baseline = args[i + 1]
        del args[i:i + 2]
    if len(args) < 3:
        sys.exit(__doc__)
    main(args[0], args[1], args[2:], pair, baseline)

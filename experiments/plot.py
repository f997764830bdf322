#!/usr/bin/env python3
"""Figures of one sweep from a vtoken result database (figures defined in docs/METRICS.md).

    python3 experiments/plot.py --db results/eval.db --sweep NAME --out results/figures/NAME

Reads the sweep's completed runs (runs, steps, summary tables) and writes a PNG per figure the
sweep has data for, printing each path it writes:

  util_hist.png       block utilization histogram, naive vs vtoken per grid point (steps.hist0..3)
  blocks_over_time.png  allocated blocks vs time per run (steps.allocated_blocks, steps.time_s)
  sla_frontier.png    throughput and p95 E2E vs concurrency (engine.max_num_seqs), SLA line
  capacity_frontier.png  preemptions vs concurrency limit; peak concurrency without preemption
  overhead.png        forward / policy / planner / fence seconds per run (summary)
  block_size.png      blocks held, tokens moved and waste vs engine.block_size
  by_KEY.png          blocks held, throughput and ROUGE-L vs any other numeric grid key

The grid's varying keys are found by comparing the runs' resolved configs (runs.config_toml),
so the script needs nothing but the database. Only the Python standard library and matplotlib.
"""

import argparse
import math
import os
import sqlite3
import sys
import tomllib

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot.py: error: matplotlib is not installed (apt-get install python3-matplotlib)")

MODE_ORDER = {"native": 0, "naive": 1, "vtoken": 2}
MODE_COLOR = {"native": "tab:gray", "naive": "tab:orange", "vtoken": "tab:blue"}
HIST_LABELS = ["[0,25)%", "[25,50)%", "[50,75)%", "[75,100]%"]
# Keys that identify a run but are not grid axes: the mode is a column of its own, and the
# experiment name is the same for every run of a sweep.
NOT_AXES = {"modes", "name"}
# Grid keys that have a figure of their own; the rest get a generic by_KEY figure.
OWN_FIGURE = {"engine.max_num_seqs", "engine.block_size"}


def flatten(table, prefix=""):
    out = {}
    for k, v in table.items():
        key = prefix + k
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


class Run:
    def __init__(self, row, config, summary):
        self.id, self.mode, self.policy, self.block_size, self.num_blocks = row
        self.config = config
        self.summary = summary
        self.point = ()  # (key, value) of each varying grid key, mode excluded

    def get(self, name):
        v = self.summary.get(name)
        return float("nan") if v is None else v

    def point_label(self, skip=()):
        parts = [f"{short(k)}={fmt(v)}" for k, v in self.point if k not in skip]
        return ", ".join(parts)

    def label(self, skip=()):
        base = self.mode + (f"/{self.policy}" if self.policy else "")
        point = self.point_label(skip)
        return f"{base} {point}".strip()


def short(key):
    """A grid key for a legend: its last part ("policy" for policy.name)."""
    parts = key.split(".")
    return parts[-2] if parts[-1] == "name" and len(parts) > 1 else parts[-1]


def fmt(v):
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list):
        return "[" + ",".join(fmt(x) for x in v) + "]"
    return str(v)


def load(db_path, sweep):
    if not os.path.exists(db_path):
        sys.exit(f"plot.py: error: database {db_path} not found")
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    rows = con.execute(
        "SELECT id, mode, policy, block_size, num_blocks, config_toml FROM runs "
        "WHERE sweep = ? AND status = 'completed' ORDER BY id",
        (sweep,),
    ).fetchall()
    if not rows:
        sys.exit(f"plot.py: error: no completed runs of sweep '{sweep}' in {db_path}")
    runs = []
    for r in rows:
        try:
            config = flatten(tomllib.loads(r[5])) if r[5] else {}
        except tomllib.TOMLDecodeError as e:
            sys.exit(f"plot.py: error: run {r[0]}: config_toml does not parse: {e}")
        summary = dict(con.execute("SELECT name, value FROM summary WHERE run_id = ?", (r[0],)))
        runs.append(Run(r[:5], config, summary))
    axes = varying_keys(runs)
    for run in runs:
        run.point = tuple((k, run.config.get(k)) for k in axes)
    return con, runs, axes


def varying_keys(runs):
    keys = sorted(set().union(*(r.config.keys() for r in runs)) - NOT_AXES)
    out = []
    for k in keys:
        values = {repr(r.config.get(k)) for r in runs}
        if len(values) > 1:
            out.append(k)
    return out


def sort_key(v):
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def save(fig, out_dir, name, written):
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)


def steps_of(con, run_id, columns):
    return con.execute(
        f"SELECT {columns} FROM steps WHERE run_id = ? ORDER BY step", (run_id,)
    ).fetchall()


def points(runs, skip=()):
    """Grid points (mode excluded, keys in `skip` ignored) in first-seen order."""
    seen = {}
    for r in runs:
        key = tuple((k, v) for k, v in r.point if k not in skip)
        seen.setdefault(repr(key), (key, []))[1].append(r)
    return list(seen.values())


def plot_util_hist(con, runs, out_dir, written):
    evicting = [r for r in runs if r.mode in ("naive", "vtoken")]
    if not evicting:
        return
    groups = points(evicting)
    modes = sorted({r.mode for r in evicting}, key=MODE_ORDER.get)
    n = len(groups)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axs = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    width = 0.8 / len(modes)
    drew = False
    for i, (key, members) in enumerate(groups):
        ax = axs[i // cols][i % cols]
        for j, mode in enumerate(modes):
            sums = [0, 0, 0, 0]
            for r in members:
                if r.mode != mode:
                    continue
                for row in steps_of(con, r.id, "hist0, hist1, hist2, hist3"):
                    for b in range(4):
                        sums[b] += row[b] or 0
            total = sum(sums)
            if total == 0:
                continue
            drew = True
            xs = [b + (j - (len(modes) - 1) / 2) * width for b in range(4)]
            ax.bar(xs, [100.0 * s / total for s in sums], width, label=mode,
                   color=MODE_COLOR[mode])
        policy = members[0].policy
        title = ", ".join(p for p in [policy, members[0].point_label(skip=("policy.name",))] if p)
        ax.set_title(title or "all runs", fontsize=9)
        ax.set_xticks(range(4))
        ax.set_xticklabels(HIST_LABELS, fontsize=8)
        ax.set_xlabel("block utilization (live slots / block size)")
        ax.set_ylabel("allocated block-steps (%)")
        ax.legend(fontsize=8)
    for i in range(n, rows * cols):
        axs[i // cols][i % cols].axis("off")
    if not drew:
        plt.close(fig)
        return
    fig.suptitle("Block utilization histogram (all steps)", fontsize=11)
    save(fig, out_dir, "util_hist.png", written)


def plot_blocks_over_time(con, runs, out_dir, written):
    groups = points(runs)[:9]
    n = len(groups)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axs = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    drew = False
    for i, (key, members) in enumerate(groups):
        ax = axs[i // cols][i % cols]
        for r in sorted(members, key=lambda r: MODE_ORDER.get(r.mode, 9)):
            data = steps_of(con, r.id, "time_s, allocated_blocks")
            if not data:
                continue
            drew = True
            ax.plot([d[0] for d in data], [d[1] for d in data], label=r.label(skip=[k for k, _ in key]),
                    color=MODE_COLOR.get(r.mode), linewidth=1.2)
        ax.set_title(members[0].point_label() or "all runs", fontsize=9)
        ax.set_xlabel("time since run start (s)")
        ax.set_ylabel("allocated blocks")
        ax.legend(fontsize=7)
    for i in range(n, rows * cols):
        axs[i // cols][i % cols].axis("off")
    if not drew:
        plt.close(fig)
        return
    fig.suptitle("KV blocks held over time", fontsize=11)
    save(fig, out_dir, "blocks_over_time.png", written)


def series(runs, key, skip_more=()):
    """{(mode, rest-of-point label): [(value of key, run), ...] sorted by value}."""
    out = {}
    for r in runs:
        x = r.config.get(key)
        if x is None:
            continue
        by_policy = r.policy and "policy.name" in dict(r.point) and key != "policy.name"
        label = r.mode + (f"/{r.policy}" if by_policy else "")
        rest = r.point_label(skip=(key, "policy.name") + tuple(skip_more))
        out.setdefault((r.mode, label + (f" {rest}" if rest else "")), []).append((x, r))
    for v in out.values():
        v.sort(key=lambda p: sort_key(p[0]))
    return dict(sorted(out.items(), key=lambda kv: (MODE_ORDER.get(kv[0][0], 9), kv[0][1])))


def plot_sla(runs, axes, out_dir, written):
    key = "engine.max_num_seqs"
    if key not in axes:
        return
    naive = [r for r in runs if r.mode == "naive"]
    if not naive:
        return
    # SLA = 1.05 x naive's p95 E2E at C_ref = 8 (the nearest swept concurrency if 8 is absent).
    c_ref = min({r.config[key] for r in naive}, key=lambda c: (abs(c - 8), c))
    ref = [r.get("e2e_p95") for r in naive if r.config[key] == c_ref]
    sla = 1.05 * sum(ref) / len(ref)
    s = series(runs, key)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for (mode, label), pts in s.items():
        xs = [p[0] for p in pts]
        thr = [p[1].get("throughput_tok_s") for p in pts]
        lat = [p[1].get("e2e_p95") for p in pts]
        ax1.plot(xs, thr, marker="o", label=label, color=MODE_COLOR.get(mode))
        ax2.plot(xs, lat, marker="o", label=label, color=MODE_COLOR.get(mode))
        ok = [(t, x) for x, t, l in zip(xs, thr, lat) if l <= sla]
        if ok:
            t, x = max(ok)
            ax1.plot([x], [t], marker="*", markersize=14, color=MODE_COLOR.get(mode))
    ax2.axhline(sla, color="red", linestyle="--", label=f"SLA {sla:.2f} s (1.05x naive @ C={c_ref})")
    ax1.set_xlabel("concurrency limit C (engine.max_num_seqs)")
    ax1.set_ylabel("throughput (output tokens/s)")
    ax1.set_title("Throughput; * = C_sel (best C meeting the SLA)", fontsize=9)
    ax2.set_xlabel("concurrency limit C (engine.max_num_seqs)")
    ax2.set_ylabel("p95 end-to-end latency (s)")
    ax2.set_title("p95 E2E latency and the SLA", fontsize=9)
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    save(fig, out_dir, "sla_frontier.png", written)


def plot_capacity(runs, axes, out_dir, written):
    key = "engine.max_num_seqs"
    if key not in axes:
        return
    s = series(runs, key)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    labels, caps, colors = [], [], []
    for (mode, label), pts in s.items():
        xs = [p[0] for p in pts]
        ax1.plot(xs, [p[1].get("preemptions") for p in pts], marker="o", label=label,
                 color=MODE_COLOR.get(mode))
        # The concurrency actually reached: admission may hold a run below its limit C.
        free = [r.get("peak_running") for _, r in pts if r.get("preemptions") == 0]
        labels.append(label)
        caps.append(max(free) if free else 0)
        colors.append(MODE_COLOR.get(mode, "tab:green"))
    ax1.set_xlabel("concurrency limit C (engine.max_num_seqs)")
    ax1.set_ylabel("preemptions (count)")
    ax1.set_title("Preemptions under a fixed block budget", fontsize=9)
    ax1.legend(fontsize=7)
    ax2.barh(range(len(labels)), caps, color=colors)
    ax2.set_yticks(range(len(labels)))
    ax2.set_yticklabels(labels, fontsize=8)
    ax2.invert_yaxis()
    ax2.set_xlabel("peak concurrency reached without preemption")
    ax2.set_title("Capacity frontier", fontsize=9)
    for i, c in enumerate(caps):
        ax2.text(c, i, f" {fmt(c)}", va="center", fontsize=8)
    save(fig, out_dir, "capacity_frontier.png", written)


def plot_overhead(runs, out_dir, written):
    parts = [("forward_s", "model forward"), ("policy_s", "policy scoring"),
             ("planner_s", "reclaim planner"), ("fence_s", "copy fence waits")]
    if not any(not math.isnan(r.get(k)) for r in runs for k, _ in parts):
        return
    width = max(6, 0.45 * len(runs) + 2)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(2 * width, 4.4))
    x = range(len(runs))
    labels = [f"#{r.id} {r.label()}" for r in runs]
    # Left: everything in seconds; right: the eviction / reclamation parts alone in ms, which
    # the forward pass would otherwise hide.
    for ax, chosen, scale, unit in ((ax1, parts, 1.0, "seconds"),
                                   (ax2, parts[1:], 1e3, "milliseconds")):
        bottom = [0.0] * len(runs)
        for k, label in chosen:
            vals = [0.0 if math.isnan(r.get(k)) else scale * r.get(k) for r in runs]
            ax.bar(x, vals, bottom=bottom, label=label,
                   color={"forward_s": "tab:blue", "policy_s": "tab:orange",
                          "planner_s": "tab:green", "fence_s": "tab:red"}[k])
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(unit)
        ax.legend(fontsize=8)
    ax1.plot(list(x), [r.get("wall_s") for r in runs], "k_", markersize=14, label="run wall time")
    ax1.legend(fontsize=8)
    ax1.set_title("Time per run: forward pass and the rest", fontsize=10)
    ax2.set_title("Eviction and reclamation overhead alone", fontsize=10)
    save(fig, out_dir, "overhead.png", written)


def plot_block_size(runs, axes, out_dir, written):
    key = "engine.block_size"
    if key not in axes:
        return
    s = series(runs, key)
    fig, axs = plt.subplots(1, 3, figsize=(13, 3.8))
    for (mode, label), pts in s.items():
        xs = [p[0] for p in pts]
        c = MODE_COLOR.get(mode)
        axs[0].plot(xs, [p[1].get("blocks_mean") * x for x, p in zip(xs, pts)], marker="o",
                    label=label, color=c)
        axs[1].plot(xs, [p[1].get("moves") for p in pts], marker="o", label=label, color=c)
        axs[2].plot(xs, [p[1].get("waste_ratio_mean") for p in pts], marker="o", label=label,
                    color=c)
    titles = ["KV slots held per request (blocks held x block size)", "tokens moved by reclamation",
              "waste ratio F (mean over steps)"]
    ylabels = ["slots (tokens) held, time-mean", "tokens moved (count)", "F = 1 - live / allocated"]
    for ax, t, y in zip(axs, titles, ylabels):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("block size (tokens per block)")
        ax.set_ylabel(y)
        ax.set_title(t, fontsize=9)
        ax.legend(fontsize=7)
    save(fig, out_dir, "block_size.png", written)


def plot_generic(runs, axes, out_dir, written):
    panels = [("blocks_mean", "blocks held / request (time-mean)"),
              ("waste_ratio_mean", "waste ratio F (mean)"),
              ("throughput_tok_s", "throughput (output tokens/s)"),
              ("rouge_l_vs_native", "ROUGE-L F1 vs native")]
    for key in axes:
        if key in OWN_FIGURE:
            continue
        s = series(runs, key)
        # Panels with at least one value (ROUGE-L only exists when a native run was scored).
        shown = [p for p in panels
                 if any(not math.isnan(r.get(p[0])) for pts in s.values() for _, r in pts)]
        numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool)
                      for pts in s.values() for x, _ in pts)
        categories = []
        for pts in s.values():
            for x, _ in pts:
                if fmt(x) not in categories:
                    categories.append(fmt(x))
        fig, axs = plt.subplots(1, len(shown), figsize=(4.3 * len(shown), 3.9), squeeze=False)
        width = 0.8 / max(1, len(s))
        for i, ((mode, label), pts) in enumerate(s.items()):
            for ax, (name, _) in zip(axs[0], shown):
                ys = [r.get(name) for _, r in pts]
                if numeric:
                    ax.plot([x for x, _ in pts], ys, marker="o", label=label,
                            color=MODE_COLOR.get(mode) if len(s) <= 3 else None)
                else:
                    xs = [categories.index(fmt(x)) + (i - (len(s) - 1) / 2) * width for x, _ in pts]
                    ax.bar(xs, ys, width, label=label,
                           color=MODE_COLOR.get(mode) if len(s) <= 3 else None)
        for ax, (_, ylabel) in zip(axs[0], shown):
            if not numeric:
                ax.set_xticks(range(len(categories)))
                ax.set_xticklabels(categories, rotation=30, ha="right", fontsize=8)
            ax.set_xlabel(key)
            ax.set_ylabel(ylabel)
            ax.legend(fontsize=7)
        fig.suptitle(f"Summary figures vs {key}", fontsize=11)
        save(fig, out_dir, "by_" + key.replace(".", "_") + ".png", written)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", required=True, help="result database (SQLite)")
    ap.add_argument("--sweep", required=True, help="sweep name (runs.sweep)")
    ap.add_argument("--out", required=True, help="directory for the PNG files")
    args = ap.parse_args()
    con, runs, axes = load(args.db, args.sweep)
    os.makedirs(args.out, exist_ok=True)
    written = []
    plot_util_hist(con, runs, args.out, written)
    plot_blocks_over_time(con, runs, args.out, written)
    plot_sla(runs, axes, args.out, written)
    plot_capacity(runs, axes, args.out, written)
    plot_overhead(runs, args.out, written)
    plot_block_size(runs, axes, args.out, written)
    plot_generic(runs, axes, args.out, written)
    for path in written:
        print(path)


if __name__ == "__main__":
    main()

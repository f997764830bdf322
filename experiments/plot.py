#!/usr/bin/env python3
"""Figures of one sweep from a vtoken result database (figures defined in docs/METRICS.md).

    python3 experiments/plot.py --db results/eval.db --sweep NAME --out results/figures/NAME
                                [--format pdf,png] [--time step|wall]

Reads the sweep's completed runs (runs, steps, summary tables) and writes each figure the sweep
has data for as NAME.pdf and NAME.png (300 dpi), printing each path it writes:

  util_hist          block utilization histogram, naive vs vtoken per grid point (steps.hist0..3)
  blocks_over_time   allocated blocks per engine step (steps.step; --time wall: steps.time_s)
  sla_frontier       throughput and p95 E2E vs concurrency (engine.max_num_seqs), SLA line
  capacity_frontier  preemptions vs concurrency limit; peak concurrency without preemption
  overhead           forward / policy / planner / fence time per grid point and mode (summary)
  block_size         slots held, tokens moved and waste vs engine.block_size
  by_KEY             blocks held, waste, throughput and ROUGE-L vs any other grid key
  accuracy_vs_blocks task accuracy against the KV blocks each run really held per request,
                     naive vs vtoken, one colour per policy (task sweeps: docs/TASKS.md)
  accuracy_vs_compression  task accuracy against the compression ratio (1 - keep ratio), one
                     line per policy, native dashed (kvpress's leaderboard format)
  needle_heatmap_keep_K    per keep ratio K, one panel per policy: mean score per needle depth
                     and context length
  allocation         layer / head granularity: live tokens per layer at finish (and the spread
                     between a layer's KV heads), one line per policy and budget allocation

Grouping. The grid's varying keys are found by comparing the runs' resolved configs
(runs.config_toml), so the script needs nothing but the database. Runs that differ only in
SEED_KEYS are the seeds of one point (as `vtoken-cli export --table points` groups them); a
figure shows their mean and, with 2 or more seeds, the half-width of the 95% confidence interval
(Student's t, ci95()) as error bars or a band, and says the number of seeds in its legend title.
Task accuracy and ROUGE-L are means over requests (sweep_points.PER_REQUEST): their mean and
interval are taken over the requests of all of a point's seeds, pooled, also for one seed.
A native run does not depend on the policy, so native runs that differ only in policy.* keys are
one baseline, drawn once.

Style. Widths fit a paper column (COLUMN_IN) or the full text width (FULL_IN) at 7-8 pt fonts;
legends sit below the axes. Every mode has one line style and marker and, where policies are not
told apart, one colour (MODE_STYLE); where a figure shows several policies, the colour is the
policy's (policy_color()), the same in every figure. Only the Python standard library and
matplotlib.
"""

import argparse
import json
import math
import os
import sys
import zlib

from sweep_points import Point, ci95, fmt, is_number, load, short, sort_key

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot.py: error: matplotlib is not installed (apt-get install python3-matplotlib)")

# Grid keys that have a figure of their own; the rest get a generic by_KEY figure.
OWN_FIGURE = {"engine.max_num_seqs", "engine.block_size"}

COLUMN_IN = 3.4  # one column of a two-column paper, inches
FULL_IN = 7.0  # the full text width
DPI = 300
MAX_FACETS = 12

MODES = ("native", "naive", "vtoken")
# Okabe-Ito colours (safe for colour-blind readers and in grey print).
MODE_STYLE = {
    "native": {"color": "#000000", "linestyle": ":", "marker": "s"},
    "naive": {"color": "#E69F00", "linestyle": "--", "marker": "v"},
    "vtoken": {"color": "#0072B2", "linestyle": "-", "marker": "o"},
}
# One colour per registered policy (vtoken-cli policies); other policies get a colour from
# FALLBACK_COLORS by a hash of their name, so a policy's colour never depends on the sweep.
POLICY_COLORS = {
    "h2o": "#D55E00",
    "tova": "#009E73",
    "snapkv": "#CC79A7",
    "streaming_llm": "#56B4E9",
    "scissorhands": "#8C564B",
    "random": "#7F7F7F",
    "knorm": "#9467BD",
    "decayed_attention": "#BCBD22",
    "drop": "#17BECF",
}
FALLBACK_COLORS = ("#1B9E77", "#7570B3", "#E7298A", "#66A61E", "#A6761D", "#E6AB02", "#386CB0",
                   "#F0027F", "#BF5B17", "#666666")
# The overhead figure's phases: greys and purples, apart from the mode and policy colours.
PHASES = (("forward_s", "model forward", "#D0D0D0"), ("policy_s", "policy", "#3F007D"),
          ("planner_s", "reclaim planner", "#807DBA"), ("fence_s", "copy fence waits", "#BCBDDC"))
HIST_LABELS = ["0-25", "25-50", "50-75", "75-100"]

plt.rcParams.update({
    "font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "xtick.labelsize": 7,
    "ytick.labelsize": 7, "legend.fontsize": 7, "legend.title_fontsize": 7,
    "lines.linewidth": 1.2, "lines.markersize": 3.5, "errorbar.capsize": 2,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
    "grid.linewidth": 0.4, "grid.alpha": 0.5, "axes.axisbelow": True,
    "pdf.fonttype": 42, "ps.fonttype": 42,  # TrueType in the PDF: no Type 3 fonts
})


def policy_color(policy):
    if policy in POLICY_COLORS:
        return POLICY_COLORS[policy]
    return FALLBACK_COLORS[zlib.crc32(policy.encode()) % len(FALLBACK_COLORS)]


def style(mode, policy, by_policy):
    """Line style of a curve: the mode's, coloured by the policy when policies are told apart."""
    s = dict(MODE_STYLE.get(mode, {"color": "#444444", "linestyle": "-.", "marker": "x"}))
    if by_policy and policy:
        s["color"] = policy_color(policy)
    return s


def styles(points, by_policy):
    """style() of each point's curve; curves that would look the same (same mode and policy, other
    grid values) get lighter tints of the colour, in order."""
    out = [style(p.mode, p.policy, by_policy) for p in points]
    same = {}
    for st in out:
        same.setdefault((st["color"], st["linestyle"]), []).append(st)
    for group in same.values():
        for i, st in enumerate(group):
            if len(group) > 1:
                white = 0.6 * i / (len(group) - 1)
                rgb = matplotlib.colors.to_rgb(st["color"])
                st["color"] = tuple(c + (1 - c) * white for c in rgb)
    return out



def seeds_note(points, figures=()):
    """The legend title that says over how many seeds the figure's points are averaged, and
    which of its `figures` (summary names) have their interval over the requests instead."""
    counts = sorted({len(p.runs) for p in points})
    per_request = [f for f in figures
                   if any(r.per_request.get(f) for p in points for r in p.runs)]
    notes = []
    if counts and counts[-1] >= 2:
        n = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        notes.append(f"mean \u00b1 95% CI (Student's t) over {n} seeds")
    if per_request:
        names = " and ".join(sorted({"ROUGE-L" if f.startswith("rouge") else "accuracy"
                                     for f in per_request}))
        notes.append(f"{names}: 95% CI over the requests")
    return "; ".join(notes) or None


def mode_rank(p):
    return MODES.index(p.mode) if p.mode in MODES else len(MODES)


class Writer:
    """Saves figures in the chosen formats and remembers the paths."""

    def __init__(self, out_dir, formats):
        self.out_dir, self.formats = out_dir, formats
        self.written = []

    def save(self, fig, name, legend_axes=None, note=None, ncol=None, last=()):
        """Lays out fig, puts one legend of every labelled artist below the axes (the labels
        starting with one of `last` at its end), writes it."""
        if not fig.get_constrained_layout():
            fig.tight_layout(pad=0.4)
        handles, labels = [], []
        for ax in legend_axes if legend_axes is not None else fig.axes:
            for h, l in zip(*ax.get_legend_handles_labels()):
                if l not in labels and not l.startswith("_"):
                    handles.append(h)
                    labels.append(l)
        tail = [i for i, l in enumerate(labels) if l.startswith(tuple(last))]
        order = [i for i in range(len(labels)) if i not in tail] + tail
        handles, labels = [handles[i] for i in order], [labels[i] for i in order]
        extra = []
        if labels:
            width = fig.get_size_inches()[0]
            longest = max(len(l) for l in labels)
            fit = max(1, int(width / (0.055 * longest + 0.45)))
            ncol = ncol or min(len(labels), fit)
            extra.append(fig.legend(handles, labels, loc="upper center", ncol=ncol,
                                    bbox_to_anchor=(0.5, 0.0), frameon=False, title=note,
                                    columnspacing=1.2, handlelength=2.4))
        for f in self.formats:
            path = os.path.join(self.out_dir, f"{name}.{f}")
            # No creation date in the PDF: the same database gives the same file.
            meta = {"CreationDate": None} if f == "pdf" else {}
            fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.03,
                        bbox_extra_artists=extra + list(fig.texts), metadata=meta)
            self.written.append(path)
        plt.close(fig)


def grid(n, width, panel_h, max_cols):
    cols = max(1, min(n, max_cols))
    rows = math.ceil(n / cols)
    fig, axs = plt.subplots(rows, cols, figsize=(width, panel_h * rows), squeeze=False)
    flat = [ax for row in axs for ax in row]
    for ax in flat[n:]:
        ax.axis("off")
    return fig, flat[:n]


def panel_title(ax, text, cols):
    """A panel's title, broken at its commas into lines that fit the panel's width."""
    fit = int(ax.figure.get_size_inches()[0] / cols * 12)  # characters of 8 pt per line
    lines, line = [], ""
    for part in text.split(", "):
        if line and len(line) + 2 + len(part) > fit:
            lines.append(line + ",")
            line = part
        else:
            line = f"{line}, {part}" if line else part
    ax.set_title("\n".join(lines + [line]))


def label_outer(axs, cols, xlabel, ylabel):
    """Axis labels on the bottom panel of each column and the first panel of each row only."""
    n = len(axs)
    for i, ax in enumerate(axs):
        if i + cols >= n:
            ax.set_xlabel(xlabel)
        if i % cols == 0:
            ax.set_ylabel(ylabel)


def facets(points, skip):
    """Points grouped by their grid values outside `skip` (first-seen order)."""
    seen = {}
    for p in points:
        key = repr([(k, v) for k, v in p.values.items() if k not in skip])
        seen.setdefault(key, []).append(p)
    groups = list(seen.values())
    if len(groups) > MAX_FACETS:
        print(f"plot.py: {len(groups)} panels; drawing the first {MAX_FACETS}", file=sys.stderr)
    return groups[:MAX_FACETS]


# The range each figure can take: an interval is drawn within it (a ratio cannot exceed 1, a
# count or a time cannot fall below 0).
BOUNDS = {"rouge_l_vs_native": (0.0, 1.0), "rouge_l_vs_reference": (0.0, 1.0),
          "rouge_l_vs_naive": (0.0, 1.0), "waste_ratio_mean": (0.0, 1.0),
          "task_accuracy": (0.0, 1.0), "throughput_tok_s": (0.0, None),
          "blocks_mean": (0.0, None), "e2e_p95": (0.0, None), "ttft_p95": (0.0, None),
          "preemptions": (0.0, None), "moves": (0.0, None)}


def clipped(mean, half, bounds):
    """(below, above): the error bar lengths of mean ± half cut at the figure's bounds."""
    if math.isnan(half) or math.isnan(mean):
        return 0.0, 0.0
    lo, hi = bounds
    below = half if lo is None else max(0.0, min(half, mean - lo))
    above = half if hi is None else max(0.0, min(half, hi - mean))
    return below, above


def errorbar(ax, xs, stats, st, label, dodge=(0, 1), log=False, bounds=(None, None), **kw):
    """A curve of means with 95% CI error bars (none where a point has one seed), cut at the
    figure's `bounds` (BOUNDS).

    dodge = (i, k): the curve is the i-th of k, shifted sideways a little so that the error bars
    of curves at the same x do not hide each other. Returns the x positions drawn."""
    means = [s[0] for s in stats]
    cut = [clipped(s[0], s[1], bounds) for s in stats]
    errs = [[c[0] for c in cut], [c[1] for c in cut]]
    if any(errs[0]) or any(errs[1]):
        shift = 0.025 * (dodge[0] - (dodge[1] - 1) / 2)
        if log:
            xs = [x * 2 ** shift for x in xs]
        elif len(xs) > 1:
            span = max(xs) - min(xs)
            xs = [x + shift * span / 2 for x in xs]
        ax.errorbar(xs, means, yerr=errs, label=label, elinewidth=0.8, **st, **kw)
    else:
        ax.plot(xs, means, label=label, **st, **kw)
    return xs


def value_ticks(ax, cs):
    """Ticks at the swept values of a numeric axis when there are few of them."""
    xs = sorted({x for _, pts, _ in cs for x, _ in pts})
    if 1 < len(xs) <= 10:
        ax.set_xticks(xs)
        ax.set_xticklabels([fmt(x) for x in xs])
        ax.minorticks_off()


def plot_util_hist(con, points, out):
    evicting = [p for p in points if p.mode in ("naive", "vtoken")]
    groups = facets(evicting, skip=())
    if not groups:
        return
    modes = sorted({p.mode for p in evicting}, key=MODES.index)
    width = 0.8 / len(modes)
    n = len(groups)
    fig, axs = grid(n, COLUMN_IN if n == 1 else FULL_IN, 1.9 if n > 1 else 2.3, 4)
    drew = False
    for ax, members in zip(axs, groups):
        for j, mode in enumerate(modes):
            point = next((p for p in members if p.mode == mode), None)
            if point is None:
                continue
            shares = [[] for _ in range(4)]  # per bin: each seed's share of block-steps (%)
            for r in point.runs:
                sums = con.execute("SELECT SUM(hist0), SUM(hist1), SUM(hist2), SUM(hist3) "
                                   "FROM steps WHERE run_id = ?", (r.id,)).fetchone()
                total = sum(s or 0 for s in sums)
                if total:
                    for b in range(4):
                        shares[b].append(100.0 * (sums[b] or 0) / total)
            if not shares[0]:
                continue
            drew = True
            stats = [ci95(s) for s in shares]
            errs = [0.0 if math.isnan(s[1]) else s[1] for s in stats]
            xs = [b + (j - (len(modes) - 1) / 2) * width for b in range(4)]
            ax.bar(xs, [s[0] for s in stats], width, yerr=errs if any(errs) else None,
                   label=mode, color=MODE_STYLE[mode]["color"], error_kw={"elinewidth": 0.8})
        panel_title(ax, members[0].facet_label(), min(n, 4))
        ax.set_xticks(range(4))
        ax.set_xticklabels(HIST_LABELS)
        ax.grid(axis="x", visible=False)
    if not drew:
        plt.close(fig)
        return
    label_outer(axs, min(n, 4), "block utilization (%)", "block-steps (%)")
    out.save(fig, "util_hist", note=seeds_note(evicting))


def steps_of(con, run_id, time_column):
    return con.execute(f"SELECT {time_column}, allocated_blocks FROM steps WHERE run_id = ? "
                       "ORDER BY step", (run_id,)).fetchall()


def plot_blocks_over_time(con, points, axes, out, time_axis):
    policies = {p.policy for p in points if p.policy}
    by_policy = len(policies) > 1
    # A panel per setting of the grid keys but the policy: native once, beside every policy.
    groups = facets(points, skip=("policy.name",) if by_policy else ())
    n = len(groups)
    fig, axs = grid(n, COLUMN_IN if n == 1 else FULL_IN, 2.2 if n == 1 else 1.9, 3)
    drew = False
    for ax, members in zip(axs, groups):
        members = sorted(members, key=lambda p: (mode_rank(p), p.policy))
        for p, st in zip(members, styles(members, by_policy)):
            st.pop("marker")
            label = p.label(skip=axes, by_policy=by_policy)
            series = [steps_of(con, r.id, "step" if time_axis == "step" else "time_s")
                      for r in p.runs]
            series = [s for s in series if s]
            if not series:
                continue
            drew = True
            if time_axis == "wall":  # seeds' clocks do not line up: one thin line per seed
                for i, s in enumerate(series):
                    ax.plot([d[0] for d in s], [d[1] for d in s], linewidth=0.8,
                            label=label if i == 0 else "_", **st)
                continue
            # Mean over the seeds per step; a seed whose run has ended holds 0 blocks.
            by_step = {}
            last = max(s[-1][0] for s in series)
            for s in series:
                for step, blocks in s:
                    by_step.setdefault(step, []).append(blocks)
                for step in range(s[-1][0] + 1, last + 1):
                    by_step.setdefault(step, []).append(0)
            xs = sorted(by_step)
            stats = [ci95(by_step[x]) for x in xs]
            ax.plot(xs, [s[0] for s in stats], label=label, linewidth=1.0,
                    zorder=3 if p.mode == "native" else 2, **st)
            if len(series) > 1:
                lo = [max(0, s[0] - (0 if math.isnan(s[1]) else s[1])) for s in stats]
                hi = [s[0] + (0 if math.isnan(s[1]) else s[1]) for s in stats]
                ax.fill_between(xs, lo, hi, color=st["color"], alpha=0.12, linewidth=0)
        title = members[0].facet_label(skip=("policy.name",))
        if n > 1 or title != "all runs":
            panel_title(ax, title, min(n, 3))
        ax.set_ylim(bottom=0)
    label_outer(axs, min(n, 3), "engine step" if time_axis == "step" else
                "time since run start (s)", "allocated blocks")
    if not drew:
        plt.close(fig)
        return
    note = seeds_note(points)
    if note and time_axis == "step":
        note += " (an ended run holds 0 blocks)"
    elif note:
        note = f"one line per seed ({note.split(' over ')[1]})"
    out.save(fig, "blocks_over_time", note=note)


def curves(points, key):
    """Points along `key`, one curve per mode, policy and setting of the other grid keys.

    Returns [(label, [(x, point), ...] sorted by x, style)] in mode order. A point without `key`
    (native, where key is a policy.* key) is not on any curve."""
    by_policy = len({p.policy for p in points if p.policy}) > 1 and key != "policy.name"
    # A grid key whose value follows from key's (block_size_paper scales num_blocks with the
    # block size) does not split a curve.
    follows = set()
    for k in {k for p in points for k in p.values} - {key}:
        seen = {}
        if all(seen.setdefault(repr(p.values[key]), repr(p.values[k])) == repr(p.values[k])
               for p in points if key in p.values and k in p.values):
            follows.add(k)
    out = {}
    for p in points:
        if key not in p.values:
            continue
        rest = repr([(k, v) for k, v in p.values.items() if k != key and k not in follows])
        out.setdefault((p.mode, p.policy if by_policy else "", rest), []).append((p.values[key], p))
    result = []
    for (mode, policy, _), pts in out.items():
        pts.sort(key=lambda xp: sort_key(xp[0]))
        result.append((pts[0][1], pts))
    result.sort(key=lambda c: (mode_rank(c[0]), c[0].policy,
                               [sort_key(v) for k, v in sorted(c[0].values.items()) if k != key]))
    sts = styles([first for first, _ in result], by_policy)
    return [(first.label(skip={key} | follows, by_policy=by_policy), pts, st)
            for (first, pts), st in zip(result, sts)], by_policy


def plot_sla(points, axes, out):
    key = "engine.max_num_seqs"
    naive = [p for p in points if p.mode == "naive" and key in p.values]
    if key not in axes or not naive:
        return
    # SLA = 1.05 x naive's p95 E2E at C_ref (docs/METRICS.md), averaged over its runs.
    c_ref = min({p.values[key] for p in naive}, key=lambda c: (abs(c - 8), c))
    ref = [r.get("e2e_p95") for p in naive if p.values[key] == c_ref for r in p.runs]
    sla = 1.05 * sum(ref) / len(ref)
    cs, by_policy = curves(points, key)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(FULL_IN, 2.4))
    for i, (label, pts, st) in enumerate(cs):
        xs = [x for x, _ in pts]
        thr = [p.stat("throughput_tok_s") for _, p in pts]
        lat = [p.stat("e2e_p95") for _, p in pts]
        drawn = errorbar(ax1, xs, thr, st, label, dodge=(i, len(cs)),
                         bounds=BOUNDS["throughput_tok_s"])
        errorbar(ax2, xs, lat, st, label, dodge=(i, len(cs)), bounds=BOUNDS["e2e_p95"])
        ok = [(t[0], x) for x, t, l in zip(drawn, thr, lat) if l[0] <= sla]
        if ok:  # the smallest C on a tie, as `report`
            t, x = max(ok, key=lambda tx: (tx[0], -tx[1]))
            ax1.plot([x], [t], marker="*", markersize=10, color=st["color"], linestyle="none",
                     markeredgecolor="white", markeredgewidth=0.5, zorder=5)
    ax1.plot([], [], marker="*", markersize=8, color="#444444", linestyle="none",
             label="C_sel: best C meeting the SLA")
    ax2.axhline(sla, color="#CC0000", linestyle="-.", linewidth=0.9,
                label=f"SLA {sla:.4g} s (1.05x naive p95 at C={fmt(c_ref)})")
    for ax in (ax1, ax2):
        ax.set_xlabel("concurrency limit C")
        value_ticks(ax, cs)
    ax1.set_ylabel("throughput (output tok/s)")
    ax2.set_ylabel("p95 end-to-end latency (s)")
    out.save(fig, "sla_frontier", note=seeds_note(points), last=("C_sel", "SLA"))


def plot_capacity(points, axes, out):
    key = "engine.max_num_seqs"
    if key not in axes:
        return
    cs, by_policy = curves(points, key)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(FULL_IN, 2.4),
                                   gridspec_kw={"width_ratios": [3, 2]})
    labels, caps, errs, colors = [], [], [], []
    for i, (label, pts, st) in enumerate(cs):
        errorbar(ax1, [x for x, _ in pts], [p.stat("preemptions") for _, p in pts], st, label,
                 bounds=BOUNDS["preemptions"],
                 dodge=(i, len(cs)))
        # The concurrency actually reached, at the points where no seed preempted: admission may
        # hold a run below its limit C.
        free = [p.stat("peak_running") for _, p in pts
                if all(r.get("preemptions") == 0 for r in p.runs)]
        best = max(free, key=lambda s: s[0]) if free else (0.0, math.nan, 0)
        labels.append(label)
        caps.append(best[0])
        errs.append(0.0 if math.isnan(best[1]) else best[1])
        colors.append(st["color"])
    ax1.set_xlabel("concurrency limit C")
    ax1.set_ylabel("preemptions")
    ax1.set_ylim(bottom=0, top=None if ax1.get_ylim()[1] > 0.5 else 1)
    value_ticks(ax1, cs)
    ys = range(len(labels))
    ax2.barh(ys, caps, xerr=errs if any(errs) else None, color=colors, height=0.6,
             error_kw={"elinewidth": 0.8})
    ax2.set_yticks(list(ys))
    ax2.set_yticklabels(labels)
    ax2.invert_yaxis()
    ax2.grid(axis="y", visible=False)
    ax2.set_xlabel("peak concurrency, no preemption")
    for i, c in enumerate(caps):
        ax2.text(c + errs[i], i, f" {c:.3g}", va="center", fontsize=7)
    ax2.set_xlim(right=max(caps + [1]) * 1.18)
    out.save(fig, "capacity_frontier", legend_axes=[ax1], note=seeds_note(points))


OVERHEAD_ROWS = 28  # bars per overhead figure; a larger sweep gets overhead_2, overhead_3, ...


def plot_overhead(points, axes, out):
    if not any(not math.isnan(p.mean(k)) for p in points for k, _, _ in PHASES):
        return
    by_policy = len({p.policy for p in points if p.policy}) > 1
    ordered = sorted(points, key=lambda p: ([sort_key(p.values.get(k, "")) for k in axes
                                             if k != "policy.name"], mode_rank(p), p.policy))
    pages = [ordered[i:i + OVERHEAD_ROWS] for i in range(0, len(ordered), OVERHEAD_ROWS)]
    for page, rows in enumerate(pages):
        draw_overhead(rows, by_policy, out, "overhead" + (f"_{page + 1}" if page else ""),
                      seeds_note(points))


def draw_overhead(rows, by_policy, out, name, note):
    """One horizontal stacked bar per point (mode, policy when several, other grid keys)."""
    n = len(rows)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(FULL_IN, 0.8 + 0.16 * n), sharey=True)
    ys = list(range(n))
    for ax, phases, scale in ((ax1, PHASES, 1.0), (ax2, PHASES[1:], 1e3)):
        left = [0.0] * n
        for key, label, color in phases:
            vals = [0.0 if math.isnan(p.mean(key)) else scale * p.mean(key) for p in rows]
            ax.barh(ys, vals, left=left, height=0.7, label=label, color=color)
            left = [a + b for a, b in zip(left, vals)]
        # The CI of each bar's total, over the seeds.
        totals = [ci95([sum(0.0 if math.isnan(r.get(k)) else scale * r.get(k)
                            for k, _, _ in phases) for r in p.runs]) for p in rows]
        errs = [0.0 if math.isnan(t[1]) else t[1] for t in totals]
        if any(errs):
            ax.errorbar(left, ys, xerr=errs, fmt="none", ecolor="#333333", elinewidth=0.7)
        ax.grid(axis="y", visible=False)
        ax.set_xlim(left=0)  # a CI reaching below 0 s is cut at the axis
    ax1.plot([p.mean("wall_s") for p in rows], ys, linestyle="none", marker="|", markersize=7,
             color="black", label="run wall time")
    ax1.set_yticks(ys)
    ax1.set_yticklabels([p.label(by_policy=by_policy) for p in rows])
    ax1.set_ylim(n - 0.5, -0.5)
    ax1.set_xlabel("time per run (s)")
    ax2.set_xlabel("eviction and reclamation (ms)")
    ax1.set_title("all phases")
    ax2.set_title("without the forward pass")
    out.save(fig, name, note=note)


def plot_block_size(points, axes, out):
    key = "engine.block_size"
    if key not in axes:
        return
    cs, by_policy = curves(points, key)
    fig, axs = plt.subplots(1, 3, figsize=(FULL_IN, 2.2))
    for i, (label, pts, st) in enumerate(cs):
        xs = [x for x, _ in pts]
        held = [ci95([r.get("blocks_mean") * x for r in p.runs]) for x, p in pts]
        d = {"dodge": (i, len(cs)), "log": True}
        errorbar(axs[0], xs, held, st, label, **d)
        errorbar(axs[1], xs, [p.stat("moves") for _, p in pts], st, label,
                 bounds=BOUNDS["moves"], **d)
        errorbar(axs[2], xs, [p.stat("waste_ratio_mean") for _, p in pts], st, label,
                 bounds=BOUNDS["waste_ratio_mean"], **d)
    ylabels = ["slots held / request", "tokens moved", "waste ratio F (mean)"]
    for ax, y in zip(axs, ylabels):
        ax.set_xscale("log", base=2)
        value_ticks(ax, cs)
        ax.set_xlabel("block size (tokens)")
        ax.set_ylabel(y)
    out.save(fig, "block_size", note=seeds_note(points))


GENERIC_PANELS = (("blocks_mean", "blocks held / request"), ("waste_ratio_mean", "waste ratio F"),
                  ("throughput_tok_s", "throughput (tok/s)"),
                  ("rouge_l_vs_native", "ROUGE-L F1 vs native"))


MAX_BARS = 8  # bars per category; a sweep with more is drawn as lines against a numeric key


def plot_generic(points, axes, out):
    for key in axes:
        if key in OWN_FIGURE:
            continue
        x_key = key
        cs, by_policy = curves(points, key)
        numeric = all(is_number(x) for _, pts, _ in cs for x, _ in pts)
        if not numeric and len(cs) > MAX_BARS:
            # Too many bars per category (another grid key with many values): lines against the
            # numeric grid key with the most values, one per mode and value of `key`.
            others = [k for k in axes if k != key and
                      all(is_number(p.values[k]) for p in points if k in p.values)]
            if others:
                x_key = max(others, key=lambda k: len({repr(p.values.get(k)) for p in points}))
                cs, by_policy = curves(points, x_key)
                numeric = True
        # A point without the key (native, for a policy.* key) is a reference line, once.
        refs = [p for p in points if x_key not in p.values]
        members = [p for _, pts, _ in cs for _, p in pts] + refs
        shown = [pn for pn in GENERIC_PANELS if any(not math.isnan(p.mean(pn[0])) for p in members)]
        if not shown:
            continue
        categories = []
        for _, pts, _ in cs:
            for x, _ in pts:
                if fmt(x) not in categories:
                    categories.append(fmt(x))
        cols = 2 if len(shown) == 4 else len(shown)
        fig, axs = grid(len(shown), FULL_IN if len(shown) > 1 else COLUMN_IN,
                        2.0 if len(shown) > 1 else 2.3, cols)
        width = 0.8 / max(1, len(cs))
        for i, (label, pts, st) in enumerate(cs):
            for ax, (name, _) in zip(axs, shown):
                stats = [p.stat(name) for _, p in pts]
                bounds = BOUNDS.get(name, (None, None))
                if numeric:
                    errorbar(ax, [x for x, _ in pts], stats, st, label, dodge=(i, len(cs)),
                             bounds=bounds)
                else:
                    xs = [categories.index(fmt(x)) + (i - (len(cs) - 1) / 2) * width
                          for x, _ in pts]
                    cut = [clipped(s[0], s[1], bounds) for s in stats]
                    errs = [[c[0] for c in cut], [c[1] for c in cut]]
                    ax.bar(xs, [s[0] for s in stats], width, label=label, color=st["color"],
                           hatch="//" if st["linestyle"] == "--" else None, edgecolor="white",
                           linewidth=0.3, yerr=errs if any(errs[0]) or any(errs[1]) else None,
                           error_kw={"elinewidth": 0.8})
        for ref, st in zip(refs, styles(refs, False)):
            label = ref.label(skip=(x_key,))
            for ax, (name, _) in zip(axs, shown):
                m, h, _ = ref.stat(name)
                if math.isnan(m):
                    continue
                ax.axhline(m, color=st["color"], linestyle=st["linestyle"], linewidth=1.0,
                           label=label)
                if not math.isnan(h):
                    below, above = clipped(m, h, BOUNDS.get(name, (None, None)))
                    ax.axhspan(m - below, m + above, color=st["color"], alpha=0.12, linewidth=0)
        for i, (ax, (_, ylabel)) in enumerate(zip(axs, shown)):
            if not numeric:
                ax.set_xticks(range(len(categories)))
                ax.set_xticklabels(categories, rotation=25 if len(categories) > 4 else 0,
                                   ha="right" if len(categories) > 4 else "center")
                ax.grid(axis="x", visible=False)
            else:
                value_ticks(ax, cs)
            if i >= len(shown) - cols:
                ax.set_xlabel(x_key)
            ax.set_ylabel(ylabel)
            lo, hi = BOUNDS.get(shown[i][0], (None, None))
            if lo is not None:
                ax.set_ylim(bottom=lo)
            if hi is not None:
                ax.set_ylim(top=hi * 1.03)
        out.save(fig, "by_" + key.replace(".", "_"),
                 note=seeds_note(members, [name for name, _ in shown]))


def plot_accuracy_vs_blocks(con, points, out):
    """Accuracy (mean over the requests of a point's runs, 95% interval over them, clipped to
    [0, 1]) against blocks held per request: what a policy keeps, in the memory it really holds.
    Naive and vtoken evict the same tokens, so a policy's two markers sit at one accuracy; the
    gap between them is the memory that only reclamation frees."""
    task_points = [p for p in points if not math.isnan(p.mean("task_accuracy"))]
    if not task_points:
        return
    fig, ax = plt.subplots(figsize=(COLUMN_IN, 2.8))
    by_curve = {}
    for p in task_points:
        m, h, _ = p.stat("task_accuracy")  # over the requests (sweep_points.PER_REQUEST)
        groups = p.mean("kv_groups")
        # Blocks of one KV group at layer / head granularity: on the token scale, as `compare`.
        blocks = p.mean("blocks_mean") / (groups if not math.isnan(groups) and groups > 1 else 1)
        by_curve.setdefault((p.mode, p.policy), []).append((blocks, m, h))
    for (mode, policy), pts in sorted(by_curve.items(), key=lambda kv: (mode_rank_name(kv[0][0]),
                                                                         kv[0][1] or "")):
        pts.sort()
        st = dict(MODE_STYLE[mode]) if mode in MODE_STYLE else {}
        if policy:
            st["color"] = policy_color(policy)
        xs, ys = [x for x, _, _ in pts], [y for _, y, _ in pts]
        lo = [y - max(0.0, y - h) if not math.isnan(h) else 0.0 for _, y, h in pts]
        hi = [min(1.0, y + h) - y if not math.isnan(h) else 0.0 for _, y, h in pts]
        label = mode + (f" / {policy}" if policy else "")
        ax.errorbar(xs, ys, yerr=[lo, hi], label=label, elinewidth=0.7, **st)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlim(left=0)
    ax.set_xlabel("KV blocks held per request (mean over its steps)")
    ax.set_ylabel("task accuracy (share of answers found)")
    out.save(fig, "accuracy_vs_blocks", legend_axes=[ax],
             note="bars: 95% interval over the requests, within [0, 1]")


def eviction_mode(points):
    """The mode whose runs stand for a policy's accuracy: naive, else vtoken (they evict the same
    tokens, so their answers are the same)."""
    modes = {p.mode for p in points}
    return "naive" if "naive" in modes else ("vtoken" if "vtoken" in modes else None)


def plot_accuracy_vs_compression(con, points, out):
    """kvpress's leaderboard view: task accuracy against the compression ratio (the share of the
    context evicted, 1 - policy.keep_ratio), one line per policy, the 95% interval over the
    requests as a band within [0, 1], the full cache (native) as a dashed line."""
    task_points = [p for p in points if not math.isnan(p.mean("task_accuracy"))]
    mode = eviction_mode(task_points)
    curves = {}  # one per policy and setting of the other grid keys
    for p in task_points:
        keep = p.config.get("policy.keep_ratio")
        if p.mode != mode or not is_number(keep) or keep <= 0:
            continue
        m, h, _ = p.stat("task_accuracy")  # over the requests (sweep_points.PER_REQUEST)
        rest = ", ".join(f"{short(k)}={fmt(v)}" for k, v in p.values.items()
                         if v is not None and k not in ("policy.name", "policy.keep_ratio"))
        curves.setdefault((p.policy, rest), []).append((1.0 - keep, m, h))
    curves = {k: c for k, c in curves.items() if len({x for x, _, _ in c}) >= 2}
    if not curves:
        return
    fig, ax = plt.subplots(figsize=(COLUMN_IN, 2.8))
    for policy, rest in sorted(curves):
        pts = sorted(curves[(policy, rest)])
        xs, ys = [x for x, _, _ in pts], [y for _, y, _ in pts]
        color = policy_color(policy)
        ax.plot(xs, ys, marker="o", markersize=3, lw=1, color=color,
                label=policy + (f", {rest}" if rest else ""))
        if any(not math.isnan(h) for _, _, h in pts):
            ax.fill_between(xs, [max(0.0, y - (0 if math.isnan(h) else h)) for _, y, h in pts],
                            [min(1.0, y + (0 if math.isnan(h) else h)) for _, y, h in pts],
                            color=color, alpha=0.12, lw=0)
    native = [p for p in task_points if p.mode == "native"]
    if native:
        pooled = Point("native", "", {})  # every native point's requests
        pooled.runs = [r for p in native for r in p.runs]
        ax.axhline(pooled.mean("task_accuracy"), color="black", ls="--", lw=0.8,
                   label="native (full cache)")
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("compression ratio (share of the context evicted)")
    ax.set_ylabel("task accuracy (share of answers found)")
    out.save(fig, "accuracy_vs_compression", legend_axes=[ax],
             note=f"{mode} runs; bands: 95% interval over the requests, within [0, 1]")


def request_cells(con, run_ids):
    """(configured needle depth, context tokens, score) of the scored requests of `run_ids`."""
    cols = {r[1] for r in con.execute("PRAGMA table_info(requests)")}
    if not {"score", "depth", "context_tokens"} <= cols:
        return []
    marks = ",".join("?" * len(run_ids))
    return con.execute(
        f"SELECT depth, context_tokens, score FROM requests WHERE run_id IN ({marks}) "
        "AND score IS NOT NULL AND depth IS NOT NULL", list(run_ids)).fetchall()


def plot_needle_heatmap(con, points, out):
    """Per keep ratio, one panel per policy: the mean score of the requests at each needle depth
    (rows) and context length (columns), with the count of requests per cell; native first."""
    task_points = [p for p in points if not math.isnan(p.mean("task_accuracy"))]
    mode = eviction_mode(task_points)
    by_keep = {}
    native = []
    for p in task_points:
        cells = request_cells(con, [r.id for r in p.runs])
        if not cells:
            continue
        if p.mode == "native":
            native.extend(cells)
        elif p.mode == mode:
            keep = p.config.get("policy.keep_ratio")
            by_keep.setdefault(keep, {}).setdefault(p.policy, []).extend(cells)
    for keep, policies in sorted(by_keep.items(), key=lambda kv: sort_key(kv[0])):
        panels = ([("native (full cache)", native)] if native else []) + sorted(policies.items())
        depths = sorted({d for _, cells in panels for d, _, _ in cells})
        lengths = sorted({n for _, cells in panels for _, n, _ in cells})
        cols = min(4, len(panels))
        rows = math.ceil(len(panels) / cols)
        fig, axs = plt.subplots(rows, cols, squeeze=False, sharex=True, sharey=True,
                                constrained_layout=True,
                                figsize=(FULL_IN, 0.6 + rows * (0.35 + 0.22 * len(depths))))
        image = None
        for i, (name, cells) in enumerate(panels):
            ax = axs[i // cols][i % cols]
            grid_sum = [[0.0] * len(lengths) for _ in depths]
            grid_n = [[0] * len(lengths) for _ in depths]
            for d, n, score in cells:
                grid_sum[depths.index(d)][lengths.index(n)] += score
                grid_n[depths.index(d)][lengths.index(n)] += 1
            values = [[grid_sum[r][c] / grid_n[r][c] if grid_n[r][c] else math.nan
                       for c in range(len(lengths))] for r in range(len(depths))]
            image = ax.imshow(values, vmin=0, vmax=1, cmap="viridis", aspect="auto",
                              origin="upper")
            for r in range(len(depths)):
                for c in range(len(lengths)):
                    if grid_n[r][c]:
                        v = values[r][c]
                        ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=5.5,
                                color="black" if v > 0.6 else "white")
            ax.set_title(name, fontsize=7)
            ax.grid(False)
            ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
            ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
        for j in range(len(panels), rows * cols):
            axs[j // cols][j % cols].axis("off")
        for ax in axs[-1]:
            ax.set_xlabel("context (tokens)")
        for row in axs:
            row[0].set_ylabel("needle depth")
        fig.colorbar(image, ax=axs, shrink=0.8, label="mean score")
        fig.text(0.5, 1.0, f"{mode} runs at keep ratio {fmt(keep)}: mean score of the requests "
                 "at each needle depth and context length", ha="center", va="bottom", fontsize=7)
        out.save(fig, f"needle_heatmap_keep_{fmt(keep)}")


def request_groups(con, run_ids):
    """requests.live_per_group of `run_ids`, parsed: per request a list per layer of the live
    tokens of its KV heads (a layer-granularity entry is one head)."""
    cols = {r[1] for r in con.execute("PRAGMA table_info(requests)")}
    if "live_per_group" not in cols:
        return []
    marks = ",".join("?" * len(run_ids))
    out = []
    for (v,) in con.execute(f"SELECT live_per_group FROM requests WHERE run_id IN ({marks}) "
                            "AND live_per_group IS NOT NULL", list(run_ids)):
        out.append([g if isinstance(g, list) else [g] for g in json.loads(v)])
    return out


def plot_allocation(con, points, out):
    """What a budget allocation kept where (layer / head granularity): per layer, the live tokens
    of a request at its finish summed over the layer's KV heads (mean over the requests), one
    line per point of the eviction mode; at head granularity a second panel shows the spread
    between a layer's heads (max - min, mean over the requests)."""
    mode = eviction_mode(points)
    rows = []
    for p in points:
        if p.mode != mode:
            continue
        reqs = request_groups(con, [r.id for r in p.runs])
        if not reqs:
            continue
        layers = len(reqs[0])
        per_layer = [sum(sum(r[l]) for r in reqs) / len(reqs) for l in range(layers)]
        spread = [sum(max(r[l]) - min(r[l]) for r in reqs) / len(reqs) for l in range(layers)]
        heads = max(len(g) for g in reqs[0])
        label = (f"{p.policy}, {p.config.get('cache.granularity', 'token')}, "
                 f"{p.config.get('policy.budget_allocation', 'uniform')}")
        rest = [f"{short(k)}={fmt(v)}" for k, v in p.values.items()
                if v is not None and
                k not in ("policy.name", "cache.granularity", "policy.budget_allocation")]
        rows.append((", ".join([label] + rest), p.policy, per_layer, spread, heads))
    if not rows:
        return
    per_head = any(h > 1 for *_, h in rows)
    fig, axs = plt.subplots(1, 2 if per_head else 1, squeeze=False,
                            figsize=(FULL_IN if per_head else COLUMN_IN, 2.6))
    markers = "osD^vP*X"
    for i, (label, policy, per_layer, spread, heads) in enumerate(rows):
        kw = dict(color=policy_color(policy), marker=markers[i % len(markers)], markersize=3,
                  lw=1, label=label)
        xs = list(range(len(per_layer)))
        axs[0][0].plot(xs, per_layer, **kw)
        if per_head and heads > 1:
            axs[0][1].plot(xs, spread, **kw)
    axs[0][0].set_xlabel("layer")
    axs[0][0].set_ylabel("live tokens at finish (per request)")
    axs[0][0].set_ylim(bottom=0)
    if per_head:
        axs[0][1].set_xlabel("layer")
        axs[0][1].set_ylabel("max - min over the layer's KV heads")
        axs[0][1].set_ylim(bottom=0)
    out.save(fig, "allocation", note=f"{mode} runs; means over the requests")


def mode_rank_name(mode):
    return MODES.index(mode) if mode in MODES else len(MODES)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", required=True, help="result database (SQLite)")
    ap.add_argument("--sweep", required=True, help="sweep name (runs.sweep)")
    ap.add_argument("--out", required=True, help="directory for the figure files")
    ap.add_argument("--format", default="pdf,png",
                    help="comma-separated file formats of every figure (default: pdf,png)")
    ap.add_argument("--time", choices=("step", "wall"), default="step",
                    help="time axis of blocks_over_time: engine step (default, reproducible) or "
                         "wall seconds (steps.time_s)")
    args = ap.parse_args(argv)
    formats = [f.strip().lower() for f in args.format.split(",") if f.strip()]
    bad = [f for f in formats if f not in ("pdf", "png", "svg")]
    if not formats or bad:
        ap.error(f"--format: {','.join(bad) or 'empty'} not in pdf, png, svg")
    con, points, axes = load(args.db, args.sweep)
    os.makedirs(args.out, exist_ok=True)
    out = Writer(args.out, formats)
    plot_util_hist(con, points, out)
    plot_blocks_over_time(con, points, axes, out, args.time)
    plot_sla(points, axes, out)
    plot_capacity(points, axes, out)
    plot_overhead(points, axes, out)
    plot_block_size(points, axes, out)
    plot_generic(points, axes, out)
    plot_accuracy_vs_blocks(con, points, out)
    plot_accuracy_vs_compression(con, points, out)
    plot_needle_heatmap(con, points, out)
    plot_allocation(con, points, out)
    for path in out.written:
        print(path)


if __name__ == "__main__":
    main()

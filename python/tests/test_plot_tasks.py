"""experiments/plot.py's accuracy_vs_blocks figure: task accuracy over the requests of a point's
runs (all seeds), its 95% interval clipped to [0, 1], against the blocks each mode held."""

import math
import os
import sqlite3
import sys

import pytest

matplotlib = pytest.importorskip("matplotlib")

SRC = os.environ.get("VTOKEN_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "experiments"))
sys.path.insert(0, os.path.dirname(__file__))

import plot  # noqa: E402
import sweep_points  # noqa: E402
from test_plot import SCHEMA, Capture  # noqa: E402

# Per (mode, seed): the scores of 4 requests. naive and vtoken evict the same tokens: same scores.
SCORES = {1: [1.0, 1.0, 0.0, 0.0], 2: [1.0, 1.0, 1.0, 1.0]}
BLOCKS = {"native": 66.0, "naive": 51.0, "vtoken": 21.0}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tasks") / "t.db")
    con = sqlite3.connect(path)
    for ddl in SCHEMA:
        con.execute(ddl)
    con.execute("CREATE TABLE requests (run_id INTEGER NOT NULL, request_id INTEGER NOT NULL, "
                "score REAL, PRIMARY KEY (run_id, request_id)) WITHOUT ROWID")
    run_id = 0
    for seed in (1, 2):
        for mode in ("native", "naive", "vtoken"):
            run_id += 1
            toml = f'name = "t"\nmodes = ["{mode}"]\nseed = {seed}\n[workload]\nseed = {seed}\n'
            if mode != "native":
                toml += '[policy]\nname = "h2o"\n'
            con.execute("INSERT INTO runs (id, created, config_toml, sweep, mode, policy, seed, "
                        "status) VALUES (?, '2026-12-05T00:00:00Z', ?, 't', ?, ?, ?, 'completed')",
                        (run_id, toml, mode, "" if mode == "native" else "h2o", seed))
            scores = [1.0] * 4 if mode == "native" else SCORES[seed]
            con.executemany("INSERT INTO requests VALUES (?, ?, ?)",
                            [(run_id, i, s) for i, s in enumerate(scores)])
            summary = {"task_accuracy": sum(scores) / 4, "blocks_mean": BLOCKS[mode]}
            con.executemany("INSERT INTO summary VALUES (?, ?, ?)",
                            [(run_id, k, v) for k, v in summary.items()])
    con.commit()
    con.close()
    return path


def test_accuracy_is_over_requests_clipped_and_labelled_in_words(db):
    con, points, _ = sweep_points.load(db, "t")
    out = Capture()
    plot.plot_accuracy_vs_blocks(con, points, out)
    ax = out.figures["accuracy_vs_blocks"].axes[0]
    assert ax.get_ylim() == (-0.03, 1.03)
    assert ax.get_xlabel() == "KV blocks held per request (mean over its steps)"
    assert ax.get_ylabel() == "task accuracy (share of answers found)"
    bars = {c.get_label(): c for c in ax.containers}
    assert set(bars) == {"native", "naive / h2o", "vtoken / h2o"}
    for label, x in (("naive / h2o", 51.0), ("vtoken / h2o", 21.0), ("native", 66.0)):
        xs, ys = bars[label].lines[0].get_data()
        assert list(xs) == [x]
        assert list(ys) == [1.0 if label == "native" else 0.75]
    # The interval over the 8 requests of both seeds: t(0.975, 7) * s / sqrt(8) = 0.387, cut at 1
    # above; over the two seeds' means (0.5, 1.0) it would be 3.18.
    spans = []
    for c in ax.containers:
        for seg in c.lines[2][0].get_segments():
            (x0, y0), (x1, y1) = seg
            if x0 == x1 and x0 in (51.0, 21.0):
                spans.append((min(y0, y1), max(y0, y1)))
    assert len(spans) == 2
    for lo, hi in spans:
        assert lo == pytest.approx(0.75 - 0.387, abs=1e-3)
        assert hi == 1.0


# A keep-ratio sweep of two policies: per (mode, policy, keep ratio) the scores of 4 requests at
# depths 0, 0.5, 0.5, 1.0 and 1,024 tokens (the first two) or 2,048 (the last two).
DEPTHS = [0.0, 0.5, 0.5, 1.0]
LENGTHS = [1024, 1024, 2048, 2048]
KEEP_SCORES = {("h2o", 0.5): [1, 1, 0, 1], ("h2o", 0.25): [0, 1, 0, 1],
               ("snapkv", 0.5): [1, 1, 1, 1], ("snapkv", 0.25): [1, 0, 0, 1]}


@pytest.fixture(scope="module")
def keep_db(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("keep") / "k.db")
    con = sqlite3.connect(path)
    for ddl in SCHEMA:
        con.execute(ddl)
    con.execute("CREATE TABLE requests (run_id INTEGER NOT NULL, request_id INTEGER NOT NULL, "
                "depth REAL, context_tokens INTEGER, score REAL, "
                "PRIMARY KEY (run_id, request_id)) WITHOUT ROWID")
    runs = [("native", "", None)] + [(m, pol, k) for (pol, k) in KEEP_SCORES
                                     for m in ("naive", "vtoken")]
    for run_id, (mode, policy, keep) in enumerate(runs, start=1):
        toml = f'name = "k"\nmodes = ["{mode}"]\nseed = 1\n'
        if policy:
            toml += f'[policy]\nname = "{policy}"\nkeep_ratio = {keep}\n'
        con.execute("INSERT INTO runs (id, created, config_toml, sweep, mode, policy, seed, "
                    "status) VALUES (?, '2026-12-05T00:00:00Z', ?, 'k', ?, ?, 1, 'completed')",
                    (run_id, toml, mode, policy))
        scores = [1] * 4 if mode == "native" else KEEP_SCORES[(policy, keep)]
        con.executemany("INSERT INTO requests VALUES (?, ?, ?, ?, ?)",
                        [(run_id, i, DEPTHS[i], LENGTHS[i], s) for i, s in enumerate(scores)])
        con.execute("INSERT INTO summary VALUES (?, 'task_accuracy', ?)", (run_id, sum(scores) / 4))
    con.commit()
    con.close()
    return path


def test_accuracy_vs_compression_has_one_line_per_policy_and_the_full_cache(keep_db):
    con, points, _ = sweep_points.load(keep_db, "k")
    out = Capture()
    plot.plot_accuracy_vs_compression(con, points, out)
    ax = out.figures["accuracy_vs_compression"].axes[0]
    lines = {l.get_label(): l for l in ax.get_lines()}
    assert set(lines) == {"h2o", "snapkv", "native (full cache)"}
    xs, ys = lines["h2o"].get_data()
    assert list(xs) == [0.5, 0.75] and list(ys) == [0.75, 0.5]
    xs, ys = lines["snapkv"].get_data()
    assert list(xs) == [0.5, 0.75] and list(ys) == [1.0, 0.5]
    assert list(lines["native (full cache)"].get_data()[1]) == [1.0, 1.0]
    assert ax.get_xlim() == (0, 1) and ax.get_ylim() == (-0.03, 1.03)
    for band in ax.collections:  # the 95% intervals, cut to [0, 1]
        ys = band.get_paths()[0].vertices[:, 1]
        assert ys.min() >= 0.0 and ys.max() <= 1.0
    assert ax.get_xlabel() == "compression ratio (share of the context evicted)"


def test_needle_heatmap_cells_are_mean_scores_per_depth_and_length(keep_db):
    con, points, _ = sweep_points.load(keep_db, "k")
    out = Capture()
    plot.plot_needle_heatmap(con, points, out)
    assert set(out.figures) == {"needle_heatmap_keep_0.25", "needle_heatmap_keep_0.5"}
    fig = out.figures["needle_heatmap_keep_0.25"]
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert set(panels) == {"native (full cache)", "h2o", "snapkv"}
    # h2o at 25%: depth 0 / 1,024 -> 0; depth 0.5 -> 1 (1,024) and 0 (2,048); depth 1 -> 1.
    grid = panels["h2o"].get_images()[0].get_array()
    assert grid.shape == (3, 2)
    assert grid[0][0] == 0.0 and math.isnan(grid[0][1])
    assert grid[1][0] == 1.0 and grid[1][1] == 0.0
    assert math.isnan(grid[2][0]) and grid[2][1] == 1.0
    assert [t.get_text() for t in fig.texts] == [
        "naive runs at keep ratio 0.25: mean score of the requests at each needle depth and "
        "context length"]
    full = panels["native (full cache)"]  # the first column: its tick labels are shown
    assert [t.get_text() for t in full.get_yticklabels()] == ["0%", "50%", "100%"]
    assert [t.get_text() for t in full.get_xticklabels()] == ["1024", "2048"]
    assert (full.get_images()[0].get_array() == 1.0).sum() == 4


def test_allocation_sums_each_layers_heads_and_shows_their_spread(tmp_path):
    path = str(tmp_path / "a.db")
    con = sqlite3.connect(path)
    for ddl in SCHEMA:
        con.execute(ddl)
    con.execute("CREATE TABLE requests (run_id INTEGER NOT NULL, request_id INTEGER NOT NULL, "
                "live_per_group TEXT, PRIMARY KEY (run_id, request_id)) WITHOUT ROWID")
    # Two head-granularity points (uniform, pyramid) of 3 layers x 2 KV heads, 2 requests each.
    groups = {"uniform": ["[[4, 4], [4, 4], [4, 4]]", "[[6, 2], [4, 4], [4, 4]]"],
              "pyramid": ["[[8, 6], [4, 4], [1, 1]]", "[[8, 8], [4, 2], [1, 1]]"]}
    for run_id, (alloc, values) in enumerate(groups.items(), start=1):
        toml = ('name = "a"\nmodes = ["naive"]\nseed = 1\n[cache]\ngranularity = "head"\n'
                f'[policy]\nname = "h2o"\nbudget_allocation = "{alloc}"\n')
        con.execute("INSERT INTO runs (id, created, config_toml, sweep, mode, policy, seed, "
                    "status) VALUES (?, '2026-12-05T00:00:00Z', ?, 'a', 'naive', 'h2o', 1, "
                    "'completed')", (run_id, toml))
        con.executemany("INSERT INTO requests VALUES (?, ?, ?)",
                        [(run_id, i, v) for i, v in enumerate(values)])
        con.execute("INSERT INTO summary VALUES (?, 'kv_groups', 6)", (run_id,))
    con.commit()
    con.close()
    con, points, _ = sweep_points.load(path, "a")
    out = Capture()
    plot.plot_allocation(con, points, out)
    totals, spreads = out.figures["allocation"].axes[:2]
    lines = {l.get_label(): l.get_data()[1] for l in totals.get_lines()}
    assert list(lines["h2o, head, uniform"]) == [8.0, 8.0, 8.0]
    assert list(lines["h2o, head, pyramid"]) == [15.0, 7.0, 2.0]
    spread = {l.get_label(): l.get_data()[1] for l in spreads.get_lines()}
    assert list(spread["h2o, head, uniform"]) == [2.0, 0.0, 0.0]
    assert list(spread["h2o, head, pyramid"]) == [1.0, 1.0, 0.0]
    assert totals.get_ylabel() == "live tokens at finish (per request)"


def test_bounded_figures_keep_their_intervals_within_bounds(tmp_path):
    """Two seeds far apart give a 95% interval wider than the range: ROUGE-L (a ratio) is drawn
    within [0, 1] and throughput (a rate) not below 0, on the by_KEY figure."""
    path = str(tmp_path / "b.db")
    con = sqlite3.connect(path)
    for ddl in SCHEMA:
        con.execute(ddl)
    run_id = 0
    for keep in (0.25, 0.5):
        for seed, (rouge, tput) in ((1, (0.30, 1.0)), (2, (0.95, 40.0))):
            run_id += 1
            toml = (f'name = "b"\nmodes = ["naive"]\nseed = {seed}\n[workload]\nseed = {seed}\n'
                    f'[policy]\nname = "h2o"\nkeep_ratio = {keep}\n')
            con.execute("INSERT INTO runs (id, created, config_toml, sweep, mode, policy, seed, "
                        "status) VALUES (?, '2026-12-05T00:00:00Z', ?, 'b', 'naive', 'h2o', ?, "
                        "'completed')", (run_id, toml, seed))
            con.executemany("INSERT INTO summary VALUES (?, ?, ?)",
                            [(run_id, "rouge_l_vs_native", rouge),
                             (run_id, "throughput_tok_s", tput)])
    con.commit()
    con.close()
    _, points, axes = sweep_points.load(path, "b")
    out = Capture()
    plot.plot_generic(points, axes, out)
    fig = out.figures["by_policy_keep_ratio"]
    by_label = {ax.get_ylabel(): ax for ax in fig.axes}
    for ylabel, (lo, hi) in (("ROUGE-L F1 vs native", (0.0, 1.0)),
                             ("throughput (tok/s)", (0.0, math.inf))):
        ax = by_label[ylabel]
        segments = [seg for c in ax.containers for seg in c.lines[2][0].get_segments()]
        assert segments, ylabel  # the interval is drawn, and cut
        ends = [y for seg in segments for _, y in seg]
        assert min(ends) >= lo and max(ends) <= hi, (ylabel, ends)
        assert ax.get_ylim()[0] >= lo
    assert by_label["ROUGE-L F1 vs native"].get_ylim()[1] <= 1.03


def test_accuracy_vs_compression_needs_two_keep_ratios_per_curve(keep_db):
    con, points, _ = sweep_points.load(keep_db, "k")
    one_ratio = [p for p in points if p.config.get("policy.keep_ratio") in (None, 0.5)]
    out = Capture()
    plot.plot_accuracy_vs_compression(con, one_ratio, out)
    assert out.figures == {}


def test_rouge_l_interval_is_over_the_requests(tmp_path):
    """ROUGE-L is a mean over requests (sweep_points.PER_REQUEST): with one seed its interval on
    the by_KEY figure is the one over the run's requests (stored since schema 5), and a file
    without the per-request column keeps no interval for a single seed."""
    rouge = [0.6, 0.5, 0.5, 0.4]  # mean 0.5, s 0.0816: t(0.975, 3) * s / 2 = 0.1299
    paths = {}
    for per_request in (True, False):
        path = str(tmp_path / f"r{int(per_request)}.db")
        con = sqlite3.connect(path)
        for ddl in SCHEMA:
            con.execute(ddl)
        con.execute("CREATE TABLE requests (run_id INTEGER NOT NULL, request_id INTEGER NOT "
                    "NULL, score REAL" + (", rouge_l_vs_native REAL" if per_request else "") +
                    ", PRIMARY KEY (run_id, request_id)) WITHOUT ROWID")
        for run_id, keep in enumerate((0.25, 0.5), start=1):
            toml = (f'name = "r"\nmodes = ["naive"]\nseed = 1\n'
                    f'[policy]\nname = "h2o"\nkeep_ratio = {keep}\n')
            con.execute("INSERT INTO runs (id, created, config_toml, sweep, mode, policy, seed, "
                        "status) VALUES (?, '2026-12-05T00:00:00Z', ?, 'r', 'naive', 'h2o', 1, "
                        "'completed')", (run_id, toml))
            for i, v in enumerate(rouge):
                con.execute("INSERT INTO requests VALUES (?, ?, NULL" +
                            (", ?)" if per_request else ")"),
                            (run_id, i, v) if per_request else (run_id, i))
            con.execute("INSERT INTO summary VALUES (?, 'rouge_l_vs_native', 0.5)", (run_id,))
        con.commit()
        con.close()
        paths[per_request] = path

    _, points, axes = sweep_points.load(paths[True], "r")
    mean, half, n = points[0].stat("rouge_l_vs_native")
    assert (mean, n) == (pytest.approx(0.5), 4)
    assert half == pytest.approx(0.1299, abs=1e-4)
    out = Capture()
    plot.plot_generic(points, axes, out)
    fig = out.figures["by_policy_keep_ratio"]
    ax = {a.get_ylabel(): a for a in fig.axes}["ROUGE-L F1 vs native"]
    ends = sorted(y for c in ax.containers for seg in c.lines[2][0].get_segments()
                  for _, y in seg)
    assert ends == pytest.approx([0.3701, 0.3701, 0.6299, 0.6299], abs=1e-4)
    assert fig.legends[0].get_title().get_text() == "ROUGE-L: 95% CI over the requests"

    _, old_points, _ = sweep_points.load(paths[False], "r")
    mean, half, n = old_points[0].stat("rouge_l_vs_native")
    assert (mean, n) == (0.5, 1) and math.isnan(half)

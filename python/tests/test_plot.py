"""experiments/plot.py on a small database with seeds, written here in the result store's schema.

The sweep: policy.name h2o / tova x engine.max_num_seqs 2 / 4 x seeds 1, 2, 3, modes native,
naive and vtoken, native run once per point as `sweep` runs it (12 native runs, 4 baselines of
3 seeds). Every figure it has data for must come out as a PDF and a 300-dpi PNG, the error bars
must be the 95% confidence intervals computed by hand, and native must be one curve.
"""

import math
import os
import sqlite3
import struct
import subprocess
import sys

import pytest

matplotlib = pytest.importorskip("matplotlib")

SRC = os.environ.get("VTOKEN_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "experiments"))

import plot  # noqa: E402
import sweep_points  # noqa: E402

# lib/engine/result_store.cc's tables that plot.py reads (same columns, same constraints).
SCHEMA = [
    """CREATE TABLE runs (
      id INTEGER PRIMARY KEY, created TEXT NOT NULL, git_sha TEXT NOT NULL DEFAULT '',
      config_toml TEXT NOT NULL DEFAULT '', config_hash TEXT NOT NULL DEFAULT '',
      sweep TEXT NOT NULL DEFAULT '', model TEXT NOT NULL DEFAULT '',
      mode TEXT NOT NULL DEFAULT '', policy TEXT NOT NULL DEFAULT '',
      budget REAL NOT NULL DEFAULT 0, block_size INTEGER NOT NULL DEFAULT 0,
      num_blocks INTEGER NOT NULL DEFAULT 0, workload TEXT NOT NULL DEFAULT '',
      seed INTEGER NOT NULL DEFAULT 0,
      status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'interrupted')),
      error TEXT NOT NULL DEFAULT '', pid INTEGER NOT NULL DEFAULT 0, finished TEXT)""",
    """CREATE TABLE steps (
      run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE, step INTEGER NOT NULL,
      time_s REAL, num_running INTEGER, num_waiting INTEGER, free_blocks INTEGER,
      allocated_blocks INTEGER, live_slots INTEGER, waste_ratio REAL, held_blocks INTEGER,
      ideal_blocks INTEGER, hist0 INTEGER, hist1 INTEGER, hist2 INTEGER, hist3 INTEGER,
      moves INTEGER, fence_waits INTEGER, PRIMARY KEY (run_id, step)) WITHOUT ROWID""",
    """CREATE TABLE summary (
      run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE, name TEXT NOT NULL,
      value REAL, PRIMARY KEY (run_id, name)) WITHOUT ROWID""",
]

SEEDS = (1, 2, 3)
OFFSET = {1: -2.0, 2: -1.0, 3: 3.0}  # per seed: mean 0, sample standard deviation sqrt(7)
# t(0.975, 2 df) * sqrt(7) / sqrt(3), by hand: 4.303 * 2.6457513 / 1.7320508.
HALF_WIDTH = 6.5729
EXPECTED = ["util_hist", "blocks_over_time", "sla_frontier", "capacity_frontier", "overhead",
            "by_policy_name"]


def config(mode, policy, c, seed):
    return f"""name = "t"
modes = ["{mode}"]
seed = {seed}
[workload]
seed = {seed}
[engine]
max_num_seqs = {c}
[policy]
name = "{policy}"
"""


def throughput(mode, policy, c):
    """A point's mean throughput; native's does not depend on the policy."""
    extra = 5 if policy == "tova" and mode != "native" else 0
    return 100.0 * c + {"native": 0, "naive": 10, "vtoken": 20}[mode] + extra


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("plot") / "t.db")
    con = sqlite3.connect(path)
    for ddl in SCHEMA:
        con.execute(ddl)
    run_id = 0
    for policy in ("h2o", "tova"):
        for c in (2, 4):
            for seed in SEEDS:
                for mode in ("native", "naive", "vtoken"):
                    run_id += 1
                    con.execute(
                        "INSERT INTO runs (id, created, config_toml, sweep, mode, policy, seed, "
                        "status) VALUES (?, '2026-12-01T00:00:00Z', ?, 't', ?, ?, ?, 'completed')",
                        (run_id, config(mode, policy, c, seed), mode,
                         "" if mode == "native" else policy, seed))
                    for step in range(4 + seed):
                        con.execute(
                            "INSERT INTO steps (run_id, step, time_s, allocated_blocks, hist0, "
                            "hist1, hist2, hist3) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                            (run_id, step, 0.1 * step, 10 + step, seed, 1, 2, 3))
                    summary = {
                        "throughput_tok_s": throughput(mode, policy, c) + OFFSET[seed],
                        "e2e_p95": 1.0 + 0.1 * c, "preemptions": 0.0, "peak_running": float(c),
                        "blocks_mean": 5.0, "waste_ratio_mean": 0.2, "wall_s": 1.0,
                        "forward_s": 0.8, "policy_s": 0.01, "planner_s": 0.002, "fence_s": 0.0,
                    }
                    con.executemany("INSERT INTO summary VALUES (?, ?, ?)",
                                    [(run_id, k, v) for k, v in summary.items()])
    con.commit()
    con.close()
    return path


def png_dpi(path):
    """Pixels per inch from the PNG's pHYs chunk (None without one)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos = 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"pHYs":
            x, y, unit = struct.unpack(">IIB", data[pos + 8:pos + 17])
            assert unit == 1  # per metre
            return round(x * 0.0254), round(y * 0.0254)
        pos += 12 + length
    return None


def test_ci95_matches_hand_computed_values():
    mean, half, n = sweep_points.ci95([4.0, 5.0, 9.0])
    assert (mean, n) == (6.0, 3)
    assert half == pytest.approx(HALF_WIDTH, abs=1e-4)
    # Two values: t(0.975, 1) = 12.706, s = sqrt(2), n = 2.
    assert sweep_points.ci95([1.0, 3.0])[1] == pytest.approx(12.706)
    # NaN and None are left out; one value has no interval; none has no mean.
    mean, half, n = sweep_points.ci95([2.0, math.nan, None])
    assert (mean, n) == (2.0, 1) and math.isnan(half)
    assert sweep_points.ci95([])[2] == 0 and math.isnan(sweep_points.ci95([])[0])
    # Beyond the table (30 df), lib/engine/stats.cc's first Cornish-Fisher term:
    # 1.959964 + (1.959964^3 + 1.959964) / 160 = 2.01927 (the exact quantile is 2.0211).
    assert sweep_points.student_t975(40) == pytest.approx(2.01927, abs=1e-5)


def test_points_group_seeds_and_one_native_baseline(db):
    _, points, axes = sweep_points.load(db, "t")
    assert axes == ["engine.max_num_seqs", "policy.name"]
    assert all(len(p.runs) == 3 for p in points)
    native = [p for p in points if p.mode == "native"]
    # 12 native runs, one per policy, C and seed: 2 baselines (C = 2, 4) of 3 seeds.
    assert sorted(p.values["engine.max_num_seqs"] for p in native) == [2, 4]
    assert all("policy.name" not in p.values for p in native)
    assert len(points) == 2 + 2 * 2 * 2


def test_cli_writes_pdf_and_300_dpi_png_per_figure(db, tmp_path):
    out = tmp_path / "figs"
    run = subprocess.run([sys.executable, os.path.join(SRC, "experiments", "plot.py"), "--db", db,
                          "--sweep", "t", "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    expected = [str(out / f"{name}.{fmt}") for name in EXPECTED for fmt in ("pdf", "png")]
    assert run.stdout.split() == expected
    assert sorted(os.listdir(out)) == sorted(os.path.basename(p) for p in expected)
    for name in EXPECTED:
        with open(out / f"{name}.pdf", "rb") as f:
            assert f.read(5) == b"%PDF-"
        assert png_dpi(out / f"{name}.png") == (300, 300)
    assert "6 native runs repeat a baseline" in run.stderr
    bad = subprocess.run([sys.executable, os.path.join(SRC, "experiments", "plot.py"), "--db", db,
                          "--sweep", "t", "--out", str(out), "--format", "pdf,gif"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--format: gif not in pdf, png, svg" in bad.stderr


class Capture(plot.Writer):
    """Keeps every figure (the legend included) instead of writing it."""

    def __init__(self):
        super().__init__(out_dir="", formats=[])
        self.figures = {}

    def save(self, fig, name, **kw):
        super().save(fig, name, **kw)
        self.figures[name] = fig


def test_sla_frontier_has_the_ci_error_bars_and_native_once(db):
    _, points, axes = sweep_points.load(db, "t")
    out = Capture()
    plot.plot_sla(points, axes, out)
    fig = out.figures["sla_frontier"]
    throughput_ax = fig.axes[0]
    labels = [c.get_label() for c in throughput_ax.containers]
    assert labels == ["native", "naive h2o", "naive tova", "vtoken h2o", "vtoken tova"]
    for container in throughput_ax.containers:
        means = container.lines[0].get_ydata()
        bars = container.lines[2][0].get_segments()
        assert len(bars) == 2  # C = 2 and 4
        for (x0, lo), (x1, hi) in bars:
            assert x0 == x1
            assert (hi - lo) / 2 == pytest.approx(HALF_WIDTH, abs=1e-4)
        mode, _, policy = container.get_label().partition(" ")
        assert list(means) == pytest.approx([throughput(mode, policy or "h2o", c) for c in (2, 4)])
    legend = fig.legends[0]
    assert "over 3 seeds" in legend.get_title().get_text()
    # The legend is below every axes, so it covers no data.
    renderer = fig.canvas.get_renderer()
    legend_box = legend.get_window_extent(renderer)
    assert all(legend_box.y1 <= ax.get_tightbbox(renderer).y0 + 1 for ax in fig.axes)


def test_one_seed_has_no_error_bars(db):
    _, points, axes = sweep_points.load(db, "t")
    for p in points:
        p.runs = p.runs[:1]
    out = Capture()
    plot.plot_sla(points, axes, out)
    fig = out.figures["sla_frontier"]
    assert fig.axes[0].containers == []
    assert fig.legends[0].get_title().get_text() == ""

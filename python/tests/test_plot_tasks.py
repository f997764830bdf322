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

"""The points of one sweep in a vtoken result database: runs grouped over their seeds.

A point is one setting of the grid keys in one mode; its runs are the seeds (runs whose
resolved configs differ only in SEED_KEYS, as `vtoken-cli export --table points` groups them).
Native runs ignore the policy.* keys: the native runs of a sweep that differ only in the policy
are one baseline. ci95() is engine::MeanCi95 (lib/engine/stats.cc) in Python.

Used by experiments/plot.py; only the Python standard library.
"""

import math
import os
import sqlite3
import sys
import tomllib

# Keys whose values tell the seeds of one point apart: `[sweep] seeds` sets both (docs/SWEEPS.md),
# and `export --table points` groups over the same two.
SEED_KEYS = ("seed", "workload.seed")
# Keys that identify a run but are not grid axes: the mode is a column of its own, and the
# experiment name is the same for every run of a sweep.
NOT_AXES = {"modes", "name"}
# Summary figures that are the mean over a run's requests of one requests column
# (engine::kPerRequestFigures, lib/engine/result_schema.h): a point's mean and interval are taken
# over the requests of all its runs, pooled, not over the seeds' means.
PER_REQUEST = {"task_accuracy": "score", "rouge_l_vs_native": "rouge_l_vs_native",
               "rouge_l_vs_naive": "rouge_l_vs_naive",
               "rouge_l_vs_reference": "rouge_l_vs_reference"}


T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060,
        2.056, 2.052, 2.048, 2.045, 2.042)


def student_t975(df):
    """The 0.975 quantile of Student's t with df degrees of freedom (lib/engine/stats.cc)."""
    if df < 1:
        return math.nan
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4.0 * df)


def ci95(values):
    """(mean, half-width of the two-sided 95% CI of the mean, n) over the non-NaN values.

    The half-width is t(0.975, n-1) * s / sqrt(n), s the sample standard deviation, as
    engine::MeanCi95 and `export --table points`; NaN when n < 2 (the mean too when n = 0).
    """
    vals = [v for v in values if v is not None and not math.isnan(v)]
    n = len(vals)
    if n == 0:
        return math.nan, math.nan, 0
    mean = sum(vals) / n
    if n < 2:
        return mean, math.nan, 1
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    return mean, student_t975(n - 1) * sd / math.sqrt(n), n


def flatten(table, prefix=""):
    out = {}
    for k, v in table.items():
        key = prefix + k
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def short(key):
    """A grid key for a label: its last part ("policy" for policy.name)."""
    parts = key.split(".")
    return parts[-2] if parts[-1] == "name" and len(parts) > 1 else parts[-1]


def fmt(v):
    if v is None:  # a key older runs' configs lack
        return "unset"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list):
        return "[" + ",".join(fmt(x) for x in v) + "]"
    return str(v)


def sort_key(v):
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Run:
    def __init__(self, run_id, mode, policy, config, summary, per_request=None):
        self.id, self.mode, self.policy = run_id, mode, policy
        self.config = config
        self.summary = summary
        # PER_REQUEST figure -> its requests' values (absent: the file stores none).
        self.per_request = per_request or {}

    def get(self, name):
        v = self.summary.get(name)
        return math.nan if v is None else v

    def seed(self):
        return tuple(repr(self.config.get(k)) for k in SEED_KEYS)


def native_ignores(key):
    """Keys a native run does not read (the CLI's NativeView): policy.* and reclaim.*."""
    return key.startswith("policy.") or key.startswith("reclaim.")


class Point:
    """One grid point of one mode: its runs, one per seed, and the grid keys that identify it.

    `config` is the resolved config without NOT_AXES and SEED_KEYS, and for native without the
    policy.* and reclaim.* keys (native does not depend on them, and records none of them). `values` maps each grid axis the point has
    to its value (set by load()).
    """

    def __init__(self, mode, policy, config):
        self.mode, self.policy, self.config = mode, policy, config
        self.runs = []
        self.values = {}

    def stat(self, name):
        """(mean, 95% half-width, n): over the requests of all the point's runs for a
        PER_REQUEST figure that every run has per request, else over the runs (seeds)."""
        if self.runs and all(r.per_request.get(name) for r in self.runs):
            return ci95([v for r in self.runs for v in r.per_request[name]])
        return ci95([r.get(name) for r in self.runs])

    def mean(self, name):
        return self.stat(name)[0]

    def ignores(self, key):
        return self.mode == "native" and native_ignores(key)

    def label(self, skip=(), by_policy=True):
        """"vtoken h2o, num_blocks=48": the mode, the policy, the other grid keys."""
        head = self.mode + (f" {self.policy}" if by_policy and self.policy else "")
        rest = [f"{short(k)}={fmt(v)}" for k, v in self.values.items()
                if k not in skip and k != "policy.name"]
        return ", ".join([head] + rest)

    def facet_label(self, skip=()):
        parts = [fmt(v) if k == "policy.name" else f"{short(k)}={fmt(v)}"
                 for k, v in self.values.items() if k not in skip]
        return ", ".join(parts) or "all runs"


def group_points(runs):
    """Points of the runs (first-seen order) and how many duplicate runs were left out.

    A native run whose (seed, config without policy.* and reclaim.*) another native run already
    has is the same baseline; the first is kept."""
    points, index, dropped = [], {}, 0
    for r in runs:
        config = {k: v for k, v in r.config.items()
                  if k not in NOT_AXES and k not in SEED_KEYS
                  and not (r.mode == "native" and native_ignores(k))}
        key = (r.mode, repr(sorted(config.items())))
        if key not in index:
            index[key] = len(points)
            points.append(Point(r.mode, "" if r.mode == "native" else r.policy, config))
        p = points[index[key]]
        if any(x.seed() == r.seed() for x in p.runs):
            dropped += 1
            continue
        p.runs.append(r)
    return points, dropped


def varying_keys(points):
    keys = sorted(set().union(*(p.config.keys() for p in points)))
    out = []
    for k in keys:
        values = {repr(p.config.get(k)) for p in points if not p.ignores(k)}
        if len(values) > 1:
            out.append(k)
    return out


def load(db_path, sweep):
    """(connection, points, grid axes) of the sweep's completed runs."""
    if not os.path.exists(db_path):
        sys.exit(f"plot.py: error: database {db_path} not found")
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    rows = con.execute(
        "SELECT id, mode, policy, config_toml FROM runs "
        "WHERE sweep = ? AND status = 'completed' ORDER BY id",
        (sweep,),
    ).fetchall()
    if not rows:
        sys.exit(f"plot.py: error: no completed runs of sweep '{sweep}' in {db_path}")
    request_columns = {r[1] for r in con.execute("PRAGMA table_info(requests)")}
    runs = []
    for run_id, mode, policy, config_toml in rows:
        try:
            config = flatten(tomllib.loads(config_toml)) if config_toml else {}
        except tomllib.TOMLDecodeError as e:
            sys.exit(f"plot.py: error: run {run_id}: config_toml does not parse: {e}")
        summary = dict(con.execute("SELECT name, value FROM summary WHERE run_id = ?", (run_id,)))
        per_request = {}
        for name, column in PER_REQUEST.items():
            if column in request_columns and summary.get(name) is not None:
                per_request[name] = [v for (v,) in con.execute(
                    f"SELECT {column} FROM requests WHERE run_id = ? AND {column} IS NOT NULL",
                    (run_id,))]
        runs.append(Run(run_id, mode, policy, config, summary, per_request))
    points, dropped = group_points(runs)
    if dropped:
        print(f"plot.py: {dropped} native runs repeat a baseline that differs only in policy.* "
              "keys; each baseline is drawn once", file=sys.stderr)
    axes = varying_keys(points)
    for p in points:
        p.values = {k: p.config.get(k) for k in axes if not p.ignores(k)}
    return con, points, axes

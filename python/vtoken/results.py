"""Reader of vtoken result databases (lib/engine/result_store.h), pure Python (sqlite3, tomllib).

``load(db)`` opens a database read-only, as ``vtoken-cli export`` does, and gives its tables with
export's columns (docs/EXPORT.md): ``runs()`` one row per run (record, the config keys that vary
among the selected runs, every summary figure), ``requests()`` one row per request (timings,
blocks, ROUGE-L against the run's native / naive counterpart), ``steps()`` one row per engine
step, plus ``outputs()`` (generated texts) and ``config(run_id)``. Each returns a pandas
DataFrame when pandas is installed (unless ``frames=False``), else a list of dicts.

Differences from export's CSV: config values keep their TOML type (TOML arrays are lists), and a
missing value is None (NaN in a DataFrame).
"""

import math
import os
import sqlite3
import tomllib

from vtoken import _core

# The schema versions this reader reads: lib/engine/result_schema.h's kResultSchemaVersion and
# the older ones (result_schema_test checks that this is that constant).
SCHEMA_VERSION = 5

RUN_COLUMNS = ["run_id", "status", "mode", "policy", "model", "workload", "sweep", "created",
               "finished", "git_sha", "error"]
_RUN_FIELDS = ["id", "created", "git_sha", "config_toml", "config_hash", "sweep", "model", "mode",
               "policy", "budget", "block_size", "num_blocks", "workload", "seed", "status",
               "error", "pid", "finished"]


def _number(v):
    """A stored figure, or None when it is missing or not finite (export's empty field)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return None
    return v


def _process_alive(pid):
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _run_lock_held(db_path, run_id):
    """Whether a live process holds run `run_id`'s lock in "<db>-runlock" (lib/engine/run_lock.h);
    True when the file system cannot tell, as the C++ reader."""
    import fcntl
    import struct
    try:
        fd = os.open(db_path + "-runlock", os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        query = struct.pack("hhqqi4x", fcntl.F_RDLCK, os.SEEK_SET, run_id, 1, 0)
        answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, query)
        return struct.unpack("hhqqi4x", answer)[0] != fcntl.F_UNLCK
    except (OSError, AttributeError):
        return True
    finally:
        os.close(fd)


def native_view(config):
    """A flat config without the keys a native run does not read (policy.* and reclaim.*), as
    the CLI's NativeView: runs find their native counterpart through it."""
    return {k: v for k, v in config.items() if not native_ignores(k)}


def flatten_config(config_toml, what=""):
    """The leaves of a run's resolved config by dotted key ("engine.num_blocks" -> 384)."""
    try:
        table = tomllib.loads(config_toml)
    except tomllib.TOMLDecodeError as e:
        raise _core.DataLossError(f"{what}: config_toml does not parse: {e}") from None
    out = {}

    def walk(t, prefix):
        for k, v in t.items():
            if isinstance(v, dict):
                walk(v, prefix + k + ".")
            else:
                out[prefix + k] = v
    walk(table, "")
    return out


def varying_keys(configs, ignore=("modes",), native=None):
    """Sorted keys whose value is not the same in every config (missing counts as a value).
    A config marked in `native` (a native run's) has no say on the keys native does not read."""
    native = native or [False] * len(configs)
    keys = sorted({k for c in configs for k in c})
    missing = object()
    out = []
    for k in keys:
        if k in ignore:
            continue
        skip = native_ignores(k)
        values = [c.get(k, missing) for c, n in zip(configs, native) if not (n and skip)]
        if any(v is missing for v in values) and not all(v is missing for v in values):
            out.append(k)
        elif any(v != values[0] for v in values):
            out.append(k)
    return out


def native_ignores(key):
    """Whether a native run does not read `key` (policy.* and reclaim.*), as the CLI's."""
    return key.startswith("policy.") or key.startswith("reclaim.")


def rouge_tokenize(text):
    """rouge-score's tokens (lowercase, [a-z0-9]+ words), as lib/engine/rouge.h."""
    tokens, cur = [], []
    for ch in text.lower():
        if ("a" <= ch <= "z") or ("0" <= ch <= "9"):
            cur.append(ch)
        elif cur:  # str.lower() maps U+212A to "k" and U+0130 to "i" + a combining dot.
            tokens.append("".join(cur))
            cur = []
    if cur:
        tokens.append("".join(cur))
    return tokens


def lcs_length(a, b):
    """Length of the longest common subsequence of two token lists (bit-parallel, Hyyro 2004)."""
    if not a or not b:
        return 0
    masks = {}
    for i, tok in enumerate(a):
        masks[tok] = masks.get(tok, 0) | (1 << i)
    full = (1 << len(a)) - 1
    v = full
    for tok in b:
        u = v & masks.get(tok, 0)
        v = ((v + u) | (v - u)) & full
    return len(a) - bin(v).count("1")


def rouge_l_f1(candidate, reference):
    """ROUGE-L F1 of a generated text against a reference (rouge-score's definition)."""
    c, r = rouge_tokenize(candidate), rouge_tokenize(reference)
    lcs = lcs_length(c, r)
    if lcs == 0:
        return 0.0
    p, rec = lcs / len(c), lcs / len(r)
    return 2 * p * rec / (p + rec)


class ResultDb:
    """A result database opened read-only. Not thread-safe (one sqlite3 connection)."""

    def __init__(self, path, frames=None):
        self.path = str(path)
        if not os.path.isfile(self.path):
            raise _core.NotFoundError(f"result db {self.path} not found")
        self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        self._db.execute("PRAGMA query_only = ON")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        self._version = version
        if not 1 <= version <= SCHEMA_VERSION:
            extra = " (not a vtoken result database)" if version == 0 else ""
            raise _core.FailedPreconditionError(
                f"result db {self.path}: schema version {version}, expected 1..{SCHEMA_VERSION}"
                f"{extra}")
        if frames is None:
            try:
                import pandas  # noqa: F401
                frames = True
            except ImportError:
                frames = False
        self.frames = frames

    def close(self):
        self._db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- records ---

    def _writer_alive(self, run):
        """As ResultStore::WriterAlive: the run's lock, or its pid for a run without one."""
        if run.get("run_lock"):
            return _run_lock_held(self.path, run["id"])
        return _process_alive(run["pid"])

    def columns(self, table):
        """The columns of a child table (requests, steps) in the file, run_id excepted: the
        columns lib/engine/result_schema.h declares for the file's schema version, in order."""
        return [row[1] for row in self._db.execute(f"PRAGMA table_info({table})")
                if row[1] != "run_id"]

    def _all_runs(self, status=None):
        fields = _RUN_FIELDS + (["run_lock"] if self._version >= 2 else [])
        sql = f"SELECT {', '.join(fields)} FROM runs"
        args = ()
        if status:
            sql += " WHERE status = ?"
            args = (status,)
        runs = []
        for row in self._db.execute(sql + " ORDER BY id", args):
            r = dict(zip(fields, row))
            r["finished"] = r["finished"] or ""
            # As OpenReadOnly: a 'running' run whose writer is gone reads as interrupted.
            if r["status"] == "running" and not self._writer_alive(r):
                r["status"] = "interrupted"
                r["error"] = f"process {r['pid']} exited without finishing the run"
            runs.append(r)
        return runs

    def _select(self, sweep, ids):
        if sweep is not None and ids is not None:
            raise _core.InvalidArgumentError("give sweep or ids, not both")
        runs = self._all_runs()
        if ids is not None:
            ids = sorted(set(int(i) for i in ids))
            have = {r["id"] for r in runs}
            missing = [i for i in ids if i not in have]
            if missing:
                raise _core.NotFoundError(
                    f"result db {self.path}: no run {', '.join(map(str, missing))}")
            return [r for r in runs if r["id"] in set(ids)]
        if sweep is None:
            return runs
        selected = [r for r in runs if r["sweep"] == sweep]
        if not selected:
            sweeps = sorted({r["sweep"] for r in runs if r["sweep"]})
            known = f" (sweeps: {', '.join(sweeps)})" if sweeps else " (it has no sweeps)"
            raise _core.NotFoundError(
                f"result db {self.path} has no runs of sweep '{sweep}'{known}")
        return selected

    def _table(self, columns, rows):
        if self.frames:
            import pandas as pd
            return pd.DataFrame(rows, columns=columns)
        return [dict(zip(columns, r)) for r in rows]

    def config(self, run_id):
        """The resolved config of a run as flat dotted keys."""
        row = self._db.execute("SELECT config_toml FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise _core.NotFoundError(f"result db {self.path}: no run {run_id}")
        return flatten_config(row[0], f"result db {self.path}: run {run_id}")

    def summary(self, run_id):
        """A run's summary figures by name (empty unless the run completed)."""
        return {n: _number(v) for n, v in self._db.execute(
            "SELECT name, value FROM summary WHERE run_id = ? ORDER BY name", (run_id,))}

    # --- tables ---

    def runs(self, sweep=None, ids=None):
        """One row per run: export's runs table."""
        runs = self._select(sweep, ids)
        configs = [flatten_config(r["config_toml"], f"result db {self.path}: run {r['id']}")
                   for r in runs]
        summaries = [self.summary(r["id"]) for r in runs]
        keys = varying_keys(configs, native=[r["mode"] == "native" for r in runs])
        figures = sorted({n for s in summaries for n in s})
        rows = []
        for r, c, s in zip(runs, configs, summaries):
            record = [r["id"]] + [r[k] for k in RUN_COLUMNS[1:]]
            rows.append(record + [c.get(k) for k in keys] + [s.get(f) for f in figures])
        return self._table(RUN_COLUMNS + keys + figures, rows)

    def steps(self, sweep=None, ids=None):
        """One row per engine step per run: export's steps table."""
        columns = self.columns("steps")
        rows = []
        for r in self._select(sweep, ids):
            for row in self._db.execute(
                    f"SELECT {', '.join(columns)} FROM steps WHERE run_id = ? ORDER BY step",
                    (r["id"],)):
                rows.append([r["id"]] + [_number(v) for v in row])
        return self._table(["run_id"] + columns, rows)

    def _texts(self, run_id):
        return dict(self._db.execute(
            "SELECT request_id, text FROM outputs WHERE run_id = ?", (run_id,)))

    def outputs(self, sweep=None, ids=None):
        """One row per generated output: run_id, request_id, text, token_ids (a list)."""
        import json
        rows = []
        for r in self._select(sweep, ids):
            for rid, text, token_ids in self._db.execute(
                    "SELECT request_id, text, token_ids FROM outputs WHERE run_id = ? "
                    "ORDER BY request_id", (r["id"],)):
                rows.append([r["id"], rid, text, json.loads(token_ids)])
        return self._table(["run_id", "request_id", "text", "token_ids"], rows)

    def _counterpart(self, run, mode, completed):
        """export's counterpart: the completed run of `mode` in the same sweep with the same
        config but for the mode, nearest before by id, else nearest after."""
        me = completed.get(run["id"])
        if me is None:
            return None
        if run["mode"] == mode:
            return run["id"]
        # A native run records no [policy] / [reclaim] (older ones do): compare without them.
        at = 3 if mode == "native" else 2  # the config, or its native view
        before = after = None
        for rid, entry in completed.items():  # ascending ids
            if entry[0] != mode or entry[1] != me[1] or entry[at] != me[at]:
                continue
            if rid < run["id"]:
                before = rid
            if rid > run["id"] and after is None:
                after = rid
        return before if before is not None else after

    def requests(self, sweep=None, ids=None):
        """One row per request per run: export's requests table, ROUGE-L included."""
        completed = {}
        for r in self._all_runs(status="completed"):
            c = flatten_config(r["config_toml"], f"result db {self.path}: run {r['id']}")
            c.pop("modes", None)
            completed[r["id"]] = (r["mode"], r["sweep"], c, native_view(c))
        rows = []
        texts_cache = {}

        def texts(run_id):
            if run_id not in texts_cache:
                texts_cache[run_id] = self._texts(run_id)
            return texts_cache[run_id]

        def rouge(run_texts, ref_id, request_id):
            if ref_id is None:
                return None
            ref = texts(ref_id)
            if request_id not in run_texts or request_id not in ref:
                return None
            return rouge_l_f1(run_texts[request_id], ref[request_id])

        columns = self.columns("requests")
        # Files before schema 5 store no per-request ROUGE-L: computed from the counterparts'
        # outputs, as the run would have stored it.
        computed = [] if "rouge_l_vs_native" in columns else ["rouge_l_vs_native",
                                                               "rouge_l_vs_naive"]
        for r in self._select(sweep, ids):
            reqs = self._db.execute(
                f"SELECT {', '.join(columns)} FROM requests WHERE run_id = ? "
                "ORDER BY request_id", (r["id"],)).fetchall()
            if not reqs:
                continue
            if not computed:
                rows.extend([r["id"]] + [_number(v) for v in q] for q in reqs)
                continue
            own = texts(r["id"])
            native = self._counterpart(r, "native", completed)
            naive = self._counterpart(r, "naive", completed) if r["mode"] == "vtoken" else None
            for q in reqs:
                rows.append([r["id"]] + [_number(v) for v in q] +
                            [rouge(own, native, q[0]), rouge(own, naive, q[0])])
        return self._table(["run_id"] + columns + computed, rows)


def load(db, frames=None):
    """Opens result database `db` read-only. frames: True for pandas DataFrames, False for lists
    of dicts, None (default) for DataFrames when pandas is installed."""
    return ResultDb(db, frames=frames)

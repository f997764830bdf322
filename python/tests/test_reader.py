"""vtoken.load(db): the reader returns the quickstart's figures and export's tables.

One small quickstart run (4 requests, three modes) on the bundled model writes a database; the
reader's runs / requests / steps must equal `vtoken-cli export --format jsonl` cell for cell, its
summary figures must be the ones the run printed, and its row counts those sqlite3 reports.
"""

import json
import os
import re
import subprocess

import pytest

import vtoken

SRC = os.environ.get("VTOKEN_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("VTOKEN_CLI", os.path.join(SRC, "build/release/apps/vtoken-cli/vtoken-cli"))


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    if not os.path.exists(CLI):
        pytest.skip(f"{CLI} not built")
    subprocess.run(["bash", "scripts/make-corpus.sh", "build/corpus"], cwd=SRC, check=True,
                   capture_output=True)
    db = str(tmp_path_factory.mktemp("reader") / "q.db")
    run = subprocess.run([CLI, "run", "experiments/quickstart.toml", "--set",
                          "workload.num_requests=4", "--db", db],
                         cwd=SRC, check=True, capture_output=True, text=True)
    return db, run.stdout


def export(db, table, *extra):
    out = subprocess.run([CLI, "export", "--db", db, "--table", table, "--format", "jsonl",
                          *extra], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def printed_rows(stdout):
    """The run's comparison table: label -> the three runs' first figures (ratios dropped)."""
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"^(\S.*?)\s{2,}(\S.*)$", line)
        if m:
            rows[m.group(1)] = re.sub(r"\([^)]*\)", "", m.group(2)).split()
    return rows


@pytest.mark.parametrize("table", ["runs", "requests", "steps"])
def test_tables_equal_export(quickstart, table):
    db, _ = quickstart
    rows = getattr(vtoken.load(db, frames=False), table)()
    want = export(db, table)
    assert [list(r) for r in rows] == [list(r) for r in want]  # same columns, same order
    assert rows == want


def test_run_selection_equals_export(quickstart):
    db, _ = quickstart
    r = vtoken.load(db, frames=False)
    assert r.runs(ids=[2, 3]) == export(db, "runs", "--runs", "2,3")
    assert r.steps(ids=[3]) == export(db, "steps", "--runs", "3")


def test_quickstart_figures(quickstart):
    db, stdout = quickstart
    runs = vtoken.load(db).runs()  # a DataFrame
    assert list(runs["mode"]) == ["native", "naive", "vtoken"]
    assert list(runs["policy"]) == ["", "h2o", "h2o"]
    assert set(runs["status"]) == {"completed"}
    printed = printed_rows(stdout)
    assert printed["run"] == [str(i) for i in runs["run_id"]]
    assert printed["requests"] == [f"{v:.0f}" for v in runs["requests"]]
    assert printed["blocks held / request (mean)"] == [f"{v:.1f}" for v in runs["blocks_mean"]]
    assert printed["blocks held / request (final)"] == [
        f"{v:.1f}" for v in runs["blocks_final_mean"]]
    assert printed["ideal packed blocks (final)"] == [
        f"{v:.1f}" for v in runs["ideal_final_mean"]]
    assert printed["waste ratio F (mean)"] == [f"{v:.3f}" for v in runs["waste_ratio_mean"]]
    assert printed["peak allocated blocks (with copy sources)"] == [
        f"{v:.0f}" for v in runs["peak_allocated_blocks"]]
    assert printed["tokens evicted"] == [f"{v:.0f}" for v in runs["evictions"]]
    assert printed["ROUGE-L vs native"] == [f"{v:.4f}" for v in runs["rouge_l_vs_native"]]
    # Native evicts nothing; naive and vtoken evict the same tokens and hold fewer blocks.
    native, naive, vt = runs.to_dict("records")
    assert native["evictions"] == 0 and naive["evictions"] == vt["evictions"] > 0
    assert naive["blocks_mean"] < native["blocks_mean"]
    assert runs["rouge_l_vs_reference"].isna().all()  # no reference texts: NaN, not 0

    # A run's rouge_l_vs_native is the mean of its requests' scores.
    req = vtoken.load(db).requests()
    means = req.groupby("run_id")["rouge_l_vs_native"].mean()
    for run_id, figure in zip(runs["run_id"], runs["rouge_l_vs_native"]):
        assert means[run_id] == pytest.approx(figure, rel=1e-12)
    assert (req[req["run_id"] == 3]["rouge_l_vs_naive"] == 1.0).all()


def test_row_counts_equal_sqlite3(quickstart):
    db, _ = quickstart
    r = vtoken.load(db)

    def sql(q):
        return int(subprocess.run(["sqlite3", db, q], check=True, capture_output=True,
                                  text=True).stdout)
    assert len(r.requests()) == sql("SELECT count(*) FROM requests") == 12
    assert len(r.steps()) == sql("SELECT count(*) FROM steps")
    assert len(r.outputs()) == sql("SELECT count(*) FROM outputs") == 12
    assert r.steps()["moves"].sum() == sql("SELECT sum(moves) FROM steps")
    assert r.config(1)["engine.num_blocks"] == 384
    assert r.config(1)["workload.num_requests"] == 4


def test_errors_are_exports_messages(quickstart, tmp_path):
    db, _ = quickstart

    def cli_error(*args):
        p = subprocess.run([CLI, "export", "--table", "runs", *args], capture_output=True,
                           text=True)
        assert p.returncode == 1
        return p.stderr.strip().removeprefix("vtoken-cli: error: ")

    missing = str(tmp_path / "none.db")
    with pytest.raises(vtoken.NotFoundError) as e:
        vtoken.load(missing)
    assert str(e.value) == cli_error("--db", missing)
    with pytest.raises(vtoken.NotFoundError) as e:
        vtoken.load(db).runs(sweep="nope")
    assert str(e.value) == cli_error("--db", db, "--sweep", "nope")
    with pytest.raises(vtoken.NotFoundError) as e:
        vtoken.load(db).runs(ids=[9])
    assert str(e.value) == cli_error("--db", db, "--runs", "9")
    assert not os.path.exists(missing)


def test_rouge_matches_dynamic_programming():
    from vtoken.results import lcs_length, rouge_tokenize

    def dp(a, b):
        prev = [0] * (len(b) + 1)
        for x in a:
            row = [0]
            for j, y in enumerate(b, 1):
                row.append(prev[j - 1] + 1 if x == y else max(prev[j], row[j - 1]))
            prev = row
        return prev[-1]
    import random
    rng = random.Random(5)
    for _ in range(200):
        a = [rng.choice("abcde") for _ in range(rng.randrange(0, 90))]
        b = [rng.choice("abcde") for _ in range(rng.randrange(0, 90))]
        assert lcs_length(a, b) == dp(a, b)
    assert rouge_tokenize("And GOD said, \u212Aing \u0130s 42!") == [
        "and", "god", "said", "king", "i", "s", "42"]
    assert vtoken.rouge_l_f1("the cat sat", "the cat sat") == 1.0
    assert vtoken.rouge_l_f1("", "the") == 0.0

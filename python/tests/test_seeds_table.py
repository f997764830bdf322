"""experiments/seeds_table.py on a small export written here: two policies x 2 seeds, naive and
vtoken per point, one native run per seed shared by both points (listed once per seed, as
`sweep` shares it). The means, min-max, the vtoken = naive column and the paired differences
must be the ones computed by hand.
"""

import os
import subprocess
import sys

import pytest

pd = pytest.importorskip("pandas")

SRC = os.environ.get("VTOKEN_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(SRC, "experiments", "seeds_table.py")


def run(tmp_path, rows, *args):
    csv = tmp_path / "runs.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    return subprocess.run([sys.executable, SCRIPT, str(csv), *args], capture_output=True,
                          text=True)


def row(mode, policy, seed, rouge, vs_naive=float("nan"), blocks=10.0, sweep="q", below=0.3):
    return {"run_id": 0, "status": "completed", "sweep": sweep, "mode": mode, "policy": policy,
            "policy.name": policy, "workload.seed": seed, "blocks_mean": blocks,
            "blocks_final_mean": 2 * blocks, "ideal_final_mean": blocks,
            "waste_ratio_mean": 0.5, "util_hist_0": below / 4, "util_hist_1": 3 * below / 4,
            "util_hist_2": (1 - below) / 2, "util_hist_3": (1 - below) / 2,
            "rouge_l_vs_native": rouge, "rouge_l_vs_naive": vs_naive}


def rows():
    out = []
    for seed, (h2o, tova) in {1: (0.5, 0.7), 2: (0.6, 0.4)}.items():
        for policy in ("h2o", "tova"):  # The shared native run, once per point of the seed.
            out.append(row("native", float("nan"), seed, 1.0, blocks=40.0))
        out.append(row("naive", "h2o", seed, h2o, below={1: 0.5, 2: 0.7}[seed]))
        out.append(row("vtoken", "h2o", seed, h2o, vs_naive=1.0, blocks=5.0))
        out.append(row("naive", "tova", seed, tova))
        out.append(row("vtoken", "tova", seed, tova, vs_naive=1.0 if seed == 1 else 0.9))
    out.append(row("naive", "h2o", 3, 0.0, sweep="other"))  # Another sweep: left out.
    return out


def test_means_over_seeds_and_pairs(tmp_path):
    r = run(tmp_path, rows(), "q", "policy", "--pair", "policy=h2o")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "| - | native | 2 | 40.0 | - | 2.00x | 0.500 | 0.300 (0.300-0.300) | - | - |" in lines
    assert ("| h2o | naive | 2 | 10.0 | - | 2.00x | 0.500 | 0.600 (0.500-0.700) "
            "| 0.5500 (0.5000-0.6000) | - |") in lines
    assert ("| h2o | vtoken | 2 | 5.0 | 2.00x (2.00-2.00) | 2.00x | 0.500 | 0.300 (0.300-0.300) "
            "| 0.5500 (0.5000-0.6000) | yes |") in lines
    assert ("| tova | vtoken | 2 | 10.0 | 1.00x (1.00-1.00) | 2.00x | 0.500 | 0.300 (0.300-0.300) "
            "| 0.5500 (0.4000-0.7000) | no |") in lines
    # Paired: tova - h2o = +0.2 (seed 1), -0.2 (seed 2).
    assert "| tova | 2 | +0.0000 (-0.2000, +0.2000) |" in lines
    assert not any(line.startswith("| h2o | 2 |") for line in lines)


def test_runs_without_native_leave_rouge_out(tmp_path):
    no_native = [dict(x, rouge_l_vs_native=float("nan")) for x in rows() if x["mode"] != "native"]
    r = run(tmp_path, no_native, "q", "policy")
    assert r.returncode == 0, r.stderr
    assert ("| h2o | naive | 2 | 10.0 | - | 2.00x | 0.500 | 0.600 (0.500-0.700) | - | - |"
            in r.stdout.splitlines())


def test_exports_without_the_histogram_leave_its_column_out(tmp_path):
    no_hist = [{k: v for k, v in x.items() if not k.startswith("util_hist")} for x in rows()]
    r = run(tmp_path, no_hist, "q", "policy")
    assert r.returncode == 0, r.stderr
    assert ("| h2o | naive | 2 | 10.0 | - | 2.00x | 0.500 | - | 0.5500 (0.5000-0.6000) | - |"
            in r.stdout.splitlines())


def test_a_sweep_with_seeds_uses_its_seed_column(tmp_path):
    with_seeds = [{("seed" if k == "workload.seed" else k): v for k, v in x.items()}
                  for x in rows()]
    r = run(tmp_path, with_seeds, "q", "policy", "--pair", "policy=h2o")
    assert r.returncode == 0, r.stderr
    assert "| tova | 2 | +0.0000 (-0.2000, +0.2000) |" in r.stdout.splitlines()


def test_bad_arguments_are_one_line_errors(tmp_path):
    r = run(tmp_path, rows(), "no_such_sweep", "policy")
    assert r.returncode != 0 and "no completed runs of sweep no_such_sweep" in r.stderr
    r = run(tmp_path, rows(), "q", "no_such_key")
    assert r.returncode != 0 and "has no column no_such_key" in r.stderr
    r = run(tmp_path, rows(), "q", "policy", "--pair", "policy")
    assert r.returncode != 0 and "--pair needs KEY=VALUE" in r.stderr
    one_seed = [{k: v for k, v in x.items() if k != "workload.seed"} for x in rows()]
    r = run(tmp_path, one_seed, "q", "policy")
    assert r.returncode != 0 and "has no seed or workload.seed column" in r.stderr


def test_a_vtoken_only_sweep_takes_its_naive_ratio_from_the_baseline_runs(tmp_path):
    # The ablations: the sweep has vtoken runs only (no ROUGE-L vs naive of their own); one run
    # named "abl" outside any sweep per seed holds native and naive.
    out = []
    for seed, naive_blocks in {1: 20.0, 2: 30.0}.items():
        for flag in (False, True):
            out.append(dict(row("vtoken", "h2o", seed, float("nan"), blocks=10.0 if flag else 5.0),
                            **{"engine.force_sync": flag, "name": "ablations"}))
        for mode, blocks in (("native", 40.0), ("naive", naive_blocks)):
            out.append(dict(row(mode, "h2o", seed, 0.5, blocks=blocks, sweep=float("nan")),
                            **{"engine.force_sync": False, "name": "abl"}))
    out.append(dict(row("naive", "h2o", 1, 0.5, blocks=1.0, sweep=float("nan")),
                    **{"engine.force_sync": False, "name": "other"}))  # Another name: left out.
    r = run(tmp_path, out, "q", "engine.force_sync", "--baseline", "abl")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert lines[1:] == [
        "| - | native | 2 | 40.0 | - | 2.00x | 0.500 | 0.300 (0.300-0.300) | - | - |",
        "| - | naive | 2 | 25.0 | - | 2.00x | 0.500 | 0.300 (0.300-0.300) | 0.5000 (0.5000-0.5000) | - |",
        "| False | vtoken | 2 | 5.0 | 5.00x (4.00-6.00) | 2.00x | 0.500 | 0.300 (0.300-0.300) | - | - |",
        "| True | vtoken | 2 | 10.0 | 2.50x (2.00-3.00) | 2.00x | 0.500 | 0.300 (0.300-0.300) | - | - |",
    ]
    # Without the baseline the sweep still prints, with no ratio and no vtoken = naive verdict.
    r = run(tmp_path, out, "q", "engine.force_sync")
    assert r.returncode == 0, r.stderr
    assert ("| False | vtoken | 2 | 5.0 | - | 2.00x | 0.500 | 0.300 (0.300-0.300) | - | - |"
            in r.stdout.splitlines())
    r = run(tmp_path, out, "q", "engine.force_sync", "--baseline", "nothing")
    assert r.returncode != 0 and "no completed runs named nothing outside a sweep" in r.stderr

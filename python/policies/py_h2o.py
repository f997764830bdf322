"""H2O as a Python policy: the example of docs/WRITING_A_POLICY.md, "A policy in Python".

Run it inside the engine with
    vtoken-cli --python-policy python/policies/py_h2o.py:PyH2O run CONFIG --set policy.name=py_h2o
It picks exactly the victims of the C++ policy h2o (policies/h2o.cc): tests/cli/
python_policy_cli_test.sh compares the two runs' outputs.
"""
import numpy as np


class PyH2O:
    name = "py_h2o"
    rule = "h2o in Python: the highest accumulated attention plus a recent window"
    signals = ["attn_sum"]  # attn, attn_sum, key_norm or registered token signals
    params = {"recent_ratio": 0.5}  # name -> default; passed to __init__ by name

    def __init__(self, recent_ratio):
        self.recent_ratio = recent_ratio

    def score(self, tokens, ctx):
        """One score per live token (logical order), higher = keep."""
        scores = tokens["attn_sum"].copy()
        recent = int(self.recent_ratio * ctx["budget"])
        if recent > 0:
            scores[max(0, len(scores) - recent):] = np.inf
        return scores

"""docs/PYTHON.md's worked example (python/examples/toy_decode.py) keeps its promises."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import toy_decode  # noqa: E402


def test_toy_decode_reclaims_without_changing_attention():
    naive_prefill, naive, naive_moved, naive_out = toy_decode.run("naive")
    vt_prefill, vt, vt_moved, vt_out = toy_decode.run("vtoken")
    assert naive_prefill == vt_prefill  # the same evictions before any reclamation
    assert naive["live_slots"] == vt["live_slots"] and naive["ideal_blocks"] == vt["ideal_blocks"]
    assert naive_moved == 0 and vt_moved > 0
    # Reclamation packs the survivors: fewer blocks, F under the planner's 0.25 threshold.
    assert vt["ideal_blocks"] <= vt["held_blocks"] < naive["held_blocks"] / 2
    assert vt["waste_ratio"] < 0.25 < naive["waste_ratio"]
    # Relocation is invisible to attention: bit-identical outputs.
    assert naive_out.shape == (len(toy_decode.PROMPTS) * toy_decode.DECODE_STEPS, toy_decode.DIM)
    assert np.array_equal(naive_out, vt_out)

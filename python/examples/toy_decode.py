"""A plain-numpy decode loop over a paged KV cache managed by vtoken (docs/PYTHON.md).

Four sequences with a one-layer toy attention: K and V live in numpy arrays indexed by slot, the
cache hands out the slots (sync_new_tokens), attention reads the live slots in logical order
(live_slots), H2O picks the victims from the attention each step (Evictor), the cache evicts them
(evict_tokens), and in vtoken mode the planner repacks sparse blocks, numpy copying the KV
(begin_relocation / apply_moves / complete_relocation). The same loop runs in naive mode
(eviction only) and the two must produce bit-identical attention outputs.

Run: PYTHONPATH=build/release/python /usr/bin/python3 python/examples/toy_decode.py
"""

import numpy as np

import vtoken

DIM = 64
PROMPTS = [520, 610, 450, 700]
DECODE_STEPS = 96


def run(mode):
    rng = np.random.default_rng(0)  # the same KV, queries and signals in both modes
    wq, wk, wv = (rng.standard_normal((DIM, DIM)).astype(np.float32) / np.sqrt(DIM)
                  for _ in range(3))
    cache = vtoken.VirtualKvCache(num_blocks=256, block_size=16, headroom_blocks=8, mode=mode)
    keys = np.zeros((cache.num_slots, DIM), np.float32)
    values = np.zeros((cache.num_slots, DIM), np.float32)
    evictor = vtoken.Evictor("h2o", keep_ratio=0.25, num_sink=4, num_recent=32)
    # Plan whenever F > 0.25 (low_watermark 1.0: the pool counts as under pressure at any load).
    planner = vtoken.ReclaimPlanner(trigger="pressure", frag_threshold=0.25, low_watermark=1.0)
    moved = 0

    def copy(src, dst):  # the "copy engine": every layer's K and V (one layer here)
        keys[dst] = keys[src]
        values[dst] = values[src]

    def append(seq, hidden):  # hidden: [n, DIM] -> KV of n new tokens
        slots = cache.sync_new_tokens(seq, len(hidden))
        keys[slots] = hidden @ wk
        values[slots] = hidden @ wv

    def attend(seq, h):  # one query over the live tokens, then observe and evict
        slots = cache.live_slots(seq)
        k = keys[slots]
        logits = k @ (h @ wq) / np.sqrt(DIM)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        evictor.observe(seq, cache.live_tokens(seq), p.astype(np.float32),
                        np.linalg.norm(k, axis=1))
        cache.evict_tokens(seq, evictor.victims(seq))
        return p @ values[slots]

    seqs, hidden, outputs = [], [], []
    for n in PROMPTS:  # prefill: write the prompt's KV, attend from its last token
        seq = cache.add_sequence()
        h = rng.standard_normal((n, DIM)).astype(np.float32)
        append(seq, h)
        seqs.append(seq)
        hidden.append(np.tanh(attend(seq, h[-1]) + h[-1]))
    after_prefill = cache.stats()
    for _ in range(DECODE_STEPS):
        for i, seq in enumerate(seqs):
            append(seq, hidden[i][None, :])
            out = attend(seq, hidden[i])
            outputs.append(out)
            hidden[i] = np.tanh(out + 0.1 * rng.standard_normal(DIM).astype(np.float32))
        if mode == "vtoken":
            rel = vtoken.reclaim(cache, planner, copy)
            moved += rel.num_moves if rel else 0
    cache.check_invariants()
    return after_prefill, cache.stats(), moved, np.array(outputs)


def show(label, s):
    print(f"  {label:<22} blocks held {s['held_blocks']:4d}   ideal {s['ideal_blocks']:3d}   "
          f"live tokens {s['live_slots']:5d}   F {s['waste_ratio']:.3f}")


def main():
    results = {}
    for mode in ("naive", "vtoken"):
        prefill, final, moved, outputs = run(mode)
        results[mode] = outputs
        print(f"{mode}: {len(PROMPTS)} sequences, prompts {sum(PROMPTS)} tokens, "
              f"{DECODE_STEPS} decode steps each, h2o keep 25% (4 sink + 32 recent)")
        show("after prefill", prefill)
        show("after decode", final)
        if mode == "vtoken":
            print(f"  tokens moved by reclamation: {moved}")
    diff = np.abs(results["naive"] - results["vtoken"]).max()
    print(f"max |attention output naive - vtoken| over {len(results['naive'])} steps: {diff}")


if __name__ == "__main__":
    main()

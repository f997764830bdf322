"""Per-layer / per-head KV groups from Python: one token table per group, eviction and
relocation per group, and the per-group ideal bound."""

import numpy as np
import pytest

import vtoken


def test_groups_have_their_own_slots_liveness_and_blocks():
    cache = vtoken.VirtualKvCache(num_blocks=16, block_size=4, mode="vtoken", num_groups=2)
    assert cache.num_groups == 2
    seq = cache.add_sequence()
    slots = cache.sync_new_tokens(seq, 8)
    assert len(slots) == 16  # group-major: group 0's 8 slots, then group 1's
    assert set(slots[:8] // 4).isdisjoint(set(slots[8:] // 4))  # no block holds both groups
    assert list(cache.live_slots(seq, group=1)) == list(slots[8:])
    # Evict tokens 0-3 in group 0 only: its first block returns, group 1 keeps all.
    cache.evict_tokens(seq, np.array([0, 1, 2, 3]), group=0)
    assert list(cache.live_tokens(seq, group=0)) == [4, 5, 6, 7]
    assert list(cache.live_tokens(seq, group=1)) == list(range(8))
    assert cache.num_blocks_held(seq) == 3 and cache.ideal_blocks(seq) == 3
    # Without a group: every group where the token lives.
    cache.evict_token(seq, 5)
    assert 5 not in cache.live_tokens(seq, group=0) and 5 not in cache.live_tokens(seq, group=1)
    with pytest.raises(vtoken.NotFoundError):
        cache.live_slots(seq, group=2)
    cache.check_invariants()


def test_relocation_moves_one_groups_tokens():
    cache = vtoken.VirtualKvCache(num_blocks=32, block_size=4, headroom_blocks=2, mode="vtoken",
                                  num_groups=2)
    seq = cache.add_sequence()
    cache.sync_new_tokens(seq, 16)
    cache.evict_tokens(seq, np.array([t for t in range(15) if t % 4 != 0]), group=1)
    before = list(cache.live_slots(seq, group=0))
    planner = vtoken.ReclaimPlanner(trigger="always")
    plan = planner.plan(cache)
    assert plan
    rel = cache.begin_relocation(plan)
    assert {s.group for s in rel.seqs} == {1}
    for s in rel.seqs:
        cache.apply_moves(s.seq, s.moves, group=s.group)
    cache.complete_relocation(rel.id)
    cache.check_invariants()
    assert list(cache.live_slots(seq, group=0)) == before  # group 0 untouched
    assert cache.num_blocks_held(seq) == 4 + 2  # group 0: 4 full blocks; group 1: 5 live -> 2

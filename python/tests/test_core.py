"""The core bindings: cache, relocation, planner, policies, evictor, errors."""

import os
import subprocess

import numpy as np
import pytest

import vtoken


def test_sync_evict_and_stats():
    cache = vtoken.VirtualKvCache(num_blocks=8, block_size=4, headroom_blocks=1, mode="vtoken")
    seq = cache.add_sequence()
    slots = cache.sync_new_tokens(seq, 10)
    assert slots.dtype == np.int64 and list(slots) == list(range(10))
    assert cache.num_blocks_held(seq) == 3
    cache.evict_tokens(seq, np.array([1, 2, 3, 5]))
    assert list(cache.live_tokens(seq)) == [0, 4, 6, 7, 8, 9]
    assert list(cache.live_slots(seq)) == [0, 4, 6, 7, 8, 9]
    s = cache.stats()
    assert (s["allocated_blocks"], s["live_slots"], s["ideal_blocks"], s["held_blocks"]) == (3, 6, 2, 3)
    assert s["waste_ratio"] == pytest.approx(1 - 6 / 12)
    assert s["utilization_hist"] == [0, 1, 1, 1]
    # Evicting a whole block releases it at once (naive release).
    cache.evict_tokens(seq, np.array([4, 6, 7]))
    assert cache.num_blocks_held(seq) == 2 and cache.num_free_blocks == 6


def test_relocation_repacks_and_keeps_kv():
    cache = vtoken.VirtualKvCache(num_blocks=16, block_size=4, headroom_blocks=2)
    kv = np.zeros((cache.num_slots, 3), dtype=np.float32)  # one layer, 3 floats per token
    seq = cache.add_sequence()
    slots = cache.sync_new_tokens(seq, 16)
    kv[slots] = np.arange(16, dtype=np.float32)[:, None]  # token t's KV = t
    victims = np.array([t for t in range(12) if t % 4 != 0])  # leave one live token per block
    cache.evict_tokens(seq, victims)
    assert cache.num_blocks_held(seq) == 4
    planner = vtoken.ReclaimPlanner(trigger="always")
    plan = planner.plan(cache)
    assert plan and plan.num_moves == 3 and plan.blocks_freed == 2
    rel = cache.begin_relocation(plan)
    copies = rel.copies()
    assert copies.shape == (3, 2)
    assert all(cache.is_slot_pending(d) for d in copies[:, 1])
    kv[copies[:, 1]] = kv[copies[:, 0]]
    for s in rel.seqs:
        assert s.moves.shape == (3, 3) and list(s.moves[:, 0]) == [0, 4, 8]
        cache.apply_moves(s.seq, s.moves)
    assert cache.has_pending_reads(seq)
    cache.complete_relocation(rel.id)
    assert not cache.has_pending_reads(seq)
    assert cache.num_blocks_held(seq) == 2
    live = cache.live_tokens(seq)
    assert list(kv[cache.live_slots(seq), 0]) == list(live.astype(np.float32))
    cache.check_invariants()
    assert cache.stats()["waste_ratio"] == pytest.approx(1 - 7 / 8)
    # The planner has nothing left to gain.
    assert not planner.plan(cache)


def test_stale_plan_and_errors_raise_with_status_message():
    cache = vtoken.VirtualKvCache(num_blocks=4, block_size=4)
    seq = cache.add_sequence()
    cache.sync_new_tokens(seq, 8)
    cache.evict_tokens(seq, np.array([0, 1, 2]))
    plan = vtoken.ReclaimPlanner(trigger="always").plan(cache)
    cache.sync_new_tokens(seq, 1)  # the cache changed: the plan is stale
    with pytest.raises(vtoken.FailedPreconditionError, match="stale"):
        cache.begin_relocation(plan)
    with pytest.raises(vtoken.FailedPreconditionError) as e:
        cache.evict_token(seq, 0)
    assert str(e.value) == "token 0 of sequence 0 is already evicted"
    with pytest.raises(vtoken.ResourceExhaustedError):
        cache.sync_new_tokens(seq, 100)
    with pytest.raises(vtoken.NotFoundError):
        cache.live_slots(42)
    with pytest.raises(LookupError):  # NotFoundError is a LookupError too
        cache.free_sequence(42)
    with pytest.raises(vtoken.InvalidArgumentError) as e:
        vtoken.VirtualKvCache(num_blocks=0)
    assert isinstance(e.value, ValueError) and isinstance(e.value, vtoken.VtokenError)
    with pytest.raises(vtoken.InvalidArgumentError):
        vtoken.VirtualKvCache(num_blocks=4, mode="lazy")
    native = vtoken.VirtualKvCache(num_blocks=4, mode="native")
    s = native.add_sequence()
    native.sync_new_tokens(s, 2)
    with pytest.raises(vtoken.FailedPreconditionError):
        native.evict_token(s, 0)


def test_fork_shares_full_blocks():
    cache = vtoken.VirtualKvCache(num_blocks=8, block_size=4)
    parent = cache.add_sequence()
    cache.sync_new_tokens(parent, 10)
    child, copies = cache.fork_sequence(parent, 10)
    # Two full blocks are shared; the parent's open tail (tokens 8, 9) is copied.
    assert copies.shape == (2, 2) and list(copies[:, 0]) == [8, 9]
    assert list(cache.live_slots(child))[:8] == list(range(8))
    assert cache.stats()["allocated_blocks"] == 4


def test_policies_are_the_registry():
    names = vtoken.policy_names()
    cli = os.environ.get("VTOKEN_CLI")
    if cli and os.path.exists(cli):
        out = subprocess.run([cli, "policies"], check=True, capture_output=True, text=True).stdout
        assert names == [line.split()[0] for line in out.splitlines()[1:] if line.strip()]
    assert {"h2o", "tova", "snapkv", "streaming_llm"} <= set(names)
    h2o = next(p for p in vtoken.policies() if p.name == "h2o")
    assert h2o.source_file.endswith("policies/h2o.cc")
    assert h2o.params == [{"name": "recent_ratio", "type": "double", "default": 0.5,
                           "help": "fraction of the budget kept for the most recent tokens",
                           "min": 0.0, "max": 1.0, "min_exclusive": False,
                           "max_exclusive": False, "choices": []}]


def test_policy_score():
    attn_sum = np.array([3.0, 1.0, 2.0, 5.0, 0.5, 4.0])
    # h2o: the last recent_ratio * budget tokens are kept outright, the rest score attn_sum.
    scores = vtoken.Policy("h2o").score({"attn_sum": attn_sum}, budget=4)
    assert scores.dtype == np.float32
    assert list(scores) == [3.0, 1.0, 2.0, 5.0, np.inf, np.inf]
    scores = vtoken.Policy("h2o", recent_ratio=0.0).score({"attn_sum": attn_sum}, budget=4)
    assert list(scores) == list(attn_sum.astype(np.float32))
    tova = vtoken.Policy("tova")
    assert list(tova.score({"attn": [0.1, 0.7, 0.2]}, budget=2)) == pytest.approx([0.1, 0.7, 0.2])
    with pytest.raises(vtoken.InvalidArgumentError, match="recent_ratio"):
        vtoken.Policy("h2o", recent_ratio=2.0)
    with pytest.raises(vtoken.NotFoundError, match="tova"):  # lists the registered ones
        vtoken.Policy("nope")
    with pytest.raises(vtoken.InvalidArgumentError):
        tova.score({"attn": [0.1, 0.2], "age": [1, 2, 3]}, budget=1)


def test_token_signals_are_the_registry_and_reach_policies_by_name():
    names = [s["name"] for s in vtoken.token_signals()]
    assert names == sorted(names) and "value_norm" in names and "value_l1_norm" in names
    cli = os.environ.get("VTOKEN_CLI")
    if cli and os.path.exists(cli):
        out = subprocess.run([cli, "policies", "--token-signals"], check=True,
                             capture_output=True, text=True).stdout
        assert names == [line.split()[0] for line in out.splitlines()[1:] if line.strip()]
    assert all(s["doc"] and s["source_file"].endswith(s["name"] + ".cc")
               for s in vtoken.token_signals())
    vatp = vtoken.Policy("vatp", recent_ratio=0.0)
    assert vatp.token_signals == ["value_l1_norm"]
    assert vtoken.Policy("h2o").token_signals == []
    attn_sum = np.array([0.75, 0.4, 0.3, 0.35, 0.2], dtype=np.float32)
    vnorm = np.array([0.1, 1.0, 4.0, 1.0, 1.0], dtype=np.float32)
    scores = vatp.score({"attn_sum": attn_sum, "value_l1_norm": vnorm}, budget=4)
    assert list(scores) == list(attn_sum * vnorm)
    # The evictor takes them once per token: for the ids from unseen_from(seq) on.
    e = vtoken.Evictor("vatp", budget_tokens=4, recent_ratio=0.0)
    assert e.token_signals == ["value_l1_norm"] and e.unseen_from(1) == 0
    e.observe(1, np.arange(5), attn_sum / attn_sum.sum(), np.ones(5, np.float32),
              token_values=vnorm)
    assert e.unseen_from(1) == 5
    assert list(e.victims(1)) == [0]
    with pytest.raises(vtoken.InvalidArgumentError, match="value_l1_norm"):
        e.observe(1, np.arange(1, 7), np.full(6, 1 / 6, np.float32), np.ones(6, np.float32))


def test_relative_token_signals_are_given_for_every_live_token_on_eviction_steps():
    kinds = {s["name"]: s["relative"] for s in vtoken.token_signals()}
    assert kinds["key_anchor_cosine"] and not kinds["value_norm"] and kinds["expected_attention"]
    queries = [s["name"] for s in vtoken.token_signals() if s["queries"]]
    assert queries == ["expected_attention", "window_attention"]
    e = vtoken.Evictor("keydiff", budget_tokens=3)
    assert e.relative_token_signals == ["key_anchor_cosine"] and e.absolute_token_signals == []
    # kvpress's KeyDiffPress on one KV row: anchor = mean(normalize(keys)), score = -cosine.
    keys = np.array([[1, 0], [0, 1], [2, 0.1], [-0.2, -1], [1, -0.1], [1, 1]], np.float32)
    unit = keys / np.linalg.norm(keys, axis=1, keepdims=True)
    anchor = unit.mean(axis=0)
    cosine = (keys @ anchor) / (np.linalg.norm(keys, axis=1) * np.linalg.norm(anchor))
    assert e.scores_next(1)
    e.observe(1, np.arange(6), np.zeros(0, np.float32), np.zeros(0, np.float32))
    with pytest.raises(vtoken.FailedPreconditionError, match="key_anchor_cosine"):
        e.victims(1)
    with pytest.raises(vtoken.InvalidArgumentError, match="6 live tokens"):
        e.observe_relative(1, cosine[:3].astype(np.float32))
    e.observe_relative(1, cosine.astype(np.float32))
    # The three keys most like the anchor (the x keys) go.
    assert list(e.victims(1)) == sorted(np.argsort(-cosine)[:3].tolist()) == [0, 2, 4]


def test_a_token_signal_view_has_one_column_per_layer():
    e = vtoken.Evictor("layer_union", budget_tokens=2, num_layers=3, num_kv_heads=2,
                       signal="value_norm", over="head")
    assert e.token_signals == ["value_norm@head"]
    assert (e.absolute_width, e.relative_width) == (6, 0)  # 3 layers x 2 KV heads
    values = np.tile(np.array([[0.1], [0.9], [0.3], [0.8], [0.2]], np.float32), (1, 6))
    values[:, 4] = [0.5, 0.1, 0.2, 0.3, 0.4]  # Layer 2's first head ranks token 0 first.
    with pytest.raises(vtoken.InvalidArgumentError, match="30 values expected"):
        e.observe(1, np.arange(5), np.zeros(0, np.float32), np.zeros(0, np.float32),
                  token_values=values[:, :5])
    e.observe(1, np.arange(5), np.zeros(0, np.float32), np.zeros(0, np.float32),
              token_values=values)
    assert list(e.victims(1)) == [2, 3, 4]  # Best ranks 1, 1, 0.6, 0.8, 0.8 (3 before 4).
    # vtoken.Policy takes a view as (n, columns): the best rank over the columns.
    p = vtoken.Policy("layer_union", signal="value_norm")
    assert p.token_signals == ["value_norm@layer"]
    v = np.array([[3, 0], [1, 2], [2, 1]], np.float32)
    scores = p.score({"value_norm@layer": v}, budget=1)
    assert scores.tolist() == pytest.approx([1, 1, 2 / 3])
    with pytest.raises(vtoken.InvalidArgumentError, match="value_norm@layer must be"):
        p.score({"value_norm@layer": np.zeros((3, 2, 2), np.float32)}, budget=1)


def test_policy_observe_returns_state():
    pandas = pytest.importorskip("pandas")
    decayed = vtoken.Policy("decayed_attention", decay=0.5)
    assert decayed.state_size == 1
    signals = pandas.DataFrame({"attn": [0.5, 0.25, 0.25]})
    state = decayed.observe(signals, budget=2)
    assert state.shape == (3, 1) and list(state[:, 0]) == [0.5, 0.25, 0.25]
    state = decayed.observe(signals, budget=2, state=state)
    assert list(state[:, 0]) == [0.75, 0.375, 0.375]
    assert list(decayed.score(signals, budget=2, state=state)) == [0.75, 0.375, 0.375]


def test_evictor_keeps_budget_and_protects():
    ev = vtoken.Evictor("h2o", budget_tokens=6, num_sink=1, num_recent=2, recent_ratio=0.0)
    live = np.arange(12)
    attn = np.array([0.0, 9, 1, 8, 2, 7, 3, 6, 4, 5, 0, 0], dtype=np.float32)
    attn /= attn.sum()
    ev.observe(0, live, attn, np.ones(12, dtype=np.float32))
    victims = ev.victims(0)
    # Token 0 is a sink, 10 and 11 are recent; of the rest the 6 lowest attention go.
    assert list(victims) == [2, 4, 6, 7, 8, 9]
    assert ev.budget(0) == 6
    assert len(ev.victims(0)) == 0  # once per step
    with pytest.raises(vtoken.InvalidArgumentError, match="evicted"):
        ev.observe(0, live, attn, np.ones(12, dtype=np.float32))
    with pytest.raises(vtoken.InvalidArgumentError):
        vtoken.Evictor("h2o")  # neither budget_tokens nor keep_ratio


def test_evictor_asks_for_signals_only_when_its_policy_reads_them():
    """TOVA reads signals only when it evicts (every 2nd step here); H2O's attn_sum every step."""
    none = np.zeros(0, dtype=np.float32)
    tova = vtoken.Evictor("tova", budget_tokens=4, num_sink=1, num_recent=1, evict_interval=2)
    h2o = vtoken.Evictor("h2o", budget_tokens=4, num_sink=1, num_recent=1, evict_interval=2)
    live = np.arange(6)
    attn = np.full(6, 1 / 6, dtype=np.float32)
    for ev in (tova, h2o):
        assert ev.signals_wanted(0)
        ev.observe(0, live, attn, np.ones(6, dtype=np.float32))
        live_now = np.setdiff1d(live, ev.victims(0))
        assert len(live_now) == 4
    live_now = np.append(live_now, 6)
    assert not tova.signals_wanted(0) and h2o.signals_wanted(0)
    tova.observe(0, live_now, none, none)
    with pytest.raises(vtoken.InvalidArgumentError, match="reads this step's signals"):
        h2o.observe(0, live_now, none, none)
    assert tova.signals_wanted(0)


def test_policy_driven_eviction_then_reclaim():
    """An end-to-end loop: the evictor picks victims, the cache evicts, the reclaimer repacks."""
    cache = vtoken.VirtualKvCache(num_blocks=64, block_size=16, headroom_blocks=4)
    ev = vtoken.Evictor("tova", keep_ratio=0.25, num_sink=4, num_recent=8)
    rng = np.random.default_rng(0)
    seq = cache.add_sequence()
    cache.sync_new_tokens(seq, 256)
    live = cache.live_tokens(seq)
    attn = rng.random(len(live)).astype(np.float32)
    ev.observe(seq, live, attn / attn.sum(), np.ones(len(live), dtype=np.float32))
    cache.evict_tokens(seq, ev.victims(seq))
    assert cache.num_live(seq) == 64 and cache.num_blocks_held(seq) == 16
    rel = vtoken.reclaim(cache, vtoken.ReclaimPlanner(trigger="always"), lambda src, dst: None)
    assert rel is not None
    # The open tail block (tokens 240..255) is never moved; every other live token is packed.
    in_tail = int((cache.live_tokens(seq) >= 240).sum())
    assert in_tail >= 8
    assert cache.num_blocks_held(seq) == 1 + -(-(64 - in_tail) // 16)
    assert cache.stats()["ideal_blocks"] == 4

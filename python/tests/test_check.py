"""The check harness of lib/core/check_harness.cc, rewritten in Python over the bindings.

PyCheckHarness draws the same operations from the same splitmix64 words as the C++ CheckHarness
(add / fork / free / append / evict / reclaim / poll / read), drives a vtoken.VirtualKvCache and
a vtoken.ReclaimPlanner with begin_relocation / apply_moves / complete_relocation, keeps the KV
bytes in a numpy store it copies itself, and verifies every live token's bytes against a
reference after every operation. The tests require its counts to equal those `vtoken-cli check`
prints and vtoken.run_check returns for the same seed: the Python API reproduces the C++ one
operation for operation.
"""

import bisect
import os
import re
import subprocess

import numpy as np
import pytest

import vtoken

M64 = (1 << 64) - 1
WORDS = 4  # 32 bytes per token per layer, as CheckOptions.bytes_per_token.
LAYERS = 2


def split_mix64(state):
    """(value, new state): lib/core's SplitMix64, on Python ints."""
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31), state


def fill_content(contents):
    """FillContent for every content id and layer: uint64 array [layers, n, WORDS]."""
    c = np.asarray(contents, dtype=np.uint64)
    out = np.empty((LAYERS, c.size, WORDS), dtype=np.uint64)
    for layer in range(LAYERS):
        state = c * np.uint64(0x100000001B3) + np.uint64(layer)
        for w in range(WORDS):
            state = state + np.uint64(0x9E3779B97F4A7C15)
            z = state
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            out[layer, :, w] = z ^ (z >> np.uint64(31))
    return out


class PyCheckHarness:
    def __init__(self, mode="vtoken", num_blocks=64, block_size=16, headroom_blocks=8,
                 trigger="always", max_seqs=8, max_prompt_tokens=96):
        self.cache = vtoken.VirtualKvCache(num_blocks, block_size, headroom_blocks, mode)
        self.planner = vtoken.ReclaimPlanner(trigger=trigger)
        self.store = np.zeros((LAYERS, num_blocks * block_size, WORDS), dtype=np.uint64)
        self.mode = mode
        self.max_seqs = max_seqs
        self.max_prompt_tokens = max_prompt_tokens
        self.ref = {}  # seq -> (sorted live token ids, their content ids)
        self.in_flight = []  # (relocation, dst slots, source words before the copy)
        self.next_content = 1
        self.words = np.zeros((LAYERS, 1024, WORDS), dtype=np.uint64)  # content id -> its bytes
        self.r = dict(steps=0, evictions=0, appended_tokens=0, forks=0, pool_exhausted=0,
                      relocations=0, tokens_moved=0, blocks_reclaimed=0, hash_checks=0,
                      invariant_checks=0, tokens_verified=0, fence_waits=0, violations=0)
        self.messages = []

    def violation(self, msg):
        self.r["violations"] += 1
        self.messages.append(msg)

    def pick(self, arg):
        if not self.ref:
            return None
        return sorted(self.ref)[arg % len(self.ref)]

    def step(self, a, b, c):
        self.r["steps"] += 1
        op = a % 100
        seq = self.pick(b)
        if seq is None or (op < 5 and len(self.ref) < self.max_seqs):
            self.add(c)
        elif op < 8:
            self.fork(b, c)
        elif op < 11:
            self.free(seq)
        elif op < 45:
            self.append(seq, 1 + c % 4)
        elif op < 75:
            self.evict(seq, c)
        elif op < 88:
            self.reclaim()
        elif op < 93:
            self.poll()
        else:
            self.poll()  # FenceForRead: retire finished copies (sync copies: all), then read.
            self.verify_seq(seq, require_no_pending=True)
        self.verify()

    def add(self, arg):
        if len(self.ref) >= self.max_seqs:
            return
        seq = self.cache.add_sequence()
        self.ref[seq] = ([], [])
        self.append(seq, 1 + arg % self.max_prompt_tokens)

    def fork(self, arg1, arg2):
        if len(self.ref) >= self.max_seqs:
            return
        parent = self.pick(arg1)
        n = arg2 % (self.cache.num_tokens(parent) + 1)
        try:
            child, copies = self.cache.fork_sequence(parent, n)
        except vtoken.ResourceExhaustedError:
            return
        self.r["forks"] += 1
        if len(copies):
            self.store[:, copies[:, 1], :] = self.store[:, copies[:, 0], :]
        tokens, contents = self.ref[parent]
        k = bisect.bisect_left(tokens, n)
        self.ref[child] = (tokens[:k], contents[:k])

    def free(self, seq):
        self.cache.free_sequence(seq)
        del self.ref[seq]

    def append(self, seq, n):
        first = self.cache.num_tokens(seq)
        try:
            slots = self.cache.sync_new_tokens(seq, n)
        except vtoken.ResourceExhaustedError:
            self.r["pool_exhausted"] += 1  # Preempt the sequence, as an engine would.
            self.free(seq)
            return
        contents = list(range(self.next_content, self.next_content + n))
        self.next_content += n
        while self.words.shape[1] < self.next_content:
            self.words = np.concatenate([self.words, np.zeros_like(self.words)], axis=1)
        self.words[:, contents, :] = fill_content(contents)
        self.store[:, slots, :] = self.words[:, contents, :]
        tokens, cs = self.ref[seq]
        tokens.extend(range(first, first + n))
        cs.extend(contents)
        self.r["appended_tokens"] += n

    def evict(self, seq, arg):
        if self.mode == "native":
            return
        tokens, contents = self.ref[seq]
        victims = []
        if tokens:
            v, state = split_mix64(arg)
            count = 1 + v % 6
            i = 0
            while i < count and i < len(tokens):
                v, state = split_mix64(state)
                k = v % len(tokens)
                victims.append(tokens.pop(k))
                contents.pop(k)
                i += 1
        for t in victims:
            self.cache.evict_token(seq, t)
            self.r["evictions"] += 1

    def reclaim(self):
        if self.mode != "vtoken" or not self.planner.triggered(self.cache):
            return
        plan = self.planner.plan(self.cache)
        if not plan:
            return
        rel = self.cache.begin_relocation(plan)
        copies = rel.copies()
        before = self.store[:, copies[:, 0], :].copy()
        self.store[:, copies[:, 1], :] = self.store[:, copies[:, 0], :]  # the copy engine
        for s in rel.seqs:
            self.cache.apply_moves(s.seq, s.moves)
        self.r["relocations"] += 1
        self.r["tokens_moved"] += rel.num_moves
        self.r["blocks_reclaimed"] += plan.blocks_freed
        self.in_flight.append((rel, copies[:, 1], before))

    def poll(self):
        for rel, dst, before in self.in_flight:
            self.r["hash_checks"] += len(dst)
            if not np.array_equal(self.store[:, dst, :], before):
                self.violation(f"relocation {rel.id}: destination bytes differ from the source")
            self.cache.complete_relocation(rel.id)
        self.in_flight = []

    def verify_seq(self, seq, require_no_pending):
        tokens, contents = self.ref[seq]
        live = self.cache.live_tokens(seq)
        if len(live) != len(tokens) or not np.array_equal(live, tokens):
            self.violation(f"sequence {seq}: live tokens differ from the reference")
            return
        slots = self.cache.live_slots(seq)
        ok = np.ones(len(slots), dtype=bool)
        if self.in_flight:
            ok = np.array([not self.cache.is_slot_pending(s) for s in slots], dtype=bool)
            if require_no_pending and not ok.all():
                self.violation(f"sequence {seq}: read-after-copy")
        got = self.store[:, slots[ok], :]
        want = self.words[:, np.asarray(contents, dtype=np.int64)[ok], :]
        bad = (got != want).any(axis=(0, 2))
        if bad.any():
            self.violation(f"sequence {seq}: {int(bad.sum())} tokens hold wrong bytes")
        self.r["tokens_verified"] += int(ok.sum())

    def verify(self):
        self.r["invariant_checks"] += 1
        try:
            self.cache.check_invariants()
        except vtoken.InternalError as e:
            self.violation(f"invariant: {e}")
        for seq in sorted(self.ref):
            self.verify_seq(seq, require_no_pending=False)

    def finish(self):
        self.r["invariant_checks"] += 1
        try:
            self.cache.check_invariants()
        except vtoken.InternalError as e:
            self.violation(f"invariant: {e}")
        self.poll()
        for seq in sorted(self.ref):
            self.verify_seq(seq, require_no_pending=True)
        for seq in sorted(self.ref):
            self.free(seq)
        self.cache.check_invariants()
        if self.cache.num_free_blocks != self.cache.num_blocks:
            self.violation("blocks leaked")

    def run(self, seed, steps):
        state = seed
        for _ in range(steps):
            a, state = split_mix64(state)
            b, state = split_mix64(state)
            c, state = split_mix64(state)
            self.step(a, b, c)
        self.finish()
        return self.r


CLI_LABELS = {"steps": "steps", "tokens appended": "appended_tokens", "evictions": "evictions",
              "forks": "forks", "pool exhausted": "pool_exhausted",
              "relocations": "relocations", "tokens moved": "tokens_moved",
              "blocks reclaimed": "blocks_reclaimed", "hash checks": "hash_checks",
              "invariant checks": "invariant_checks", "tokens verified": "tokens_verified",
              "fence waits": "fence_waits", "violations": "violations"}


def cli_check(args):
    cli = os.environ.get("VTOKEN_CLI")
    if not cli or not os.path.exists(cli):
        pytest.skip("VTOKEN_CLI (the vtoken-cli binary) not set")
    out = subprocess.run([cli, "check", *args], check=True, capture_output=True, text=True).stdout
    counts = {}
    for line in out.splitlines():
        m = re.match(r"^  ([a-z ]+?)\s+(\d+)$", line)
        if m and m.group(1) in CLI_LABELS:
            counts[CLI_LABELS[m.group(1)]] = int(m.group(2))
    assert len(counts) == len(CLI_LABELS), out
    return counts


CASES = [
    # (seed, steps, mode, num_blocks, headroom_blocks, trigger)
    (1, 3000, "vtoken", 64, 8, "always"),
    (7, 2000, "naive", 64, 8, "always"),
    # A small pool: appends run out of blocks and sequences are preempted.
    (3, 2000, "vtoken", 24, 4, "pressure"),
]


@pytest.mark.parametrize("seed,steps,mode,num_blocks,headroom,trigger", CASES)
def test_python_harness_reproduces_cli_check(seed, steps, mode, num_blocks, headroom, trigger):
    py = PyCheckHarness(mode=mode, num_blocks=num_blocks, headroom_blocks=headroom,
                        trigger=trigger).run(seed, steps)
    cli = cli_check(["--seed", str(seed), "--steps", str(steps), "--mode", mode,
                     "--num-blocks", str(num_blocks), "--headroom", str(headroom),
                     "--trigger", trigger])
    assert py == cli
    assert py["violations"] == 0
    assert py["evictions"] > 0 if mode != "native" else py["evictions"] == 0
    if mode == "vtoken":
        assert py["relocations"] > 0 and py["tokens_moved"] == py["hash_checks"]
    if num_blocks == 24:
        assert py["pool_exhausted"] > 0


def test_run_check_matches_cli_and_known_counts():
    report = vtoken.run_check(seed=1, steps=2000)
    # `vtoken-cli check --seed 1 --steps 2000`, as printed by the C++ build.
    assert {k: report[k] for k in ("appended_tokens", "evictions", "forks", "relocations",
                                   "tokens_moved", "blocks_reclaimed", "tokens_verified")} == {
        "appended_tokens": 4234, "evictions": 1899, "forks": 22, "relocations": 52,
        "tokens_moved": 1889, "blocks_reclaimed": 67, "tokens_verified": 436590}
    assert report["violations"] == 0 and report["first_violations"] == []
    cli = cli_check(["--seed", "1", "--steps", "2000"])
    assert {k: report[k] for k in cli} == cli

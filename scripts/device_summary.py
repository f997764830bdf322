#!/usr/bin/env python3
"""summary.md of a device run (scripts/device-check.sh): the stage table, the GPU test counts,
every benchmark figure as a table, the GPU-runtime issue's targets computed from this run's
figures, and the engine comparisons. Also run on the CPU benchmark's output by
tests/scripts/gpu_bench_cpu_test.sh, so that this script is tested without a GPU.

Usage: device_summary.py STATUS_FILE OUT_DIR MODE SECONDS
  STATUS_FILE  one line per stage: name|result|seconds|budget
  OUT_DIR      the run's $OUT (env.txt, ctest-cuda.xml, cuda-bench.jsonl, model-bench.json, ...)
"""
import json, os, re, sys
status, out, mode, took = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
p = lambda *a: print(*a)
env = open(os.path.join(out, "env.txt")).read() if os.path.exists(os.path.join(out, "env.txt")) else ""
def env_line(prefix):
    for line in env.splitlines():
        if line.startswith(prefix): return line
    return prefix + " ?"
p(f"# device-check ({mode}), {took} s")
p()
for prefix in ("date:", "mode:", "python", "torch CXX11 ABI", "torch cmake prefix", "c++ CXX11",
               "cmake version"):
    p(f"- {env_line(prefix)}")
gpu = re.search(r"^name, memory.total.*\n(.*)$", env, re.M)
p(f"- gpu: {gpu.group(1) if gpu else 'unknown (see env.txt)'}")
p()
p("| stage | result | seconds | budget |")
p("| --- | --- | --- | --- |")
for line in open(status):
    name, result, secs, budget = line.rstrip("\n").split("|")
    p(f"| {name} | {result} | {secs} | {budget} |")
junit = os.path.join(out, "ctest-cuda.xml")
if os.path.exists(junit):
    x = open(junit).read()
    m = re.search(r"<testsuite[^>]*>", x)
    attrs = dict(re.findall(r'(\w+)="([^"]*)"', m.group(0))) if m else {}
    p()
    p(f"GPU tests (ctest -L cuda): {attrs.get('tests', '?')} tests, {attrs.get('failures', '?')} "
      f"failed, {attrs.get('skipped', '?')} skipped")
bench = os.path.join(out, "cuda-bench.jsonl")
if os.path.exists(bench):
    rows = {}
    for line in open(bench):
        try: r = json.loads(line)
        except ValueError: continue
        rows.setdefault(r.pop("bench", "?"), []).append(r)
    for kind, rs in rows.items():
        keys = list(dict.fromkeys(k for r in rs for k in r))
        p()
        p(f"### vtoken-cuda-bench: {kind}")
        p()
        p("| " + " | ".join(keys) + " |")
        p("|" + " --- |" * len(keys))
        for r in rs: p("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |")
model = os.path.join(out, "model-bench.json")
if os.path.exists(model):
    try: doc = json.load(open(model))
    except ValueError: doc = {}
    ctx = doc.get("context", {})
    p()
    p(f"### torch_gpu_bench: decode step, {ctx.get('model', '?')}, {ctx.get('dtype', '?')} on "
      f"{ctx.get('device', '?')} (wall ms per step; ratio = scattered / contiguous slots)")
    p()
    p("| cell | scattered ms | contiguous ms | ratio | tokens/s | static ms | graphs | "
      "graph speedup | error |")
    p("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    benches = doc.get("benchmarks", [])
    for b in benches:
        if not b.get("name", "").startswith("BM_DecodeStep/"): continue
        cell = "/".join(b.get("name", "?").split("/")[1:3])
        f = lambda k: f"{b[k]:.3f}" if k in b else ""
        p(f"| {cell} | {f('scattered_ms')} | {f('contiguous_ms')} | {f('ratio')} | "
          f"{f('tok_per_s')} | {f('static_ms')} | {b.get('graphs', '')} | "
          f"{f('graph_speedup')} | {b.get('error_message', '')} |")
    p()
    p(f"### torch_gpu_bench: one layer's decode attention, paged kernel vs torch "
      f"({ctx.get('attention_reference', '?')}) on dense K/V (ms per call; ratio = paged / torch)")
    p()
    p("| cell | paged ms | torch ms | ratio | paged K/V GB/s | error |")
    p("| --- | --- | --- | --- | --- | --- |")
    for b in benches:
        if not b.get("name", "").startswith("BM_Attention/"): continue
        cell = "/".join(b.get("name", "?").split("/")[1:3])
        f = lambda k: f"{b[k]:.3f}" if k in b else ""
        p(f"| {cell} | {f('paged_ms')} | {f('reference_ms')} | {f('ratio')} | "
          f"{f('kv_gb_per_s')} | {b.get('error_message', '')} |")
# The GPU-runtime issue's targets, each as a ratio of two figures of this run.
targets = []
if os.path.exists(bench):
    rs = [json.loads(l) for l in open(bench) if l.strip().startswith("{")]
    rel = [r for r in rs if r.get("bench") == "relocate" and r.get("memcpy_gb_per_s")]
    if rel:
        worst = min(r["gb_per_s"] / r["memcpy_gb_per_s"] for r in rel)
        targets.append(("relocation >= 80% of cudaMemcpy D2D", f"{100 * worst:.0f}% (worst shape)",
                        worst >= 0.8))
    att = [r for r in rs if r.get("bench") == "batch_attention" and r.get("num_seqs") == 32
           and r.get("context") == 4096]
    peak = max((r["memcpy_gb_per_s"] for r in rel), default=0)
    if att and peak:
        frac = att[0]["kv_gb_per_s"] / peak
        targets.append(("decode attention >= 60% of HBM bandwidth (32 x 4K, bf16)",
                        f"{100 * frac:.0f}% of the memcpy bandwidth measured here ({peak:.0f} GB/s)",
                        frac >= 0.6))
if os.path.exists(model):
    cells = [b for b in doc.get("benchmarks", [])
             if b.get("name", "").startswith("BM_DecodeStep/") and "ratio" in b]
    if cells:
        worst = max(b["ratio"] for b in cells)
        targets.append(("indirection overhead < 1% of the decode step",
                        f"{100 * (worst - 1):+.2f}% (worst cell, scattered vs contiguous)",
                        worst < 1.01))
    batch1 = [b for b in cells if "/batch:1/" in b.get("name", "") and b.get("graphs") == 1]
    if batch1:
        slowest = min(b["graph_speedup"] for b in batch1)
        targets.append(("CUDA graph replay faster than eager at batch 1",
                        f"{slowest:.2f}x eager's speed (slowest batch-1 cell)", slowest > 1))
if targets:
    p()
    p("## Targets (GPU-runtime issue), from this run")
    p()
    p("| target | measured | met |")
    p("| --- | --- | --- |")
    for name, value, met in targets:
        p(f"| {name} | {value} | {'yes' if met else 'no'} |")
compare = os.path.join(out, "compare.txt")
if os.path.exists(compare):
    p()
    p("## Engine evaluation on the GPU (vtoken-cli compare)")
    p()
    p("```")
    p(open(compare).read().rstrip())
    p("```")

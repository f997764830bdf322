#!/usr/bin/env python3
"""summary.md of a device run (scripts/device-check.sh): the stage table, the GPU test counts,
every benchmark figure as a table, the GPU-runtime issue's targets computed from this run's
figures, and the engine comparisons. Also run on the CPU benchmark's output by
tests/scripts/gpu_bench_cpu_test.sh, so that this script is tested without a GPU.

Usage: device_summary.py STATUS_FILE OUT_DIR MODE SECONDS
  STATUS_FILE  one line per stage: name|result|seconds|budget
  OUT_DIR      the run's $OUT (env.txt, ctest-cuda.xml, cuda-bench.jsonl, model-bench.json, ...)

Every target gets a row, "not measured (why)" when this run has no figure for it. Outputs cut
short (a stage's timeout) are read as far as they are complete, and the summary says so.
"""
import json, os, re, statistics, sys
status, out, mode, took = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
p = lambda *a: print(*a)
# Nominal HBM bandwidth (GB/s, vendor datasheets) by a name nvidia-smi reports; the attention
# target is judged against it. A GPU not listed is reported, not judged.
NOMINAL_HBM_GB_S = [("H200", 4800), ("H100 80GB HBM3", 3350), ("H100 SXM", 3350),
                    ("H100 NVL", 3900), ("H100 PCIe", 2000), ("A100-SXM4-80GB", 2039),
                    ("A100 80GB PCIe", 1935), ("A100-SXM4-40GB", 1555)]
L2_RESIDENT_MIB = 128  # K/V under about twice an H100/H200's L2 (50-60 MB) stays in cache.

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
gpu_name = gpu.group(1).split(",")[0].strip() if gpu else ""
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

# vtoken-cuda-bench: one JSON object per line; a line cut short (or not JSON) is skipped.
bench = os.path.join(out, "cuda-bench.jsonl")
cuda_rows, bad_lines = [], 0
if os.path.exists(bench):
    for line in open(bench):
        if not line.strip(): continue
        try: cuda_rows.append(json.loads(line))
        except ValueError: bad_lines += 1
    rows = {}
    for r in cuda_rows:
        rows.setdefault(r.get("bench", "?"), []).append({k: v for k, v in r.items() if k != "bench"})
    if bad_lines:
        p()
        p(f"cuda-bench.jsonl: {bad_lines} line(s) unreadable (cut short?), left out")
    for kind, rs in rows.items():
        keys = list(dict.fromkeys(k for r in rs for k in r))
        p()
        p(f"### vtoken-cuda-bench: {kind}")
        p()
        p("| " + " | ".join(keys) + " |")
        p("|" + " --- |" * len(keys))
        for r in rs: p("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |")

def load_benchmark_json(path):
    """Google Benchmark's JSON, or as much of it as was written: (doc, note)."""
    text = open(path).read()
    try: return json.loads(text), ""
    except ValueError: pass
    doc, dec = {"benchmarks": []}, json.JSONDecoder()
    m = re.search(r'"context"\s*:\s*', text)
    if m:
        try: doc["context"] = dec.raw_decode(text, m.end())[0]
        except ValueError: pass
    m = re.search(r'"benchmarks"\s*:\s*\[', text)
    pos = m.end() if m else len(text)
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,": pos += 1
        try: obj, pos = dec.raw_decode(text, pos)
        except ValueError: break
        doc["benchmarks"].append(obj)
    return doc, (f"model-bench.json was cut short (the stage's timeout?): "
                 f"{len(doc['benchmarks'])} complete cell(s) read")

model = os.path.join(out, "model-bench.json")
doc = {}
decode_cells, decode_names = [], []
if os.path.exists(model):
    doc, note = load_benchmark_json(model)
    ctx = doc.get("context", {})
    if note:
        p()
        p(note)
    p()
    p(f"### torch_gpu_bench: decode step, {ctx.get('model', '?')}, {ctx.get('dtype', '?')} on "
      f"{ctx.get('device', '?')} (wall ms per step; ratio = scattered / contiguous slots: of the "
      f"summed times, and the median (min-max) of the per-iteration pairs; sample cost = the "
      f"static step with every sequence sampling, temperature 0.8 / top_p 0.9 on the device, "
      f"over the greedy static step, batch-32 cells)")
    p()
    p(f"Cells skipped for KV memory: {ctx.get('skipped_cells', '?')}")
    p()
    p("| cell | scattered ms | contiguous ms | ratio | paired ratio median (min-max) | tokens/s | "
      "static ms | static speedup | graphs (replays) | static eager ms | graph speedup | "
      "sampled ms | sample cost | error |")
    p("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    benches = doc.get("benchmarks", [])
    for b in benches:
        if not b.get("name", "").startswith("BM_DecodeStep/"): continue
        decode_names.append(b["name"])
        if "ratio" in b: decode_cells.append(b)
        cell = "/".join(b.get("name", "?").split("/")[1:3])
        f = lambda k: f"{b[k]:.3f}" if k in b else ""
        spread = (f"{b['ratio_median']:.4f} ({b['ratio_min']:.4f}-{b['ratio_max']:.4f})"
                  if "ratio_median" in b else "")
        graphs = f"{b['graphs']:.0f} ({b.get('replays', 0):.0f})" if "graphs" in b else ""
        err = b.get("error_message", "") or b.get("label", "")
        p(f"| {cell} | {f('scattered_ms')} | {f('contiguous_ms')} | {f('ratio')} | {spread} | "
          f"{f('tok_per_s')} | {f('static_ms')} | {f('static_speedup')} | {graphs} | "
          f"{f('static_eager_ms')} | {f('graph_speedup')} | {f('sampled_ms')} | "
          f"{f('sample_cost')} | {err} |")
    p()
    p(f"### torch_gpu_bench: one layer's decode attention, paged kernel vs torch "
      f"({ctx.get('attention_reference', '?')}) on dense K/V (ms per call; ratio = paged / torch; "
      f"K/V under {L2_RESIDENT_MIB} MiB stays in the L2 cache across calls: not an HBM figure)")
    p()
    p("| cell | paged ms | torch ms | ratio | paged K/V GB/s | K/V MiB | error |")
    p("| --- | --- | --- | --- | --- | --- | --- |")
    for b in benches:
        if not b.get("name", "").startswith("BM_Attention/"): continue
        cell = "/".join(b.get("name", "?").split("/")[1:3])
        f = lambda k: f"{b[k]:.3f}" if k in b else ""
        mib = b.get("kv_mib")
        size = "" if mib is None else f"{mib:.0f}" + (" (L2-resident)" if mib < L2_RESIDENT_MIB else "")
        p(f"| {cell} | {f('paged_ms')} | {f('reference_ms')} | {f('ratio')} | "
          f"{f('kv_gb_per_s')} | {size} | {b.get('error_message', '')} |")
    groups = [b for b in benches if b.get("name", "").startswith("BM_DecodeGroups/")]
    if groups:
        p()
        p("### torch_gpu_bench: per-head KV groups, the decode step at token vs head granularity "
          "(same live tokens and K/V bytes; ms per step; ratio = head / token; eager ForwardPaged "
          "and the static step, replayed when graphs are; index / signal MiB = the head step's "
          "slot list up and attention signal down)")
        p()
        p("| batch x context | groups | token ms | head ms | ratio | static token ms | "
          "static head ms | static ratio | replays | index MiB | signal MiB | error |")
        p("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for b in groups:
            parts = b.get("name", "?").split("/")
            shape = " x ".join(x.split(":")[1] for x in parts[1:3] if ":" in x)
            f = lambda k: f"{b[k]:.3f}" if k in b else ""
            n = lambda k: f"{b[k]:.0f}" if k in b else ""
            p(f"| {shape} | {n('groups')} | {f('token_ms')} | {f('head_ms')} | {f('ratio')} | "
              f"{f('static_token_ms')} | {f('static_head_ms')} | {f('static_ratio')} | "
              f"{n('replays')} | {f('index_mib')} | {f('signal_mib')} | "
              f"{b.get('error_message', '')} |")

# The GPU-runtime issue's targets, each from this run's figures; every target gets a row.
targets = []
rel = [r for r in cuda_rows if r.get("bench") == "relocate" and r.get("memcpy_gb_per_s")]
if rel:
    big = max(rel, key=lambda r: r.get("copies", 0))
    frac = big["gb_per_s"] / big["memcpy_gb_per_s"]
    worst = min(r["gb_per_s"] / r["memcpy_gb_per_s"] for r in rel)
    payload_mib = big.get("copies", 0) * big.get("layers", 0) * 2 * big.get("bytes_per_row", 0) / 2**20
    targets.append(("relocation >= 80% of cudaMemcpy D2D",
                    f"{100 * frac:.0f}% at {big.get('copies')} copies ({payload_mib:.0f} MiB moved; "
                    f"one cudaMemcpyAsync of the same payload at {big['memcpy_gb_per_s']:.0f} GB/s "
                    f"read+write); lowest over {len(rel)} shapes {100 * worst:.0f}%",
                    "yes" if frac >= 0.8 else "no"))
else:
    targets.append(("relocation >= 80% of cudaMemcpy D2D",
                    "not measured (no relocate rows in cuda-bench.jsonl)", "-"))
att = [r for r in cuda_rows if r.get("bench") == "batch_attention" and r.get("num_seqs") == 32
       and r.get("context") == 4096]
att_name = "decode attention >= 60% of HBM bandwidth (32 x 4K, bf16)"
if att:
    gbs = att[0]["kv_gb_per_s"]
    memcpy = max((r["memcpy_gb_per_s"] for r in rel), default=0)
    also = f"; {100 * gbs / memcpy:.0f}% of the memcpy figure ({memcpy:.0f} GB/s read+write)" if memcpy else ""
    peak = next((bw for key, bw in NOMINAL_HBM_GB_S if key in gpu_name), None)
    if peak:
        targets.append((att_name, f"{gbs:.0f} GB/s = {100 * gbs / peak:.0f}% of the {gpu_name}'s "
                        f"nominal {peak} GB/s{also}", "yes" if gbs / peak >= 0.6 else "no"))
    else:
        targets.append((att_name, f"{gbs:.0f} GB/s; no nominal HBM bandwidth known for GPU "
                        f"'{gpu_name or '?'}'{also}", "not judged"))
else:
    targets.append((att_name, "not measured (no 32 x 4096 batch_attention row in cuda-bench.jsonl)", "-"))
ind_name = "indirection overhead < 1% of the decode step"
paired = [b for b in decode_cells if "ratio_median" in b]
if paired:
    mid = statistics.median(b["ratio_median"] for b in paired)
    worst = max(paired, key=lambda b: b["ratio_median"])
    wcell = "/".join(worst["name"].split("/")[1:3])
    targets.append((ind_name, f"{100 * (mid - 1):+.2f}% (median over {len(paired)} of "
                    f"{len(decode_names)} cells of each cell's paired median, scattered vs "
                    f"contiguous); worst cell {100 * (worst['ratio_median'] - 1):+.2f}% ({wcell})",
                    "yes" if mid < 1.01 else "no"))
else:
    why = "no model-bench.json" if not os.path.exists(model) else \
          f"no decode cell completed ({len(decode_names)} listed)"
    targets.append((ind_name, f"not measured ({why})", "-"))
graph_name = "CUDA graph replay faster than eager at batch 1"
batch1 = [b for b in decode_cells if "/batch:1/" in b.get("name", "") and b.get("graphs") == 1
          and "graph_speedup" in b]
if batch1:
    slowest = min(batch1, key=lambda b: b["graph_speedup"])
    targets.append((graph_name, f"{slowest['graph_speedup']:.2f}x the same static step run eagerly "
                    f"(slowest of {len(batch1)} batch-1 cells)", "yes" if slowest["graph_speedup"] > 1 else "no"))
else:
    targets.append((graph_name, "not measured (no batch-1 cell replayed a CUDA graph: no CUDA, "
                    "the capture failed, or the cells did not complete)", "-"))
p()
p("## Targets (GPU-runtime issue), from this run")
p()
p("| target | measured | met |")
p("| --- | --- | --- |")
for name, value, met in targets:
    p(f"| {name} | {value} | {met} |")
compare = os.path.join(out, "compare.txt")
if os.path.exists(compare):
    p()
    p("## Engine evaluation on the GPU (vtoken-cli compare)")
    p()
    p("```")
    p(open(compare).read().rstrip())
    p("```")

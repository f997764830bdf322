#!/usr/bin/env bash
# bench/torch_gpu_bench on the CPU: the device run's decode benchmark runs here too (on vt-tiny,
# --quick, fewer iterations), reports every cell of its grid with the scattered / contiguous ratio
# and the static decode step's time (no graphs on the CPU), and the attention cells (paged kernel
# vs the torch reference),
# and refuses a malformed flag with a one-line error.
# Usage: gpu_bench_cpu_test.sh SOURCE_DIR BENCH_BINARY
set -euo pipefail
src="$1"
bench="$2"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT

OMP_WAIT_POLICY=PASSIVE "$bench" --model="$src/models/vt-tiny" --device=cpu --dtype=float32 \
  --quick --warmup=1 --iterations=2 --benchmark_format=json >"$out"
python3 - "$out" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
cells = {b["name"]: b for b in doc["benchmarks"]}
want = {f"BM_{kind}/batch:{b}/context:{c}/iterations:2/manual_time"
        for kind in ("DecodeStep", "Attention") for b in (1, 32) for c in (1024, 4096)}
want.add("BM_DecodeGroups/batch:8/context:1024/iterations:2/manual_time")
assert set(cells) == want, sorted(cells)
for name, b in cells.items():
    assert "error_message" not in b, (name, b.get("error_message"))
    assert b["iterations"] == 2, name
    if name.startswith("BM_DecodeGroups"):
        # vt-tiny: 6 layers x 1 KV head = 6 head groups, 8 x 1025 keys each.
        assert b["groups"] == 6 and b["keys"] == 6 * 8 * 1025, (name, b["groups"], b["keys"])
        for key in ("token_ms", "head_ms", "ratio", "static_token_ms", "static_head_ms",
                    "static_ratio", "index_mib", "signal_mib"):
            assert b[key] > 0, (name, key, b[key])
        assert abs(b["ratio"] - b["head_ms"] / b["token_ms"]) < 1e-6 * b["ratio"], name
        assert abs(b["index_mib"] - 8 * b["keys"] / 2**20) < 1e-9, name
        assert b["replays"] == 0, (name, "no CUDA graphs on the CPU")
        continue
    if name.startswith("BM_Attention"):
        for key in ("paged_ms", "reference_ms", "ratio", "kv_gb_per_s"):
            assert b[key] > 0, (name, key, b[key])
        assert abs(b["ratio"] - b["paged_ms"] / b["reference_ms"]) < 1e-6 * b["ratio"], name
        continue
    for key in ("scattered_ms", "contiguous_ms", "ratio", "ratio_median", "ratio_min",
                "ratio_max", "tok_per_s", "static_ms", "static_speedup"):
        assert b[key] > 0, (name, key, b[key])
    assert abs(b["ratio"] - b["scattered_ms"] / b["contiguous_ms"]) < 1e-6 * b["ratio"], name
    assert b["ratio_min"] <= b["ratio_median"] <= b["ratio_max"], name
    assert b["graphs"] == 0 and b["replays"] == 0, (name, "no CUDA graphs on the CPU")
    assert "graph_speedup" not in b and "static_eager_ms" not in b, (name, "nothing replayed")
    sampled = "/batch:32/" in name  # The cells that time the sampled static step too.
    assert ("sampled_ms" in b) == sampled and ("sample_cost" in b) == sampled, name
    if sampled:
        assert b["sampled_ms"] > 0, name
        assert abs(b["sample_cost"] - b["sampled_ms"] / b["static_ms"]) < 1e-6 * b["sample_cost"], name
ctx = doc["context"]
assert ctx["device"] == "cpu" and ctx["dtype"] == "float32" and ctx["blas"], ctx
assert ctx["skipped_cells"] == "none", ctx
# math under Debian's libtorch 1.13 (no public SDPA), sdpa under a 2.x wheel (preset torch2).
assert ctx["attention_reference"] in ("math", "sdpa"), ctx
print("torch_gpu_bench on the CPU:", ", ".join(
    f"{n.split('/')[0][3:]} {n.split('/')[1]}/{n.split('/')[2]} ratio {cells[n]['ratio']:.2f}"
    for n in sorted(cells)))
PY

# The device run's summary.md generator on these figures: both tables, one row per cell, the
# indirection target from the decode cells' paired medians, and a "not measured" row for each
# target without figures here (nothing was replayed, no vtoken-cuda-bench output).
dir="$(mktemp -d)"
trap 'rm -f "$out"; rm -rf "$dir"' EXIT
cp "$out" "$dir/model-bench.json"
echo "bench-model|ok|1|40" >"$dir/status"
python3 "$src/scripts/device_summary.py" "$dir/status" "$dir" full 1 >"$dir/summary.md"
python3 - "$dir/summary.md" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
assert "| bench-model | ok | 1 | 40 |" in text, text
assert "### torch_gpu_bench: decode step" in text, text
assert re.search(r"one layer's decode attention, paged kernel vs torch \((math|sdpa)\)", text), text
assert "### torch_gpu_bench: per-head KV groups" in text, text
assert re.search(r"^\| 8 x 1024 \| 6 \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|", text, re.M), text
rows = [l for l in text.splitlines() if l.startswith("| batch:")]
assert len(rows) == 8, rows
import re
m = re.search(r"^\| indirection overhead < 1% of the decode step \| ([-+][0-9.]+)% \(median over 4 of 4 "
              r"cells.*\| (yes|no) \|$", text, re.M)
assert m, text
# Every target has a row; those without figures here say so.
for target in ("relocation >= 80% of cudaMemcpy D2D", "decode attention >= 60% of HBM bandwidth",
               "CUDA graph replay faster than eager at batch 1"):
    assert re.search(r"^\| " + re.escape(target) + r".*\| not measured \(.*\| - \|$", text, re.M), (target, text)
PY
# With the batch-1 decode cells marked replayed (as on a CUDA libtorch): the graph target.
cp "$dir/model-bench.json" "$dir/cpu-bench.json"
python3 - "$dir/model-bench.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for b in doc["benchmarks"]:
    if b["name"].startswith("BM_DecodeStep/batch:1/"):
        b.update(graphs=1, replays=12, static_eager_ms=2 * b["static_ms"], graph_speedup=2.0)
json.dump(doc, open(sys.argv[1], "w"))
PY
python3 "$src/scripts/device_summary.py" "$dir/status" "$dir" full 1 >"$dir/summary.md"
grep -q '^| CUDA graph replay faster than eager at batch 1 | 2.00x the same static step run eagerly (slowest of 2 batch-1 cells) | yes |$' "$dir/summary.md" ||
  { echo "summary.md has no graph target:" >&2; cat "$dir/summary.md" >&2; exit 1; }

# Outputs cut short by a stage's timeout: the complete cells and lines are still read.
head -c "$(( $(wc -c <"$dir/cpu-bench.json") * 2 / 3 ))" "$dir/cpu-bench.json" >"$dir/model-bench.json"
cat >"$dir/cuda-bench.jsonl" <<'JSONL'
{"bench":"device","name":"NVIDIA H200"}
{"bench":"relocate","layers":32,"bytes_per_row":2048,"copies":16,"ms":0.0100,"gb_per_s":419.4,"payload_gb_per_s":209.7,"memcpy_ms":0.0080,"memcpy_gb_per_s":524.3}
{"bench":"relocate","layers":32,"bytes_per_row":2048,"copies":32768,"ms":1.2000,"gb_per_s":7158.3,"payload_gb_per_s":3579.1,"memcpy_ms":1.0000,"memcpy_gb_per_s":8589.9}
{"bench":"batch_attention","num_seqs":32,"context":4096,"kv_gb_per_s":3600.0}
{"bench":"batch_attention","num_seqs":32,"cont
JSONL
printf 'name, memory.total [MiB], driver_version\nNVIDIA H200, 143771 MiB, 580.65\n' >"$dir/env.txt"
python3 "$src/scripts/device_summary.py" "$dir/status" "$dir" full 1 >"$dir/summary.md"
python3 - "$dir/summary.md" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
assert re.search(r"^model-bench.json was cut short .*: [1-9][0-9]* complete cell\(s\) read$", text, re.M), text
assert "cuda-bench.jsonl: 1 line(s) unreadable (cut short?), left out" in text, text
# Judged at the largest shape (83% of one memcpy), the smallest shown beside it.
assert re.search(r"^\| relocation >= 80% of cudaMemcpy D2D \| 83% at 32768 copies \(4096 MiB moved;"
                 r".*lowest over 2 shapes 80% \| yes \|$", text, re.M), text
# Against the H200's nominal 4800 GB/s, not the memcpy figure.
assert re.search(r"^\| decode attention >= 60% of HBM bandwidth \(32 x 4K, bf16\) \| 3600 GB/s = 75% "
                 r"of the NVIDIA H200's nominal 4800 GB/s; 42% of the memcpy figure .* \| yes \|$",
                 text, re.M), text
PY

# A malformed flag: one line naming it, exit status 2, no benchmark run.
set +e
msg="$("$bench" --kv-gib=lots 2>&1 >/dev/null)"
rc=$?
set -e
[[ $rc -eq 2 ]] || { echo "expected exit 2 for --kv-gib=lots, got $rc" >&2; exit 1; }
[[ "$msg" == 'torch_gpu_bench: error: --kv-gib needs a positive number, got "lots"' ]] ||
  { echo "unexpected message: $msg" >&2; exit 1; }
msg="$("$bench" --device=tpu 2>&1 >/dev/null)" && { echo "--device=tpu was accepted" >&2; exit 1; }
[[ "$(wc -l <<<"$msg")" -eq 1 && "$msg" == *tpu* ]] || { echo "unexpected message: $msg" >&2; exit 1; }
echo "gpu_bench_cpu: ok"

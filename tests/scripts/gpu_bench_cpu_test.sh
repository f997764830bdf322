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
assert set(cells) == want, sorted(cells)
for name, b in cells.items():
    assert "error_message" not in b, (name, b.get("error_message"))
    assert b["iterations"] == 2, name
    if name.startswith("BM_Attention"):
        for key in ("paged_ms", "reference_ms", "ratio", "kv_gb_per_s"):
            assert b[key] > 0, (name, key, b[key])
        assert abs(b["ratio"] - b["paged_ms"] / b["reference_ms"]) < 1e-6 * b["ratio"], name
        continue
    for key in ("scattered_ms", "contiguous_ms", "ratio", "tok_per_s", "static_ms",
                "graph_speedup"):
        assert b[key] > 0, (name, key, b[key])
    assert abs(b["ratio"] - b["scattered_ms"] / b["contiguous_ms"]) < 1e-6 * b["ratio"], name
    assert b["graphs"] == 0, (name, "no CUDA graphs on the CPU")
ctx = doc["context"]
assert ctx["device"] == "cpu" and ctx["dtype"] == "float32" and ctx["blas"], ctx
assert ctx["attention_reference"] == "math", ctx  # Debian's libtorch 1.13 has no public SDPA.
print("torch_gpu_bench on the CPU:", ", ".join(
    f"{n.split('/')[0][3:]} {n.split('/')[1]}/{n.split('/')[2]} ratio {cells[n]['ratio']:.2f}"
    for n in sorted(cells)))
PY

# The device run's summary.md generator on these figures: both tables, one row per cell, and the
# indirection target computed from the decode cells (no graph target: nothing was replayed).
dir="$(mktemp -d)"
trap 'rm -f "$out"; rm -rf "$dir"' EXIT
cp "$out" "$dir/model-bench.json"
echo "bench-model|ok|1|40" >"$dir/status"
python3 "$src/scripts/device_summary.py" "$dir/status" "$dir" full 1 >"$dir/summary.md"
python3 - "$dir/summary.md" <<'PY'
import sys
text = open(sys.argv[1]).read()
assert "| bench-model | ok | 1 | 40 |" in text, text
assert "### torch_gpu_bench: decode step" in text, text
assert "one layer's decode attention, paged kernel vs torch (math)" in text, text
rows = [l for l in text.splitlines() if l.startswith("| batch:")]
assert len(rows) == 8, rows
assert "| indirection overhead < 1% of the decode step |" in text, text
assert "CUDA graph replay" not in text, text
PY
# And with the batch-1 decode cells marked replayed (as on a CUDA libtorch): the graph target.
python3 - "$dir/model-bench.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for b in doc["benchmarks"]:
    if b["name"].startswith("BM_DecodeStep/batch:1/"): b["graphs"] = 1
json.dump(doc, open(sys.argv[1], "w"))
PY
python3 "$src/scripts/device_summary.py" "$dir/status" "$dir" full 1 >"$dir/summary.md"
grep -q '^| CUDA graph replay faster than eager at batch 1 | [0-9.]*x eager' "$dir/summary.md" ||
  { echo "summary.md has no graph target:" >&2; cat "$dir/summary.md" >&2; exit 1; }

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

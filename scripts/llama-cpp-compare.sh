#!/usr/bin/env bash
# llama-cpp-compare.sh: the workbench's CPU step against llama.cpp on SmolLM2-135M-Instruct's
# shapes, both on the same fp32 weights, in one run on this machine (docs/PERFORMANCE.md,
# "Against llama.cpp on SmolLM2"). llama.cpp is a peer tool: built here from the source
# distribution of llama-cpp-python on PyPI (which vendors it), never part of the repository.
#
#  1. The peer: `pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36` into
#     .cache/peers (sha256 checked below), its vendor/llama.cpp built twice, Release with OpenMP:
#     `native` (-DGGML_NATIVE=ON: every ISA this CPU has) and `avx2` (GGML_NATIVE=OFF, AVX2 + FMA
#     + F16C, no AVX-512), the comparison for AVX2-only hosts. Kept once built.
#  2. The model: the Q4_1 GGUF that scripts/fetch-model.sh fetched, every tensor dequantized to
#     F32 (gguf_dequant_dump --f32): the weights our runtime computes with after loading it; and
#     its matrices rounded to BF16 (gguf_dequant_dump --bf16), for our model.weights = bfloat16.
#  3. ROUNDS rounds (default 3), each running in turn: ours at every ISA level this CPU has
#     (VTOKEN_CPU_ISA=avx512 / avx2; bench/torch_model_bench --benchmark_filter=BM_SmolLm2Shapes:
#     prefill 512 and 2,048; decode of batch 1, 8 and 32 at contexts 512 and 2,048, 16 steps) and
#     each llama.cpp build (llama-bench -p 512,2048 -n 0; llama-batched-bench -npp 512,2048
#     -ntg 16 -npl 1,8,32 with one KV stream per sequence, its default), all on THREADS threads
#     (default: every CPU), KV cache f16 and flash attention auto (llama.cpp's defaults). And the
#     weights as stored: ours with model weights as_stored (BM_SmolLm2Shapes/.../stored:1, decode
#     of batch 1 and 8 at context 512, prefill of 512) and as_stored_q8 (stored:2: the activations
#     quantized to 8 bits as llama.cpp does, prefill included) against llama.cpp on the Q4_1 file
#     itself (llama-batched-bench's decode, and its prompt processing of one sequence). And bf16:
#     ours with model weights bfloat16 (stored:3, every prefill and decode case above) against
#     llama.cpp on the BF16 file (llama-bench, llama-batched-bench as for F32). Ours runs each
#     case twice, its KV store in fp32 and in fp16 (kv16 = 1: model.kv_dtype = float16).
#  4. A table of medians (tokens/s) and ratios, ours over llama.cpp at the same ISA level, to
#     stdout and OUT/summary.md; every raw output under OUT (default build/llama-cpp-compare).
#
# With --vt-tiny, the bundled vt-tiny model instead (models/vt-tiny written as an F32 GGUF by
# gguf_dequant_dump --from-dir): ours BM_LlamaCppShapes (a 512-token prefill; 128 decode steps
# from an empty cache; batch 1, 8 and 32 at context 512, 128 steps; fp32 KV) against llama-bench
# -p 512 -n 128 and llama-batched-bench -npp 512 -ntg 128 -npl 1,8,32 (f16 KV), per ISA level.
#
# Usage: scripts/llama-cpp-compare.sh [--rounds N] [--threads N] [--out DIR] [--vt-tiny]
# Needs the release build's bench/torch_model_bench and tests/gguf_dequant_dump (make build).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
fail() { echo "llama-cpp-compare: error: $*" >&2; exit 1; }

rounds=3 threads=$(nproc) out=build/llama-cpp-compare vt_tiny=0
usage="usage: scripts/llama-cpp-compare.sh [--rounds N] [--threads N] [--out DIR] [--vt-tiny]"
while [[ $# -gt 0 ]]; do
  case $1 in
    --vt-tiny) vt_tiny=1; shift ;;
    --rounds) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || fail "--rounds needs a count >= 1"; rounds=$2; shift 2 ;;
    --threads) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || fail "--threads needs a count >= 1"; threads=$2; shift 2 ;;
    --out) [[ -n ${2:-} ]] || fail "--out needs a directory"; out=$2; shift 2 ;;
    *) fail "unknown argument '$1' ($usage)" ;;
  esac
done

version=0.3.36
sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
peers=${VTOKEN_CACHE_DIR:-$repo/.cache}/peers
bench=$repo/build/release/bench/torch_model_bench
dump=$repo/build/release/tests/gguf_dequant_dump
[[ -x $bench && -x $dump ]] || fail "build/release has no bench/torch_model_bench or tests/gguf_dequant_dump (run make build)"
bash scripts/fetch-model.sh smollm2-135m >/dev/null || fail "scripts/fetch-model.sh smollm2-135m failed"
model_q=$(ls "$repo"/.cache/models/smollm2-135m/*.gguf 2>/dev/null | head -n1)
[[ -f $model_q ]] || fail "no SmolLM2 GGUF in .cache/models/smollm2-135m"
mkdir -p "$peers" "$out" || fail "cannot create $peers or $out"

# 1. The peer's source and builds.
src=$peers/llama_cpp_python-$version
if [[ ! -d $src/vendor/llama.cpp ]]; then
  tarball=$peers/llama_cpp_python-$version.tar.gz
  if [[ ! -f $tarball ]]; then
    python3 -m pip download --quiet --no-deps --no-binary :all: --progress-bar off -d "$peers" \
      "llama-cpp-python==$version" >/dev/null 2>"$peers/pip.log" ||
      fail "pip download llama-cpp-python==$version failed (see $peers/pip.log)"
  fi
  actual=$(sha256sum "$tarball" | cut -d' ' -f1)
  [[ $actual == "$sdist_sha256" ]] || fail "$tarball: sha256 $actual, expected $sdist_sha256"
  tar -C "$peers" -xzf "$tarball" || fail "cannot unpack $tarball"
fi
build_peer() {
  local name=$1; shift
  local dir=$peers/llama.cpp-$name
  if [[ ! -x $dir/bin/llama-batched-bench || ! -x $dir/bin/llama-bench ]]; then
    echo "llama-cpp-compare: building llama.cpp ($name) in $dir" >&2
    cmake -S "$src/vendor/llama.cpp" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DGGML_OPENMP=ON \
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "$@" \
      >"$dir.configure.log" 2>&1 || fail "configure of llama.cpp ($name) failed (see $dir.configure.log)"
    cmake --build "$dir" -j "$(nproc)" --target llama-bench llama-batched-bench \
      >"$dir.build.log" 2>&1 || fail "build of llama.cpp ($name) failed (see $dir.build.log)"
  fi
}
build_peer native -DGGML_NATIVE=ON
build_peer avx2 -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_BMI2=ON -DGGML_AVX512=OFF

# Our ISA levels: the host's best and every FMA level below it.
levels=()
for isa in avx512 avx2; do
  VTOKEN_CPU_ISA=$isa "$bench" --benchmark_filter=NONE >/dev/null 2>&1 && levels+=("$isa")
done
[[ ${#levels[@]} -ge 1 ]] || fail "this CPU has neither AVX2 nor AVX-512: nothing to compare"
peer_of() { [[ $1 == avx512 ]] && echo native || echo avx2; }

if [[ $vt_tiny == 1 ]]; then
  tiny=$peers/vt-tiny-f32.gguf
  "$dump" --from-dir "$repo/models/vt-tiny" "$tiny" || fail "cannot write $tiny"
  for ((r = 1; r <= rounds; r++)); do
    for isa in "${levels[@]}"; do
      echo "llama-cpp-compare: vt-tiny round $r/$rounds: ours, $isa" >&2
      VTOKEN_CPU_ISA=$isa taskset -c "0-$((threads - 1))" "$bench" \
        --benchmark_filter=BM_LlamaCppShapes --benchmark_min_time=0.5 --benchmark_format=json \
        >"$out/tiny-ours-$isa-$r.json" 2>"$out/tiny-ours-$isa-$r.err" ||
        fail "torch_model_bench failed (see $out/tiny-ours-$isa-$r.err)"
      peer=$peers/llama.cpp-$(peer_of "$isa")/bin
      echo "llama-cpp-compare: vt-tiny round $r/$rounds: llama.cpp, $(peer_of "$isa")" >&2
      "$peer/llama-bench" -m "$tiny" -p 512 -n 128 -t "$threads" -r 1 -o json \
        >"$out/tiny-peer-$isa-$r-pp.json" 2>"$out/tiny-peer-$isa-$r-pp.err" ||
        fail "llama-bench failed (see $out/tiny-peer-$isa-$r-pp.err)"
      "$peer/llama-batched-bench" -m "$tiny" -c 32768 -b 2048 -ub 512 -npp 512 -ntg 128 \
        -npl 1,8,32 -t "$threads" --output-format jsonl \
        >"$out/tiny-peer-$isa-$r-tg.jsonl" 2>"$out/tiny-peer-$isa-$r-tg.err" ||
        fail "llama-batched-bench failed (see $out/tiny-peer-$isa-$r-tg.err)"
    done
  done
  python3 - "$out" "$rounds" "${levels[@]}" <<'EOF' | tee "$out/summary-vt-tiny.md"
import json, statistics, sys
out, rounds, levels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"vt-tiny, tokens/s, medians of {rounds} rounds. Ours: BM_LlamaCppShapes, fp32 weights and "
      "KV; llama.cpp: the F32 GGUF, its default f16 KV cache.\n")
print("| ISA | case | llama.cpp | ours | ratio |")
print("|---|---|---:|---:|---:|")
for isa in levels:
    o, p = {}, {}
    for r in range(1, rounds + 1):
        for b in json.load(open(f"{out}/tiny-ours-{isa}-{r}.json"))["benchmarks"]:
            if b.get("run_type") == "aggregate" or "tok_s" not in b:
                continue
            parts = dict(x.split(":") for x in b["name"].split("/")[1:3])
            batch, prompt = int(parts["batch"]), int(parts["prompt"])
            key = ("prefill 512" if prompt == 0 else "decode batch 1, empty cache" if prompt < 0
                   else f"decode batch {batch}, context {prompt}")
            o.setdefault(key, []).append(b["tok_s"])
        for b in json.load(open(f"{out}/tiny-peer-{isa}-{r}-pp.json")):
            key = "prefill 512" if int(b["n_gen"]) == 0 else "decode batch 1, empty cache"
            p.setdefault(key, []).append(b["avg_ts"])
        for line in open(f"{out}/tiny-peer-{isa}-{r}-tg.jsonl"):
            if line.strip().startswith("{") and "speed_tg" in line:
                b = json.loads(line)
                p.setdefault(f"decode batch {b['pl']}, context {b['pp']}", []).append(b["speed_tg"])
    for key in o:
        if key in p:
            mo, mp = statistics.median(o[key]), statistics.median(p[key])
            print(f"| {isa} | {key} | {mp:,.0f} | {mo:,.0f} | **{mo / mp:.2f}x** |")
EOF
  exit 0
fi

# 2. The F32 model, and the BF16 one (the same weights rounded to bf16).
model=$peers/smollm2-135m-f32.gguf
if [[ ! -f $model || $model -ot $model_q ]]; then
  "$dump" --f32 "$model_q" "$model" || fail "cannot write $model"
fi
model_bf16=$peers/smollm2-135m-bf16.gguf
if [[ ! -f $model_bf16 || $model_bf16 -ot $model_q ]]; then
  "$dump" --bf16 "$model_q" "$model_bf16" || fail "cannot write $model_bf16"
fi

# 3. The rounds.
for ((r = 1; r <= rounds; r++)); do
  for isa in "${levels[@]}"; do
    echo "llama-cpp-compare: round $r/$rounds: ours, $isa" >&2
    VTOKEN_CPU_ISA=$isa taskset -c "0-$((threads - 1))" "$bench" --benchmark_filter=BM_SmolLm2Shapes \
      --benchmark_min_time=0.5 --benchmark_format=json >"$out/ours-$isa-$r.json" 2>"$out/ours-$isa-$r.err" ||
      fail "torch_model_bench failed (see $out/ours-$isa-$r.err)"
    peer=$peers/llama.cpp-$(peer_of "$isa")/bin
    echo "llama-cpp-compare: round $r/$rounds: llama.cpp, $(peer_of "$isa")" >&2
    "$peer/llama-bench" -m "$model" -p 512,2048 -n 0 -t "$threads" -r 1 -o json \
      >"$out/peer-$isa-$r-pp.json" 2>"$out/peer-$isa-$r-pp.err" ||
      fail "llama-bench failed (see $out/peer-$isa-$r-pp.err)"
    "$peer/llama-batched-bench" -m "$model" -c 67000 -b 2048 -ub 512 -npp 512,2048 -ntg 16 \
      -npl 1,8,32 -t "$threads" --output-format jsonl \
      >"$out/peer-$isa-$r-tg.jsonl" 2>"$out/peer-$isa-$r-tg.err" ||
      fail "llama-batched-bench failed (see $out/peer-$isa-$r-tg.err)"
    "$peer/llama-batched-bench" -m "$model_q" -c 5000 -b 2048 -ub 512 -npp 512 -ntg 16 \
      -npl 1,8 -t "$threads" --output-format jsonl \
      >"$out/peer-$isa-$r-q.jsonl" 2>"$out/peer-$isa-$r-q.err" ||
      fail "llama-batched-bench on $model_q failed (see $out/peer-$isa-$r-q.err)"
    "$peer/llama-bench" -m "$model_bf16" -p 512,2048 -n 0 -t "$threads" -r 1 -o json \
      >"$out/peer-$isa-$r-bf16-pp.json" 2>"$out/peer-$isa-$r-bf16-pp.err" ||
      fail "llama-bench on $model_bf16 failed (see $out/peer-$isa-$r-bf16-pp.err)"
    "$peer/llama-batched-bench" -m "$model_bf16" -c 67000 -b 2048 -ub 512 -npp 512,2048 -ntg 16 \
      -npl 1,8,32 -t "$threads" --output-format jsonl \
      >"$out/peer-$isa-$r-bf16.jsonl" 2>"$out/peer-$isa-$r-bf16.err" ||
      fail "llama-batched-bench on $model_bf16 failed (see $out/peer-$isa-$r-bf16.err)"
  done
done

# 4. The table.
python3 - "$out" "$rounds" "${levels[@]}" <<'EOF' | tee "$out/summary.md"
import json, statistics, sys, glob
out, rounds, levels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def ours(isa):
    rows = {}
    for r in range(1, rounds + 1):
        for b in json.load(open(f"{out}/ours-{isa}-{r}.json"))["benchmarks"]:
            if b.get("run_type") == "aggregate" or "tok_s" not in b:
                continue
            parts = dict(p.split(":") for p in b["name"].split("/")[1:5])
            key = (int(parts["batch"]), int(parts["context"]), int(parts["stored"]))
            rows.setdefault(key, {}).setdefault(int(parts["kv16"]), []).append(b["tok_s"])
    return rows
def peer(isa):
    rows = {}
    for r in range(1, rounds + 1):
        for name, stored in (("pp.json", 0), ("bf16-pp.json", 3)):
            for b in json.load(open(f"{out}/peer-{isa}-{r}-{name}")):
                rows.setdefault((0, int(b["n_prompt"]), stored), []).append(b["avg_ts"])
        # llama.cpp on the Q4_1 file faces both of our stored forms (stored 1 and 2); on the BF16
        # file, our bf16 weights (stored 3).
        for name, stored in (("tg.jsonl", (0,)), ("q.jsonl", (1, 2)), ("bf16.jsonl", (3,))):
            for line in open(f"{out}/peer-{isa}-{r}-{name}"):
                line = line.strip()
                if not line.startswith("{"):
                    continue
                b = json.loads(line)
                if "speed_tg" in b:
                    for s in stored:
                        rows.setdefault((int(b["pl"]), int(b["pp"]), s), []).append(b["speed_tg"])
                        # Its prompt processing of one sequence on the Q4_1 file: the prefill
                        # row of our stored forms (stored = 1 prefills on fp32 weights).
                        if s in (1, 2) and int(b["pl"]) == 1:
                            rows.setdefault((0, int(b["pp"]), s), []).append(b["speed_pp"])
    return rows
print(f"Tokens/s, medians of {rounds} rounds; batch 0 = prefill of `context` tokens, else decode "
      "of `batch` sequences at that context (16 steps). Weights: fp32 (llama.cpp: the F32 GGUF) "
      "or Q4_1 as stored (ours: model.weights = as_stored, or as_stored_q8 with 8-bit activations "
      "as llama.cpp computes; llama.cpp: the Q4_1 file) or bf16 (ours: model.weights = bfloat16; "
      "llama.cpp: the BF16 GGUF of the same rounded weights). KV cache: "
      "llama.cpp's f16 (its default); ours in fp32 and in fp16 (model.kv_dtype = float16).\n")
print("| ISA | weights | case | llama.cpp | ours, fp32 KV | ratio | ours, fp16 KV | ratio |")
print("|---|---|---|---:|---:|---:|---:|---:|")
for isa in levels:
    o, p = ours(isa), peer(isa)
    for key in sorted(o, key=lambda k: (k[2], k[0] > 0, k[1], k[0])):
        if key not in p:
            continue
        mp = statistics.median(p[key])
        case = f"prefill {key[1]}" if key[0] == 0 else f"decode batch {key[0]}, context {key[1]}"
        weights = ("fp32", "Q4_1 as stored", "Q4_1 as stored, q8", "bf16")[key[2]]
        cells = ""
        for kv16 in (0, 1):
            if kv16 in o[key]:
                mo = statistics.median(o[key][kv16])
                cells += f" {mo:,.0f} | **{mo / mp:.2f}x** |"
            else:
                cells += " - | - |"
        print(f"| {isa} | {weights} | {case} | {mp:,.0f} |{cells}")
EOF

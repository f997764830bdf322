#!/usr/bin/env python3
"""Checks the torch-free GGUF reader and dequantization against gguf-py, an independent reader.

For every tensor of each file, gguf-py (gguf.GGUFReader + gguf.quants.dequantize) and our
tests/model/tools/gguf_dequant_dump each dequantize it; the script prints, per ggml type, the
tensors and elements compared, the largest absolute difference, how many elements differ in their
float32 bits and how many are NaN on one side only. It also compares our ggml type table with
gguf.GGML_QUANT_SIZES and, with --synthetic, QuantizeRow's bytes with gguf.quants.quantize.
Exits 1 when a difference exceeds --tolerance (default 0: bit for bit), a NaN or a name, type or
size disagrees.

  scripts/check-gguf-dequant.py --model FILE [--model FILE ...]
  scripts/check-gguf-dequant.py --synthetic DIR     small files of every supported type, written
                                                    by gguf-py into DIR, then checked
  scripts/check-gguf-dequant.py --write-seeds DIR   the GGUF fuzz target's seed corpus
                                                    (tests/fuzz/corpus_gguf)
Build the dump tool first: cmake --build BUILD --target gguf_dequant_dump (--dump PATH, else the
first of build/h-gguf, build/release, build/asan that has it).
"""
import argparse
import importlib.metadata
import os
import subprocess
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUPPORTED = [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]
QUANTIZABLE = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1]  # QuantizeRow's types
# Byte offsets of the f16 scales in each block: random bytes there could be NaN or infinite.
HALF_FIELDS = {Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}


def find_dump(path):
    if path:
        return path
    for build in ("build/h-gguf", "build/release", "build/asan"):
        candidate = os.path.join(ROOT, build, "tests", "gguf_dequant_dump")
        if os.path.exists(candidate):
            return candidate
    sys.exit("check-gguf-dequant: no gguf_dequant_dump; build it or pass --dump")


def read_dump(dump, path):
    """Yields (name, type name, float32 array or None) per tensor, from the dump tool's stdout."""
    proc = subprocess.Popen([dump, path], stdout=subprocess.PIPE)
    try:
        while True:
            line = proc.stdout.readline()
            if not line:
                break
            name, type_name, count = line.decode().rstrip("\n").split("\t")
            if count == "unsupported":
                yield name, type_name, None
                continue
            n = int(count)
            data = proc.stdout.read(4 * n)
            if len(data) != 4 * n:
                raise RuntimeError(f"{path}: dump of {name} ends early")
            yield name, type_name, np.frombuffer(data, dtype="<f4")
    finally:
        proc.stdout.close()
        if proc.wait() != 0:
            raise RuntimeError(f"{dump} {path} exited {proc.returncode}")


class Tally:
    """Per-type comparison figures."""

    def __init__(self):
        self.rows = {}

    def add(self, type_name, ours, theirs):
        row = self.rows.setdefault(type_name, {"tensors": 0, "elements": 0, "max_abs": 0.0,
                                               "bits_differ": 0, "nan_only_one": 0})
        row["tensors"] += 1
        row["elements"] += ours.size
        nan_ours, nan_theirs = np.isnan(ours), np.isnan(theirs)
        row["nan_only_one"] += int(np.count_nonzero(nan_ours != nan_theirs))
        both = ~(nan_ours | nan_theirs)
        a, b = ours[both], theirs[both]
        row["bits_differ"] += int(np.count_nonzero(a.view(np.uint32) != b.view(np.uint32)))
        with np.errstate(invalid="ignore"):
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        inf_mismatch = np.isinf(a) | np.isinf(b)
        diff[inf_mismatch & (a != b)] = np.inf
        diff[inf_mismatch & (a == b)] = 0.0
        if diff.size:
            row["max_abs"] = max(row["max_abs"], float(diff.max()))

    def print(self, title):
        print(title)
        print(f"  {'type':6} {'tensors':>7} {'elements':>11} {'max_abs_diff':>13} "
              f"{'bits_differ':>11} {'nan_one_side':>12}")
        for type_name, r in sorted(self.rows.items()):
            print(f"  {type_name:6} {r['tensors']:7d} {r['elements']:11d} {r['max_abs']:13.6g} "
                  f"{r['bits_differ']:11d} {r['nan_only_one']:12d}")

    def failed(self, tolerance):
        return any(r["max_abs"] > tolerance or r["nan_only_one"] for r in self.rows.values())


def check_file(dump, path, tolerance):
    reader = gguf.GGUFReader(path)
    tally = Tally()
    problems = []
    ours = list(read_dump(dump, path))
    if len(ours) != len(reader.tensors):
        problems.append(f"{len(ours)} tensors dumped, gguf-py reads {len(reader.tensors)}")
    for (name, type_name, values), t in zip(ours, reader.tensors):
        if name != t.name or type_name != t.tensor_type.name:
            problems.append(f"tensor {name} {type_name} vs gguf-py's {t.name} {t.tensor_type.name}")
            continue
        if values is None:
            if t.tensor_type in SUPPORTED:
                problems.append(f"{name}: {type_name} reported unsupported")
            continue
        theirs = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        if theirs.size != values.size:
            problems.append(f"{name}: {values.size} elements vs gguf-py's {theirs.size}")
            continue
        tally.add(type_name, values, theirs)
    tally.print(f"{path}: ours vs gguf-py")
    for p in problems:
        print(f"  PROBLEM: {p}")
    return not problems and not tally.failed(tolerance)


def check_type_table(dump):
    out = subprocess.run([dump, "--types"], check=True, capture_output=True, text=True).stdout
    ours = {}
    for line in out.splitlines():
        i, name, block, size = line.split("\t")
        ours[int(i)] = (name, int(block), int(size))
    theirs = {int(t): (t.name, b, s) for t, (b, s) in gguf.GGML_QUANT_SIZES.items()}
    ok = ours == theirs
    print(f"type table: {len(ours)} types, {'equal to' if ok else 'DIFFERS from'} "
          f"gguf.GGML_QUANT_SIZES (gguf {importlib.metadata.version('gguf')})")
    if not ok:
        for i in sorted(set(ours) | set(theirs)):
            if ours.get(i) != theirs.get(i):
                print(f"  {i}: ours {ours.get(i)} gguf-py {theirs.get(i)}")
    return ok


def random_tensor(qtype, rows, cols, rng, special=False):
    """(numpy array to write, raw_dtype or None) for a tensor of `qtype`, shape (rows, cols)."""
    x = rng.normal(0.0, 1.5, size=(rows, cols)).astype(np.float32)
    x[0, :4] = [0.0, -0.0, 3.0e-5, -65000.0]
    if special and qtype in (Q.F16, Q.BF16, Q.F32):
        x[-1, :5] = [np.inf, -np.inf, np.nan, 6.0e-8, -1.0e-40]
    if qtype == Q.F32:
        return x, None
    if qtype == Q.F16:
        return x.astype(np.float16), None
    if qtype in HALF_FIELDS:  # gguf-py cannot quantize K-quants: random blocks, finite scales
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
        for at in HALF_FIELDS[qtype]:
            scales = rng.uniform(-2.0, 2.0, size=raw.shape[0]).astype(np.float16)
            raw[:, at:at + 2] = scales.view(np.uint8).reshape(-1, 2)
        return raw.reshape(rows, cols // block * size), qtype
    return gguf.quants.quantize(x, qtype), qtype


def write_file(path, tensors, alignment=None, metadata=True):
    writer = gguf.GGUFWriter(path, "llama")
    if alignment:
        writer.add_custom_alignment(alignment)
    if metadata:
        writer.add_name("synthetic")
        writer.add_uint64("test.u64", 2**63 + 5)
        writer.add_int8("test.i8", -7)
        writer.add_float64("test.f64", 0.1)
        writer.add_bool("test.bool", True)
        writer.add_array("test.nested", [[1, 2], [3], [-4, 5, 6]])
        writer.add_array("test.strings", ["a", "", "\u00e9\u4e2d"])
    for name, array, raw_dtype in tensors:
        writer.add_tensor(name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_synthetic(directory, rng):
    os.makedirs(directory, exist_ok=True)
    paths = []
    for qtype in SUPPORTED:
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        cols = 2 * block if block > 1 else 67
        tensors = []
        for i, rows in enumerate((1, 3, 64)):
            array, raw = random_tensor(qtype, rows, cols * (1 + i % 2), rng, special=i == 1)
            tensors.append((f"t{i}.{qtype.name.lower()}", array, raw))
        path = os.path.join(directory, f"synthetic-{qtype.name}.gguf")
        write_file(path, tensors, alignment=64 if qtype == Q.Q5_0 else None)
        paths.append(path)
    return paths


def check_quantize(dump, rng):
    """QuantizeRow's bytes against gguf.quants.quantize (bit for bit) per QuantizeRow type."""
    ok = True
    print("quantize: ours vs gguf.quants.quantize")
    for qtype in QUANTIZABLE:
        x = rng.normal(0.0, 2.0, size=(64, 256)).astype(np.float32)
        x[0] = 0.0
        x[1, :32] = np.linspace(-8, 8, 32, dtype=np.float32)
        theirs = np.ascontiguousarray(gguf.quants.quantize(x, qtype)).view(np.uint8).reshape(-1)
        ours = subprocess.run([dump, "--quantize", qtype.name], input=x.tobytes(), check=True,
                              capture_output=True).stdout
        ours = np.frombuffer(ours, dtype=np.uint8)
        differ = int(np.count_nonzero(ours != theirs)) if ours.size == theirs.size else -1
        print(f"  {qtype.name:6} {x.size} elements, {ours.size} bytes, {differ} bytes differ")
        ok = ok and differ == 0
    return ok


def write_seeds(directory, rng):
    """Small seed files for tests/fuzz/gguf_fuzz.cc (each under 2 KB)."""
    os.makedirs(directory, exist_ok=True)
    small = [
        ("f32-q8_0", [Q.F32, Q.Q8_0], None, True),
        ("q4_k-align64", [Q.Q4_K], 64, False),
        ("q4_0-q5_1-f16", [Q.Q4_0, Q.Q5_1, Q.F16], None, False),
        ("q6_k-bf16", [Q.Q6_K, Q.BF16], 8, False),
        ("metadata-only", [], None, True),
    ]
    for name, types, alignment, metadata in small:
        tensors = []
        for i, qtype in enumerate(types):
            block = gguf.GGML_QUANT_SIZES[qtype][0]
            array, raw = random_tensor(qtype, 1 + i % 2, max(block, 8), rng)
            tensors.append((f"blk.{i}.w", array, raw))
        write_file(os.path.join(directory, name), tensors, alignment=alignment, metadata=metadata)
    for name in sorted(os.listdir(directory)):
        print(f"  {name}: {os.path.getsize(os.path.join(directory, name))} bytes")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", default=[], help="a GGUF file to check")
    parser.add_argument("--synthetic", metavar="DIR", help="write and check files of every type")
    parser.add_argument("--write-seeds", metavar="DIR", help="write the fuzz seed corpus")
    parser.add_argument("--dump", help="path of gguf_dequant_dump")
    parser.add_argument("--tolerance", type=float, default=0.0,
                        help="largest absolute difference allowed (default 0)")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    if args.write_seeds:
        write_seeds(args.write_seeds, rng)
        return 0
    if not args.model and not args.synthetic:
        parser.error("give --model FILE, --synthetic DIR or --write-seeds DIR")
    dump = find_dump(args.dump)
    ok = check_type_table(dump)
    files = list(args.model)
    if args.synthetic:
        files += write_synthetic(args.synthetic, rng)
        ok = check_quantize(dump, rng) and ok
    for path in files:
        ok = check_file(dump, path, args.tolerance) and ok
    print("OK: bit for bit" if ok and args.tolerance == 0 else "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

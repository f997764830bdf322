#!/usr/bin/env python3
"""Record llama.cpp's greedy outputs and tokenizations for a GGUF model as a test fixture.

llama.cpp is used here as a *peer tool* (through the installed `llama_cpp` Python package,
i.e. llama-cpp-python); nothing of it is part of this repository. The fixture it writes lets
our own GGUF loader be checked against an independent implementation:

  DIR/greedy.json    for 8 prompts x 2 formats ("raw", "chatml"): the prompt token ids and
                     exactly N greedy (argmax) continuation tokens, each with its margin
                     (top-1 logit minus top-2 logit) so near-ties can be told apart from
                     real disagreements;
  DIR/tokenize.json  ~40 strings chosen to exercise the byte-level BPE pre-tokenizer, each
                     tokenized with and without special-token parsing.

With --f32 the script instead measures llama.cpp on the *same float weights* a float
implementation uses: it writes a temporary GGUF copy of the model with every tensor
dequantized to F32 by gguf-py (gguf.quants.dequantize; same metadata, same tensor names and
shapes, general.file_type = ALL_F32), runs it with an F32 KV cache and flash attention off,
and writes

  DIR/greedy_f32.json  the same cases in the same format as greedy.json.

tokenize.json is not written in that mode (the tokenizer metadata is copied unchanged, so it
would be the same file); greedy.json and tokenize.json are left as they are.

Decoding never stops at EOS / end-of-turn: if the argmax is <|im_end|> it is fed back like
any other token, so every case has the same fixed length. Ties in the argmax go to the lowest
token id (numpy.argmax). Each case runs in a fresh llama.cpp context, so cases do not depend
on each other or on their order.

Usage:
  python3 scripts/make-llamacpp-fixture.py \
      --model /path/to/SmolLM2-135M-Instruct.Q4_1.gguf --out tests/fixtures/smollm2_llamacpp
  python3 scripts/make-llamacpp-fixture.py --f32 \
      --model /path/to/SmolLM2-135M-Instruct.Q4_1.gguf --out tests/fixtures/smollm2_llamacpp
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile

import numpy as np

try:
    import llama_cpp
except ImportError:  # the tool is not part of the project's setup; say how to get it
    sys.exit("make-llamacpp-fixture: needs the llama_cpp package "
             "(python3 -m pip install llama-cpp-python)")

# The system prompt SmolLM2-Instruct's chat template inserts when the conversation has none.
SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# One user turn rendered as the GGUF's tokenizer.chat_template does with
# add_generation_prompt=True (checked against the template itself in check_chat_template).
CHATML = ("<|im_start|>system\n" + SYSTEM_PROMPT + "<|im_end|>\n"
          "<|im_start|>user\n{prompt}<|im_end|>\n"
          "<|im_start|>assistant\n")

# Eight varied English prompts: (case name, prompt text).
PROMPTS = [
    ("factual", "What is the capital of France?"),
    ("story", "Once upon a time, in a small village at the edge of a dark forest, there lived"),
    ("code", "Write a Python function that returns the n-th Fibonacci number."),
    ("list", "List five fruits that are rich in vitamin C."),
    ("arithmetic", "Tom has 12 apples. He gives 5 to his sister and buys 3 more. "
                   "How many apples does Tom have now?"),
    ("definition", "Define the word \"photosynthesis\"."),
    ("translation", "Translate the following sentence into French: \"The weather is nice today.\""),
    ("paragraph", "The history of the bicycle spans more than two centuries. Early designs had no "
                  "pedals, and riders pushed themselves along with their feet. Later inventors "
                  "added cranks, chains and pneumatic tires, which"),
]

# Strings that exercise a byte-level BPE pre-tokenizer. SmolLM2's tokenizer.ggml.pre is
# "smollm": digits are split one by one, then GPT-2's regex splits contractions, letter runs,
# number runs, punctuation runs and whitespace (a run of spaces keeps its last space for the
# following word).
TOKENIZE_STRINGS = [
    "",
    "Hello world",
    " Hello world",
    "hello",
    " hello",
    "12345",
    " 3.14",
    "1,000,000 and 2026-12-03",
    "x=42; y = -7.5e-3",
    "don't",
    "I'LL be there, we've won, they'd gone, it's",
    "She said 'hello' and left",
    "a  b   c    d",
    "   leading spaces",
    "trailing spaces   ",
    "a\n\n b",
    "  \t x",
    "line one\nline two\r\nline three",
    "\n\n\n",
    "tab\tseparated\tvalues",
    "Hello!!! What?!? ... ---- ***",
    "(a+b)*[c/d]{e}",
    "email@example.com https://huggingface.co/HuggingFaceTB",
    "#include <stdio.h>\nint main() { return 0; }",
    "def f(x):\n    return x ** 2\n",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9",
    "\u00fcber M\u00fcnchen Stra\u00dfe",
    "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
    "\u4f60\u597d\uff0c\u4e16\u754c",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "emoji \U0001F600\U0001F680 and \u2764\ufe0f",
    "\U0001F468\u200d\U0001F469\u200d\U0001F467",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more",
    "<|endoftext|>",
    "<|im_start|",
    "CamelCaseIdentifier snake_case_name SCREAMING_CASE",
    "The year 1999 had 365 days.",
    "$100.00 (50% off!)",
]


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# llama-cpp-python does not report which llama.cpp commit it bundles at run time (its
# build info says "unknown" when built from the sdist); its CHANGELOG names the commit.
LLAMA_CPP_COMMITS = {"0.3.36": "ggml-org/llama.cpp@0c1e57098"}


def llama_cpp_version(commit=None):
    """'llama-cpp-python X (llama.cpp commit)' for the installed package."""
    version = llama_cpp.__version__
    commit = commit or LLAMA_CPP_COMMITS.get(version, "llama.cpp commit unknown")
    return "llama-cpp-python %s (%s)" % (version, commit)


# llama-cpp-python's Llama(...) settings for --f32: K and V cache in F32 (ggml_type
# GGML_TYPE_F32 = 0; the default is F16) and flash attention off (the default in
# llama-cpp-python, spelled out here because it decides how attention is computed).
GGML_TYPE_F32 = 0
F32_CONTEXT = {"type_k": GGML_TYPE_F32, "type_v": GGML_TYPE_F32, "flash_attn": False}


def open_model(path, **extra):
    """A fresh llama.cpp context: CPU, 2 threads, logits for every evaluated position."""
    return llama_cpp.Llama(model_path=path, n_ctx=2048, n_threads=2, n_threads_batch=2,
                           logits_all=True, seed=0, verbose=False, **extra)


def write_f32_gguf(src, dst):
    """Writes dst: src with every tensor dequantized to F32 by gguf-py.

    Every metadata key/value is copied with its type (general.architecture is written by
    GGUFWriter itself), except general.file_type, which becomes ALL_F32 (0). Tensors keep
    their names, order and shapes. The written file is read back and checked. Returns a
    short description of the conversion for the fixture's header.
    """
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(dst, arch)
    file_type_seen = False
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue                                   # written by GGUFWriter / virtual
        if field.name == gguf.Keys.General.ALIGNMENT:
            writer.data_alignment = field.contents()   # GGUFWriter writes it from this
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            value, file_type_seen = int(gguf.LlamaFileType.ALL_F32), True
        writer.add_key_value(field.name, value, val_type, sub_type=sub_type)
    if not file_type_seen:
        writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))

    source_types = {}
    for t in reader.tensors:
        source_types[t.tensor_type.name] = source_types.get(t.tensor_type.name, 0) + 1
        data = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))   # numpy order
        writer.add_tensor(t.name, data.reshape(shape), raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    # Read back: same keys and values (but file_type), same tensors, all F32, same numbers.
    check = gguf.GGUFReader(dst)
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    if [k for k in check.fields if not k.startswith("GGUF.")] != keys + (
            [] if file_type_seen else [gguf.Keys.General.FILE_TYPE]):
        sys.exit("make-llamacpp-fixture: the F32 copy's metadata keys differ")
    for k in keys:
        a, b = reader.fields[k], check.fields[k]
        want = (int(gguf.LlamaFileType.ALL_F32) if k == gguf.Keys.General.FILE_TYPE
                else a.contents())
        if a.types != b.types or b.contents() != want:
            sys.exit("make-llamacpp-fixture: the F32 copy's %s differs" % k)
    if len(check.tensors) != len(reader.tensors):
        sys.exit("make-llamacpp-fixture: the F32 copy has %d tensors, not %d"
                 % (len(check.tensors), len(reader.tensors)))
    for a, b in zip(reader.tensors, check.tensors):
        if (a.name != b.name or a.shape.tolist() != b.shape.tolist()
                or b.tensor_type != gguf.GGMLQuantizationType.F32
                or not np.array_equal(dequantize(a.data, a.tensor_type).reshape(-1),
                                      np.asarray(b.data).reshape(-1))):
            sys.exit("make-llamacpp-fixture: the F32 copy's tensor %s differs" % a.name)
    return ("%s dequantized to F32 by gguf-py %s (gguf.quants.dequantize), all %d tensors "
            "(source: %s), metadata copied, general.file_type = 0 (ALL_F32)"
            % (os.path.basename(src), gguf_version(), len(reader.tensors),
               ", ".join("%d %s" % (n, name) for name, n in sorted(source_types.items()))))


def gguf_version():
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:  # noqa: BLE001 - only for the record
        return "(version unknown)"


def check_f32_model(llm):
    """llama.cpp loaded the F32 copy as an all-F32 model."""
    file_type = llm.metadata.get("general.file_type")
    desc = model_desc(llm)
    if file_type != "0" or "all F32" not in desc:
        sys.exit("make-llamacpp-fixture: llama.cpp does not see an all-F32 model "
                 "(general.file_type %r, model desc %r)" % (file_type, desc))
    print("llama.cpp loaded the F32 copy: %s" % desc, file=sys.stderr)


def model_desc(llm):
    """llama.cpp's one-line description of the loaded model (type, size, file type)."""
    buf = (llama_cpp.ctypes.c_char * 256)()
    llama_cpp.llama_model_desc(llm.model, buf, 256)
    return buf.value.decode("utf-8", "replace")


def check_chat_template(llm):
    """Renders the GGUF's own chat template with jinja2 and compares it with CHATML."""
    template = llm.metadata.get("tokenizer.chat_template")
    if template is None:
        sys.exit("make-llamacpp-fixture: the model has no tokenizer.chat_template")
    try:
        import jinja2
    except ImportError:
        print("make-llamacpp-fixture: jinja2 missing, chat template not verified", file=sys.stderr)
        return
    probe = "PROMPT"
    rendered = jinja2.Template(template).render(
        messages=[{"role": "user", "content": probe}], add_generation_prompt=True)
    if rendered != CHATML.format(prompt=probe):
        sys.exit("make-llamacpp-fixture: the model's chat template renders\n%r\nnot\n%r"
                 % (rendered, CHATML.format(prompt=probe)))


def greedy(llm, prompt_ids, n_predict):
    """Argmax decoding of exactly n_predict tokens; returns (ids, margins)."""
    llm.reset()
    llm.eval(prompt_ids)
    ids, margins = [], []
    for step in range(n_predict):
        logits = llm.scores[llm.n_tokens - 1]            # float32 row for the last position
        top = int(np.argmax(logits))                      # lowest id on an exact tie
        second = float(np.partition(logits, -2)[-2])      # second-largest value (may equal top)
        ids.append(top)
        margins.append(round(float(logits[top]) - second, 4))
        if step + 1 < n_predict:                          # EOS / <|im_end|> is fed back too
            llm.eval([top])
    return ids, margins


def dump_cases(path, header, key, cases):
    """JSON with the header fields first and one list element per line (readable diffs)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n")
        for name, value in header.items():
            f.write("  %s: %s,\n" % (json.dumps(name), json.dumps(value)))
        f.write("  %s: [\n" % json.dumps(key))
        f.write(",\n".join("    " + json.dumps(c, ensure_ascii=True) for c in cases))
        f.write("\n  ]\n}\n")
    with open(path, encoding="utf-8") as f:                # the file must parse back
        json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="GGUF model file")
    ap.add_argument("--out", required=True, help="output directory for the fixture")
    ap.add_argument("--n-predict", type=int, default=128, help="greedy tokens per case")
    ap.add_argument("--f32", action="store_true", help="run llama.cpp on a temporary copy of "
                    "the model dequantized to F32, with an F32 KV cache; writes greedy_f32.json "
                    "only")
    ap.add_argument("--llama-cpp-commit", help="llama.cpp commit to record, when the installed "
                    "llama-cpp-python version is not in LLAMA_CPP_COMMITS")
    args = ap.parse_args()

    os.makedirs(args.out, exist_ok=True)
    header = {
        "model_file": os.path.basename(args.model),
        "model_sha256": sha256_of(args.model),
        "llama_cpp": llama_cpp_version(args.llama_cpp_commit),
    }
    if not args.f32:
        print("llama.cpp system info: " + llama_cpp.llama_print_system_info().decode(),
              file=sys.stderr)
        write_tokenize(args.model, args.out, header)
        write_greedy(args.model, {}, os.path.join(args.out, "greedy.json"),
                     dict(header, n_predict=args.n_predict), args.n_predict)
        return

    # --f32: the F32 copy lives in a temporary directory outside the repository.
    tmp = tempfile.mkdtemp(prefix="llamacpp-f32-")
    try:
        f32_path = os.path.join(tmp, os.path.splitext(os.path.basename(args.model))[0]
                                + ".dequant-F32.gguf")
        weights = write_f32_gguf(args.model, f32_path)
        print("llama.cpp system info: " + llama_cpp.llama_print_system_info().decode(),
              file=sys.stderr)
        header.update({
            "weights": weights,
            "f32_gguf_sha256": sha256_of(f32_path),
            "kv_cache": "F32 (type_k = type_v = GGML_TYPE_F32)",
            "flash_attn": "off",
            "n_predict": args.n_predict,
        })
        llm = open_model(f32_path, **F32_CONTEXT)
        check_f32_model(llm)
        check_chat_template(llm)
        llm.close()
        write_greedy(f32_path, F32_CONTEXT, os.path.join(args.out, "greedy_f32.json"), header,
                     args.n_predict)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_tokenize(model, out, header):
    """tokenize.json, plus the chat template check, on one context."""
    llm = open_model(model)
    check_chat_template(llm)
    tok_cases = []
    for text in TOKENIZE_STRINGS:
        raw = text.encode("utf-8")
        tok_cases.append({
            "text": text,
            "ids": llm.tokenize(raw, add_bos=False, special=True),
            "ids_no_special": llm.tokenize(raw, add_bos=False, special=False),
        })
    llm.close()
    dump_cases(os.path.join(out, "tokenize.json"), header, "cases", tok_cases)


def write_greedy(model, context, path, header, n_predict):
    """The greedy fixture: every case on a fresh context (Llama(...) extras in context)."""
    cases = []
    for name, prompt in PROMPTS:
        for fmt in ("raw", "chatml"):
            text = prompt if fmt == "raw" else CHATML.format(prompt=prompt)
            llm = open_model(model, **context)
            # add_bos=False: the file says add_bos_token=false anyway; special tokens are
            # parsed only for the chat format (the raw prompts contain none).
            prompt_ids = llm.tokenize(text.encode("utf-8"), add_bos=False,
                                      special=(fmt == "chatml"))
            output_ids, margins = greedy(llm, prompt_ids, n_predict)
            output_text = llm.detokenize(output_ids, special=True).decode("utf-8", "replace")
            llm.close()
            cases.append({"name": name, "format": fmt, "text": text, "prompt_ids": prompt_ids,
                          "output_ids": output_ids, "margins": margins,
                          "output_text": output_text})
            print("%-12s %-6s min margin %.4f  %r" % (name, fmt, min(margins), output_text[:60]),
                  file=sys.stderr)
    dump_cases(path, header, "cases", cases)

    # Near-tie summary for the README.
    all_margins = np.array([m for c in cases for m in c["margins"]])
    print("steps %d, margin < 0.1: %d, < 0.5: %d, min %.4f"
          % (all_margins.size, (all_margins < 0.1).sum(), (all_margins < 0.5).sum(),
             all_margins.min()), file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Turns a CUDA source file into host C++ for the CPU emulator (tests/cuda_emu/cuda_emu.h).

Usage: emulate_cu.py INPUT.cu OUTPUT.cc

The output includes cuda_emu.h first (nvcc includes cuda_runtime.h implicitly), then the input
under a #line directive, so diagnostics name the original file and line. Three rewrites keep
every line where it was:
  kernel<<<grid, block[, smem[, stream]]>>>(args)
      -> ::vtoken_emu::Launch(::vtoken_emu::LaunchConfig(grid, block, ...), kernel, args)
  extern __shared__ T name[];
      -> T* const name = ::vtoken_emu::DynamicShared<T>();
  __shared__ T a[N], b[M];
      -> static T a[N], b[M]; [[maybe_unused]] static const ::vtoken_emu::SharedArrays
         vtoken_emu_shared_LINE(a, b);  (the registration poisons the arrays before every block)
Anything the emulator cannot run (inline PTX, a launch or __shared__ left over) fails the build
with the file and line, rather than compiling into something else.
"""

import re
import sys


def fail(path, text, offset, message):
    line = text.count("\n", 0, offset) + 1
    sys.exit(f"{path}:{line}: emulate_cu.py: {message}")


def matching(text, start, open_char, close_char):
    """Index just past the bracket that closes text[start] (an open_char)."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_char:
            depth += 1
        elif text[i] == close_char:
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def kernel_start(text, end):
    """Start of the kernel expression (name, optional template arguments) ending at `end`."""
    i = end
    while i > 0 and text[i - 1].isspace():
        i -= 1
    if i > 0 and text[i - 1] == ">":  # Template arguments: walk back to the matching '<'.
        depth = 0
        while i > 0:
            i -= 1
            if text[i] == ">":
                depth += 1
            elif text[i] == "<":
                depth -= 1
                if depth == 0:
                    break
    while i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_:"):
        i -= 1
    return i


def rewrite_launches(path, text):
    out = []
    pos = 0
    while True:
        open_at = text.find("<<<", pos)
        if open_at < 0:
            out.append(text[pos:])
            return "".join(out)
        close_at = text.find(">>>", open_at)
        if close_at < 0:
            fail(path, text, open_at, "'<<<' without '>>>'")
        start = kernel_start(text, open_at)
        kernel = text[start:open_at].strip()
        if not re.fullmatch(r"[A-Za-z_:][\w:]*(<.*>)?", kernel, re.S):
            fail(path, text, open_at, f"cannot parse the kernel of a launch: {kernel!r}")
        args_at = close_at + 3
        while text[args_at].isspace():
            args_at += 1
        if text[args_at] != "(":
            fail(path, text, args_at, "a launch's '>>>' is not followed by '('")
        args_end = matching(text, args_at, "(", ")")
        if args_end < 0:
            fail(path, text, args_at, "unbalanced parentheses in a launch")
        config = text[open_at + 3 : close_at]
        args = text[args_at + 1 : args_end - 1]
        out.append(text[pos:start])
        out.append(f"::vtoken_emu::Launch(::vtoken_emu::LaunchConfig({config}), {kernel}")
        out.append(f", {args})" if args.strip() else ")")
        pos = args_end


DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+([\w:<> ]+?)\s+(\w+)\s*\[\s*\]\s*;")
STATIC_SHARED = re.compile(r"__shared__\s+([\w:<>]+)\s+([^;]+);")


def rewrite_shared(path, text):
    def dynamic(m):
        return f"{m.group(1)}* const {m.group(2)} = ::vtoken_emu::DynamicShared<{m.group(1)}>();"

    text = DYNAMIC_SHARED.sub(dynamic, text)

    def static(m):
        declarators = m.group(2)
        if "\n" in declarators or "=" in declarators:
            fail(path, text, m.start(), "__shared__ declarations must fit one line, uninitialized")
        names = [re.match(r"\s*(\w+)", d).group(1) for d in split_top_level(declarators)]
        line = text.count("\n", 0, m.start()) + 1
        return (f"static {m.group(1)} {declarators}; [[maybe_unused]] static const "
                f"::vtoken_emu::SharedArrays vtoken_emu_shared_{line}({', '.join(names)});")

    return STATIC_SHARED.sub(static, text)


def split_top_level(declarators):
    parts, depth, current = [], 0, ""
    for c in declarators:
        if c in "[(":
            depth += 1
        elif c in "])":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += c
    return parts + [current]


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: emulate_cu.py INPUT.cu OUTPUT.cc")
    source, output = sys.argv[1], sys.argv[2]
    with open(source, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"\basm\s*(volatile\s*)?\(", text)
    if m:
        fail(source, text, m.start(), "inline assembly cannot run on the host")
    text = rewrite_shared(source, rewrite_launches(source, text))
    for leftover in ("<<<", "__shared__"):
        at = text.find(leftover)
        if at >= 0:
            fail(source, text, at, f"'{leftover}' left after the rewrite")
    with open(output, "w", encoding="utf-8") as f:
        f.write('#include "tests/cuda_emu/cuda_emu.h"\n')
        f.write(f'#line 1 "{source}"\n')
        f.write(text)


if __name__ == "__main__":
    main()

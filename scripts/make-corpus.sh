#!/usr/bin/env bash
# Writes OUT_DIR/kjv.txt: the King James Bible as plain English prose, from Debian's bible-kjv.
#
# Format: one "Book N" heading per chapter, a blank line, then one verse per line as
# "V text" (e.g. "1 In the beginning God created the heaven and the earth."), a blank line
# between chapters. ASCII only, LF line endings, deterministic (same bytes on every run).
#
# `bible -l0` disables line wrapping (otherwise verses wrap at $COLUMNS, which would make the
# output depend on the terminal); stdout is a file, so the tool never starts a pager.
# Idempotent: an existing kjv.txt that ends with Revelation 22:21 is kept. The file is written
# to a temporary name and renamed, so an interrupted run never leaves a partial kjv.txt.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
out_dir=$1
out=$out_dir/kjv.txt
last_verse='21 The grace of our Lord Jesus Christ be with you all. Amen.'

if [[ -s $out ]] && [[ "$(tail -n 1 "$out")" == "$last_verse" ]]; then
  echo "$out is complete; nothing to do"
  exit 0
fi

if ! command -v bible >/dev/null 2>&1; then
  echo "$0: error: 'bible' not found; install the Debian package bible-kjv" >&2
  exit 1
fi

mkdir -p "$out_dir"
tmp=$(mktemp "$out_dir/.kjv.txt.XXXXXX")
trap 'rm -f "$tmp"' EXIT

# Strip the verse indentation and any trailing blanks, drop the blank line the tool prints
# before the first heading, and squeeze runs of blank lines into one.
LC_ALL=C bible -l0 "Gen1:1-Rev22:21" |
  LC_ALL=C sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' |
  LC_ALL=C cat -s |
  LC_ALL=C sed -e '1{/^$/d;}' >"$tmp"

if [[ "$(tail -n 1 "$tmp")" != "$last_verse" ]]; then
  echo "$0: error: bible output does not end with Revelation 22:21; corpus incomplete" >&2
  exit 1
fi
if LC_ALL=C grep -q -P '[^\x20-\x7e]' "$tmp"; then
  echo "$0: error: bible output contains control or non-ASCII bytes" >&2
  exit 1
fi

chmod 644 "$tmp"
mv "$tmp" "$out"
trap - EXIT
echo "wrote $out ($(wc -c <"$out") bytes, $(wc -l <"$out") lines)"

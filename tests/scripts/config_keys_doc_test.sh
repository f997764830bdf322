#!/usr/bin/env bash
# Every experiment-config key the loader reads (derived from apps/vtoken-cli/experiment_config.cc:
# each Section's typed reads) has a row in docs/EXPERIMENTS.md's key table ([sweep] keys: in
# docs/SWEEPS.md), and every key the table names is one the loader reads: a key added or renamed
# on one side only fails here.
# Usage: config_keys_doc_test.sh SOURCE_DIR
set -euo pipefail
python3 - "$1" <<'PY'
import re, sys
src_dir = sys.argv[1]
src = open(f"{src_dir}/apps/vtoken-cli/experiment_config.cc").read()
experiments = open(f"{src_dir}/docs/EXPERIMENTS.md").read()
sweeps = open(f"{src_dir}/docs/SWEEPS.md").read()

# Section VAR(table, "NAME", file): VAR.Bool("key", ...) reads NAME.key.
sections = dict(re.findall(r'Section (\w+)\([^,]+, "([\w.]*)"', src))
read = set()
for var, key in re.findall(r'\b(\w+)\.(?:Bool|Int|Int32|Uint|Double|DoubleArray|String|StringArray|Raw)\("(\w+)"', src):
    if var in sections:
        read.add(f"{sections[var]}.{key}" if sections[var] else key)
assert len(sections) >= 10 and len(read) >= 60, (sections, sorted(read))

# The table's first cells: `section.key`, then bare `key`s of the same section.
documented, wildcards = set(), set()
for line in experiments.splitlines():
    if not line.startswith("| `"):
        continue
    names = re.findall(r"`([^`]+)`", line.split("|")[1])
    prefix = names[0].rsplit(".", 1)[0] if "." in names[0] else ""
    for i, name in enumerate(names):
        full = f"{prefix}.{name}" if i > 0 and prefix and "." not in name else name
        (wildcards if full.endswith(".*") else documented).add(full)

missing = []
for key in sorted(read):
    if key.startswith("sweep."):
        bare = key.split(".", 1)[1]
        if not re.search(rf"^{bare} = |`{bare} = ", sweeps, re.M):
            missing.append(key + " (docs/SWEEPS.md)")
    elif key not in documented and not any(key.startswith(w[:-1]) for w in wildcards):
        missing.append(key)
stale = sorted(documented - read)
if missing or stale:
    print("keys the loader reads but the docs do not list:", missing)
    print("keys the docs list but the loader does not read:", stale)
    sys.exit(1)
print(f"config_keys_doc: {len(read)} keys read, all documented; {len(documented)} documented, "
      "all read")
PY
